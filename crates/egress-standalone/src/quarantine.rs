//! A pool's quarantine file (`NAMESPACE.NAME.quarantine` beside its manifest, one `MEMBER
//! REASON` line per quarantined member, `#` comments): its parser, which the pool loop reads
//! every round, and the edits `egress-proxies pools quarantine|release` makes to it.
//!
//! Guarantees:
//! - an edit names a member the pool has now (its member file, which the running operator
//!   keeps), else it fails naming the pool's members and changes nothing;
//! - a reason is one line of at most [`MAX_REASON_CHARS`] printable characters;
//! - the file is replaced whole (a temporary file beside it, synced, renamed over it), so
//!   the pool loop never reads half an edit; every other line (other members, comments) is
//!   kept as it was;
//! - releasing a member that is not quarantined, or quarantining one already quarantined for
//!   the same reason, changes nothing and says so.

use std::collections::BTreeMap;
use std::path::Path;

use crate::pool::members::MAX_QUARANTINE_BYTES;
use crate::pool::{quarantine_path, state_path};

/// Longest reason kept.
// NB: a reason is shown in a member's row and condition; a sentence fits in 256.
pub const MAX_REASON_CHARS: usize = 256;
/// Largest member or quarantine file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why an edit was refused (nothing was changed).
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    /// The pool has no member file in the directory.
    #[error(
        "pool {pool} has no members in {dir} (no {file}): is its manifest in this directory and \
         the operator running over it?"
    )]
    NoPool {
        /// `namespace/name`.
        pool: String,
        /// The manifest directory.
        dir: String,
        /// The member file looked for.
        file: String,
    },
    /// The member is not one of the pool's.
    #[error("pool {pool} has no member {member:?} (its members: {members})")]
    NoMember {
        /// `namespace/name`.
        pool: String,
        /// The member asked for.
        member: String,
        /// The pool's members, `, `-joined.
        members: String,
    },
    /// The reason is empty, too long, or not one printable line.
    #[error("--reason: {0}")]
    Reason(String),
    /// Reading or writing a file failed.
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
    /// The member was quarantined (or its reason changed).
    Quarantined,
    /// It already was, for that reason: nothing changed.
    AlreadyQuarantined,
    /// Its line was removed: the pool deletes it.
    Released,
    /// It was not quarantined: nothing changed.
    NotQuarantined,
}

/// Parses a quarantine file's text: member → reason (`quarantined` when the line has none).
pub fn parse(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((m, why)) => (m.to_owned(), why.trim().to_owned()),
            None => (l.to_owned(), "quarantined".to_owned()),
        })
        .collect()
}
/// Reads a quarantine file: `MEMBER REASON` per line, `#` comments ([`parse`]); a missing,
/// unreadable or non-regular file reads as empty (never blocks on a FIFO).
pub(crate) fn read_quarantine(path: &Path) -> BTreeMap<String, String> {
    let Ok(bytes) = crate::manifests::read_regular_bounded(path, MAX_QUARANTINE_BYTES, true) else {
        return BTreeMap::new();
    };
    parse(&String::from_utf8_lossy(&bytes))
}

/// The member names pool `namespace/name`'s member file in `dir` lists.
fn members(dir: &Path, namespace: &str, name: &str) -> Result<Vec<String>, QuarantineError> {
    let path = state_path(dir, namespace, name);
    let pool = format!("{namespace}/{name}");
    let bytes = match crate::manifests::read_regular_bounded(&path, MAX_FILE_BYTES, false) {
        Ok(b) => b,
        Err(_) => {
            return Err(QuarantineError::NoPool {
                pool,
                dir: dir.display().to_string(),
                file: path.display().to_string(),
            });
        }
    };
    #[derive(serde::Deserialize)]
    struct File {
        members: Vec<Rec>,
    }
    #[derive(serde::Deserialize)]
    struct Rec {
        name: String,
    }
    let f: File = serde_json::from_slice(&bytes).map_err(|e| QuarantineError::Io {
        path: path.display().to_string(),
        error: format!("not a member file: {e}"),
    })?;
    Ok(f.members.into_iter().map(|r| r.name).collect())
}

/// Quarantines member `member` of pool `namespace/name` in manifest directory `dir` for
/// `reason` (`Some`), or releases it (`None`). See the module's guarantees.
pub fn edit(
    dir: &Path,
    namespace: &str,
    name: &str,
    member: &str,
    reason: Option<&str>,
) -> Result<Edit, QuarantineError> {
    if let Some(r) = reason {
        check_reason(r)?;
    }
    let path = quarantine_path(dir, namespace, name);
    let text = match crate::manifests::read_regular_bounded(&path, MAX_FILE_BYTES, true) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(&path, &e)),
    };
    let current = parse(&text);
    // NB: a released member may already be gone from the member file (deleted since): its
    // line can still be removed.
    let known = members(dir, namespace, name)?;
    let is_member = known.iter().any(|m| m == member);
    let releasing_a_gone_one = reason.is_none() && current.contains_key(member);
    if !is_member && !releasing_a_gone_one {
        return Err(QuarantineError::NoMember {
            pool: format!("{namespace}/{name}"),
            member: member.to_owned(),
            members: if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        });
    }
    let is_line = |l: &str| {
        let t = l.trim();
        !t.starts_with('#') && t.split_whitespace().next() == Some(member)
    };
    let kept: Vec<&str> = text.lines().filter(|l| !is_line(l)).collect();
    let (lines, what) = match reason {
        Some(r) => {
            if current.get(member).map(String::as_str) == Some(r) {
                return Ok(Edit::AlreadyQuarantined);
            }
            let mut lines = kept;
            let line = format!("{member} {r}");
            lines.push(&line);
            (render(&lines), Edit::Quarantined)
        }
        None => {
            if !current.contains_key(member) {
                return Ok(Edit::NotQuarantined);
            }
            (render(&kept), Edit::Released)
        }
    };
    write_atomically(&path, &lines)?;
    Ok(what)
}

