//! `installation: { id }` in the provider config: read exactly, its syntax checked at the
//! field path, unknown keys refused; absent, the config carries no ID.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use egress_core::config::parse;

const EXAMPLE: &str = include_str!("../../../examples/providers.yaml");

#[test]
fn an_installation_id_in_the_config_is_read_exactly_and_absent_means_none() {
    let c = parse(EXAMPLE, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.installation, None);
    let text = format!("installation:\n  id: site-a.lab-1\n{EXAMPLE}");
    let c = parse(&text, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.installation.as_deref(), Some("site-a.lab-1"));
}

#[test]
fn an_invalid_installation_id_or_an_unknown_key_is_refused_at_its_path() {
    for bad in ["Site-A", "\"\"", "-a", "a_b", "\" a\""] {
        let text = format!("installation:\n  id: {bad}\n{EXAMPLE}");
        let e = parse(&text, "t.yaml").expect_err(bad);
        assert!(
            e.errors.iter().any(|x| x.path == "installation.id"),
            "{bad}: {e}"
        );
    }
    let text = format!("installation:\n  id: a\n  name: b\n{EXAMPLE}");
    let e = parse(&text, "t.yaml").expect_err("unknown key");
    assert!(
        e.errors.iter().any(|x| x.path.starts_with("installation")),
        "{e}"
    );
}
