//! A pool's generated credentials kept as a file (standalone mode): `NAMESPACE.POOL.credentials`
//! beside the manifest (the namespace first, so two pools of one name in different namespaces
//! never share a file: a namespace has no dot, so the name cannot be read two ways), one line `username:password`, created once with mode 0600 and
//! never overwritten, so a restart reuses them and members keep their credentials.
//!
//! Guarantees: the file is created with `create_new` (two processes racing: the first one's
//! credentials win, the second reads them) and mode 0600 from the start (never readable by
//! others, not even briefly); an existing file is only read, never replaced, and one that
//! does not hold valid credentials is an error naming the file (fix or delete it: deleting it
//! generates new credentials, which replaces the members); the password is drawn from the
//! operating system's generator (`/dev/urandom`) and never appears in an error.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use egress_core::controller::ProxyCredentials;
use egress_core::pool::credentials::{generate, to_file_line};

/// The file name suffix: `NAMESPACE.POOL.credentials`.
pub const CREDENTIALS_SUFFIX: &str = ".credentials";
/// Largest credentials file read.
// NB: a user name of 32 and a password of 128 characters (the guest's limits) and a colon.
const MAX_FILE_BYTES: u64 = 256;

/// Why the credentials file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsFileError {
    /// Reading, creating or writing it failed.
    #[error("pool credentials file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It exists but does not hold one line `username:password`.
    #[error(
        "pool credentials file {path} does not hold one line username:password; fix it, or \
         delete it to generate new credentials (the pool's members are then replaced)"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
    },
}

/// Where pool `namespace/pool`'s credentials live in manifest directory `dir`.
pub fn credentials_path(dir: &Path, namespace: &str, pool: &str) -> PathBuf {
    dir.join(format!("{namespace}.{pool}{CREDENTIALS_SUFFIX}"))
}

/// The credentials in `path`; `None` when the file does not exist.
pub fn read(path: &Path) -> Result<Option<ProxyCredentials>, CredentialsFileError> {
    let io = |source| CredentialsFileError::Io {
        path: path.to_owned(),
        source,
    };
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(CredentialsFileError::Invalid {
            path: path.to_owned(),
        });
    }
    let line = text.strip_suffix('\n').unwrap_or(&text);
    match line.split_once(':') {
        Some((u, p)) if !u.is_empty() && !p.is_empty() && !line.contains('\n') => {
            Ok(Some(ProxyCredentials {
                username: u.to_owned(),
                password: p.to_owned(),
            }))
        }
        _ => Err(CredentialsFileError::Invalid {
            path: path.to_owned(),
        }),
    }
}

/// The credentials of pool `pool` in `path`: read when the file exists, else generated and
/// written to a new 0600 file. The flag says whether they were generated now.
pub fn ensure(path: &Path, pool: &str) -> Result<(ProxyCredentials, bool), CredentialsFileError> {
    let io = |source| CredentialsFileError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(c) = read(path)? {
        return Ok((c, false));
    }
    let mut random = std::fs::File::open("/dev/urandom").map_err(io)?;
    let mut failed = None;
    let creds = generate(pool, |buf| {
        if let Err(e) = random.read_exact(buf) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(io(e));
    }
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    match open.open(path) {
        Ok(mut f) => {
            f.write_all(to_file_line(&creds).as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok((creds, true))
        }
        // Another process created it first: its credentials win.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(path)?
            .map(|c| (c, false))
            .ok_or_else(|| CredentialsFileError::Invalid {
                path: path.to_owned(),
            }),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn credentials_are_generated_once_with_mode_0600_and_reused_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = credentials_path(dir.path(), "default", "web");
        assert_eq!(path.file_name().unwrap(), "default.web.credentials");
        assert_ne!(
            credentials_path(dir.path(), "team", "web"),
            credentials_path(dir.path(), "default", "web"),
            "one pool name in two namespaces shares no file"
        );
        assert!(read(&path).unwrap().is_none());
        let (c, created) = ensure(&path, "web").unwrap();
        assert!(created);
        assert_eq!(c.username, "pool-web");
        assert_eq!(
            c.password.len(),
            egress_core::pool::credentials::PASSWORD_LEN
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A restart reads them back.
        let (again, created) = ensure(&path, "web").unwrap();
        assert!(!created);
        assert_eq!(again, c);
        // The user's own edit is kept, never replaced.
        std::fs::write(&path, "alice:s3cr3t\n").unwrap();
        let (mine, created) = ensure(&path, "web").unwrap();
        assert!(!created);
        assert_eq!(
            (mine.username.as_str(), mine.password.as_str()),
            ("alice", "s3cr3t")
        );
        // Two pools get different passwords.
        let (other, _) = ensure(&credentials_path(dir.path(), "default", "api"), "api").unwrap();
        assert_ne!(other.password, c.password);
    }

    #[test]
    fn a_file_without_valid_credentials_is_an_error_naming_it_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = credentials_path(dir.path(), "default", "web");
        let long = format!("u:{}\n", "p".repeat(300));
        for bad in ["", "nocolon\n", ":pw\n", "user:\n", "a:b\nc:d\n", &long] {
            std::fs::write(&path, bad).unwrap();
            let e = ensure(&path, "web").unwrap_err();
            assert!(matches!(e, CredentialsFileError::Invalid { .. }), "{bad:?}");
            assert!(e.to_string().contains("default.web.credentials"));
            assert_eq!(std::fs::read_to_string(&path).unwrap(), bad, "left alone");
        }
    }
}
