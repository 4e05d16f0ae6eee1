//! The workspace builds rustls with exactly one crypto provider, aws-lc-rs (the root
//! Cargo.toml says why): with two compiled in and none installed, rustls panics at the first
//! TLS handshake ("Could not automatically determine the process-level CryptoProvider"),
//! which is how `kubernetes` crashed on every https:// API server. `cargo tree` over the
//! whole workspace (every member, dev-dependencies included) must never show ring.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// Longest `cargo tree` may take (offline, from Cargo.lock).
// NB: ~1 s here; another cargo holding the package cache lock can delay it for a while.
const CARGO_TREE_SECS: &str = "300";

/// `cargo tree -i PACKAGE` of the workspace: (exit success, stdout + stderr).
fn inverted_tree(package: &str, edges: &str) -> (bool, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new("timeout")
        .arg(CARGO_TREE_SECS)
        .arg(cargo)
        .args([
            "tree",
            "--offline",
            "--workspace",
            "-e",
            edges,
            "-i",
            package,
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_workspace_builds_rustls_with_aws_lc_rs_and_never_with_ring() {
    let (ok, tree) = inverted_tree("aws-lc-rs", "normal");
    assert!(
        ok && tree.contains("rustls v0.23"),
        "aws-lc-rs must back rustls:\n{tree}"
    );
    for edges in ["normal", "all"] {
        let (_, tree) = inverted_tree("ring", edges);
        assert!(
            !tree.lines().any(|l| l.starts_with("ring v")),
            "ring is built again ({edges} edges): a second rustls crypto provider\n{tree}"
        );
        assert!(
            tree.contains("nothing to print") || tree.contains("did not match any packages"),
            "unexpected `cargo tree -i ring` output:\n{tree}"
        );
    }
}
