//! The rules of one host of an entry: name, address (`host[:port]`), user, socket, pool,
//! bridge or network, guest subnets (`guestCidr`), SSH files, concurrency and pool reserve;
//! the error for two hosts of one entry naming the same address, socket and pool, and the
//! warning for two entries sharing one.
//!
//! Guarantees: pure; every violation is reported with its field path and value.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use egress_provider::libvirt::config::{HostConfig, MAX_FENCE_TIMEOUT, MIN_FENCE_TIMEOUT};
use egress_provider::libvirt::hostpool::parse_address;
use egress_provider::libvirt::ops::trust::parse_guest_cidr;

use super::fields::{abs_path, ident, libvirt_name};
use super::{
    GIB, MAX_BRIDGE_LEN, MAX_HOST_CONCURRENCY, MAX_LIBVIRT_NAME_LEN, MAX_SOCKET_LEN, MAX_USER_LEN,
    Report,
};

pub(super) fn host<'a>(
    r: &mut Report,
    hp: &str,
    h: &'a HostConfig,
    places: &mut BTreeMap<(String, u16, &'a str, &'a str), String>,
) {
    ident(r, &format!("{hp}.name"), &h.name);
    let addr = address(r, &format!("{hp}.address"), &h.address);
    let up = format!("{hp}.user");
    if h.user.is_empty()
        || h.user.len() > MAX_USER_LEN
        || h.user.starts_with('-')
        || !h
            .user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        r.err(
            &up,
            format!(
                "{:?} is not a user name: 1 to {MAX_USER_LEN} of A-Z a-z 0-9 . _ -, not starting \
                 with -",
                h.user
            ),
        );
    }
    let sp = format!("{hp}.socket");
    if !h.socket.starts_with('/')
        || h.socket.len() > MAX_SOCKET_LEN
        || h.socket
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        r.err(
            &sp,
            format!(
                "{:?} is not a socket path: absolute, at most {MAX_SOCKET_LEN} bytes, no \
                 whitespace or control characters",
                h.socket
            ),
        );
    }
    libvirt_name(r, &format!("{hp}.pool"), &h.pool, MAX_LIBVIRT_NAME_LEN);
    match (&h.bridge, &h.network) {
        (Some(_), Some(_)) => r.err(
            &format!("{hp}.bridge"),
            "bridge and network are both set; set one of them (or neither for no NIC)",
        ),
        (None, None) => r.warn(
            hp,
            "neither bridge nor network is set: guests on this host get no network interface, \
             so their proxies are unreachable (useful only for tests)",
        ),
        _ => {}
    }
    if let Some(b) = &h.bridge {
        libvirt_name(r, &format!("{hp}.bridge"), b, MAX_BRIDGE_LEN);
    }
    if let Some(n) = &h.network {
        libvirt_name(r, &format!("{hp}.network"), n, MAX_LIBVIRT_NAME_LEN);
    }
    guest_cidr(r, hp, h);
    if let Some(seg) = &h.segment {
        ident(r, &format!("{hp}.segment"), seg);
    }
    fence(r, hp, h);
    for (i, a) in h.host_addresses.iter().enumerate() {
        if a.trim().parse::<std::net::IpAddr>().is_err() {
            r.err(
                &format!("{hp}.hostAddresses[{i}]"),
                format!("{a:?} is not an IP address (e.g. 203.0.113.9 or 2001:db8::9)"),
            );
        }
    }
    // NB: `address: local` is this machine's libvirt socket, reached without SSH: the key
    // and known_hosts are then optional (still checked when given).
    let local = h.address == crate::providers::LOCAL_ADDRESS;
    if !local || h.ssh_key_file.is_some() {
        abs_path(
            r,
            &format!("{hp}.sshKeyFile"),
            h.ssh_key_file.as_deref(),
            "the SSH private key",
        );
    }
    if !local || h.known_hosts_file.is_some() {
        abs_path(
            r,
            &format!("{hp}.knownHostsFile"),
            h.known_hosts_file.as_deref(),
            "the known_hosts file (host keys are never trusted on first use)",
        );
    }
    if h.max_concurrent == 0 || h.max_concurrent > MAX_HOST_CONCURRENCY {
        r.err(
            &format!("{hp}.maxConcurrent"),
            format!(
                "{} is out of range 1..={MAX_HOST_CONCURRENCY}",
                h.max_concurrent
            ),
        );
    }
    if h.pool_reserve_gib.checked_mul(GIB).is_none() {
        r.err(
            &format!("{hp}.poolReserveGiB"),
            format!(
                "{} GiB does not fit in 64 bits of bytes",
                h.pool_reserve_gib
            ),
        );
    }
    if let Some((host, port)) = addr {
        let key = (
            host.to_ascii_lowercase(),
            port,
            h.socket.as_str(),
            h.pool.as_str(),
        );
        let entry_of = |p: &str| p.split(".hosts[").next().unwrap_or(p).to_owned();
        if let Some(first) = places.get(&key)
            && entry_of(first) == entry_of(hp)
        {
            // One entry would open two sessions to one libvirtd and count its pool twice.
            r.err(
                &format!("{hp}.address"),
                format!(
                    "same address, socket and pool as {first}.address ({}:{port}, {}, pool {}): \
                     two hosts of one entry must not be the same place; remove one of them or \
                     give it another pool",
                    h.address, h.socket, h.pool
                ),
            );
        } else if let Some(first) = places.get(&key) {
            r.warn(
                hp,
                format!(
                    "same address, socket and pool as {first} ({}:{port}, {}, pool {}): both \
                     share the pool's space and volume namespace; use one entry or distinct pools",
                    h.address, h.socket, h.pool
                ),
            );
        } else {
            places.insert(key, hp.to_owned());
        }
    }
}

