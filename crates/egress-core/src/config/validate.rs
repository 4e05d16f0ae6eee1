//! The validation rules of the provider config. Pure functions: no I/O.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use egress_provider::error::redact;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, Timeouts};
use egress_provider::libvirt::hostpool::{dial_budget, parse_address};
use egress_provider::libvirt::seed::payload_type;

use super::{ConfigError, ConfigWarning, ProviderEntry};

/// Longest entry name, host name or catalogue key.
// NB: entry names go into every domain and volume name (`ep-<entry>-<32 hex>-root.qcow2`);
// 32 keeps those well under libvirt's and the file system's limits.
pub const MAX_IDENT_LEN: usize = 32;
/// Longest pool or network name.
// NB: libvirt has no small limit, but these names become file names and XML attributes; 64
// is far above any real name and bounds what we echo in messages.
pub const MAX_LIBVIRT_NAME_LEN: usize = 64;
/// Longest bridge name: a Linux interface name (IFNAMSIZ 16 including the NUL).
pub const MAX_BRIDGE_LEN: usize = 15;
/// Longest libvirt socket path: `sun_path` is 108 bytes including the NUL.
pub const MAX_SOCKET_LEN: usize = 107;
/// Longest SSH user name (Linux `LOGIN_NAME_MAX` is 256; useradd allows 32).
pub const MAX_USER_LEN: usize = 32;
/// Largest disk size, GiB (64 TiB: far beyond a proxy, far below u64 byte overflow).
pub const MAX_DISK_GIB: u64 = 64 << 10;
/// Largest memory size, MiB (4 TiB: QEMU's practical ceiling on one guest).
pub const MAX_MEMORY_MIB: u64 = 4 << 20;
/// Smallest memory size, MiB: below this a cloud image does not finish cloud-init.
pub const MIN_MEMORY_MIB: u64 = 128;
/// Most vCPUs (QEMU's q35 machine type supports up to 1024 on current releases).
pub const MAX_VCPUS: u32 = 1024;
/// Most concurrent operations per host.
// NB: the per-host limit exists to bound H1's blast radius; beyond 64 it bounds nothing.
pub const MAX_HOST_CONCURRENCY: u32 = 64;
/// Longest timeout, seconds (one day): longer is a typo, and bounds `Instant + timeout`.
pub const MAX_TIMEOUT_SECS: u64 = 24 * 60 * 60;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Errors and warnings collected while walking the entries.
#[derive(Default)]
struct Report {
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
}

impl Report {
    fn err(&mut self, path: &str, message: impl AsRef<str>) {
        self.errors.push(ConfigError::new(path, message));
    }
    fn warn(&mut self, path: &str, message: impl AsRef<str>) {
        self.warnings.push(ConfigWarning::new(path, message));
    }
}

