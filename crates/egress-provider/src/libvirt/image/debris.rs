//! Debris of imports cut short, removed once the host answers again instead of waiting for
//! the age-based sweep (`timeouts.imageImport` + the GC's minimum age later):
//! - the temporary data volume (`.part-*`) of an import whose upload failed and whose
//!   deletion then failed too — typically because libvirtd itself died (killed, or aborting on
//!   ENOSPC mid-upload, as libvirt 11.3 does) and could not be asked;
//! - the final base name of an import whose publish failed after creating it (or may have
//!   created it: the reply was lost) and whose deletion failed too (the host froze or the
//!   connection closed at that moment). Left there without its marker, it would make every
//!   later import of that image on the host wait for a marker nobody writes.
//!
//! This process remembers such volumes ([`note`], [`note_base`]) and removes them once the
//! host answers ([`clear`], run by each host check).
//!
//! Guarantees:
//! - only a part this process created for an import that failed before publishing is ever
//!   noted as a part; a noted base is one this process created (or asked to create) on top of
//!   its own part, and no import of this process will mark it any more;
//! - a noted base is deleted only while it is not published (no marker, or a marker that
//!   disagrees with it, which every reader refuses) **and** its backing store is still the
//!   path of the part this process noted with it: the part's name is unique to one import, so
//!   a base of the same name published since by another import (backed by its own part) is
//!   never touched. A published one is kept with its part;
//! - [`clear`] still re-checks before each part's delete that no volume of the entry's base
//!   prefix names the part as its backing store, and forgets a volume that is already gone; a
//!   volume it cannot delete now (the host still failing) stays noted for the next call;
//! - the table is bounded ([`MAX_NOTED`] notes per process): past it the oldest notes are
//!   dropped and left to the age-based sweep;
//! - the lock is a std mutex held for in-memory work only, never across an `.await`.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use libvirt_remote::Client;
use libvirt_remote::proto::StoragePool;

use super::cache;
use crate::error::Result;
use crate::libvirt::classify::classify;

/// Most notes remembered at once (each a few hundred bytes).
// NB: one entry per import that died with its host; thousands would mean the process keeps
// retrying imports into a dead pool, and the age-based sweep still collects what is dropped.
pub const MAX_NOTED: usize = 1024;

/// A base to remove before its part.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NotedBase {
    name: String,
    /// The path of the part it was created on (its backing store if it is still ours).
    part_path: String,
}

/// One part to remove, after its base if one was noted with it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Noted {
    host: String,
    pool: String,
    part: String,
    base: Option<NotedBase>,
}

fn table() -> &'static Mutex<VecDeque<Noted>> {
    static T: OnceLock<Mutex<VecDeque<Noted>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(VecDeque::new()))
}

fn lock() -> std::sync::MutexGuard<'static, VecDeque<Noted>> {
    crate::sync::lock(table())
}

fn push(n: Noted) {
    let mut t = lock();
    if let Some(old) = t
        .iter_mut()
        .find(|o| o.host == n.host && o.pool == n.pool && o.part == n.part)
    {
        if n.base.is_some() {
            old.base = n.base;
        }
        return;
    }
    if t.len() >= MAX_NOTED {
        t.pop_front();
    }
    t.push_back(n);
}

/// Remembers `part` in `pool` on `host`: an upload of this process failed and the part could
/// not be deleted.
pub fn note(host: &str, pool: &str, part: &str) {
    push(Noted {
        host: host.to_owned(),
        pool: pool.to_owned(),
        part: part.to_owned(),
        base: None,
    });
    tracing::warn!(
        host,
        pool,
        part,
        "an upload's temporary volume is left on the host; it is removed once the host answers again"
    );
}

/// Remembers base `base` in `pool` on `host`, created (or maybe created) by this process on
/// its part `part` at `part_path`, whose publish failed before it was marked and which could
/// not be deleted; the part is removed after it.
pub fn note_base(host: &str, pool: &str, base: &str, part: &str, part_path: &str) {
    drop(UnmarkedBase::new(host, pool, base, part, part_path));
}

fn note_noted(n: Noted) {
    tracing::warn!(
        host = %n.host,
        pool = %n.pool,
        base = n.base.as_ref().map(|b| b.name.as_str()),
        part = %n.part,
        "an unpublished base (no marker) may be left on the host; it is removed once the host answers again"
    );
    push(n);
}

/// A base this process just created on its part and has not marked yet: noted as debris
/// ([`note_base`]) when dropped armed — the publish failed and could not remove it, or its
/// future was dropped in between. [`UnmarkedBase::disarm`] once it is marked or removed.
#[derive(Debug)]
pub struct UnmarkedBase {
    note: Option<Noted>,
}

impl UnmarkedBase {
    /// Armed for base `base` in `pool` on `host`, created on `part` at `part_path`.
    pub fn new(host: &str, pool: &str, base: &str, part: &str, part_path: &str) -> Self {
        Self {
            note: Some(Noted {
                host: host.to_owned(),
                pool: pool.to_owned(),
                part: part.to_owned(),
                base: Some(NotedBase {
                    name: base.to_owned(),
                    part_path: part_path.to_owned(),
                }),
            }),
        }
    }

