//! The provider config loader: the example file loads; every rule rejects with the exact field
//! path; all errors of a file come together; loading never contacts a host.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;

use egress_core::config::{ConfigError, ConfigErrors, ProviderConfig, ProviderEntry, load, parse};

const EXAMPLE: &str = include_str!("../../../examples/providers.yaml");

/// The example with `from` replaced by `to` (`from` must occur exactly once).
fn with(from: &str, to: &str) -> String {
    edit(EXAMPLE, from, to)
}

fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once");
    text.replace(from, to)
}

fn ok(text: &str) -> ProviderConfig {
    match parse(text, "test.yaml") {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got:\n{e}"),
    }
}

fn errs(text: &str) -> ConfigErrors {
    match parse(text, "test.yaml") {
        Ok(c) => panic!("expected errors, got a valid config: {c:?}"),
        Err(e) => e,
    }
}

/// Asserts the file's errors are exactly one, at `path`, with a message containing `needle`.
fn only_error(text: &str, path: &str, needle: &str) -> ConfigError {
    let e = errs(text);
    assert_eq!(e.errors.len(), 1, "expected one error, got:\n{e}");
    let first = e.errors[0].clone();
    assert_eq!(first.path, path, "{e}");
    assert!(first.message.contains(needle), "{needle:?} not in {first}");
    first
}

fn paths(e: &ConfigErrors) -> Vec<&str> {
    e.errors.iter().map(|x| x.path.as_str()).collect()
}

#[test]
fn the_example_file_loads_without_errors_or_warnings() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/providers.yaml");
    let c = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let ProviderEntry::Libvirt(e) = c.entry("home").unwrap();
    assert_eq!(e.hosts[0].address, "127.0.0.1:22");
    assert_eq!(e.hosts[0].pool_reserve_gib, 5);
    assert_eq!(
        (e.defaults.disk_gib, e.defaults.memory_mib, e.defaults.vcpus),
        (10, 512, 1)
    );
    assert_eq!(
        (e.limits.disk_gib, e.limits.memory_mib, e.limits.vcpus),
        (100, 8192, 8)
    );
    assert_eq!(e.images.len(), 2);
}

#[test]
fn a_minimal_entry_gets_the_documented_defaults() {
    let c = ok(
        "providers:\n- name: home\n  type: libvirt\n  hosts:\n  - name: a\n    address: \
                h.example.org\n    network: default\n    sshKeyFile: /k\n    knownHostsFile: /kh\n",
    );
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    assert_eq!(e.hosts[0].user, "root");
    assert_eq!(e.hosts[0].socket, "/run/libvirt/libvirt-sock");
    assert_eq!((e.defaults.disk_gib, e.limits.vcpus), (10, 8));
}

// finding: M16
#[test]
fn a_malformed_address_is_rejected_naming_the_field_and_the_value() {
    for bad in [
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "h:ssh",
        "::1",
        "[::1",
        "[::1]22",
        "bad host",
        "a_b.example",
        "",
        "-x.org",
        "1.2.3",
    ] {
        let text = with("address: 127.0.0.1:22", &format!("address: {bad:?}"));
        let e = only_error(&text, "providers[0].hosts[0].address", &format!("{bad:?}"));
        assert!(!e.message.is_empty());
    }
    for good in [
        "127.0.0.1",
        "localhost:2222",
        "[::1]",
        "[2001:db8::1]:22",
        "h.example.org.",
        "host-1.example.org:65535",
    ] {
        ok(&with(
            "address: 127.0.0.1:22",
            &format!("address: {good:?}"),
        ));
    }
}

// finding: M17
#[test]
fn a_plain_http_image_without_sha256_is_rejected() {
    let text = with(
        "        sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
        "",
    );
    only_error(&text, "providers[0].images.alpine.sha256", "http://");
    // https needs no digest
    ok(&with("url: http://mirror", "url: https://mirror").replace(
        "        sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
        "",
    ));
}

#[test]
fn a_sha256_that_is_not_64_lowercase_hex_digits_is_rejected() {
    for bad in [
        "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
        "abc",
    ] {
        let text = with(
            "sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            &format!("sha256: {bad}"),
        );
        only_error(&text, "providers[0].images.alpine.sha256", bad);
    }
}

