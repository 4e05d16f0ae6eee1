//! Debris of uploads cut short: the temporary data volume (`.part-*`) of an import whose
//! upload failed and whose deletion then failed too — typically because libvirtd itself died
//! (killed, or aborting on ENOSPC mid-upload, as libvirt 11.3 does) and could not be asked.
//! This process remembers such parts ([`note`]) and removes them once the host answers again
//! ([`clear`], run by each host check), instead of leaving them to the age-based sweep
//! (`timeouts.imageImport` + the GC's minimum age later).
//!
//! Guarantees:
//! - only a part this process created for an import that failed before publishing is ever
//!   noted: no base can name it (a part becomes a base's data only by a publish, which its
//!   import never reached), and no import of this process writes to it any more;
//! - [`clear`] still re-checks before each delete that no volume of the entry's base prefix
//!   names the part as its backing store, and forgets a part that is already gone; a part it
//!   cannot delete now (the host still failing) stays noted for the next call;
//! - the table is bounded ([`MAX_NOTED`] parts per process): past it the oldest notes are
//!   dropped and left to the age-based sweep;
//! - the lock is a std mutex held for in-memory work only, never across an `.await`.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use libvirt_remote::Client;
use libvirt_remote::proto::StoragePool;

use super::cache;
use crate::error::Result;
use crate::libvirt::classify::classify;

/// Most parts remembered at once (each a few hundred bytes).
// NB: one entry per import that died with its host; thousands would mean the process keeps
// retrying imports into a dead pool, and the age-based sweep still collects what is dropped.
pub const MAX_NOTED: usize = 1024;

/// One part to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Noted {
    host: String,
    pool: String,
    part: String,
}

fn table() -> &'static Mutex<VecDeque<Noted>> {
    static T: OnceLock<Mutex<VecDeque<Noted>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(VecDeque::new()))
}

fn lock() -> std::sync::MutexGuard<'static, VecDeque<Noted>> {
    crate::sync::lock(table())
}

/// Remembers `part` in `pool` on `host`: an upload of this process failed and the part could
/// not be deleted.
pub fn note(host: &str, pool: &str, part: &str) {
    let n = Noted {
        host: host.to_owned(),
        pool: pool.to_owned(),
        part: part.to_owned(),
    };
    let mut t = lock();
    if t.contains(&n) {
        return;
    }
    if t.len() >= MAX_NOTED {
        t.pop_front();
    }
    t.push_back(n);
    tracing::warn!(
        host,
        pool,
        part,
        "an upload's temporary volume is left on the host; it is removed once the host answers again"
    );
}

/// The parts noted for `pool` on `host`.
pub fn noted(host: &str, pool: &str) -> Vec<String> {
    lock()
        .iter()
        .filter(|n| n.host == host && n.pool == pool)
        .map(|n| n.part.clone())
        .collect()
}

fn forget(host: &str, pool: &str, part: &str) {
    lock().retain(|n| !(n.host == host && n.pool == pool && n.part == part));
}

/// Removes the parts noted for `pool` on `host` of `entry` over `client` (the host answers
/// again); returns the names removed. Nothing noted: no call at all. Fails (keeping every
/// note) only when the pool cannot be listed.
pub async fn clear(
    client: &Client,
    pool: &StoragePool,
    host: &str,
    entry: &str,
) -> Result<Vec<String>> {
    let parts = noted(host, &pool.name);
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let place = format!("in pool {} on host {host}", pool.name);
    let vols = client
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &format!("listing volumes {place}")))?;
    let referenced = cache::base_backing_paths(client, entry, &vols, &place).await?;
    let mut gone = Vec::new();
    for part in parts {
        let Some(v) = vols.iter().find(|v| v.name == part) else {
            forget(host, &pool.name, &part);
            continue;
        };
        if referenced.contains(&cache::volume_path(client, v, &place).await?) {
            // NB: cannot happen for a part noted by a failed import; never delete a base's
            // data on a guess.
            forget(host, &pool.name, &part);
            continue;
        }
        match client.vol_delete(v, 0).await {
            Ok(()) => {
                tracing::info!(host, part = %part, "removed an upload's temporary volume left by a failure");
                forget(host, &pool.name, &part);
                gone.push(part);
            }
            Err(e) if cache::is_no_vol(&e) => forget(host, &pool.name, &part),
            Err(e) => {
                tracing::warn!(host, part = %part, error = %e, "could not remove an upload's temporary volume yet");
            }
        }
    }
    Ok(gone)
}
