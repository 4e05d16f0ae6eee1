//! Listing the instances of an entry on one host: every domain, its mark read under our
//! namespace, kept only when the mark is valid for the entry.
//!
//! Guarantees:
//! - the list is complete or the call fails: any connection-class failure or timeout, and any
//!   daemon error other than "no metadata" (80) or "no domain" (42), fails the whole list
//!   Transient — never a silently partial list for GC to sweep from (finding M15);
//! - a domain with no metadata under [`mark::NAMESPACE`] (e.g. another tool's mark in another
//!   namespace, finding M18), or whose mark is invalid for the entry (padded or re-cased UID,
//!   E2; another entry; unmanaged), is not listed; a domain that vanished between the listing
//!   and the mark read is skipped;
//! - `name_matches_uid` is true only when the domain's name equals the name derived from the
//!   mark's UID (GC requires it); creation times are clamped to now by [`mark::parse`] (L9);
//! - mark reads are pipelined on the one connection, at most [`MARK_READ_CONCURRENCY`] in
//!   flight; the first failure drops the rest (dropping a call abandons only that call).

use std::time::SystemTime;

use futures_util::stream::{self, StreamExt};
use libvirt_remote::Client;
use libvirt_remote::proto::Domain;

use super::{CODE_NO_DOMAIN, CODE_NO_DOMAIN_METADATA, classify, is_code};
use crate::error::Result;
use crate::libvirt::{mark, names};
use crate::model::{OwnedInstance, ProviderId};

/// Mark reads in flight at once on the host's connection.
// NB: libvirtd serves at most `max_client_requests` (default 5) calls of one client at a time
// and queues the rest; 4 keeps one slot for the other control calls sharing the pooled
// connection, and 4 round trips in flight already hide the latency of an SSH link.
pub const MARK_READ_CONCURRENCY: usize = 4;

/// Every domain on the host `host_name` (connection `client`) carrying a valid mark of `entry`.
/// Fails as a whole rather than returning a partial list.
pub async fn list_owned(
    client: &Client,
    entry: &str,
    host_name: &str,
) -> Result<Vec<OwnedInstance>> {
    let domains = client
        .list_all_domains(0)
        .await
        .map_err(|e| classify(&e, &format!("listing domains on host {host_name}")))?;
    let now = SystemTime::now();
    let reads = stream::iter(domains)
        .map(|dom| read_one(client, dom, entry, host_name, now))
        .buffered(MARK_READ_CONCURRENCY);
    futures_util::pin_mut!(reads);
    let mut out = Vec::new();
    while let Some(r) = reads.next().await {
        if let Some(inst) = r? {
            out.push(inst);
        }
    }
    Ok(out)
}

async fn read_one(
    client: &Client,
    dom: Domain,
    entry: &str,
    host_name: &str,
    now: SystemTime,
) -> Result<Option<OwnedInstance>> {
    let xml = match client.domain_metadata(&dom, mark::NAMESPACE, 0).await {
        Ok(x) => x,
        Err(e) if is_code(&e, CODE_NO_DOMAIN_METADATA) || is_code(&e, CODE_NO_DOMAIN) => {
            return Ok(None);
        }
        Err(e) => {
            let mut err = classify(
                &e,
                &format!(
                    "reading the mark of domain {} on host {host_name} while listing (the \
                     list is incomplete, so it is not returned)",
                    dom.name
                ),
            );
            // NB: whatever the code, an incomplete list must be retried, never latched.
            err.class = crate::error::ErrorClass::Transient;
            return Err(err);
        }
    };
    let Some(m) = mark::parse(&xml, entry, now) else {
        return Ok(None);
    };
    let name_matches_uid = dom.name == names::domain(entry, &m.uid);
    Ok(Some(OwnedInstance {
        id: ProviderId {
            entry: entry.to_owned(),
            host: host_name.to_owned(),
            name: dom.name,
        },
        uid: m.uid,
        created_at: m.created_at,
        name_matches_uid,
    }))
}
