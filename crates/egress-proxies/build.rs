//! Build script: records the git commit the binary is built from, for `egress-proxies version`.
//!
//! Guarantees: never fails the build. `EGRESS_PROXIES_GIT_COMMIT` set in the environment
//! wins (packagers building from a tarball set it); otherwise `git rev-parse --short HEAD` is
//! asked, and when it cannot be run the checkout's `.git` files are read directly; when this
//! is not a checkout, nothing is set and `version` says the commit is unknown. Reruns only when that variable or the checked-out commit changes.

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

/// The checkout's git directory found without git: `.git` in the crate's directory or one of
/// its parents (a directory; worktrees' `.git` files are left to git).
fn git_dir_by_hand() -> Option<std::path::PathBuf> {
    let start = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    start
        .ancestors()
        .map(|d| d.join(".git"))
        .find(|g| g.join("HEAD").is_file())
}

/// The commit HEAD names, read from the files git keeps (`HEAD`, the branch's ref file, or
/// `packed-refs`), shortened to 12 hex digits.
fn commit_by_hand(dir: &std::path::Path) -> Option<String> {
    let head = std::fs::read_to_string(dir.join("HEAD")).ok()?;
    let head = head.trim();
    let full = match head.strip_prefix("ref: ") {
        None => head.to_owned(),
        Some(r) => match std::fs::read_to_string(dir.join(r)) {
            Ok(h) => h.trim().to_owned(),
            Err(_) => std::fs::read_to_string(dir.join("packed-refs"))
                .ok()?
                .lines()
                .find_map(|l| l.strip_suffix(r).map(|h| h.trim().to_owned()))?,
        },
    };
    (full.len() >= 12 && full.chars().all(|c| c.is_ascii_hexdigit()))
        .then(|| full.chars().take(12).collect())
}

fn main() {
    println!("cargo:rerun-if-env-changed={ENV}");
    if std::env::var_os(ENV).is_some() {
        return; // Passed through to option_env! as it is.
    }
    // NB: the files to watch are found without git too: a first build where git could not be
    // run (not installed, refused the directory) must still be redone when the commit moves,
    // or `version` says "unknown" for good.
    let dir = git(&["rev-parse", "--absolute-git-dir"])
        .map(std::path::PathBuf::from)
        .or_else(git_dir_by_hand);
    if let Some(dir) = &dir {
        // HEAD moves on checkout; the branch's ref file (or packed-refs) moves on commit.
        println!("cargo:rerun-if-changed={}/HEAD", dir.display());
        println!("cargo:rerun-if-changed={}/packed-refs", dir.display());
        let head = std::fs::read_to_string(dir.join("HEAD")).unwrap_or_default();
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed={}/{r}", dir.display());
        }
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .or_else(|| dir.as_deref().and_then(commit_by_hand));
    if let Some(commit) = commit {
        println!("cargo:rustc-env={ENV}={commit}");
    }
}
