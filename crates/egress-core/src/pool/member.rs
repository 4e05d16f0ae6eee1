//! A pool's members as the pool decision sees them ([`Member`], read from a member Proxy's
//! status by [`Member::observe`]), and how members are made: their derived names
//! ([`member_name`]), the template hash they carry ([`template_hash`]) and their spec
//! ([`member_spec`]).
//!
//! Guarantees: pure and deterministic (the same inputs give the same name, hash and spec);
//! member names of a valid pool name are DNS labels (at most 63 characters).

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::model::{ConditionStatus, Phase, ProxySpec, ProxyStatus, condition};
use crate::pool::decide::DeleteCause;
use crate::pool::spec::{OnListed, ProxyTemplate};

/// A member the pool unpublished to remove it after its drain grace: since when, and why it
/// is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// When it was unpublished.
    pub since: SystemTime,
    /// Why the pool removes it.
    pub cause: DeleteCause,
}

impl Drain {
    /// The marker a driver records ([`ANNOTATION_DRAIN`], the standalone member file):
    /// `SINCE CAUSE`, e.g. `2026-12-05T07:20:00Z template`.
    pub fn marker(&self) -> String {
        format!(
            "{} {}",
            humantime::format_rfc3339_seconds(self.since),
            self.cause.as_str()
        )
    }

    /// Reads a marker. One the pool did not write (edited by hand: no time, or an unknown
    /// cause) still drains the member, as overdue (since the epoch, cause `scale-in`): a
    /// member carrying the marker is unpublished everywhere, so it must not stay forever.
    pub fn parse(marker: &str) -> Self {
        let mut parts = marker.split_whitespace();
        let since = parts
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
        let cause = parts.next().and_then(DeleteCause::parse);
        match (since, cause) {
            (Some(since), Some(cause)) => Self { since, cause },
            _ => Self {
                since: SystemTime::UNIX_EPOCH,
                cause: DeleteCause::ScaleIn,
            },
        }
    }
}

/// Label on every member naming its pool.
pub const LABEL_POOL: &str = "egress-proxies.dev/pool";
/// Label on every member: the hash of the template (and credentials) it was made from.
pub const LABEL_TEMPLATE_HASH: &str = "egress-proxies.dev/template-hash";
/// Annotation that quarantines a member; its value is the reason.
pub const ANNOTATION_QUARANTINE: &str = "egress-proxies.dev/quarantine";
/// Annotation the pool sets on a member it removes with a drain grace
/// (`update.drainGrace`): `SINCE CAUSE` ([`Drain::marker`]). A member carrying it is
/// unpublished (never available, never an endpoint or a gateway choice) and deleted once the
/// grace since `SINCE` has passed.
pub const ANNOTATION_DRAIN: &str = "egress-proxies.dev/drain";
/// Annotation the pool sets on a member that replaces a member lost with its host, at its
/// egress addresses (`rotation.egressAddress: Keep`): the lost member's name. The driver
/// honours it only when both are members of the same pool in the same namespace; then the
/// lost member's instance counts as the replacement's own copy (its host may be fenced).
pub const ANNOTATION_REPLACES: &str = "egress-proxies.dev/replaces";
/// Characters of a member name's suffix.
// NB: Kubernetes' own alphabet for generated names (no vowels, no 0/1/3: no words, no
// look-alikes); 27^6 ≈ 3.9e8 names per pool, and a clash with a live member is skipped.
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Length of a member name's suffix.
const SUFFIX_LEN: usize = 6;
/// Hex characters of a template hash.
const TEMPLATE_HASH_LEN: usize = 10;