/// Checks every rule on `providers`, returning all errors and all warnings.
///
/// Rules (errors):
/// - at least one entry; each entry has at least one host;
/// - entry names, host names and catalogue keys are safe identifiers: 1 to
///   [`MAX_IDENT_LEN`] of `a-z 0-9 -`, starting with a letter; entry names unique in the file,
///   host names unique in their entry; catalogue keys do not start with `url-` (finding L8);
/// - `address` is `host[:port]`: a DNS name, an IPv4 address or a bracketed IPv6 address
///   (`[::1]:2222`); the port is 1–65535 and defaults to 22 (M16);
/// - `user` is 1–32 of `A-Z a-z 0-9 . _ -`, not starting with `-`; `socket` an absolute path
///   of at most 107 bytes without whitespace or control characters;
/// - `pool` and `network` are libvirt object names: 1 to [`MAX_LIBVIRT_NAME_LEN`] bytes, no
///   `/`, whitespace or control characters, not starting with `-` or `.`; `bridge` the same
///   and at most 15 bytes (a Linux interface name) (L12); at most one of `bridge`/`network`;
/// - `sshKeyFile` and `knownHostsFile` are set and absolute (the transport is SSH, even to
///   localhost; relative paths would depend on the operator's working directory) — except for
///   `address: local` (this machine's libvirt socket, no SSH), where they may be omitted;
/// - `maxConcurrent` is 1 to [`MAX_HOST_CONCURRENCY`]; `poolReserveGiB` × 2³⁰ fits in u64;
/// - image URLs are `http`/`https` with a host and no userinfo (L24); an `http://` URL
///   needs `sha256` (M17); `sha256` is 64 lowercase hex digits; `caFile`, when set, is an
///   absolute path (not opened here: no I/O at load; the provider reads it once, on the
///   first download, and reports an unreadable file naming the setting);
/// - `urlImages.allowedHosts` is non-empty when URL images are enabled, and each is a host
///   name (no scheme, port or path);
/// - `maxImageBytes` > 0;
/// - `guest.vendorData` is a payload cloud-init recognises (L13);
/// - timeouts are 1 s to [`MAX_TIMEOUT_SECS`], and consistent (L17): `call` ≥ `dial` (a call
///   on a fresh connection must not expire before a slow-but-alive dial phase could);
///   `imageImport` ≥ the dial budget (3 × `dial`) + `call` (an import dials a transfer
///   connection and makes calls: shorter, and an unreachable host reads as an import
///   timeout); `start` ≥ `call` (waiting for a domain polls it with calls);
/// - sizes (L20): `limits` are disk 1..=[`MAX_DISK_GIB`], memory
///   [`MIN_MEMORY_MIB`]..=[`MAX_MEMORY_MIB`], vCPUs 1..=[`MAX_VCPUS`]; `defaults` within the
///   same floors and at most the limits; byte conversions are checked.
///
/// Warnings: a host with neither `bridge` nor `network` (the guest gets no NIC, so the
/// proxy is unreachable: useful only for tests); two hosts (in any entries) with the same
/// address, socket and pool (they share the pool's space and its volumes' namespace, the
/// seed's H4 scenario); `urlImages.allowedHosts` set while URL images are disabled; a
/// `caFile` on a plain `http://` image (used only if it redirects to https).
pub fn validate(providers: &[ProviderEntry]) -> (Vec<ConfigError>, Vec<ConfigWarning>) {
    let mut r = Report::default();
    if providers.is_empty() {
        r.err(
            "providers",
            "the list is empty; at least one provider entry is needed",
        );
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    // (host, port, socket, pool) → first path that used it.
    let mut places: BTreeMap<(String, u16, &str, &str), String> = BTreeMap::new();
    for (i, p) in providers.iter().enumerate() {
        let path = format!("providers[{i}]");
        match p {
            ProviderEntry::Libvirt(e) => libvirt_entry(&mut r, &path, e, &mut places),
        }
        if let Some(first) = names.get(p.name()) {
            r.err(
                &format!("{path}.name"),
                format!(
                    "{:?} is already the name of providers[{first}]; entry names must be unique",
                    p.name()
                ),
            );
        } else {
            names.insert(p.name(), i);
        }
    }
    (r.errors, r.warnings)
}

fn libvirt_entry<'a>(
    r: &mut Report,
    path: &str,
    e: &'a LibvirtEntry,
    places: &mut BTreeMap<(String, u16, &'a str, &'a str), String>,
) {
    ident(r, &format!("{path}.name"), &e.name);
    if e.hosts.is_empty() {
        r.err(
            &format!("{path}.hosts"),
            "the list is empty; at least one host is needed",
        );
    }
    let mut host_names: BTreeMap<&str, usize> = BTreeMap::new();
    for (j, h) in e.hosts.iter().enumerate() {
        let hp = format!("{path}.hosts[{j}]");
        host(r, &hp, h, places);
        if let Some(first) = host_names.get(h.name.as_str()) {
            r.err(
                &format!("{hp}.name"),
                format!(
                    "{:?} is already the name of {path}.hosts[{first}]; host names must be unique \
                     within an entry",
                    h.name
                ),
            );
        } else {
            host_names.insert(&h.name, j);
        }
    }
    for (key, img) in &e.images {
        let kp = format!("{path}.images.{key}");
        ident(r, &kp, key);
        if key.starts_with("url-") {
            // Finding L8 (closed by names.rs's prefixes too; rejected here so no key looks
            // like a URL image's source key)
            r.err(
                &kp,
                format!(
                    "catalogue key {key:?} starts with `url-`, which is reserved for URL images"
                ),
            );
        }
        let scheme = image_url(r, &format!("{kp}.url"), &img.url);
        match &img.sha256 {
            Some(d) if !is_sha256_hex(d) => r.err(
                &format!("{kp}.sha256"),
                format!("{d:?} is not a sha256 digest: 64 lowercase hex digits expected"),
            ),
            None if scheme.as_deref() == Some("http") => r.err(
                &format!("{kp}.sha256"),
                format!(
                    "missing: the image URL {:?} is plain http://, which anyone on the path can \
                     alter; give its sha256 or use https://",
                    img.url
                ),
            ),
            _ => {}
        }
        if let Some(ca) = &img.ca_file {
            let cp = format!("{kp}.caFile");
            abs_path(r, &cp, Some(ca.as_path()), "a PEM file of CA certificates");
            if scheme.as_deref() == Some("http") {
                r.warn(
                    &cp,
                    "is used only if the plain http:// URL redirects to https://; give the \
                     https:// URL of the mirror",
                );
            }
        }
    }
    let up = format!("{path}.urlImages.allowedHosts");
    if e.url_images.enabled && e.url_images.allowed_hosts.is_empty() {
        r.err(
            &up,
            "the list is empty while urlImages.enabled is true; name the hosts images may be \
             downloaded from",
        );
    }
    if !e.url_images.enabled && !e.url_images.allowed_hosts.is_empty() {
        r.warn(
            &up,
            "set while urlImages.enabled is false; it has no effect",
        );
    }
    for (k, h) in e.url_images.allowed_hosts.iter().enumerate() {
        if !is_dns_name(h) && h.parse::<Ipv4Addr>().is_err() {
            r.err(
                &format!("{up}[{k}]"),
                format!("{h:?} is not a host name (no scheme, port or path)"),
            );
        }
    }
    if e.max_image_bytes == 0 {
        r.err(
            &format!("{path}.maxImageBytes"),
            "0: it must be at least 1 byte",
        );
    }
    if let Some(v) = &e.guest.vendor_data {
        let vp = format!("{path}.guest.vendorData");
        if let Err(err) = payload_type(&vp, v) {
            let first = v.lines().next().unwrap_or("");
            r.err(&vp, format!("first line {first:?}: {}", err.message));
        }
    }
    timeouts(r, &format!("{path}.timeouts"), &e.timeouts);
    sizes(r, path, e);
}

