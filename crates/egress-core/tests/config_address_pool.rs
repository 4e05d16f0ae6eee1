//! A host's declared egress addresses (`addressPool:`) through the config loader: a valid pool
//! loads; every violation is reported at its full field path; two hosts whose pools could hand
//! out one address are refused; a pool on a host without a NIC is refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use egress_core::config::{ConfigErrors, ProviderConfig, ProviderEntry, parse};

const EXAMPLE: &str = include_str!("../../../examples/providers.yaml");
const HOST_END: &str = "        maxConcurrent: 4    # operations at a time on this host (1..=64)\n";

/// The example with `extra` added to its host (after `maxConcurrent`).
fn with_host(extra: &str) -> String {
    assert_eq!(EXAMPLE.matches(HOST_END).count(), 1);
    EXAMPLE.replace(HOST_END, &format!("{HOST_END}{extra}"))
}

const POOL: &str = "        addressPool:
          ipv4:
            prefix: 203.0.113.0/28
            gateway: 203.0.113.1
            ranges: [203.0.113.2-203.0.113.8]
          ipv6:
            prefix: 2001:db8:1::/64
            gateway: 2001:db8:1::1
            ranges: [2001:db8:1::100/120]
          dns: [203.0.113.53]
";

fn ok(text: &str) -> ProviderConfig {
    parse(text, "test.yaml").unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"))
}

fn errs(text: &str) -> ConfigErrors {
    match parse(text, "test.yaml") {
        Ok(c) => panic!("expected errors, got a valid config: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_valid_pool_loads_and_not_setting_one_is_none() {
    let c = ok(&with_host(POOL));
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    let pool = e.hosts[0].address_pool.as_ref().unwrap();
    let parsed = pool.parse().unwrap();
    assert_eq!(parsed.ipv4.unwrap().size(), 7);
    assert_eq!(parsed.ipv6.unwrap().size(), 256);
    // Applied: no warning about the pool.
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.path.starts_with("providers[0].hosts[0].addressPool")),
        "{:?}",
        c.warnings
    );
    let c = ok(EXAMPLE);
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    assert!(e.hosts[0].address_pool.is_none());
}

#[test]
fn every_violation_is_reported_at_its_full_field_path() {
    let bad = POOL
        .replace("gateway: 203.0.113.1", "gateway: 198.51.100.1")
        .replace(
            "[203.0.113.2-203.0.113.8]",
            "[203.0.113.2-203.0.113.15, 203.0.113.20]",
        )
        .replace(
            "dns: [203.0.113.53]",
            "dns: [203.0.113.53, resolver.example]",
        );
    let e = errs(&with_host(&bad));
    let got: Vec<(&str, &str)> = e
        .errors
        .iter()
        .map(|x| (x.path.as_str(), x.message.as_str()))
        .collect();
    let paths: Vec<&str> = got.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        paths,
        [
            "providers[0].hosts[0].addressPool.ipv4.gateway",
            "providers[0].hosts[0].addressPool.ipv4.ranges[0]",
            "providers[0].hosts[0].addressPool.ipv4.ranges[1]",
            "providers[0].hosts[0].addressPool.dns[1]",
        ],
        "{e}"
    );
    assert!(got[0].1.contains("198.51.100.1"), "{e}");
    assert!(got[1].1.contains("203.0.113.15"), "{e}");
    assert!(got[3].1.contains("resolver.example"), "{e}");
}

#[test]
fn an_unknown_key_in_a_pool_is_refused_with_its_line() {
    let e = errs(&with_host(
        &POOL.replace("          dns:", "          dnss:"),
    ));
    let text = e.to_string();
    assert!(text.contains("dnss"), "{text}");
}