/// Longest fence command (arguments, each at most [`MAX_FENCE_ARG_LEN`] bytes).
pub const MAX_FENCE_ARGS: usize = 64;
/// Longest fence command argument, bytes.
pub const MAX_FENCE_ARG_LEN: usize = 4096;

/// `fence`: a non-empty argv whose program is named, without NULs, and a timeout within
/// [`MIN_FENCE_TIMEOUT`]..=[`MAX_FENCE_TIMEOUT`].
fn fence(r: &mut Report, hp: &str, h: &HostConfig) {
    let Some(f) = &h.fence else { return };
    let cp = format!("{hp}.fence.command");
    match f.command.first() {
        None => r.err(
            &cp,
            "is empty: give the program and its arguments, e.g. [ipmitool, -H, bmc-h1, chassis,              power, off]",
        ),
        Some(p) if p.trim().is_empty() => {
            r.err(&format!("{cp}[0]"), format!("{p:?} names no program"));
        }
        Some(_) => {}
    }
    if f.command.len() > MAX_FENCE_ARGS {
        r.err(
            &cp,
            format!(
                "has {} arguments; at most {MAX_FENCE_ARGS}",
                f.command.len()
            ),
        );
    }
    for (i, a) in f.command.iter().enumerate() {
        if a.contains('\0') || a.len() > MAX_FENCE_ARG_LEN {
            r.err(
                &format!("{cp}[{i}]"),
                format!("contains a NUL byte or is longer than {MAX_FENCE_ARG_LEN} bytes"),
            );
        }
    }
    if !(MIN_FENCE_TIMEOUT..=MAX_FENCE_TIMEOUT).contains(&f.timeout) {
        r.err(
            &format!("{hp}.fence.timeout"),
            format!(
                "{}s is out of range {}s..={}s",
                f.timeout.as_secs_f64(),
                MIN_FENCE_TIMEOUT.as_secs(),
                MAX_FENCE_TIMEOUT.as_secs()
            ),
        );
    }
}

/// `guestCidr`: each value a CIDR narrower than `/0`; a bridge host without it is warned
/// about (its guests' addresses are then bounded by nothing but the host's ARP table).
fn guest_cidr(r: &mut Report, hp: &str, h: &HostConfig) {
    for (i, c) in h.guest_cidr.iter().enumerate() {
        let field = format!("{hp}.guestCidr[{i}]");
        match parse_guest_cidr(c) {
            None => r.err(
                &field,
                format!("{c:?} is not a CIDR (e.g. 192.168.122.0/24 or fd00:1::/64)"),
            ),
            Some(n) if n.prefix_len() == 0 => r.err(
                &field,
                format!(
                    "{c:?} admits every address: a guest could then have its health probes, \
                     and its proxy credentials, sent anywhere; give the guests' subnet"
                ),
            ),
            Some(_) => {}
        }
    }
    if h.bridge.is_some() && h.guest_cidr.is_empty() {
        r.warn(
            &format!("{hp}.guestCidr"),
            "not set on a bridge host: a guest's address is then taken only from the host's \
             ARP table (the guest agent is not believed), which a guest can fill with an \
             address of its choice; set it to the bridge's subnet",
        );
    }
}