fn host<'a>(
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
        if let Some(first) = places.get(&key) {
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

/// `host[:port]` → (host, port), reporting an error and returning `None` when malformed.
// Closes finding M16.
fn address(r: &mut Report, ap: &str, a: &str) -> Option<(String, u16)> {
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

fn all_digits_and_dots(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

fn is_dns_name(s: &str) -> bool {
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

/// A safe identifier: lowercase letters, digits and `-`, starting with a letter.
fn ident(r: &mut Report, p: &str, s: &str) {
    let ok = !s.is_empty()
        && s.len() <= MAX_IDENT_LEN
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        r.err(
            p,
            format!(
                "{s:?} is not a safe identifier: 1 to {MAX_IDENT_LEN} of a-z 0-9 -, starting with \
                 a letter (it becomes part of domain and volume names)"
            ),
        );
    }
}

/// A libvirt object name (pool, network, bridge).
// Closes finding L12.
fn libvirt_name(r: &mut Report, p: &str, s: &str, max: usize) {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.starts_with(['-', '.'])
        && !s
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control());
    if !ok {
        r.err(
            p,
            format!(
                "{s:?} is not a valid name: 1 to {max} bytes, no `/`, whitespace or control \
                 characters, not starting with - or ."
            ),
        );
    }
}

fn abs_path(r: &mut Report, p: &str, v: Option<&Path>, what: &str) {
    match v {
        None => r.err(
            p,
            format!("missing: the absolute path of {what} is required"),
        ),
        Some(f) if !f.is_absolute() => r.err(
            p,
            format!(
                "{:?} is relative: give an absolute path",
                f.display().to_string()
            ),
        ),
        Some(_) => {}
    }
}

/// Checks an image URL, returning its (lowercase) scheme when it has a usable one.
// Closes finding L24.
fn image_url(r: &mut Report, p: &str, u: &str) -> Option<String> {
    let parsed = match url::Url::parse(u) {
        Ok(x) => x,
        Err(e) => {
            r.err(p, format!("{u:?} is not a URL: {e}"));
            return None;
        }
    };
    let scheme = parsed.scheme().to_owned();
    if scheme != "http" && scheme != "https" {
        r.err(
            p,
            format!("{u:?}: scheme {scheme:?} is not supported; use https:// or http://"),
        );
        return None;
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        r.err(p, format!("{u:?} has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // NB: the message is redacted by ConfigError::new; the rule is stated without the
        // credentials.
        r.err(
            p,
            format!(
                "{} carries credentials (user:password@): they would end up in logs and on \
                 hosts; serve the image without them",
                redact(u)
            ),
        );
    }
    Some(scheme)
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// Closes finding L17.
fn timeouts(r: &mut Report, p: &str, t: &Timeouts) {
    let all = [
        ("dial", t.dial),
        ("call", t.call),
        ("imageImport", t.image_import),
        ("start", t.start),
    ];
    let mut in_range = true;
    for (name, d) in all {
        if d.is_zero() || d > Duration::from_secs(MAX_TIMEOUT_SECS) {
            in_range = false;
            r.err(
                &format!("{p}.{name}"),
                format!(
                    "{}s is out of range 1..={MAX_TIMEOUT_SECS} seconds",
                    d.as_secs()
                ),
            );
        }
    }
    if !in_range {
        return;
    }
    if t.call < t.dial {
        r.err(
            &format!("{p}.call"),
            format!(
                "{}s is shorter than timeouts.dial ({}s); a call must be allowed at least as long \
                 as one dial phase",
                t.call.as_secs(),
                t.dial.as_secs()
            ),
        );
    }
    let import_floor = dial_budget(t).saturating_add(t.call);
    if t.image_import < import_floor {
        r.err(
            &format!("{p}.imageImport"),
            format!(
                "{}s is shorter than {}s, the dial budget (3 × timeouts.dial = {}s) plus one \
                 call (timeouts.call = {}s); an unreachable host would be reported as an import \
                 timeout",
                t.image_import.as_secs(),
                import_floor.as_secs(),
                dial_budget(t).as_secs(),
                t.call.as_secs()
            ),
        );
    }
    if t.start < t.call {
        r.err(
            &format!("{p}.start"),
            format!(
                "{}s is shorter than timeouts.call ({}s); waiting for a start polls with calls",
                t.start.as_secs(),
                t.call.as_secs()
            ),
        );
    }
}

// Closes finding L20.
fn sizes(r: &mut Report, path: &str, e: &LibvirtEntry) {
    let (d, l) = (&e.defaults, &e.limits);
    // (field, value, floor, ceiling, unit bytes)
    let disk_ok = bounded(
        r,
        &format!("{path}.limits.diskGiB"),
        l.disk_gib,
        1,
        MAX_DISK_GIB,
        GIB,
    );
    let mem_ok = bounded(
        r,
        &format!("{path}.limits.memoryMiB"),
        l.memory_mib,
        MIN_MEMORY_MIB,
        MAX_MEMORY_MIB,
        MIB,
    );
    let cpu_ok = bounded(
        r,
        &format!("{path}.limits.vcpus"),
        u64::from(l.vcpus),
        1,
        u64::from(MAX_VCPUS),
        1,
    );
    let disk_max = if disk_ok { l.disk_gib } else { MAX_DISK_GIB };
    let mem_max = if mem_ok { l.memory_mib } else { MAX_MEMORY_MIB };
    let cpu_max = if cpu_ok {
        u64::from(l.vcpus)
    } else {
        u64::from(MAX_VCPUS)
    };
    bounded(
        r,
        &format!("{path}.defaults.diskGiB"),
        d.disk_gib,
        1,
        disk_max,
        GIB,
    );
    bounded(
        r,
        &format!("{path}.defaults.memoryMiB"),
        d.memory_mib,
        MIN_MEMORY_MIB,
        mem_max,
        MIB,
    );
    bounded(
        r,
        &format!("{path}.defaults.vcpus"),
        u64::from(d.vcpus),
        1,
        cpu_max,
        1,
    );
}

/// `v` within `lo..=hi` and `v × unit` representable; reports and returns false otherwise.
fn bounded(r: &mut Report, p: &str, v: u64, lo: u64, hi: u64, unit: u64) -> bool {
    if v.checked_mul(unit).is_none() {
        r.err(p, format!("{v} overflows 64 bits when converted to bytes"));
        return false;
    }
    if v < lo || v > hi {
        r.err(p, format!("{v} is out of range {lo}..={hi}"));
        return false;
    }
    true
}

#[cfg(test)]
mod ca_file_tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )]

    use crate::config::parse;

    const BASE: &str = "providers:
  - name: home
    type: libvirt
    hosts:
      - name: h1
        address: local
    images:
      mirror:
        url: https://mirror.example/img.qcow2
";

    fn with_ca(url: &str, ca: &str) -> String {
        BASE.replace("https://mirror.example/img.qcow2", url) + &format!("        caFile: {ca}\n")
    }

    #[test]
    fn an_absolute_ca_file_on_an_https_image_loads_without_reading_it() {
        // The file does not exist: load does no I/O, the provider reads it on first use.
        let text = with_ca("https://mirror.example/img.qcow2", "/nonexistent/ca.pem");
        let cfg = parse(&text, "test.yaml").unwrap();
        assert!(
            !cfg.warnings.iter().any(|w| w.path.contains("caFile")),
            "{:?}",
            cfg.warnings
        );
    }

    #[test]
    fn a_relative_ca_file_is_rejected_naming_the_field() {
        let text = with_ca("https://mirror.example/img.qcow2", "certs/ca.pem");
        let errs = parse(&text, "test.yaml").unwrap_err();
        let e = errs
            .errors
            .iter()
            .find(|e| e.path.ends_with("images.mirror.caFile"))
            .unwrap_or_else(|| panic!("no caFile error in {errs:?}"));
        assert!(e.message.contains("relative"), "{}", e.message);
    }

    #[test]
    fn a_ca_file_on_a_plain_http_image_is_a_warning() {
        let sha = "0".repeat(64);
        let text = with_ca("http://mirror.example/img.qcow2", "/etc/ca.pem")
            + &format!("        sha256: \"{sha}\"\n");
        let cfg = parse(&text, "test.yaml").unwrap();
        assert!(
            cfg.warnings
                .iter()
                .any(|w| w.path.ends_with("images.mirror.caFile")),
            "{:?}",
            cfg.warnings
        );
    }
}
