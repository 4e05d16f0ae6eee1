//! The rules of hosts' declared egress addresses (`addressPool:`): each pool parsed with
//! every violation at its field path, a pool only on a host with a NIC, and no address two
//! hosts on one segment could both hand out (their prefixes overlap and so do their ranges).
//!
//! Guarantees: pure; the cross-host check compares every pair of pools once per load (hosts
//! are tens, and this runs at load, never per event).

use egress_provider::libvirt::address_pool::ParsedPool;
use egress_provider::libvirt::config::HostConfig;

use super::Report;

/// Checks `h`'s pool (if any) at `hp` and returns it parsed when valid.
pub(super) fn host_pool(r: &mut Report, hp: &str, h: &HostConfig) -> Option<ParsedPool> {
    let pool = h.address_pool.as_ref()?;
    let pp = format!("{hp}.addressPool");
    if h.bridge.is_none() && h.network.is_none() {
        r.err(
            &pp,
            "set on a host with neither bridge nor network: its guests have no interface to \
             carry the addresses",
        );
    }
    match pool.parse() {
        Ok(p) => Some(p),
        Err(errs) => {
            for e in errs {
                r.err(&format!("{pp}.{}", e.field), e.message);
            }
            None
        }
    }
}

/// One valid pool for the cross-host rules: its host's path, the host's segment key
/// (entry index and [`HostConfig::segment_key`]) and the pool.
pub(super) type SegmentPool = (String, (usize, String), ParsedPool);

/// Reports, at the later host's `addressPool`, an address two hosts' pools could both hand
/// out (`pools`: each valid pool with its host path, in config order). Hosts of one entry on
/// one segment share their pool (one book hands its addresses out): they are not compared.
pub(super) fn no_shared_addresses(r: &mut Report, pools: &[SegmentPool]) {
    for (i, (later, ls, p)) in pools.iter().enumerate() {
        for (earlier, es, q) in pools.iter().take(i) {
            if ls == es {
                continue;
            }
            if let Some(ip) = p.overlap(q) {
                r.err(
                    &format!("{later}.addressPool"),
                    format!(
                        "its ranges overlap those of {earlier}.addressPool (both could hand out \
                         {ip}) on the same prefix: two guests would get one address; give each \
                         host its own ranges"
                    ),
                );
            }
        }
    }
}

/// Reports, at the later host's `addressPool`, a host of an entry whose `segment` is shared
/// with an earlier host of the entry but whose `addressPool` differs (or is missing on one of
/// them): one segment hands out one pool. `hosts`: each host's path with the host, in order.
pub(super) fn one_pool_per_segment(r: &mut Report, hosts: &[(String, &HostConfig)]) {
    for (i, (later, h)) in hosts.iter().enumerate() {
        let Some(seg) = &h.segment else { continue };
        let first = hosts
            .iter()
            .take(i)
            .find(|(_, e)| e.segment.as_ref() == Some(seg));
        if let Some((earlier, e)) = first
            && e.address_pool != h.address_pool
        {
            r.err(
                &format!("{later}.addressPool"),
                format!(
                    "differs from {earlier}.addressPool while both hosts are on segment {seg:?} \
                     ({later}.segment): hosts of one segment share one address pool; give them \
                     identical addressPools, or different segments"
                ),
            );
        }
    }
}