// finding: L24
#[test]
fn an_image_url_with_userinfo_is_rejected_and_the_password_never_printed() {
    let text = with(
        "url: http://mirror.example.org/",
        "url: http://alice:s3cret@mirror.example.org/",
    );
    let e = errs(&text);
    assert_eq!(paths(&e), ["providers[0].images.alpine.url"], "{e}");
    assert!(e.errors[0].message.contains("credentials"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
    assert!(!format!("{e:?}").contains("s3cret"), "{e:?}");
}

#[test]
fn an_image_url_that_is_not_http_or_https_is_rejected() {
    only_error(
        &with("url: http://mirror", "url: ftp://mirror"),
        "providers[0].images.alpine.url",
        "scheme",
    );
    only_error(
        &with(
            "url: http://mirror.example.org/alpine-3.20.qcow2",
            "url: not-a-url",
        ),
        "providers[0].images.alpine.url",
        "not a URL",
    );
}

// finding: L8
#[test]
fn a_catalogue_key_starting_with_url_is_rejected() {
    only_error(
        &with("      alpine:\n", "      url-alpine:\n"),
        "providers[0].images.url-alpine",
        "url-",
    );
}

#[test]
fn a_catalogue_key_that_is_not_a_safe_identifier_is_rejected() {
    only_error(
        &with("      alpine:\n", "      Alpine_3:\n"),
        "providers[0].images.Alpine_3",
        "safe identifier",
    );
}

// finding: L12
#[test]
fn pool_bridge_and_network_names_are_checked_as_libvirt_identifiers() {
    only_error(
        &with("pool: default", "pool: a/b"),
        "providers[0].hosts[0].pool",
        "\"a/b\"",
    );
    only_error(
        &with("pool: default", "pool: \"a b\""),
        "providers[0].hosts[0].pool",
        "whitespace",
    );
    only_error(
        &with("pool: default", "pool: \"-rf\""),
        "providers[0].hosts[0].pool",
        "\"-rf\"",
    );
    only_error(
        &with("network: default", "network: \"x\\ty\""),
        "providers[0].hosts[0].network",
        "control",
    );
    only_error(
        &with("network: default", &format!("network: {}", "n".repeat(65))),
        "providers[0].hosts[0].network",
        "1 to 64",
    );
    only_error(
        &with("network: default", "bridge: br0/x"),
        "providers[0].hosts[0].bridge",
        "br0/x",
    );
    // a bridge is a Linux interface name: at most 15 bytes
    only_error(
        &with("network: default", "bridge: abcdefghijklmnop"),
        "providers[0].hosts[0].bridge",
        "1 to 15",
    );
    ok(&with("network: default", "bridge: br0"));
}

#[test]
fn bridge_and_network_together_are_rejected_and_neither_is_a_warning() {
    only_error(
        &with("network: default", "network: default\n        bridge: br0"),
        "providers[0].hosts[0].bridge",
        "both",
    );
    let c = ok(&with("        network: default\n", ""));
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(c.warnings[0].path, "providers[0].hosts[0]");
    assert!(c.warnings[0].message.contains("no network interface"));
}

// finding: L13
#[test]
fn vendor_data_cloud_init_would_ignore_is_rejected() {
    let text = with(
        "        #cloud-config\n        timezone: UTC\n",
        "        timezone: UTC\n",
    );
    only_error(&text, "providers[0].guest.vendorData", "\"timezone: UTC\"");
    ok(&with(
        "        #cloud-config\n        timezone: UTC\n",
        "        #!/bin/sh\n        true\n",
    ));
}

// finding: L17
#[test]
fn timeouts_inconsistent_with_each_other_are_rejected() {
    only_error(
        &with("      call: 60", "      call: 5"),
        "providers[0].timeouts.call",
        "timeouts.dial (10s)",
    );
    // the import must outlast the dial budget (3 × dial) plus a call: 3 × 10 + 60 = 90
    only_error(
        &with("imageImport: 1800", "imageImport: 89"),
        "providers[0].timeouts.imageImport",
        "90s",
    );
    ok(&with("imageImport: 1800", "imageImport: 90"));
    only_error(
        &with("      start: 60", "      start: 59"),
        "providers[0].timeouts.start",
        "timeouts.call",
    );
}

#[test]
fn zero_or_absurd_timeouts_are_rejected() {
    only_error(
        &with("      dial: 10", "      dial: 0"),
        "providers[0].timeouts.dial",
        "0s",
    );
    only_error(
        &with("imageImport: 1800", "imageImport: 86401"),
        "providers[0].timeouts.imageImport",
        "86401s",
    );
    // a host check's calls share a 20 s budget
    for bad in ["0", "21"] {
        only_error(
            &with("      check: 10", &format!("      check: {bad}")),
            "providers[0].timeouts.check",
            &format!("{bad}s is out of range 1..=20"),
        );
    }
    for good in ["1", "4s", "20"] {
        let cfg = ok(&with("      check: 10", &format!("      check: {good}")));
        let ProviderEntry::Libvirt(e) = &cfg.providers[0];
        assert_eq!(
            e.timeouts.check,
            whole_seconds(good),
            "timeouts.check: {good}"
        );
    }
}

fn whole_seconds(s: &str) -> std::time::Duration {
    std::time::Duration::from_secs(s.trim_end_matches('s').parse().unwrap())
}

// finding: L20
#[test]
fn sizes_out_of_bounds_or_overflowing_are_rejected() {
    // 2^64 / 2^30 GiB overflows bytes: reported, not wrapped
    only_error(
        &with("      diskGiB: 100", "      diskGiB: 18446744073709551615"),
        "providers[0].limits.diskGiB",
        "overflows",
    );
    only_error(
        &with("      diskGiB: 100", "      diskGiB: 65537"),
        "providers[0].limits.diskGiB",
        "65537",
    );
    only_error(
        &with("      memoryMiB: 8192", "      memoryMiB: 64"),
        "providers[0].limits.memoryMiB",
        "64 is out of range 128..=",
    );
    only_error(
        &with("      vcpus: 8", "      vcpus: 0"),
        "providers[0].limits.vcpus",
        "0 is out of range 1..=1024",
    );
    // defaults above the limits
    only_error(
        &with("      diskGiB: 10\n", "      diskGiB: 101\n"),
        "providers[0].defaults.diskGiB",
        "101 is out of range 1..=100",
    );
    only_error(
        &with("      vcpus: 1", "      vcpus: 9"),
        "providers[0].defaults.vcpus",
        "1..=8",
    );
    only_error(
        &with("poolReserveGiB: 5", "poolReserveGiB: 18446744073709551615"),
        "providers[0].hosts[0].poolReserveGiB",
        "64 bits",
    );
}

#[test]
fn entry_and_host_names_must_be_safe_unique_identifiers() {
    only_error(
        &with("  - name: home", "  - name: Home"),
        "providers[0].name",
        "\"Home\"",
    );
    only_error(
        &with("  - name: home", &format!("  - name: {}", "a".repeat(33))),
        "providers[0].name",
        "1 to 32",
    );
    only_error(
        &with("      - name: local", "      - name: 1local"),
        "providers[0].hosts[0].name",
        "starting with a letter",
    );
    let two_hosts = with(
        "        maxConcurrent: 4",
        "        maxConcurrent: 4\n      - name: local\n        address: 127.0.0.2\n        network: default\n        sshKeyFile: /k\n        knownHostsFile: /kh",
    );
    only_error(
        &two_hosts,
        "providers[0].hosts[1].name",
        "already the name of providers[0].hosts[0]",
    );
    // a second entry named like the first
    let second = "  - name: home\n    type: libvirt\n    hosts:\n      - name: b\n        address: 10.0.0.1\n        network: default\n        sshKeyFile: /k\n        knownHostsFile: /kh\n";
    only_error(
        &format!("{EXAMPLE}{second}"),
        "providers[1].name",
        "already the name of providers[0]",
    );
}

#[test]
fn ssh_key_and_known_hosts_files_are_required_and_absolute() {
    only_error(
        &with("        sshKeyFile: /root/.ssh/id_ed25519\n", ""),
        "providers[0].hosts[0].sshKeyFile",
        "missing",
    );
    only_error(
        &with(
            "knownHostsFile: /root/.ssh/known_hosts",
            "knownHostsFile: known_hosts",
        ),
        "providers[0].hosts[0].knownHostsFile",
        "relative",
    );
}

#[test]
fn other_host_fields_are_checked() {
    only_error(
        &with("user: root", "user: \"-oProxyCommand=x\""),
        "providers[0].hosts[0].user",
        "user name",
    );
    only_error(
        &with("socket: /run/libvirt/libvirt-sock", "socket: run/sock"),
        "providers[0].hosts[0].socket",
        "absolute",
    );
    only_error(
        &with("maxConcurrent: 4", "maxConcurrent: 0"),
        "providers[0].hosts[0].maxConcurrent",
        "1..=64",
    );
}

#[test]
fn url_images_need_allowed_hosts_when_enabled_and_max_image_bytes_is_positive() {
    only_error(
        &with("enabled: false", "enabled: true"),
        "providers[0].urlImages.allowedHosts",
        "empty",
    );
    ok(&with(
        "enabled: false",
        "enabled: true\n      allowedHosts: [cloud.debian.org]",
    ));
    only_error(
        &with(
            "enabled: false",
            "enabled: true\n      allowedHosts: [\"https://x.org/\"]",
        ),
        "providers[0].urlImages.allowedHosts[0]",
        "host name",
    );
    // host:port entries (the port is part of the allowlist).
    ok(&with(
        "enabled: false",
        "enabled: true\n      allowedHosts: [\"cloud.debian.org:8443\", \"[2001:db8::1]:443\", \"[2001:db8::2]\", \"192.0.2.1:80\"]",
    ));
    for bad in [
        "x.org:0",
        "x.org:99999",
        "x.org:",
        "fd00::1",
        "[fd00::1",
        "[x.org]:443",
    ] {
        only_error(
            &with(
                "enabled: false",
                &format!("enabled: true\n      allowedHosts: [\"{bad}\"]"),
            ),
            "providers[0].urlImages.allowedHosts[0]",
            "host:port",
        );
    }
    only_error(
        &with("maxImageBytes: 8589934592", "maxImageBytes: 0"),
        "providers[0].maxImageBytes",
        "0",
    );
}

#[test]
fn an_empty_provider_list_or_host_list_is_rejected() {
    only_error("providers: []\n", "providers", "empty");
    only_error(
        "providers:\n- name: home\n  type: libvirt\n  hosts: []\n",
        "providers[0].hosts",
        "empty",
    );
}

// finding: M16, M17, L12, L13, L17, L20, L24, L8
#[test]
fn every_error_of_a_broken_file_is_reported_together_in_file_order() {
    let mut t = with("address: 127.0.0.1:22", "address: \"::1\"");
    t = edit(&t, "pool: default", "pool: a/b");
    t = edit(
        &t,
        "        sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
        "",
    );
    t = edit(&t, "url: https://cloud", "url: https://u:pw@cloud");
    t = edit(&t, "      debian-12:", "      url-debian:");
    t = edit(&t, "        #cloud-config\n", "");
    t = edit(&t, "      call: 60", "      call: 5");
    t = edit(&t, "      vcpus: 8", "      vcpus: 0");
    let e = errs(&t);
    assert_eq!(
        paths(&e),
        [
            "providers[0].hosts[0].address",
            "providers[0].hosts[0].pool",
            "providers[0].images.alpine.sha256",
            "providers[0].images.url-debian",
            "providers[0].images.url-debian.url",
            "providers[0].guest.vendorData",
            "providers[0].timeouts.call",
            "providers[0].limits.vcpus",
        ],
        "{e}"
    );
    let shown = e.to_string();
    assert_eq!(shown.lines().count(), 1 + e.errors.len(), "{shown}");
    assert!(
        shown.starts_with("provider config test.yaml: 8 errors"),
        "{shown}"
    );
    assert!(
        shown.contains("\n  error: providers[0].hosts[0].address: "),
        "{shown}"
    );
    assert!(!shown.contains("pw@"), "{shown}");
}

#[test]
fn two_entries_on_the_same_address_socket_and_pool_are_a_warning() {
    // seed H4: two entries sharing one pool on one host
    let second = "  - name: work\n    type: libvirt\n    hosts:\n      - name: same\n        address: 127.0.0.1\n        network: default\n        sshKeyFile: /k\n        knownHostsFile: /kh\n";
    let c = ok(&format!("{EXAMPLE}{second}"));
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(c.warnings[0].path, "providers[1].hosts[0]");
    assert!(
        c.warnings[0].message.contains("providers[0].hosts[0]"),
        "{}",
        c.warnings[0]
    );
    // a different pool: no warning
    let other = second.replace(
        "knownHostsFile: /kh",
        "knownHostsFile: /kh\n        pool: work",
    );
    assert!(ok(&format!("{EXAMPLE}{other}")).warnings.is_empty());
}

#[test]
fn two_hosts_of_one_entry_on_the_same_address_socket_and_pool_are_an_error_naming_both() {
    let twin = "      - name: twin\n        address: 127.0.0.1\n        network: default\n        sshKeyFile: /k\n        knownHostsFile: /kh\n";
    let text = EXAMPLE.replacen("    hosts:\n", &format!("    hosts:\n{twin}"), 1);
    let e = errs(&text);
    assert_eq!(paths(&e), ["providers[0].hosts[1].address"], "{e}");
    assert!(
        e.errors[0]
            .message
            .contains("providers[0].hosts[0].address"),
        "{e}"
    );
    // Another pool on the same daemon is fine.
    let other = twin.replace("network: default", "network: default\n        pool: other");
    ok(&EXAMPLE.replacen("    hosts:\n", &format!("    hosts:\n{other}"), 1));
}

#[test]
fn warnings_are_reported_alongside_errors() {
    let t = edit(
        &with("        network: default\n", ""),
        "pool: default",
        "pool: a/b",
    );
    let e = errs(&t);
    assert_eq!(e.warnings.len(), 1);
    assert!(
        e.to_string()
            .contains("\n  warning: providers[0].hosts[0]: neither"),
        "{e}"
    );
}

#[test]
fn yaml_and_shape_errors_carry_line_and_column() {
    let text = with(
        "        maxConcurrent: 4",
        "        maxConcurrent: 4\n        bogus: 1",
    );
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with("bogus:"))
        .unwrap()
        + 1;
    let e = errs(&text);
    assert_eq!(e.errors.len(), 1);
    let m = &e.errors[0].message;
    assert!(
        m.contains("unknown field `bogus`") && m.contains(&format!("line {line} column 9")),
        "{m}"
    );
    let e = errs(&with("    type: libvirt", "    type: xen"));
    assert!(e.errors[0].message.contains("unknown variant `xen`"), "{e}");
    let e = errs(&with(
        "    type: libvirt            # the only type today\n",
        "",
    ));
    assert!(e.errors[0].message.contains("missing field `type`"), "{e}");
    let e = errs("providers:\n  - name: [unclosed\n");
    assert!(e.errors[0].message.contains("line "), "{e}");
}

#[test]
fn a_type_error_is_reported_with_its_field_path_alongside_every_other_error() {
    let text = edit(
        &edit(
            &with("      diskGiB: 10\n", "      diskGiB: -1\n"),
            "  - name: home",
            "  - name: a/b",
        ),
        "        maxConcurrent: 4",
        "        maxConcurrent: many\n        bogus: 1",
    );
    let e = errs(&text);
    assert_eq!(
        paths(&e),
        [
            "providers[0].hosts[0].maxConcurrent",
            "providers[0].hosts[0].bogus",
            "providers[0].defaults.diskGiB",
            "providers[0].name",
        ],
        "{e}"
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with("provider config test.yaml: 4 errors"),
        "{shown}"
    );
    assert!(
        shown.contains("providers[0].defaults.diskGiB: invalid value: integer `-1`"),
        "{shown}"
    );
    assert!(shown.contains("providers[0].name: \"a/b\""), "{shown}");
    assert!(!shown.contains("<input>"), "{shown}");
}

#[test]
fn loading_a_config_never_contacts_its_hosts() {
    // A listener stands in for the host's sshd: neither a broken nor a valid config dials it.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let valid = with(
        "address: 127.0.0.1:22",
        &format!("address: 127.0.0.1:{port}"),
    );
    for (name, text) in [
        ("broken.yaml", edit(&valid, "pool: default", "pool: a/b")),
        ("valid.yaml", valid.clone()),
    ] {
        let p = dir.path().join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let _ = load(&p);
    }
    assert!(load(&dir.path().join("broken.yaml")).is_err());
    assert!(load(&dir.path().join("valid.yaml")).is_ok());
    match l.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("something connected to the host's address: {other:?}"),
    }
}

