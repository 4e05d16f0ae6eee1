//! The core has no HTTP server and no HTML (the serving layer is `egress-web`): the normal
//! dependencies of `egress-core`, as `cargo tree -p egress-core -e normal` lists them,
//! - transitive ones included, hold no web framework, no HTML template engine and not
//!   `egress-web`, and hyper only as the HTTP client of reqwest (the provider downloads
//!   images), never with a `server` feature (of hyper or hyper-util);
//! - direct ones hold no HTTP crate at all (hyper, hyper-util, http-body-util, tower-http,
//!   reqwest): what the core probes speaks its own small protocol (`health::probe`).
//!
//! No network (`--offline`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// Crates that serve HTTP or render HTML, or that only a server needs.
const FORBIDDEN: &[&str] = &[
    "egress-web",
    "maud",
    "askama",
    "tera",
    "handlebars",
    "minijinja",
    "axum",
    "actix-web",
    "warp",
    "rocket",
    "poem",
    "salvo",
    "tide",
];

/// HTTP crates the core itself must not name (reqwest's client may bring them along).
const NOT_DIRECT: &[&str] = &[
    "hyper",
    "hyper-util",
    "http-body-util",
    "tower-http",
    "reqwest",
];

/// The lines of `cargo tree -p egress-core -e normal --prefix none` with `extra` arguments.
fn tree(extra: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "tree",
            "--manifest-path",
            manifest,
            "-p",
            "egress-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .args(extra)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_core_depends_on_no_http_server_no_html_and_no_web_framework() {
    let lines = tree(&["-e", "features"]);
    // The command saw the real graph: the provider and its HTTP client are in it.
    assert!(lines.iter().any(|l| l.starts_with("egress-provider ")));
    assert!(lines.iter().any(|l| l.starts_with("reqwest ")));
    let found: Vec<&String> = lines
        .iter()
        .filter(|l| {
            let name = l.split(' ').next().unwrap_or_default();
            FORBIDDEN.contains(&name)
        })
        .collect();
    assert!(found.is_empty(), "the core depends on {found:#?}");
    let servers: Vec<&String> = lines
        .iter()
        .filter(|l| {
            (l.starts_with("hyper feature") || l.starts_with("hyper-util feature"))
                && l.contains("\"server")
        })
        .collect();
    assert!(
        servers.is_empty(),
        "hyper as a server in the core: {servers:#?}"
    );
}

#[test]
fn the_core_names_no_http_crate_of_its_own() {
    let lines = tree(&["--depth", "1"]);
    assert!(lines.iter().any(|l| l.starts_with("egress-provider ")));
    let found: Vec<&String> = lines
        .iter()
        .skip(1)
        .filter(|l| NOT_DIRECT.contains(&l.split(' ').next().unwrap_or_default()))
        .collect();
    assert!(found.is_empty(), "the core depends directly on {found:#?}");
}
