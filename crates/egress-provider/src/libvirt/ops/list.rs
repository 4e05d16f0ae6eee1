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
//!   mark's UID (GC requires it); creation times are clamped to now by [`mark::parse`];
//! - a stable age (finding L9): a mark recorded more than [`FUTURE_MARK_TOLERANCE`] in the
//!   future (a wrong clock at define, a tampered mark) is rewritten, by the listing that first
//!   sees it, with the listing's own time — so the instance's age grows from the moment it was
//!   first seen, across operator restarts and for the one-shot `gc` command alike, instead of
//!   reading zero forever. The rewrite happens only for a mark that parsed strictly as ours for
//!   this entry on a domain named for the mark's UID (the only domains GC may collect; any
//!   other domain is never written to), it writes the same mark format with only `createdAt`
//!   changed (older readers parse it alike), to the persistent definition and, when running,
//!   the live one. A failed rewrite is logged and the instance is listed with age zero (kept);
//!   the next listing retries;
//! - installation identity: a mark carrying another installation's ID (or any ID, for an
//!   installation without one) is not listed — never collected, never adopted, never written
//!   to. A mark without an ID, on a domain named for its UID, is adopted: the listing rewrites
//!   it once with this installation's ID (same format, `createdAt` kept unless restamped as
//!   above, same flags as the restamp) and reports it with age zero in that listing, so the
//!   pass that adopts it never collects it. A failed rewrite is logged, the instance is listed
//!   with age zero (kept), and the next listing retries;
//! - declared egress addresses: [`list_host`] also returns every address claim it read — the
//!   addresses recorded in any valid mark under our namespace, of any entry and any
//!   installation (the allocator counts them all as held; an address is never handed out
//!   while any instance on the host claims it) — from the same reads, complete or failed as
//!   the list is;
//! - mark reads are pipelined on the one connection, at most [`MARK_READ_CONCURRENCY`] in
//!   flight; the first failure drops the rest (dropping a call abandons only that call).

use std::time::{Duration, SystemTime};

use futures_util::stream::{self, StreamExt};
use libvirt_remote::Client;
use libvirt_remote::client::{AFFECT_CONFIG, AFFECT_LIVE};
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

/// How far in the future a mark's creation time may be before the listing restamps it.
// NB: marks are written with the operator's clock; two replicas (or a replica and the
// one-shot `gc`) on machines whose clocks differ by a few seconds would otherwise rewrite
// each other's fresh marks. Within this tolerance the time is only clamped to now, which
// delays collection by at most the tolerance; beyond it, waiting is unbounded, so it is
// restamped. One minute is far above NTP-synchronised skew and far below any minimum age
// worth configuring.
pub const FUTURE_MARK_TOLERANCE: Duration = Duration::from_secs(60);

/// Every domain on the host `host_name` (connection `client`) carrying a valid mark of `entry`
/// that is not another installation's (`installation`: this installation's ID). Fails as a
/// whole rather than returning a partial list.
pub async fn list_owned(
    client: &Client,
    entry: &str,
    installation: Option<&str>,
    host_name: &str,
) -> Result<Vec<OwnedInstance>> {
    list_host(client, entry, installation, host_name)
        .await
        .map(|l| l.owned)
}

/// One domain's claim on declared egress addresses: its name and the addresses its mark
/// records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The domain's name (the allocator's holder).
    pub domain: String,
    /// The addresses its mark records (at most one per family).
    pub addresses: Vec<std::net::IpAddr>,
}

/// What one complete listing of a host found.
#[derive(Debug, Clone, Default)]
pub struct HostListing {
    /// As [`list_owned`].
    pub owned: Vec<OwnedInstance>,
    /// Every domain whose mark (of any entry or installation) records addresses.
    pub claims: Vec<Claim>,
}

/// [`list_owned`] and the host's address claims, from one listing.
pub async fn list_host(
    client: &Client,
    entry: &str,
    installation: Option<&str>,
    host_name: &str,
) -> Result<HostListing> {
    let domains = client
        .list_all_domains(0)
        .await
        .map_err(|e| classify(&e, &format!("listing domains on host {host_name}")))?;
    let now = SystemTime::now();
    let reads = stream::iter(domains)
        .map(|dom| read_one(client, dom, entry, installation, host_name, now))
        .buffered(MARK_READ_CONCURRENCY);
    futures_util::pin_mut!(reads);
    let mut out = HostListing::default();
    while let Some(r) = reads.next().await {
        let (inst, claim) = r?;
        out.owned.extend(inst);
        out.claims.extend(claim);
    }
    Ok(out)
}

