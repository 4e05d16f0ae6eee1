//! `egress-proxies version`: what was built, from which commit, speaking which protocol.
//!
//! Guarantees: no network, no file read; the output is stable lines of `key: value` after
//! the first line, so scripts can grep them; under `-o json|yaml` one document instead.

use libvirt_remote::proto::{REMOTE_PROGRAM, REMOTE_VERSION};

/// Build-time environment variable carrying the git commit: set by `build.rs` from
/// `git rev-parse --short=12 HEAD`, or by a packager building without a checkout
/// (`EGRESS_PROXIES_GIT_COMMIT=... cargo build`), which takes precedence.
pub const GIT_COMMIT_ENV: &str = "EGRESS_PROXIES_GIT_COMMIT";

/// The text `version` prints.
pub fn text() -> String {
    let commit = option_env!("EGRESS_PROXIES_GIT_COMMIT").map_or_else(
        || format!("unknown (built without git; set {GIT_COMMIT_ENV} at build time)"),
        str::to_owned,
    );
    format!(
        "egress-proxies {version}\n\
         commit: {commit}\n\
         libvirt protocol: remote program {REMOTE_PROGRAM:#x} version {REMOTE_VERSION} \
         (libvirtd's own RPC; pure Rust client, no libvirt C library needed)\n\
         transport: SSH with stream-local forwarding to the host's libvirt socket \
         (or the local unix socket for address `local`)\n",
        version = env!("CARGO_PKG_VERSION"),
    )
}

/// What `version -o json|yaml` prints.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionDocument {
    /// The package version.
    pub version: &'static str,
    /// The git commit the binary was built from, or `unknown`.
    pub commit: &'static str,
    /// libvirt's remote program number, in hex.
    pub libvirt_program: String,
    /// libvirt's remote protocol version.
    pub libvirt_protocol_version: u32,
}

/// The [`VersionDocument`] of this build.
pub fn document() -> VersionDocument {
    VersionDocument {
        version: env!("CARGO_PKG_VERSION"),
        commit: option_env!("EGRESS_PROXIES_GIT_COMMIT").unwrap_or("unknown"),
        libvirt_program: format!("{REMOTE_PROGRAM:#x}"),
        libvirt_protocol_version: REMOTE_VERSION,
    }
}

/// Prints [`text`] (or under `-o json|yaml` the [`document`]) to stdout; always succeeds.
pub fn run() -> u8 {
    let f = super::output::format(false);
    match super::output::document(&document(), f) {
        Ok(Some(doc)) => println!("{doc}"),
        _ => print!("{}", text()),
    }
    super::EXIT_OK
}