#[test]
fn two_hosts_whose_pools_share_an_address_are_refused_at_the_later_one() {
    let second = format!(
        "      - name: second\n        address: 127.0.0.2:22\n        network: default\n        \
         sshKeyFile: /root/.ssh/id_ed25519\n        knownHostsFile: /root/.ssh/known_hosts\n{}",
        POOL.replace("203.0.113.2-203.0.113.8", "203.0.113.8-203.0.113.12")
    );
    let e = errs(&with_host(&format!("{POOL}{second}")));
    // One error per pair of hosts, naming the first shared address found (IPv4 .8).
    assert_eq!(e.errors.len(), 1, "{e}");
    for x in &e.errors {
        assert_eq!(x.path, "providers[0].hosts[1].addressPool", "{e}");
        assert!(
            x.message.contains("providers[0].hosts[0].addressPool"),
            "{e}"
        );
    }
    assert!(e.errors[0].message.contains("203.0.113.8"), "{e}");
    // Disjoint ranges on the same prefix are fine; an overlap in IPv6 alone is refused too.
    let v6_only = second.replace("203.0.113.8-203.0.113.12", "203.0.113.9-203.0.113.12");
    let e = errs(&with_host(&format!("{POOL}{v6_only}")));
    assert!(e.errors[0].message.contains("2001:db8:1::100"), "{e}");
    let disjoint = second
        .replace("203.0.113.8-203.0.113.12", "203.0.113.9-203.0.113.12")
        .replace("2001:db8:1::100/120", "2001:db8:1::200/120");
    ok(&with_host(&format!("{POOL}{disjoint}")));
}

#[test]
fn a_pool_on_a_host_without_a_nic_is_refused() {
    let text = with_host(POOL).replace("        network: default\n", "");
    let e = errs(&text);
    assert!(
        e.errors
            .iter()
            .any(|x| x.path == "providers[0].hosts[0].addressPool"
                && x.message.contains("neither bridge nor network")),
        "{e}"
    );
}

/// A second host of the example's entry, with `extra` lines and `pool`.
fn second(extra: &str, pool: &str) -> String {
    format!(
        "      - name: second\n        address: 127.0.0.2:22\n        network: default\n        \
         sshKeyFile: /root/.ssh/id_ed25519\n        knownHostsFile: /root/.ssh/known_hosts\n\
         {extra}{pool}"
    )
}

#[test]
fn hosts_of_one_segment_share_one_identical_pool_and_a_different_one_is_refused_naming_both() {
    let seg = "        segment: rack1\n";
    let c = ok(&with_host(&format!("{seg}{POOL}{}", second(seg, POOL))));
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    assert_eq!(e.hosts[0].segment.as_deref(), Some("rack1"));
    assert_eq!(e.hosts[0].segment_key(), e.hosts[1].segment_key());
    let narrower = POOL.replace("203.0.113.2-203.0.113.8", "203.0.113.2-203.0.113.7");
    let e = errs(&with_host(&format!(
        "{seg}{POOL}{}",
        second(seg, &narrower)
    )));
    assert_eq!(e.errors.len(), 1, "{e}");
    let x = &e.errors[0];
    assert_eq!(x.path, "providers[0].hosts[1].addressPool", "{e}");
    assert!(
        x.message.contains("providers[0].hosts[0].addressPool"),
        "{e}"
    );
    assert!(x.message.contains("rack1"), "{e}");
    // One host of the segment without a pool: refused too.
    let e = errs(&with_host(&format!("{seg}{POOL}{}", second(seg, ""))));
    assert_eq!(e.errors[0].path, "providers[0].hosts[1].addressPool", "{e}");
    // A segment name is an identifier.
    let e = errs(&with_host("        segment: Rack 1\n"));
    assert_eq!(e.errors[0].path, "providers[0].hosts[0].segment", "{e}");
}

#[test]
fn a_fence_needs_a_program_and_a_timeout_within_bounds() {
    let c = ok(&with_host(
        "        fence: {command: [ipmitool, -H, bmc-h1, chassis, power, off]}\n",
    ));
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    let f = e.hosts[0].fence.as_ref().unwrap();
    assert_eq!(f.command[0], "ipmitool");
    assert_eq!(f.timeout, std::time::Duration::from_secs(30), "the default");
    let e = errs(&with_host("        fence: {command: []}\n"));
    assert_eq!(
        e.errors[0].path, "providers[0].hosts[0].fence.command",
        "{e}"
    );
    for (t, shown) in [("0", "0s"), ("11m", "660s")] {
        let e = errs(&with_host(&format!(
            "        fence: {{command: [off], timeout: {t}}}\n"
        )));
        assert_eq!(
            e.errors[0].path, "providers[0].hosts[0].fence.timeout",
            "{e}"
        );
        assert!(e.errors[0].message.contains(shown), "{e}");
    }
    let e = errs(&with_host("        fence: {command: [\" \"]}\n"));
    assert_eq!(
        e.errors[0].path, "providers[0].hosts[0].fence.command[0]",
        "{e}"
    );
}