async fn read_one(
    client: &Client,
    dom: Domain,
    entry: &str,
    installation: Option<&str>,
    host_name: &str,
    now: SystemTime,
) -> Result<(Option<OwnedInstance>, Option<Claim>)> {
    let xml = match client.domain_metadata(&dom, mark::NAMESPACE, 0).await {
        Ok(x) => x,
        Err(e) if is_code(&e, CODE_NO_DOMAIN_METADATA) || is_code(&e, CODE_NO_DOMAIN) => {
            return Ok((None, None));
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
    let Some(m) = mark::parse_any(&xml, now) else {
        return Ok((None, None));
    };
    let claim = (!m.addresses.is_empty()).then(|| Claim {
        domain: dom.name.clone(),
        addresses: m.addresses.clone(),
    });
    let owner = m.owner(installation);
    if m.entry != entry || owner == mark::Owner::Foreign {
        // Another entry's, or another installation's: not ours to collect, adopt or rewrite.
        return Ok((None, claim));
    }
    let name_matches_uid = dom.name == names::domain(entry, &m.uid);
    let mut created_at = m.created_at;
    let future = m.recorded_at
        > now
            .checked_add(FUTURE_MARK_TOLERANCE)
            .unwrap_or(SystemTime::UNIX_EPOCH);
    let unclaimed = owner == mark::Owner::Unclaimed;
    if name_matches_uid && (future || unclaimed) {
        // finding: L9 — restamp with the time it was first seen; the age grows from here.
        // An unclaimed mark is adopted: rewritten with our ID.
        let stamp = if future { now } else { m.recorded_at };
        created_at = rewrite(client, &dom, &m, installation, stamp, host_name, now).await;
        if unclaimed {
            // Never collected by the pass that adopts it.
            created_at = now;
        }
    }
    Ok((
        Some(OwnedInstance {
            id: ProviderId {
                entry: entry.to_owned(),
                host: host_name.to_owned(),
                name: dom.name,
            },
            uid: m.uid,
            created_at,
            name_matches_uid,
        }),
        claim,
    ))
}

/// Rewrites the mark `m` of `dom` with the creation time `stamp` (seconds precision, as every
/// mark) and the installation ID `installation`; returns the creation time to report: the
/// stamp when written, else `m.created_at` (clamped to now).
async fn rewrite(
    client: &Client,
    dom: &Domain,
    m: &mark::Mark,
    installation: Option<&str>,
    stamp: SystemTime,
    host_name: &str,
    now: SystemTime,
) -> SystemTime {
    let xml = mark::render_for_set_metadata(&m.uid, &m.entry, installation, &m.addresses, stamp);
    // NB: a running domain has a live and a persistent definition; writing only the live one
    // would bring the future date back at its next start. `id` is -1 when inactive; a domain
    // that started or stopped since the listing fails this write and is restamped next time.
    let flags = if dom.id > 0 {
        AFFECT_LIVE | AFFECT_CONFIG
    } else {
        AFFECT_CONFIG
    };
    match client
        .domain_set_metadata(dom, Some(&xml), mark::KEY, mark::NAMESPACE, flags)
        .await
    {
        Ok(()) => {
            tracing::info!(
                domain = %dom.name,
                host = host_name,
                "rewrote a mark (dated in the future, or without an installation ID) with the \
                 time it was first seen and this installation's ID"
            );
            // The stamp as written (whole seconds), so every later listing reports the same.
            mark::parse(
                &mark::render_with(&m.uid, &m.entry, installation, &m.addresses, stamp),
                &m.entry,
                now,
            )
            .map_or(m.created_at, |w| w.created_at)
        }
        Err(e) => {
            tracing::warn!(
                domain = %dom.name,
                host = host_name,
                error = %e,
                "could not rewrite a mark dated in the future or without an installation ID; \
                 it reads as age zero until a later listing rewrites it"
            );
            m.created_at
        }
    }
}