#[test]
fn an_unreadable_file_is_one_error_naming_the_path() {
    let e = load(Path::new("/nonexistent/providers.yaml")).unwrap_err();
    assert_eq!(e.errors.len(), 1);
    assert!(e.to_string().contains("/nonexistent/providers.yaml"), "{e}");
}

#[test]
fn a_local_host_needs_no_ssh_files_but_a_remote_one_does() {
    let local = "providers:\n  - name: home\n    type: libvirt\n    hosts:\n      - name: h1\n        address: local\n        pool: p\n";
    ok(local);
    let e = errs(&local.replace("address: local", "address: 10.0.0.1"));
    assert_eq!(
        paths(&e),
        [
            "providers[0].hosts[0].sshKeyFile",
            "providers[0].hosts[0].knownHostsFile"
        ]
    );
}

#[test]
fn client_prefix_minimums_are_accepted_exactly_within_their_family_bounds() {
    // A minimum of /0 would let a Proxy admit every client of the family (`::/0`); above the
    // family's length no client network could pass. Probed on both sides of each bound.
    let base = "providers:\n- name: home\n  type: libvirt\n  hosts:\n  - name: a\n    address: \
                h.example.org\n    network: default\n    sshKeyFile: /k\n    knownHostsFile: \
                /kh\n  policy:\n";
    for (field, family, value, valid) in [
        ("minClientPrefixV4", "IPv4", 0, false),
        ("minClientPrefixV4", "IPv4", 1, true),
        ("minClientPrefixV4", "IPv4", 32, true),
        ("minClientPrefixV4", "IPv4", 33, false),
        ("minClientPrefixV6", "IPv6", 0, false),
        ("minClientPrefixV6", "IPv6", 1, true),
        ("minClientPrefixV6", "IPv6", 128, true),
        ("minClientPrefixV6", "IPv6", 129, false),
    ] {
        let text = format!("{base}    {field}: {value}\n");
        match (parse(&text, "test.yaml"), valid) {
            (Ok(c), true) => {
                let ProviderEntry::Libvirt(e) = &c.providers[0];
                let got = if family == "IPv4" {
                    e.policy.min_client_prefix_v4
                } else {
                    e.policy.min_client_prefix_v6
                };
                assert_eq!(got, value, "{field}: {value}");
            }
            (Err(_), false) => {
                let e = only_error(&text, &format!("providers[0].policy.{field}"), family);
                assert!(e.message.contains(&value.to_string()), "{field}: {e}");
            }
            (Ok(_), false) => panic!("{field}: {value} must be refused, the config validated"),
            (Err(e), true) => panic!("{field}: {value} must be accepted:\n{e}"),
        }
    }
}

#[test]
fn a_hosts_maintenance_defaults_to_none_takes_cordon_or_drain_and_refuses_anything_else() {
    use egress_provider::libvirt::config::Maintenance;
    let ProviderEntry::Libvirt(e) = &ok(EXAMPLE).providers[0];
    assert!(e.hosts.iter().all(|h| h.maintenance == Maintenance::None));
    for (v, m) in [
        ("Cordon", Maintenance::Cordon),
        ("Drain", Maintenance::Drain),
        ("None", Maintenance::None),
    ] {
        let text = with(
            "        maxConcurrent: 4",
            &format!("        maxConcurrent: 4\n        maintenance: {v}"),
        );
        let ProviderEntry::Libvirt(e) = &ok(&text).providers[0];
        assert_eq!(e.hosts[0].maintenance, m);
    }
    let e = only_error(
        &with(
            "        maxConcurrent: 4",
            "        maxConcurrent: 4\n        maintenance: Sometimes",
        ),
        "providers[0].hosts[0].maintenance",
        "Sometimes",
    );
    assert!(
        e.message.contains("Cordon") && e.message.contains("Drain"),
        "{e:?}"
    );
}
