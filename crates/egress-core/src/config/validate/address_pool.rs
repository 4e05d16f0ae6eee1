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

/// Reports, at the later host's `addressPool`, an address two hosts' pools could both hand
/// out (`pools`: each valid pool with its host path, in config order).
pub(super) fn no_shared_addresses(r: &mut Report, pools: &[(String, ParsedPool)]) {
    for (i, (later, p)) in pools.iter().enumerate() {
        for (earlier, q) in pools.iter().take(i) {
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