/// `host[:port]` → (host, port), reporting an error and returning `None` when malformed.
// Closes finding M16.
pub(super) fn address(r: &mut Report, ap: &str, a: &str) -> Option<(String, u16)> {
    if a.is_empty() || a.chars().any(|c| c.is_whitespace() || c.is_control()) {
        r.err(
            ap,
            format!("{a:?} is not host[:port]: empty, or contains whitespace"),
        );
        return None;
    }
    if !a.starts_with('[') && a.matches(':').count() > 1 {
        r.err(
            ap,
            format!("{a:?}: an IPv6 address must be in brackets, e.g. [{a}] or [{a}]:22"),
        );
        return None;
    }
    let (host, port) = match parse_address(a) {
        Ok(hp) => hp,
        Err(why) => {
            r.err(ap, format!("{a:?} is not host[:port]: {why}"));
            return None;
        }
    };
    let ok = if a.starts_with('[') {
        host.parse::<Ipv6Addr>().is_ok()
    } else {
        host.parse::<Ipv4Addr>().is_ok() || (is_dns_name(&host) && !all_digits_and_dots(&host))
    };
    if !ok {
        r.err(
            ap,
            format!(
                "{a:?}: {host:?} is not a DNS name, an IPv4 address or a bracketed IPv6 address"
            ),
        );
        return None;
    }
    Some((host, port))
}

pub(super) fn all_digits_and_dots(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

pub(super) fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.trim_end_matches('.').split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::config::{ProviderEntry, parse};

    const BASE: &str = "providers:
  - name: home
    type: libvirt
    hosts:
      - name: h1
        address: local
";

    #[test]
    fn guest_cidr_is_empty_by_default_and_takes_one_cidr_or_a_list() {
        let cfg = parse(&format!("{BASE}        network: default\n"), "t.yaml").unwrap();
        let ProviderEntry::Libvirt(e) = &cfg.providers[0];
        assert!(e.hosts[0].guest_cidr.is_empty());
        let one = format!("{BASE}        bridge: br0\n        guestCidr: 10.1.0.0/16\n");
        let cfg = parse(&one, "t.yaml").unwrap();
        let ProviderEntry::Libvirt(e) = &cfg.providers[0];
        assert_eq!(e.hosts[0].guest_cidr, ["10.1.0.0/16"]);
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        let list = format!(
            "{BASE}        network: default\n        guestCidr: [10.1.0.0/16, fd00::/64]\n"
        );
        let cfg = parse(&list, "t.yaml").unwrap();
        let ProviderEntry::Libvirt(e) = &cfg.providers[0];
        assert_eq!(e.hosts[0].guest_cidr, ["10.1.0.0/16", "fd00::/64"]);
    }

    #[test]
    fn a_bad_or_unbounded_guest_cidr_is_an_error_naming_its_field() {
        let text = format!(
            "{BASE}        network: default\n        guestCidr: [10.1.0.0/16, nonsense, 0.0.0.0/0, ::/0]\n"
        );
        let errs = parse(&text, "t.yaml").unwrap_err();
        let paths: Vec<&str> = errs.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[0].hosts[0].guestCidr[1]",
                "providers[0].hosts[0].guestCidr[2]",
                "providers[0].hosts[0].guestCidr[3]",
            ],
            "{errs}"
        );
        let shape = parse(&format!("{BASE}        guestCidr: 8\n"), "t.yaml").unwrap_err();
        assert!(
            shape
                .errors
                .iter()
                .any(|e| e.path == "providers[0].hosts[0].guestCidr"),
            "{shape}"
        );
    }

    #[test]
    fn a_bridge_host_without_guest_cidr_is_warned_about() {
        let cfg = parse(&format!("{BASE}        bridge: br0\n"), "t.yaml").unwrap();
        assert!(
            cfg.warnings
                .iter()
                .any(|w| w.path == "providers[0].hosts[0].guestCidr"),
            "{:?}",
            cfg.warnings
        );
    }
}
