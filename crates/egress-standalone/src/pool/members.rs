//! A pool's members as the standalone driver records them: the member file beside the
//! manifests (`.NAMESPACE.NAME.pool-members.json`, [`state_path`]) that survives restarts,
//! the quarantine file (`NAMESPACE.NAME.quarantine`, [`quarantine_path`]), each member's
//! derived UID ([`member_uid`]) and object ([`member_object`]), and every pool as this
//! process runs it ([`Pools`]).
//!
//! Guarantees: the member file is written atomically (a temporary file created exclusively,
//! never through a symbolic link, fsync, rename: [`write_atomic`]); a member file that cannot
//! be read counts as empty, bounded to [`MAX_STATE_BYTES`], and never blocks on a FIFO (the
//! quarantine file is read the same way by [`crate::quarantine::read_quarantine`], bounded to
//! [`MAX_QUARANTINE_BYTES`]); a member's UID
//! is a pure function of the pool and its name, so a restart finds its instance.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use egress_core::controller::{ProxyCredentials, ProxyObject};
use egress_core::model::{Phase, ProxyStatus, condition};
use egress_core::pool::member::member_spec;
use egress_core::pool::{MemberMeta, ProxyPoolStatus};
use egress_provider::ProxyUid;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::manifests::{LoadedPool, UID_NAMESPACE};
use crate::pool::credentials::CREDENTIALS_SUFFIX;
use crate::store::MemberRec;

/// The suffix of a pool's quarantine file beside its manifest: `NAMESPACE.NAME.quarantine`
/// (namespaced like the credentials file: two pools of one name never share it).
pub const QUARANTINE_SUFFIX: &str = ".quarantine";
/// Largest quarantine file read.
pub(crate) const MAX_QUARANTINE_BYTES: u64 = 1 << 20;
/// Largest member file read.
// NB: a member record is ~250 bytes of JSON; 64 MiB is far beyond the largest pool a quota
// admits, and bounds what a corrupted or hostile file can make the process hold.
pub(crate) const MAX_STATE_BYTES: u64 = 64 << 20;
/// The UID of member `member` of pool `namespace/pool`: UUIDv5 of `pool:NS/POOL/MEMBER` under
/// [`UID_NAMESPACE`] (never equal to a manifest Proxy's UID, which has no `pool:` prefix).
pub fn member_uid(namespace: &str, pool: &str, member: &str) -> ProxyUid {
    ProxyUid(Uuid::new_v5(
        &UID_NAMESPACE,
        format!("pool:{namespace}/{pool}/{member}").as_bytes(),
    ))
}

/// Where pool `namespace/name`'s quarantine file is read from in manifest directory `dir`.
pub fn quarantine_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(format!("{namespace}.{name}{QUARANTINE_SUFFIX}"))
}

/// Where pool `namespace/name`'s member list is kept in manifest directory `dir`.
pub fn state_path(dir: &Path, namespace: &str, name: &str) -> PathBuf {
    dir.join(format!(".{namespace}.{name}.pool-members.json"))
}

/// The member file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StateFile {
    pub(crate) members: Vec<MemberRec>,
    #[serde(default)]
    pub(crate) status: ProxyPoolStatus,
}

impl MemberRec {
    /// What the pool decision needs of this member besides its status.
    pub(crate) fn meta(&self, quarantine: Option<String>, deleting: bool) -> MemberMeta {
        MemberMeta {
            name: self.name.clone(),
            host: Some(self.host.clone()),
            template_hash: self.template_hash.clone(),
            created: parse_time(&self.created),
            quarantine,
            deleting,
            drain: self.drain.clone(),
        }
    }
}

impl StateFile {
    /// The member file at `path`; empty when it is missing, is not a regular file (a FIFO
    /// never blocks the read, a symbolic link is not followed), is over
    /// [`MAX_STATE_BYTES`] or does not parse.
    pub(crate) fn read(path: &Path) -> Self {
        crate::manifests::read_regular_bounded(path, MAX_STATE_BYTES, false)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes the member file to `path` atomically.
    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        write_atomic(path, &serde_json::to_vec_pretty(self).unwrap_or_default())
    }
}

pub(crate) fn now_text(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

pub(crate) fn parse_time(t: &str) -> SystemTime {
    humantime::parse_rfc3339_weak(t).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Writes `path` atomically: a new temporary file `PATH.tmp`, fsync, rename. The temporary
/// file is created exclusively (`O_CREAT|O_EXCL`, mode 0600, `O_NOFOLLOW`), so whatever sits
/// at its path is never written through: a regular file left by a crash is removed first;
/// anything else there (a symbolic link someone planted, pointing at a file of their choice;
/// a FIFO; a directory) is refused with an error naming it and left alone, and a link planted
/// between the removal and the create makes the create fail, never write through it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.file_type().is_file() => std::fs::remove_file(&tmp)?,
        Ok(m) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} is a {} where the operator writes its temporary file; remove it \
                     (it is never written through)",
                    tmp.display(),
                    if m.file_type().is_symlink() {
                        "symbolic link"
                    } else {
                        "non-regular file"
                    }
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The state of a member's status that its pool cares about (a change re-decides the pool):
/// phase, readiness, health, listing.
pub(crate) fn pool_view(s: &ProxyStatus) -> (Phase, bool, Option<bool>, bool) {
    let is_true = |type_: &str| {
        s.condition(type_)
            .is_some_and(|c| c.status == egress_core::model::ConditionStatus::True)
    };
    (
        s.phase,
        is_true(condition::READY),
        s.health.as_ref().and_then(|h| h.healthy),
        is_true(condition::LISTED),
    )
}

/// A member's object: the template pinned to its host, with the pool's credentials; the
/// member it replaces (`rec.replaces`) is vouched for only when `is_member` says it is still a
/// member of this pool (this pool's member file: same pool, same namespace).
pub(crate) fn member_object(
    p: &LoadedPool,
    rec: &MemberRec,
    uid: ProxyUid,
    creds: Option<&ProxyCredentials>,
    is_member: &dyn Fn(&str) -> bool,
) -> ProxyObject {
    let replaces = rec
        .replaces
        .as_deref()
        .filter(|r| *r != rec.name && is_member(r))
        .map(|r| member_uid(&p.namespace, &p.name, r));
    let reference = if p.policy.generate_credentials {
        Some(format!("{}{}", p.name, CREDENTIALS_SUFFIX))
    } else {
        None
    };
    ProxyObject {
        namespace: p.namespace.clone(),
        name: rec.name.clone(),
        uid,
        generation: 1,
        spec: std::sync::Arc::new(member_spec(
            &p.spec.template.spec,
            &rec.host,
            &rec.pin,
            reference.as_deref(),
        )),
        deleting: false,
        credentials: creds.cloned(),
        namespace_labels: None,
        replaces,
    }
}

#[cfg(test)]
#[path = "members_tests.rs"]
mod tests;
