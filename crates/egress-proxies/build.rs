//! Build script: records the git commit the binary is built from, for `egress-proxies version`.
//!
//! Guarantees: never fails the build. `EGRESS_PROXIES_GIT_COMMIT` set in the environment
//! wins (packagers building from a tarball set it); otherwise `git rev-parse --short HEAD` is
//! asked; when git is absent or this is not a checkout, nothing is set and `version` says
//! the commit is unknown. Reruns only when that variable or the checked-out commit changes.

use std::process::Command;

const ENV: &str = "EGRESS_PROXIES_GIT_COMMIT";

/// `git ARGS` in the crate's directory, trimmed stdout, or `None` on any failure.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed={ENV}");
    if std::env::var_os(ENV).is_some() {
        return; // Passed through to option_env! as it is.
    }
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // HEAD moves on checkout; the branch's ref file (or packed-refs) moves on commit.
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/packed-refs");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{r}");
        }
    }
    if let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) {
        println!("cargo:rustc-env={ENV}={commit}");
    }
}
