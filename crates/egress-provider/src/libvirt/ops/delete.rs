//! Removing one instance: its domain (only when the mark is ours for the UID), then its
//! overlay and seed volumes by the names derived from the UID.
//!
//! Guarantees:
//! - every name comes from the entry and the UID ([`names::domain`], [`names::overlay`],
//!   [`names::seed`]); nothing else is ever deleted — never a base, never a volume whose name
//!   was not derived from this UID;
//! - a domain with that name whose mark is not ours for the UID (none, foreign, another UID,
//!   another entry, invalid) makes delete fail Permanent and touches NOTHING, not even the
//!   volumes, since they may be that domain's disks (finding M2);
//! - the domain is destroyed (an inactive one answers "not running", which is fine) and
//!   undefined with managed-save, snapshot, checkpoint and NVRAM metadata flags (finding L5);
//! - the overlay and seed are removed whether or not a domain existed (finding M3); a volume
//!   that does not exist is success, so deleting twice succeeds;
//! - any other failure is returned classified; nothing is reported removed that was not.

use libvirt_remote::client::undefine;
use libvirt_remote::proto::StoragePool;
use libvirt_remote::{Client, Error as LvError};

use super::get::{MarkCheck, check_mark};
use super::{
    CODE_NO_DOMAIN, CODE_NO_STORAGE_POOL, CODE_NO_STORAGE_VOL, CODE_OPERATION_INVALID, classify,
    is_code,
};
use crate::error::{ProviderError, Result};
use crate::libvirt::config::HostConfig;
use crate::libvirt::names;
use crate::model::ProxyUid;

/// Removes the instance of `uid` in `entry` on `host` (connection `client`) and its overlay
/// and seed. Succeeds when none of them is left; refuses (Permanent) a same-named domain that
/// is not ours for `uid`, leaving it and every volume untouched.
pub async fn delete(
    client: &Client,
    entry: &str,
    installation: Option<&str>,
    host: &HostConfig,
    uid: &ProxyUid,
) -> Result<()> {
    let name = names::domain(entry, uid);
    let on = |what: String| move |e: LvError| classify(&e, &what);
    match client.domain_lookup_by_name(&name).await {
        Ok(dom) => {
            match check_mark(client, &dom, entry, installation, uid, &host.name).await {
                Ok(MarkCheck::Ours) => {}
                Ok(other) => {
                    return Err(ProviderError::permanent(format!(
                        "refusing to delete domain {name} on host {}: not ours (it carries {}, \
                         not a mark of entry {entry} for Proxy {uid}); nothing was touched. \
                         Remove or rename that domain by hand if it should go",
                        host.name,
                        other.describe()
                    )));
                }
                // Vanished between lookup and mark read: nothing left to undefine.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
            match client.domain_destroy(&dom, 0).await {
                Ok(()) => {}
                Err(e) if is_code(&e, CODE_OPERATION_INVALID) || is_code(&e, CODE_NO_DOMAIN) => {}
                Err(e) => {
                    return Err(classify(
                        &e,
                        &format!("destroying domain {name} on host {}", host.name),
                    ));
                }
            }
            match client.domain_undefine(&dom, undefine::ALL_METADATA).await {
                Ok(()) => {}
                Err(e) if is_code(&e, CODE_NO_DOMAIN) => {}
                Err(e) => {
                    return Err(classify(
                        &e,
                        &format!("undefining domain {name} on host {}", host.name),
                    ));
                }
            }
        }
        Err(e) if is_code(&e, CODE_NO_DOMAIN) => {}
        Err(e) => {
            return Err(on(format!(
                "looking up domain {name} on host {}",
                host.name
            ))(e));
        }
    }
    let pool = match client.pool_lookup_by_name(&host.pool).await {
        Ok(p) => p,
        Err(e) if is_code(&e, CODE_NO_STORAGE_POOL) => {
            return Err(ProviderError::permanent(format!(
                "storage pool {} (setting `pool` of host {} in entry {entry}) does not exist on \
                 the host, so the volumes of Proxy {uid} cannot be removed; fix the setting or \
                 create the pool",
                host.pool, host.name
            ))
            .with_code(e.libvirt_code()));
        }
        Err(e) => {
            return Err(on(format!(
                "looking up storage pool {} on host {}",
                host.pool, host.name
            ))(e));
        }
    };
    for vol in [names::overlay(entry, uid), names::seed(entry, uid)] {
        delete_volume(client, &pool, &vol, &host.name).await?;
    }
    Ok(())
}

/// Deletes the volume `name` of `pool` if it exists.
async fn delete_volume(client: &Client, pool: &StoragePool, name: &str, host: &str) -> Result<()> {
    let ctx = || {
        format!(
            "deleting volume {name} in pool {} on host {host}",
            pool.name
        )
    };
    let vol = match client.vol_lookup_by_name(pool, name).await {
        Ok(v) => v,
        Err(e) if is_code(&e, CODE_NO_STORAGE_VOL) => return Ok(()),
        Err(e) => return Err(classify(&e, &ctx())),
    };
    match client.vol_delete(&vol, 0).await {
        Ok(()) => Ok(()),
        Err(e) if is_code(&e, CODE_NO_STORAGE_VOL) => Ok(()),
        Err(e) => Err(classify(&e, &ctx())),
    }
}
