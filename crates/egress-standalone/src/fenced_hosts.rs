//! Hosts an administrator declared dead (`fenced-hosts` in the manifest directory, one
//! `ENTRY HOST WHEN BY REASON` line per host, `#` comments): the edits `egress-proxies hosts
//! fence|unfence` make to it, and what the running operator does with it after each host
//! check of an entry ([`apply`]).
//!
//! Guarantees:
//! - a declaration frees what the host's instances held (the provider's
//!   [`fence_host`](egress_provider::Provider::fence_host)) only while the host's latest
//!   check found it dead (`Unreachable` or `Timeout`), and once per line per process: a
//!   line read again after the host answered never frees what its live instances hold;
//! - a host that answers a check again has its line removed by the operator (logged): its
//!   answer, not the declaration, says what it holds from then on; a declaration survives an
//!   operator restart while the host stays dead, since it is a file;
//! - the file is replaced whole (a temporary file beside it, synced, renamed over it), every
//!   other line kept as it was; a reason is one line of at most [`MAX_REASON_CHARS`]
//!   printable characters; an edit that changes nothing says so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use egress_core::host_health::{FENCE_APPLIED, FENCE_REMOVING, FENCE_WAITING, HostFence};
use egress_core::providers::ProviderHandle;
use egress_provider::HostReport;
use egress_provider::sync::lock;

/// The file's name in the manifest directory.
pub const FILE_NAME: &str = "fenced-hosts";
/// Longest reason kept.
pub const MAX_REASON_CHARS: usize = 256;
/// Largest file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where the declarations are kept for manifest directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// One declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// The provider entry.
    pub entry: String,
    /// The host.
    pub host: String,
    /// When (RFC 3339, as written).
    pub when: String,
    /// Who declared it.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// Parses the file's text; lines with fewer than three fields are skipped.
pub fn parse(text: &str) -> Vec<Declared> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.splitn(5, char::is_whitespace);
            let entry = f.next()?.to_owned();
            let host = f.next()?.to_owned();
            let when = f.next()?.to_owned();
            let by = f.next().unwrap_or("-").to_owned();
            let reason = f.next().unwrap_or("").trim().to_owned();
            Some(Declared {
                entry,
                host,
                when,
                by,
                reason,
            })
        })
        .collect()
}

/// Why an edit was refused (nothing was changed).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The reason is empty, too long, or not one printable line.
    #[error("--reason: {0}")]
    Reason(String),
    /// Reading or writing the file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        error: String,
    },
}

/// What an edit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// The host was declared dead.
    Fenced,
    /// It already was: nothing changed.
    AlreadyFenced,
    /// Its line was removed.
    Unfenced,
    /// It was not declared dead: nothing changed.
    NotFenced,
}

fn read_text(p: &Path) -> Result<String, FenceError> {
    match crate::manifests::read_regular_bounded(p, MAX_FILE_BYTES, true) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(FenceError::Io {
            path: p.display().to_string(),
            error: e.to_string(),
        }),
    }
}

fn is_line(l: &str, entry: &str, host: &str) -> bool {
    let t = l.trim();
    let mut f = t.split_whitespace();
    !t.starts_with('#') && f.next() == Some(entry) && f.next() == Some(host)
}

/// Declares `entry`'s `host` dead (`Some((when, by, reason))`) or removes its declaration
/// (`None`) in manifest directory `dir`. The caller checks that the entry has the host.
pub fn edit(
    dir: &Path,
    entry: &str,
    host: &str,
    declare: Option<(&str, &str, &str)>,
) -> Result<Edit, FenceError> {
    if let Some((_, by, reason)) = declare {
        check_text("--reason", reason)?;
        check_text("who", by)?;
    }
    let p = path(dir);
    let text = read_text(&p)?;
    let present = text.lines().any(|l| is_line(l, entry, host));
    let kept: Vec<&str> = text.lines().filter(|l| !is_line(l, entry, host)).collect();
    let (lines, what) = match declare {
        Some((when, by, reason)) => {
            if present {
                return Ok(Edit::AlreadyFenced);
            }
            let by = by.split_whitespace().collect::<Vec<_>>().join("_");
            let line = format!("{entry} {host} {when} {by} {reason}");
            let mut lines = kept;
            lines.push(&line);
            (render(&lines), Edit::Fenced)
        }
        None => {
            if !present {
                return Ok(Edit::NotFenced);
            }
            (render(&kept), Edit::Unfenced)
        }
    };
    crate::pool::members::write_atomic(&p, lines.as_bytes()).map_err(|e| FenceError::Io {
        path: p.display().to_string(),
        error: e.to_string(),
    })?;
    Ok(what)
}