fn render(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

fn check_reason(r: &str) -> Result<(), QuarantineError> {
    if r.trim().is_empty() {
        return Err(QuarantineError::Reason("empty".into()));
    }
    let n = r.chars().count();
    if n > MAX_REASON_CHARS {
        return Err(QuarantineError::Reason(format!(
            "{n} characters; at most {MAX_REASON_CHARS}"
        )));
    }
    if r.chars().any(char::is_control) {
        return Err(QuarantineError::Reason(
            "control characters (a line break, a tab): one line of text only".into(),
        ));
    }
    Ok(())
}

fn io_err(path: &Path, e: &std::io::Error) -> QuarantineError {
    QuarantineError::Io {
        path: path.display().to_string(),
        error: e.to_string(),
    }
}

/// Replaces `path` with `text` (a temporary file beside it, synced, renamed over it).
fn write_atomically(path: &Path, text: &str) -> Result<(), QuarantineError> {
    crate::pool::members::write_atomic(path, text.as_bytes()).map_err(|e| io_err(path, &e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool_dir(members: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let recs: Vec<serde_json::Value> = members
            .iter()
            .map(|m| serde_json::json!({"name": m, "host": "h1", "templateHash": "x", "created": "2026-01-01T00:00:00Z"}))
            .collect();
        std::fs::write(
            state_path(d.path(), "default", "web"),
            serde_json::json!({ "members": recs }).to_string(),
        )
        .unwrap();
        d
    }

    fn file(d: &tempfile::TempDir) -> String {
        std::fs::read_to_string(quarantine_path(d.path(), "default", "web")).unwrap_or_default()
    }

    #[test]
    fn quarantine_and_release_edit_only_their_member_line_and_keep_the_rest() {
        let d = pool_dir(&["web-a", "web-b"]);
        std::fs::write(
            quarantine_path(d.path(), "default", "web"),
            "# kept for the audit\nweb-b slow disk\n",
        )
        .unwrap();
        let e = edit(d.path(), "default", "web", "web-a", Some("looked odd")).unwrap();
        assert_eq!(e, Edit::Quarantined);
        assert_eq!(
            file(&d),
            "# kept for the audit\nweb-b slow disk\nweb-a looked odd\n"
        );
        assert_eq!(parse(&file(&d)).get("web-a").unwrap(), "looked odd");
        let again = edit(d.path(), "default", "web", "web-a", Some("looked odd")).unwrap();
        assert_eq!(again, Edit::AlreadyQuarantined);
        let e = edit(d.path(), "default", "web", "web-a", Some("new reason")).unwrap();
        assert_eq!(e, Edit::Quarantined);
        assert_eq!(parse(&file(&d)).get("web-a").unwrap(), "new reason");
        assert_eq!(
            edit(d.path(), "default", "web", "web-a", None).unwrap(),
            Edit::Released
        );
        assert_eq!(file(&d), "# kept for the audit\nweb-b slow disk\n");
        assert_eq!(
            edit(d.path(), "default", "web", "web-a", None).unwrap(),
            Edit::NotQuarantined
        );
    }

    #[test]
    fn an_unknown_pool_member_or_bad_reason_is_refused_and_changes_nothing() {
        let d = pool_dir(&["web-a"]);
        let e = edit(d.path(), "default", "nope", "web-a", Some("x")).unwrap_err();
        assert!(matches!(e, QuarantineError::NoPool { .. }), "{e}");
        let e = edit(d.path(), "default", "web", "web-z", Some("x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pool default/web has no member \"web-z\" (its members: web-a)"
        );
        for bad in ["", "  ", "two\nlines", &"x".repeat(MAX_REASON_CHARS + 1)] {
            assert!(matches!(
                edit(d.path(), "default", "web", "web-a", Some(bad)).unwrap_err(),
                QuarantineError::Reason(_)
            ));
        }
        assert!(!quarantine_path(d.path(), "default", "web").exists());
    }

    #[test]
    fn a_member_gone_from_the_pool_can_still_be_released() {
        let d = pool_dir(&["web-a"]);
        std::fs::write(
            quarantine_path(d.path(), "default", "web"),
            "web-old broken\n",
        )
        .unwrap();
        assert_eq!(
            edit(d.path(), "default", "web", "web-old", None).unwrap(),
            Edit::Released
        );
        assert_eq!(file(&d), "");
    }
}