    /// The base was marked (published) or removed: nothing to note.
    pub fn disarm(&mut self) {
        self.note = None;
    }
}

impl Drop for UnmarkedBase {
    fn drop(&mut self) {
        if let Some(n) = self.note.take() {
            note_noted(n);
        }
    }
}

/// The volumes noted for `pool` on `host`: each noted base, then each part.
pub fn noted(host: &str, pool: &str) -> Vec<String> {
    let t = lock();
    let mine = || t.iter().filter(|n| n.host == host && n.pool == pool);
    mine()
        .filter_map(|n| n.base.as_ref().map(|b| b.name.clone()))
        .chain(mine().map(|n| n.part.clone()))
        .collect()
}

fn forget(host: &str, pool: &str, part: &str) {
    lock().retain(|n| !(n.host == host && n.pool == pool && n.part == part));
}

/// The base is settled (gone, or published and kept): only its part remains to judge.
fn base_settled(host: &str, pool: &str, part: &str) {
    for n in lock().iter_mut() {
        if n.host == host && n.pool == pool && n.part == part {
            n.base = None;
        }
    }
}

/// Removes the volumes noted for `pool` on `host` of `entry` over `client` (the host answers
/// again): noted bases first, then parts (a part waits while its base is still noted);
/// returns the names removed. Nothing noted: no call at all. A volume that cannot be read or
/// deleted now stays noted; fails (keeping the part notes) only when the pool cannot be listed.
pub async fn clear(
    client: &Client,
    pool: &StoragePool,
    host: &str,
    entry: &str,
) -> Result<Vec<String>> {
    let notes: Vec<Noted> = lock()
        .iter()
        .filter(|n| n.host == host && n.pool == pool.name)
        .cloned()
        .collect();
    if notes.is_empty() {
        return Ok(Vec::new());
    }
    let place = format!("in pool {} on host {host}", pool.name);
    let mut gone = Vec::new();
    for n in &notes {
        let Some(b) = &n.base else { continue };
        match remove_base(client, pool, b, &place).await {
            Ok(removed) => {
                if removed {
                    tracing::info!(host, base = %b.name, "removed an unpublished base a failed import left");
                    gone.push(b.name.clone());
                }
                base_settled(host, &pool.name, &n.part);
            }
            Err(e) => {
                tracing::warn!(host, base = %b.name, error = %e, "could not remove an unpublished base yet");
            }
        }
    }
    let parts: Vec<String> = lock()
        .iter()
        .filter(|n| n.host == host && n.pool == pool.name && n.base.is_none())
        .map(|n| n.part.clone())
        .collect();
    if parts.is_empty() {
        return Ok(gone);
    }
    let vols = client
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &format!("listing volumes {place}")))?;
    let referenced = cache::base_backing_paths(client, entry, &vols, &place).await?;
    for part in parts {
        let Some(v) = vols.iter().find(|v| v.name == part) else {
            forget(host, &pool.name, &part);
            continue;
        };
        if referenced.contains(&cache::volume_path(client, v, &place).await?) {
            // NB: a part noted by a failed import is referenced only by a base that got
            // published after all (kept) or one not ours; never delete a base's data.
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

/// Deletes noted base `b` if it exists, is not published and is still backed by its noted
/// part; `Ok(true)` when this call deleted it. `Ok(false)`: settled without a delete (gone
/// already, published, or not ours). Err: the host could not be read or the delete failed;
/// the note stays.
async fn remove_base(
    client: &Client,
    pool: &StoragePool,
    b: &NotedBase,
    place: &str,
) -> Result<bool> {
    let read =
        |e: &libvirt_remote::Error, what: &str| classify(e, &format!("{what} {} {place}", b.name));
    let vol = cache::handle(pool, &b.name, "");
    let xml = match client.vol_xml(&vol).await {
        Ok(x) => x,
        Err(e) if cache::is_no_vol(&e) => return Ok(false),
        Err(e) => return Err(read(&e, "reading base")),
    };
    let facts = crate::libvirt::volumes::parse_volume_xml(&xml);
    if facts.as_ref().and_then(|f| f.backing.as_deref()) != Some(b.part_path.as_str()) {
        // Not (any more) the base this process created on its part.
        return Ok(false);
    }
    let marker = cache::handle(pool, &cache::marker_name(&b.name), "");
    match client.vol_info(&marker).await {
        Ok(mi) if facts.is_some_and(|f| f.capacity == mi.capacity) => {
            // Published after all (the marker was written before the failure): readers may
            // use it already; it is kept like any published base.
            return Ok(false);
        }
        Ok(_) => {}
        Err(e) if cache::is_no_vol(&e) => {}
        Err(e) => return Err(read(&e, "reading the marker of base")),
    }
    match client.vol_delete(&vol, 0).await {
        Ok(()) => Ok(true),
        Err(e) if cache::is_no_vol(&e) => Ok(false),
        Err(e) => Err(read(&e, "deleting base")),
    }
}