fn render(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

fn check_text(what: &str, r: &str) -> Result<(), FenceError> {
    if r.trim().is_empty() {
        return Err(FenceError::Reason(format!("{what}: empty")));
    }
    let n = r.chars().count();
    if n > MAX_REASON_CHARS {
        return Err(FenceError::Reason(format!(
            "{what}: {n} characters; at most {MAX_REASON_CHARS}"
        )));
    }
    if r.chars().any(char::is_control) {
        return Err(FenceError::Reason(format!(
            "{what}: control characters (a line break, a tab): one line of text only"
        )));
    }
    Ok(())
}

/// A declaration: (entry, host, when it was written).
type DeclarationKey = (String, String, String);

/// The declarations this process has applied → (when it applied it, what that freed): each at
/// most once.
#[derive(Debug, Default)]
pub(crate) struct Applied(Mutex<HashMap<DeclarationKey, (String, Vec<String>)>>);

/// After a check of `handle`'s entry (`reports`): applies each declaration of the entry
/// whose host the check found dead and that this process has not applied yet; removes the
/// line of a host that answered the check. Failures are logged; the next check retries.
/// Returns each declared host's row state (`fenced` in `/status` and `/hosts`): `Applied`,
/// or `Waiting` with the provider's refusal; a host whose line was removed has none.
pub(crate) fn apply(
    dir: &Path,
    handle: &ProviderHandle,
    reports: &[HostReport],
    done: &Applied,
) -> HashMap<String, HostFence> {
    let entry = &handle.config.name;
    let mut rows = HashMap::new();
    let p = path(dir);
    let text = match read_text(&p) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("reading the hosts declared dead: {e}");
            return rows;
        }
    };
    for d in parse(&text).into_iter().filter(|d| &d.entry == entry) {
        let Some(r) = reports.iter().find(|r| r.host == d.host) else {
            continue;
        };
        let key = (d.entry.clone(), d.host.clone(), d.when.clone());
        let mut row = HostFence {
            reason: egress_core::model::truncate(&d.reason, MAX_REASON_CHARS),
            state: FENCE_WAITING.to_owned(),
            applied_at: None,
            freed: Vec::new(),
            message: None,
        };
        if egress_core::host_health::is_dead(Some(r.state)) {
            if let Some((at, freed)) = lock(&done.0).get(&key).cloned() {
                row.state = FENCE_APPLIED.to_owned();
                row.applied_at = Some(at);
                row.freed = freed;
                rows.insert(d.host.clone(), row);
                continue;
            }
            match handle.provider.fence_host(&d.host) {
                Ok(freed) => {
                    let freed: Vec<String> = freed.iter().map(ToString::to_string).collect();
                    let at =
                        humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
                    lock(&done.0).insert(key, (at.clone(), freed.clone()));
                    tracing::warn!(
                        entry = %d.entry,
                        host = %d.host,
                        by = %d.by,
                        reason = %d.reason,
                        ?freed,
                        "host declared dead by an administrator: what its instances held may \
                         move to other hosts of its segment"
                    );
                    row.state = FENCE_APPLIED.to_owned();
                    row.applied_at = Some(at);
                    row.freed = freed;
                }
                Err(e) => {
                    tracing::warn!(
                        entry = %d.entry,
                        host = %d.host,
                        "applying the declaration that the host is dead: {e}"
                    );
                    row.message = Some(egress_core::model::truncate(
                        &egress_provider::error::redact(&e.to_string()),
                        MAX_REASON_CHARS,
                    ));
                }
            }
            rows.insert(d.host.clone(), row);
        } else {
            // NB: it answered: its listings say what it holds; the line must not apply again.
            match edit(dir, &d.entry, &d.host, None) {
                Ok(_) => tracing::info!(
                    entry = %d.entry,
                    host = %d.host,
                    "a host declared dead answered again: its line in {FILE_NAME} is removed"
                ),
                Err(e) => {
                    tracing::warn!(
                        entry = %d.entry,
                        host = %d.host,
                        "removing the declaration of a host that answered again: {e}"
                    );
                    row.state = FENCE_REMOVING.to_owned();
                    rows.insert(d.host.clone(), row);
                }
            }
            lock(&done.0).remove(&key);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fence_and_unfence_edit_only_their_line_and_say_when_nothing_changed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            path(d.path()),
            "# kept\nseg h2 2026-01-01T00:00:00Z ops other\n",
        )
        .unwrap();
        let decl = Some(("2026-12-05T12:00:00Z", "alice", "BMC unreachable, rack off"));
        assert_eq!(edit(d.path(), "seg", "h1", decl).unwrap(), Edit::Fenced);
        assert_eq!(
            edit(d.path(), "seg", "h1", decl).unwrap(),
            Edit::AlreadyFenced
        );
        let got = parse(&std::fs::read_to_string(path(d.path())).unwrap());
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            Declared {
                entry: "seg".into(),
                host: "h1".into(),
                when: "2026-12-05T12:00:00Z".into(),
                by: "alice".into(),
                reason: "BMC unreachable, rack off".into(),
            }
        );
        assert_eq!(edit(d.path(), "seg", "h1", None).unwrap(), Edit::Unfenced);
        assert_eq!(edit(d.path(), "seg", "h1", None).unwrap(), Edit::NotFenced);
        assert_eq!(
            std::fs::read_to_string(path(d.path())).unwrap(),
            "# kept\nseg h2 2026-01-01T00:00:00Z ops other\n"
        );
        assert!(matches!(
            edit(d.path(), "seg", "h1", Some(("t", "a", "two\nlines"))),
            Err(FenceError::Reason(_))
        ));
    }
}
