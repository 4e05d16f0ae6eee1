//! The validation rules of the provider config. Pure functions: no I/O.
//!
//! [`validate`] walks the entries and reports every violation; the rules live by subject:
//! an entry's own fields here, a host's (address, user, socket, pool, network) in `host`,
//! the shapes of single fields (identifiers, libvirt names, paths, image URLs) in `fields`,
//! and the numbers (timeouts and sizes, with checked byte arithmetic) in `numbers`.

mod address_pool;
mod fields;
mod host;
mod numbers;
mod policy;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::libvirt::seed::payload_type;

use self::fields::{abs_path, ident, image_url, is_sha256_hex};
use self::host::{host, is_dns_name};
use self::numbers::{sizes, timeouts};
use self::policy::policy;
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

pub(super) const GIB: u64 = 1 << 30;
pub(super) const MIB: u64 = 1 << 20;

/// Errors and warnings collected while walking the entries.
#[derive(Default)]
pub(super) struct Report {
    pub(super) errors: Vec<ConfigError>,
    pub(super) warnings: Vec<ConfigWarning>,
}

impl Report {
    pub(super) fn err(&mut self, path: &str, message: impl AsRef<str>) {
        self.errors.push(ConfigError::new(path, message));
    }
    pub(super) fn warn(&mut self, path: &str, message: impl AsRef<str>) {
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
///   (DNS name, IPv4, `[IPv6]`) with an optional `:port` 1–65535 (no scheme or path);
/// - `maxImageBytes` > 0;
/// - `policy`: `minClientPrefixV4` 1–32, `minClientPrefixV6` 1–128, `maxClientSpanV4` 8–32,
///   `maxClientSpanV6` 32–64, `minPasswordLength`
///   8–128; `allowedDestinations` domains are `example.com` or `*.example.com`, CIDRs parse,
///   ports are not 0, at most 64 of each; `allowedInternalCidrs` parse (a `/0` warns);
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
/// Two hosts of one entry with the same address, socket and pool are an error at the second
/// one's `address` naming the first's (one entry would open two sessions to one daemon and
/// count its pool twice).
///
/// Warnings: a host with neither `bridge` nor `network` (the guest gets no NIC, so the
/// proxy is unreachable: useful only for tests); two hosts of different entries with the same
/// address, socket and pool (they share the pool's space and its volumes' namespace, finding
/// H4); `urlImages.allowedHosts` set while URL images are disabled; a `caFile` on a plain
/// `http://` image (used only if it redirects to https).
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
    // Every valid address pool with its host's path, for the cross-host overlap rule.
    let mut pools = Vec::new();
    for (i, p) in providers.iter().enumerate() {
        let path = format!("providers[{i}]");
        match p {
            ProviderEntry::Libvirt(e) => libvirt_entry(&mut r, &path, e, &mut places),
        }
        let ProviderEntry::Libvirt(e) = p;
        let mut hosts = Vec::new();
        for (j, h) in e.hosts.iter().enumerate() {
            let hp = format!("{path}.hosts[{j}]");
            if let Some(pool) = address_pool::host_pool(&mut r, &hp, h) {
                pools.push((hp.clone(), (i, h.segment_key()), pool));
            }
            hosts.push((hp, h));
        }
        address_pool::one_pool_per_segment(&mut r, &hosts);
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
    address_pool::no_shared_addresses(&mut r, &pools);
    (r.errors, r.warnings)
}

pub(super) fn libvirt_entry<'a>(
    r: &mut Report,
    path: &str,
    e: &'a LibvirtEntry,
    places: &mut BTreeMap<(String, u16, &'a str, &'a str), String>,
) {
    ident(r, &format!("{path}.name"), &e.name);
    policy(r, &format!("{path}.policy"), &e.policy);
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
        let ok = match egress_provider::libvirt::image::source::split_host_port(h) {
            Some((host, _)) if h.trim_start().starts_with('[') => {
                host.parse::<std::net::Ipv6Addr>().is_ok()
            }
            Some((host, _)) => is_dns_name(&host) || host.parse::<Ipv4Addr>().is_ok(),
            None => false,
        };
        if !ok {
            r.err(
                &format!("{up}[{k}]"),
                format!(
                    "{h:?} is not a host name or host:port (a DNS name, an IPv4 address or an IPv6 \
                     address in brackets, with an optional port 1-65535; no scheme or path)"
                ),
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
    access(r, path, e);
}

/// `access` (namespace names are DNS labels, a selector has labels) and its absence where a
/// feature is worth restricting (a warning: the entry is open to every namespace).
fn access(r: &mut Report, path: &str, e: &LibvirtEntry) {
    use egress_provider::libvirt::config::Namespaces;
    let names = |r: &mut Report, p: &str, n: &Namespaces| {
        for (i, ns) in n.namespaces.iter().enumerate() {
            if !crate::model::is_dns_label(ns) {
                r.err(
                    &format!("{p}.namespaces[{i}]"),
                    format!(
                        "{ns:?} is not a namespace name (a DNS label: a-z 0-9 '-', at most 63)"
                    ),
                );
            }
        }
        if n.namespace_selector
            .as_ref()
            .is_some_and(|s| s.match_labels.is_empty())
        {
            r.err(
                &format!("{p}.namespaceSelector.matchLabels"),
                "empty: a selector must name at least one label (it would match no namespace)",
            );
        }
    };
    match &e.access {
        Some(a) => {
            let ap = format!("{path}.access");
            names(r, &ap, &a.tenants());
            for (field, g) in [
                ("urlImages", &a.url_images),
                ("internalCidrs", &a.internal_cidrs),
                ("addressPools", &a.address_pools),
            ] {
                if let Some(g) = g {
                    names(r, &format!("{ap}.{field}"), g);
                }
            }
        }
        None => {
            let features: Vec<&str> = [
                ("URL images", e.url_images.enabled),
                (
                    "policy.allowedInternalCidrs",
                    !e.policy.allowed_internal_cidrs.is_empty(),
                ),
                (
                    "address pools",
                    e.hosts.iter().any(|h| h.address_pool.is_some()),
                ),
            ]
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f)
            .collect();
            if !features.is_empty() {
                r.warn(
                    &format!("{path}.access"),
                    format!(
                        "not set: every namespace may use this entry and its {}; grant them to \
                         the namespaces that need them (docs/security.md)",
                        features.join(", ")
                    ),
                );
            }
        }
    }
    for (j, h) in e.hosts.iter().enumerate() {
        if let Some(a) = &h.access {
            names(r, &format!("{path}.hosts[{j}].access"), a);
        }
        if let Some(a) = h.address_pool.as_ref().and_then(|p| p.access.as_ref()) {
            names(r, &format!("{path}.hosts[{j}].addressPool.access"), a);
        }
    }
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