/// One member Proxy as the pool decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member Proxy's name.
    pub name: String,
    /// The host the pool placed it on (its `spec.host`).
    pub host: Option<String>,
    /// The template hash it was made from.
    pub template_hash: String,
    /// When it was created.
    pub created: SystemTime,
    /// Its phase.
    pub phase: Phase,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Ready, Running and (when health checks run) healthy through itself.
    pub available: bool,
    /// Running or Paused and not available: since when (unset otherwise).
    pub unhealthy_since: Option<SystemTime>,
    /// Why it is not working (its last error), for the pool's ReplicaFailure condition.
    pub failure: Option<String>,
    /// The quarantine annotation's value, when set.
    pub quarantine: Option<String>,
    /// It is being deleted.
    pub deleting: bool,
    /// The pool unpublished it and deletes it once its drain grace has passed (never
    /// available meanwhile).
    pub draining: Option<Drain>,
    /// The declared egress addresses it holds (its `status.egressAddress`; empty when none).
    pub egress_address: Vec<String>,
    /// Its address on the host's network (its `status.ip`).
    pub ip: Option<String>,
    /// The address the world sees its traffic from, as its health check last saw it.
    pub egress_ip: Option<String>,
    /// Its egress addresses (declared or observed) listed in a DNS blocklist now (its
    /// `status.reputation.listed`), each once, sorted; empty when none.
    pub listed: Vec<String>,
    /// The listings, for messages (`ADDRESS in ZONE (CODES) since TIME; ...`); empty when
    /// none.
    pub listed_note: String,
}

/// What a driver knows of a member Proxy besides its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMeta {
    /// Name.
    pub name: String,
    /// Its `spec.host`.
    pub host: Option<String>,
    /// Its template-hash label.
    pub template_hash: String,
    /// When it was created.
    pub created: SystemTime,
    /// Its quarantine annotation.
    pub quarantine: Option<String>,
    /// It is being deleted.
    pub deleting: bool,
    /// Its drain marker ([`ANNOTATION_DRAIN`]), when the pool unpublished it to remove it.
    pub drain: Option<String>,
}

impl Member {
    /// Reads a member from its Proxy's status. With health checks on, a member is available
    /// only when the health engine saw it healthy through itself; with them off, Ready
    /// (running with an address) is all there is to go by.
    pub fn observe(meta: MemberMeta, status: &ProxyStatus, health_checks: bool) -> Self {
        Self::observe_with(meta, status, health_checks, OnListed::Ignore)
    }

