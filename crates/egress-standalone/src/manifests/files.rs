//! The reads a manifest directory needs besides the manifests: credentials files
//! (`username:password`, confined to the directory and bounded), the bounded read of a
//! regular file, and the errors every manifest reader reports.
//!
//! Guarantees: a `credentialsRef` names a file inside the manifest directory only (no
//! absolute path, no `..`, no link resolving outside it: [`resolve_in_dir`]); every file is
//! read with a hard bound and only when it is a regular file (a FIFO or a device is refused
//! without blocking: [`read_regular_bounded`]); a password never reaches an error message or
//! a `Debug` output.

use std::fmt;
use std::path::{Path, PathBuf};

/// Largest credentials file (`username:password`) read.
// NB: a user name and a password fit in far less; a bound keeps a wrong path harmless.
pub const MAX_CREDENTIALS_BYTES: u64 = 4096;

/// Credentials read from a `username:password` file. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password (never logged).
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// One error in a manifest file. `Display`: `FILE[#DOC]: PATH: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file (or the directory, for a directory error).
    pub file: PathBuf,
    /// 0-based document index within the file, when the error is about one document.
    pub document: Option<usize>,
    /// Field path (`spec.proxy.port`), empty for a whole-document error.
    pub path: String,
    /// What is wrong (redacted, never a password).
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(d) = self.document {
            write!(f, " document {d}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Reads `username:password` for a manifest in `dir` from `reference` (its
/// `credentialsRef`), without ever putting the content in an error message. The reference
/// must stay inside `dir` (see [`resolve_in_dir`]); the file is read through
/// [`read_regular_bounded`].
pub(crate) fn read_credentials(dir: &Path, reference: &str) -> Result<Credentials, String> {
    let path = resolve_in_dir(dir, reference)?;
    // NB: `path` is resolved (no links left); a link put in its place since is not followed.
    let bytes = read_regular_bounded(&path, MAX_CREDENTIALS_BYTES, false)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        format!(
            "{} is not UTF-8 text; it must hold one line `username:password`",
            path.display()
        )
    })?;
    let line = text.trim_end_matches(['\n', '\r']);
    match line.split_once(':') {
        Some((u, p)) if !u.is_empty() && !p.is_empty() && !line.contains('\n') => Ok(Credentials {
            username: u.to_owned(),
            password: p.to_owned(),
        }),
        _ => Err(format!(
            "{} must hold one line `username:password` with both parts non-empty",
            path.display()
        )),
    }
}

/// The file a `credentialsRef` names, which must lie inside the manifest directory `dir`: a
/// relative path without `..` components, whose resolved location (symbolic links followed,
/// e.g. a Kubernetes-style `..data` link farm) is still inside `dir`'s resolved location.
/// An absolute path, a `..` component or a link out of the directory is refused, so a
/// manifest cannot make the operator read (and send as a proxy password) any file it can
/// read. Returns the resolved path (no links left in it).
pub fn resolve_in_dir(dir: &Path, reference: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    let rel = Path::new(reference);
    if rel.is_absolute() {
        return Err(format!(
            "{reference:?} is an absolute path; name a file in the manifest directory \
             (relative to it)"
        ));
    }
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{reference:?} leaves the manifest directory (`..`); name a file inside it"
        ));
    }
    let base = std::fs::canonicalize(dir).map_err(|e| {
        format!(
            "cannot resolve the manifest directory {}: {e}",
            dir.display()
        )
    })?;
    let joined = dir.join(rel);
    let real = std::fs::canonicalize(&joined)
        .map_err(|e| format!("cannot read {}: {e}", joined.display()))?;
    if !real.starts_with(&base) {
        return Err(format!(
            "{} resolves to {}, outside the manifest directory; credentials files must be \
             inside it",
            joined.display(),
            real.display()
        ));
    }
    Ok(real)
}

/// Reads at most `limit` bytes of the regular file `path`. The file is opened without
/// blocking (`O_NONBLOCK`: a FIFO with no writer does not hang the open), and without
/// following a final symbolic link unless `follow_link`; its type is checked on the opened descriptor (a FIFO,
/// socket, device such as `/dev/zero`, or directory is refused), and the read itself stops
/// at `limit + 1` bytes, so a file that grows after the check is still bounded.
pub fn read_regular_bounded(
    path: &Path,
    limit: u64,
    follow_link: bool,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let nofollow = if follow_link { 0 } else { libc::O_NOFOLLOW };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | nofollow)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket, device or directory is never read)",
        ));
    }
    if meta.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes; at most {limit} are read", meta.len()),
        ));
    }
    let mut out = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("more than {limit} bytes; at most {limit} are read"),
        ));
    }
    Ok(out)
}

/// A Kubernetes-style DNS label (RFC 1123): names and namespaces end up in UIDs and
/// descriptions, so they are kept to a safe alphabet.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
