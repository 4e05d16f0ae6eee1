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
use egress_core::pool::credentials::{DIGEST_KEY_LEN, generate, to_file_line};

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
    /// The installation's digest key file exists but is not [`DIGEST_KEY_LEN`] bytes.
    #[error(
        "the digest key file {path} is not {DIGEST_KEY_LEN} bytes; delete it to make a new \
         one (the members of pools with chosen credentials are then replaced)"
    )]
    InvalidKey {
        /// The file.
        path: PathBuf,
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

/// The installation's digest key file in the manifest directory: [`DIGEST_KEY_LEN`] random
/// bytes that key the digest of chosen pool passwords in members' template hash
/// ([`keyed_digest`](egress_core::pool::credentials::keyed_digest)).
pub const DIGEST_KEY_FILE: &str = ".egress-proxies.digest-key";

/// The installation's digest key in manifest directory `dir`: read when the file exists,
/// else drawn from `/dev/urandom` and written to a new file (`O_EXCL`, mode 0600, never
/// through a symbolic link; two processes racing: the first one's key wins). A file that is
/// not a regular file of exactly [`DIGEST_KEY_LEN`] bytes is an error naming it.
pub fn ensure_digest_key(dir: &Path) -> Result<[u8; DIGEST_KEY_LEN], CredentialsFileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(DIGEST_KEY_FILE);
    let io = |source| CredentialsFileError::Io {
        path: path.clone(),
        source,
    };
    let read = || match crate::manifests::read_regular_bounded(&path, DIGEST_KEY_LEN as u64, false)
    {
        Ok(b) => <[u8; DIGEST_KEY_LEN]>::try_from(b.as_slice())
            .map(Some)
            .map_err(|_| CredentialsFileError::InvalidKey { path: path.clone() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(CredentialsFileError::InvalidKey { path: path.clone() })
        }
        Err(e) => Err(io(e)),
    };
    if let Some(k) = read()? {
        return Ok(k);
    }
    let mut key = [0u8; DIGEST_KEY_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut key))
        .map_err(io)?;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    match created {
        Ok(mut f) => {
            f.write_all(&key).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read()?.ok_or(CredentialsFileError::InvalidKey { path: path.clone() })
        }
        Err(e) => Err(io(e)),
    }
}

/// Where pool `namespace/pool`'s credentials live in manifest directory `dir`.
pub fn credentials_path(dir: &Path, namespace: &str, pool: &str) -> PathBuf {
    dir.join(format!("{namespace}.{pool}{CREDENTIALS_SUFFIX}"))
}

/// The credentials in `path`; `None` when the file does not exist. Anything but a regular
/// file there (a FIFO, a socket, a device, a directory) is an error naming it, found without
/// blocking: a FIFO with no writer never hangs the pool's round.
pub fn read(path: &Path) -> Result<Option<ProxyCredentials>, CredentialsFileError> {
    let invalid = || CredentialsFileError::Invalid {
        path: path.to_owned(),
    };
    let bytes = match crate::manifests::read_regular_bounded(path, MAX_FILE_BYTES, true) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // Over MAX_FILE_BYTES.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(invalid()),
        Err(source) => {
            return Err(CredentialsFileError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
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

#[cfg(test)]
mod fifo_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_fifo_or_directory_at_the_credentials_path_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let path = credentials_path(dir.path(), "default", "web");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&path)
                .status()
                .unwrap()
                .success()
        );
        // In a thread with a deadline: a reader that opens the FIFO blocks until a writer
        // comes, which would hang the pool's round for good.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send(ensure(&p, "web").map(|_| ()).map_err(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO credentials file hung")
            .unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(e.contains("default.web.credentials"), "{e}");
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_fifo()
        );

        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = ensure(&path, "web").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}

#[cfg(test)]
mod key_tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_digest_key_is_made_once_0600_reused_and_a_bad_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let k = ensure_digest_key(dir.path()).unwrap();
        assert_ne!(k, [0u8; DIGEST_KEY_LEN]);
        let path = dir.path().join(DIGEST_KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            ensure_digest_key(dir.path()).unwrap(),
            k,
            "a restart reads it back"
        );
        std::fs::write(&path, b"short").unwrap();
        let e = ensure_digest_key(dir.path()).unwrap_err();
        assert!(matches!(e, CredentialsFileError::InvalidKey { .. }), "{e}");
        // Another directory (installation) gets another key.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(ensure_digest_key(other.path()).unwrap(), k);
        // A planted link is not followed.
        let third = tempfile::tempdir().unwrap();
        let decoy = third.path().join("decoy");
        std::os::unix::fs::symlink(&decoy, third.path().join(DIGEST_KEY_FILE)).unwrap();
        assert!(ensure_digest_key(third.path()).is_err());
        assert!(!decoy.exists());
    }
}