    /// [`Self::observe`] under the pool's `reputation.onListed`: with `Unpublish`, a member
    /// with a listed address is not available (not published) while it is listed, and is
    /// not counted as unhealthy for it (so autohealing does not replace it for a listing).
    pub fn observe_with(
        meta: MemberMeta,
        status: &ProxyStatus,
        health_checks: bool,
        on_listed: OnListed,
    ) -> Self {
        let mut listed: Vec<String> = status
            .reputation
            .as_ref()
            .map(|r| r.listed.iter().map(|l| l.address.clone()).collect())
            .unwrap_or_default();
        listed.sort();
        listed.dedup();
        let listed_note = status
            .reputation
            .as_ref()
            .map(|r| {
                r.listed
                    .iter()
                    .map(|l| {
                        let codes = if l.codes.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", l.codes.join(", "))
                        };
                        format!("{} in {}{codes} since {}", l.address, l.zone, l.since)
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        let ready_cond = status.condition(condition::READY);
        let ready = ready_cond.is_some_and(|c| c.status == ConditionStatus::True);
        let verified =
            !health_checks || status.health.as_ref().and_then(|h| h.healthy) == Some(true);
        let available = ready && verified && status.phase == Phase::Running;
        let unhealthy_since =
            (matches!(status.phase, Phase::Running | Phase::Paused) && !available).then(|| {
                ready_cond
                    .filter(|c| c.status != ConditionStatus::True)
                    .and_then(|c| humantime::parse_rfc3339_weak(&c.last_transition_time).ok())
                    .unwrap_or(meta.created)
            });
        let failure = (status.phase == Phase::Failed || unhealthy_since.is_some())
            .then(|| status.last_error())
            .flatten();
        Self {
            name: meta.name,
            host: meta.host,
            template_hash: meta.template_hash,
            created: meta.created,
            phase: status.phase,
            ready,
            unhealthy_since,
            failure,
            quarantine: meta.quarantine,
            deleting: meta.deleting,
            egress_address: status.egress_address.clone(),
            // NB: after `unhealthy_since`: neither a listing nor a drain ever starts the
            // autohealing clock.
            available: available
                && meta.drain.is_none()
                && (on_listed != OnListed::Unpublish || listed.is_empty()),
            draining: meta.drain.as_deref().map(Drain::parse),
            listed,
            listed_note,
            ip: status.ip.clone(),
            egress_ip: status.health.as_ref().and_then(|h| h.egress_ip.clone()),
        }
    }

    /// A member the driver created and has not observed yet: Pending on its host, made from
    /// `template_hash` at `created`.
    pub fn expected(name: &str, host: &str, template_hash: &str, created: SystemTime) -> Self {
        Self {
            name: name.to_owned(),
            host: Some(host.to_owned()),
            template_hash: template_hash.to_owned(),
            created,
            phase: Phase::Pending,
            ready: false,
            available: false,
            unhealthy_since: None,
            failure: None,
            quarantine: None,
            deleting: false,
            draining: None,
            egress_address: Vec::new(),
            ip: None,
            egress_ip: None,
            listed: Vec::new(),
            listed_note: String::new(),
        }
    }

    /// Its listed addresses that it holds from its host's address pool (declared): the ones a
    /// replacement at a fresh address leaves behind, and that can be retired.
    pub fn listed_declared(&self) -> Vec<String> {
        self.listed
            .iter()
            .filter(|a| self.egress_address.contains(a))
            .cloned()
            .collect()
    }
}

/// The hash members made from `template` with credentials of digest `credentials_digest`
/// carry ("" when the pool generates none). A change of the spec, the metadata or the
/// credentials changes it, which replaces the members through the update budget.
pub fn template_hash(template: &ProxyTemplate, credentials_digest: &str) -> String {
    let mut h = Sha256::new();
    // NB: serde_json writes struct fields in declaration order, so equal templates hash
    // equally; a field added later with its default skipped keeps old hashes, and so does a
    // template without metadata (hashed as the spec alone, as before metadata existed).
    h.update(serde_json::to_vec(&template.spec).unwrap_or_default());
    h.update([0]);
    h.update(credentials_digest.as_bytes());
    if !template.metadata.is_empty() {
        h.update([0]);
        h.update(serde_json::to_vec(&template.metadata).unwrap_or_default());
    }
    let d = h.finalize();
    let mut out = String::with_capacity(TEMPLATE_HASH_LEN);
    for b in d.iter().take(TEMPLATE_HASH_LEN / 2) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The name of a new member of `pool`: `POOL-xxxxxx`, the suffix derived from the pool, the
/// template hash, the time and `attempt` (the caller tries the next attempt on a clash with
/// a live member).
pub fn member_name(pool: &str, template_hash: &str, now: SystemTime, attempt: u32) -> String {
    let nanos = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(pool.as_bytes());
    h.update([0]);
    h.update(template_hash.as_bytes());
    h.update(nanos.to_be_bytes());
    h.update(attempt.to_be_bytes());
    let d = h.finalize();
    let mut n = d
        .iter()
        .take(8)
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    let base = SUFFIX_ALPHABET.len() as u64;
    let mut name = String::with_capacity(pool.len() + 1 + SUFFIX_LEN);
    name.push_str(pool);
    name.push('-');
    for _ in 0..SUFFIX_LEN {
        let i = usize::try_from(n % base).unwrap_or(0);
        name.push(char::from(SUFFIX_ALPHABET.get(i).copied().unwrap_or(b'b')));
        n /= base;
    }
    name
}

/// The spec of a member placed on `host`: the template, pinned to `host` and to the egress
/// addresses `pin` (a replaced member's, under `rotation.egressAddress: Keep`; none
/// otherwise), with the pool's generated credentials when it has them.
pub fn member_spec(
    template: &ProxySpec,
    host: &str,
    pin: &[std::net::IpAddr],
    credentials_ref: Option<&str>,
) -> ProxySpec {
    let mut spec = template.clone();
    spec.host = Some(host.to_owned());
    if !pin.is_empty() {
        spec.egress.address = pin.iter().map(ToString::to_string).collect();
    }
    if let Some(r) = credentials_ref {
        spec.proxy.credentials_ref = Some(r.to_owned());
    }
    spec
}
