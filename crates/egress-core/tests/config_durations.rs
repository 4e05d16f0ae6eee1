//! The provider config file's durations: whole seconds as before, or `30s` / `5m` / `1h30m`
//! as on the command line, read through the real loader (YAML, lenient reader, validation).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use egress_core::config::{self, ProviderEntry};

fn yaml(timeouts: &str) -> String {
    format!(
        "providers:\n  - name: e1\n    type: libvirt\n    hosts:\n      - name: h1\n        \
         address: local\n        network: default\n    timeouts: {timeouts}\n"
    )
}

#[test]
fn timeouts_in_the_config_file_accept_duration_strings_and_whole_seconds() {
    let cfg = config::parse(
        &yaml("{dial: 15s, call: 2m, imageImport: 1h30m, start: 180}"),
        "providers.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ProviderEntry::Libvirt(e) = &cfg.providers[0];
    assert_eq!(e.timeouts.dial, Duration::from_secs(15));
    assert_eq!(e.timeouts.call, Duration::from_secs(120));
    assert_eq!(e.timeouts.image_import, Duration::from_secs(5400));
    assert_eq!(e.timeouts.start, Duration::from_secs(180));
}

#[test]
fn a_timeout_with_an_unknown_unit_is_an_error_naming_its_field() {
    let err = config::parse(&yaml("{dial: 10x}"), "providers.yaml")
        .expect_err("10x accepted")
        .to_string();
    assert!(err.contains("timeouts.dial"), "{err}");
    assert!(err.contains("\"30s\""), "says what is accepted: {err}");
}
