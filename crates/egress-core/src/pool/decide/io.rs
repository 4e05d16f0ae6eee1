//! What the pool decision looks at ([`PoolInputs`]) and what it decides ([`PoolDecision`]).
//!
//! Guarantees: plain data, no I/O; drivers build the inputs from their own stores (a pool's
//! members only, never every Proxy) and carry the decision out.

use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::Maintenance;
use egress_provider::model::HostState;

use crate::controller::Event;
use crate::pool::member::Member;
use crate::pool::status::ProxyPoolStatus;
use crate::pool::validate::PoolPolicy;

/// One host of the pool's provider entry and its last health report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolHost {
    /// Its name in the provider config.
    pub name: String,
    /// Its last health report (`None` before the first).
    pub state: Option<HostState>,
    /// Its `maintenance:` in the config: a cordoned or draining host gets no new member, and
    /// the members on a draining one are replaced elsewhere within the pool's budget.
    pub maintenance: Maintenance,
    /// Since when its reports have said it is dead (`Unreachable` or `Timeout`) without a
    /// break; `None` when its last report is not dead (or there is none). Drivers keep this
    /// in memory: after an operator restart the clock starts again at the first dead report,
    /// so a member is never declared lost early.
    pub dead_since: Option<SystemTime>,
    /// Since when its reports have said it is `Ready` without a break; `None` when its last
    /// report is not `Ready` (or there is none). Kept in memory like `dead_since`: after an
    /// operator restart the clock starts again at the first Ready report, so a pool never
    /// moves a member to a host early after one (see `placement.rebalance`).
    pub ready_since: Option<SystemTime>,
    /// Its `segment:` in the config (hosts of one segment share an L2 segment and an
    /// address pool): under `rotation.egressAddress: Keep`, a member lost with its host is
    /// replaced on another host of that host's segment, at its addresses.
    pub segment: Option<String>,
}

impl PoolHost {
    /// Whether it takes new members: its health allows it
    /// ([`crate::host_health::accepts_placements`]) and it is not cordoned or draining.
    pub fn accepts_placements(&self) -> bool {
        crate::host_health::accepts_placements(self.state) && self.maintenance.accepts_placements()
    }
}

/// Everything the pool decision looks at.
#[derive(Debug, Clone, Copy)]
pub struct PoolInputs<'a> {
    /// The pool's name (member names derive from it).
    pub name: &'a str,
    /// The pool's spec generation.
    pub generation: i64,
    /// The pool's spec, validated and resolved.
    pub policy: &'a PoolPolicy,
    /// The current template hash ([`crate::pool::member::template_hash`]).
    pub template_hash: &'a str,
    /// The pool's members (and nothing else).
    pub members: &'a [Member],
    /// The hosts of the pool's provider entry, in config order.
    pub hosts: &'a [PoolHost],
    /// The pool's status as last written (its memory between rounds).
    pub status: &'a ProxyPoolStatus,
    /// Whether the pool's generated credentials exist (meaningful when it generates them).
    pub credentials_present: bool,
    /// The clock.
    pub now: SystemTime,
}

/// A member to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateMember {
    /// Its derived name.
    pub name: String,
    /// The host to pin it to.
    pub host: String,
    /// The template hash to label it with.
    pub template_hash: String,
    /// Egress addresses to pin (its `spec.egress.address`): the replaced member's, under
    /// `rotation.egressAddress: Keep`; empty otherwise.
    pub pin: Vec<std::net::IpAddr>,
    /// The member it replaces, when that member was lost with its host and this one takes
    /// its addresses on another host of the same segment (`rotation.egressAddress: Keep`):
    /// the provider may confirm that member's instance gone (fence its host) to free them.
    pub replaces: Option<String>,
}

/// Why a member is deleted (a metrics label and part of the event message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeleteCause {
    /// Older than `rotation.maxAge`.
    Age,
    /// Unhealthy for longer than `autohealing.unhealthyAfter`.
    Unhealthy,
    /// In phase Failed.
    Failed,
    /// Made from an older template (or credentials).
    Template,
    /// More members than `replicas`.
    ScaleIn,
    /// Its quarantine annotation was removed (it had already been replaced).
    Quarantine,
    /// Its declared egress address is listed in a DNS blocklist (`onListed: Replace`).
    Listed,
    /// Its host is draining (`maintenance: Drain`).
    Drain,
    /// Its host was dead for `autohealing.hostDeadAfter`, so it was replaced elsewhere, and
    /// its host answers again: the old copy goes.
    HostLost,
    /// Its host holds at least two members more than another host the pool may use
    /// (`placement.rebalance`): it is replaced on that host.
    Rebalance,
}

impl DeleteCause {
    /// The label value: `age`, `unhealthy`, `failed`, `template`, `scale-in`, `quarantine`,
    /// `listed`, `drain`, `host-lost`, `rebalance`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Age => "age",
            Self::Unhealthy => "unhealthy",
            Self::Failed => "failed",
            Self::Template => "template",
            Self::ScaleIn => "scale-in",
            Self::Quarantine => "quarantine",
            Self::Listed => "listed",
            Self::Drain => "drain",
            Self::HostLost => "host-lost",
            Self::Rebalance => "rebalance",
        }
    }

    /// The cause of label value `s` ([`Self::as_str`]).
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Age,
            Self::Unhealthy,
            Self::Failed,
            Self::Template,
            Self::ScaleIn,
            Self::Quarantine,
            Self::Listed,
            Self::Drain,
            Self::Rebalance,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Whether the pool plans this removal (`template`, `age`, `listed`, `drain`,
    /// `scale-in`, `rebalance`): the member is unpublished first and deleted after the drain grace. A
    /// broken member (`failed`, `unhealthy`) and a released quarantined one are deleted at
    /// once.
    pub fn is_planned(self) -> bool {
        matches!(
            self,
            Self::Age
                | Self::Template
                | Self::ScaleIn
                | Self::Listed
                | Self::Drain
                | Self::Rebalance
        )
    }
}

/// A member to unpublish now and delete after the pool's drain grace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpublishMember {
    /// The member's name.
    pub name: String,
    /// Why it is removed.
    pub cause: DeleteCause,
    /// The marker to record on it ([`crate::pool::member::Drain::marker`]).
    pub marker: String,
}

/// A member to delete, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteMember {
    /// The member's name.
    pub name: String,
    /// Why.
    pub cause: DeleteCause,
}

/// What the pool decision decided. A driver carries it out in this order: generate the
/// credentials (when asked), create, unpublish, delete, then write the status. It decides again when
/// the pool or any of its members changes, and after `requeue_after`.
///
/// NB: the members created here must be among the next round's members (a driver that
/// learns of its own creates late, as a Kubernetes informer does, counts them as expected
/// until it sees them); otherwise the next round creates them again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolDecision {
    /// Generate the pool's credentials now (they do not exist and the pool generates them).
    pub generate_credentials: bool,
    /// Members to create.
    pub creates: Vec<CreateMember>,
    /// Members to unpublish now (their drain marker recorded) and delete once the drain
    /// grace has passed (a later round deletes them).
    pub unpublishes: Vec<UnpublishMember>,
    /// Members to delete.
    pub deletes: Vec<DeleteMember>,
    /// Members quarantined since the last round (to stop publishing and to announce).
    pub newly_quarantined: Vec<String>,
    /// The pool's new status.
    pub status: ProxyPoolStatus,
    /// Events to emit.
    pub events: Vec<Event>,
    /// Decide again after this long even if nothing changes (an age, an unhealthy period or
    /// a backoff runs out then).
    pub requeue_after: Option<Duration>,
}
