//! The per-entry limits on cached bases (`limits.maxBases`, `limits.maxUrlImages`): their
//! defaults, and out-of-range values rejected with the exact field path.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use egress_core::config::{ConfigErrors, ProviderConfig, ProviderEntry, parse};

const EXAMPLE: &str = include_str!("../../../examples/providers.yaml");

/// The example with its `limits.vcpus` line followed by `extra`.
fn with_limits(extra: &str) -> String {
    let from = "      vcpus: 8\n";
    assert_eq!(EXAMPLE.matches(from).count(), 1);
    EXAMPLE.replace(from, &format!("{from}{extra}"))
}

fn ok(text: &str) -> ProviderConfig {
    parse(text, "test.yaml").unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"))
}

fn only_error(text: &str, path: &str, needle: &str) {
    let e: ConfigErrors = match parse(text, "test.yaml") {
        Ok(c) => panic!("expected errors, got a valid config: {c:?}"),
        Err(e) => e,
    };
    assert_eq!(e.errors.len(), 1, "expected one error, got:\n{e}");
    assert_eq!(e.errors[0].path, path, "{e}");
    assert!(
        e.errors[0].message.contains(needle),
        "{needle:?} not in {e}"
    );
}

fn limits(c: &ProviderConfig) -> (u32, u32) {
    let ProviderEntry::Libvirt(e) = &c.providers[0];
    (e.limits.max_bases, e.limits.max_url_images)
}

#[test]
fn max_bases_and_max_url_images_default_to_16_and_4_and_are_range_checked_with_their_paths() {
    assert_eq!(limits(&ok(EXAMPLE)), (16, 4));
    assert_eq!(
        limits(&ok(&with_limits(
            "      maxBases: 2\n      maxUrlImages: 0\n"
        ))),
        (2, 0)
    );
    only_error(
        &with_limits("      maxBases: 0\n      maxUrlImages: 0\n"),
        "providers[0].limits.maxBases",
        "0 is out of range 1..=1000",
    );
    only_error(
        &with_limits("      maxBases: 2\n      maxUrlImages: 3\n"),
        "providers[0].limits.maxUrlImages",
        "3 is out of range 0..=2",
    );
}
