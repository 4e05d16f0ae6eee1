//! What the operator reports about a ProxyPool, and the little the pool decision remembers
//! between rounds in it (per-host failure backoff, members held in quarantine), so that a
//! Kubernetes operator that restarts resumes where it was.
//!
//! Guarantees: every condition message is redacted and bounded ([`crate::model::Condition`]);
//! the remembered lists hold at most one row per host of the entry and one per quarantined
//! member.

use serde::{Deserialize, Serialize};

use crate::model::Condition;

/// Condition types a ProxyPool reports.
pub mod condition {
    /// At least `replicas - maxUnavailable` members are available.
    pub const AVAILABLE: &str = "Available";
    /// The pool is converging (True), done (True, reason `Complete`), or stuck (False).
    pub const PROGRESSING: &str = "Progressing";
    /// Members could not be created or failed; the message names hosts and reasons.
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
}

/// Stable reasons of a pool's conditions and events (users and alerts match on them).
pub mod reason {
    /// Enough members are available.
    pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    /// Too few members are available.
    pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
    /// Every member is current, available, and there are exactly `replicas`.
    pub const COMPLETE: &str = "Complete";
    /// Members are being added.
    pub const SCALING_UP: &str = "ScalingUp";
    /// Members are being removed.
    pub const SCALING_DOWN: &str = "ScalingDown";
    /// Members are replaced with a new template.
    pub const ROLLING_UPDATE: &str = "RollingUpdate";
    /// Members are replaced for their age.
    pub const ROTATING: &str = "Rotating";
    /// Members on a draining host are replaced elsewhere.
    pub const DRAINING: &str = "Draining";
    /// Broken or quarantined members are replaced.
    pub const REPLACING: &str = "Replacing";
    /// New members are waiting to become available.
    pub const WAITING_FOR_MEMBERS: &str = "WaitingForMembers";
    /// A member is needed and no host may take one.
    pub const NO_HOST_AVAILABLE: &str = "NoHostAvailable";
    /// A member is needed and every usable host is backing off after failures.
    pub const BACKING_OFF: &str = "BackingOff";
    /// A member failed or stayed unhealthy.
    pub const MEMBER_FAILED: &str = "MemberFailed";
    /// Nothing failed.
    pub const NO_FAILURE: &str = "NoFailure";
    /// The pool's spec is invalid.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A member was created (event).
    pub const MEMBER_CREATED: &str = "MemberCreated";
    /// A member was deleted (event; the message says why).
    pub const MEMBER_DELETED: &str = "MemberDeleted";
    /// A member the pool removes was unpublished; it is deleted after the drain grace
    /// (event; the message says why and when).
    pub const MEMBER_DRAINING: &str = "MemberDraining";
    /// A member was quarantined and is being replaced (event).
    pub const MEMBER_QUARANTINED: &str = "MemberQuarantined";
    /// Members whose declared egress address is listed are replaced (`onListed: Replace`).
    pub const REPLACING_LISTED: &str = "ReplacingListed";
    /// A listed egress address was retired from its host's address pool (event).
    pub const ADDRESS_RETIRED: &str = "AddressRetired";
    /// Members on a host dead for `autohealing.hostDeadAfter` were replaced elsewhere
    /// (condition reason of `ReplicaFailure`, and the event of each such member).
    pub const HOST_LOST: &str = "HostLost";
    /// A member is replaced on a less loaded host to spread the pool again
    /// (`placement.rebalance`; the event names the member, both hosts and their counts, and
    /// the `Progressing` reason while it runs).
    pub const REBALANCING: &str = "Rebalancing";
}

/// Most entries of `status.retiredAddresses` (the newest are kept).
pub const MAX_RETIRED: usize = 1000;

/// An egress address retired from its host's address pool: no Proxy is given it before
/// `until`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RetiredAddress {
    /// The host whose address pool it belongs to.
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub host: String,
    /// The address.
    #[cfg_attr(feature = "schema", schemars(length(max = 45)))]
    pub address: String,
    /// The member that held it when it was retired.
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub member: String,
    /// Why (the listing: zone, meaning, since when).
    #[cfg_attr(feature = "schema", schemars(length(max = 1024)))]
    pub reason: String,
    /// When it was retired (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub since: String,
    /// When the retirement ends (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub until: String,
}

/// A member lost with its host: its host was dead (`Unreachable` or `Timeout`) for
/// `autohealing.hostDeadAfter`, so it was replaced elsewhere; it is deleted once its host
/// answers again, never before.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LostMember {
    /// The member's name.
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub member: String,
    /// Its host.
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub host: String,
    /// Since when the host had been dead when the member was lost (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub since: String,
}

/// A replaced member's egress addresses, waiting for the member to be gone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PendingAddress {
    /// The deleted member's name.
    pub member: String,
    /// Its host: the replacement goes there.
    pub host: String,
    /// Its egress addresses: the replacement pins them.
    pub addresses: Vec<String>,
    /// The member was lost with its host (`host`, dead): its replacement goes to another
    /// host of that host's segment at once, pinned to these addresses, and gets them once
    /// the old instance is confirmed gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// A member being replaced on a less loaded host to spread the pool again
/// (`placement.rebalance`): one at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Rebalancing {
    /// The member replaced.
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub member: String,
    /// Its host (the most loaded).
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub from: String,
    /// The host its replacement goes to (the least loaded).
    #[cfg_attr(feature = "schema", schemars(length(max = 253)))]
    pub to: String,
    /// When it started (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub since: String,
}

/// What the operator reports about a ProxyPool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Members counted by the pool (not quarantined, not being deleted).
    #[serde(default)]
    pub replicas: u32,
    /// Members whose Ready condition is True (quarantined ones included).
    #[serde(default)]
    pub ready_replicas: u32,
    /// Members that count towards `replicas` and are healthy through themselves: the ones
    /// clients get.
    #[serde(default)]
    pub available_replicas: u32,
    /// Members made from the current template (and credentials).
    #[serde(default)]
    pub updated_replicas: u32,
    /// `Available`, `Progressing` and `ReplicaFailure`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"]
    )))]
    pub conditions: Vec<Condition>,
    /// The spec generation last acted on.
    #[serde(default)]
    pub observed_generation: i64,
    /// Hash of the current template (and credentials), as members carry it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template_hash: String,
    /// Hosts whose members recently failed, with the failure count behind their backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["host"]
    )))]
    pub host_failures: Vec<HostFailures>,
    /// Members held in quarantine (replaced, kept for inspection); a member leaving this list
    /// because its annotation was removed is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// Members lost with their host (dead for `autohealing.hostDeadAfter`): replaced
    /// elsewhere, not counted in `replicas`, each deleted once its host answers again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["member"]
    )))]
    pub lost_members: Vec<LostMember>,
    /// Egress addresses kept for replacements (`rotation.egressAddress: Keep`): a member
    /// deleted for its age or a template change, its host and addresses; its replacement is
    /// created there with them once it is gone. At most `replicas` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_addresses: Vec<PendingAddress>,
    /// Egress addresses retired from their host's address pool because the member holding
    /// them was listed in a DNS blocklist (`reputation.onListed: Replace`): no Proxy is given
    /// one before its `until`. At most 1000 entries (the newest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 1000)))]
    pub retired_addresses: Vec<RetiredAddress>,
    /// The member being replaced on a less loaded host to spread the pool again
    /// (`placement.rebalance`), until it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalancing: Option<Rebalancing>,
    /// The label selector of the pool's members (`egress-proxies.dev/pool=NAME`), as the
    /// `scale` subresource reports it to `kubectl scale` and autoscalers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// The members (quarantined ones included), by name, with their host, phase and
    /// addresses; at most [`MAX_STATUS_MEMBERS`], the rest counted in `membersOmitted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"]
    )))]
    pub members: Vec<PoolMemberStatus>,
    /// Members left out of `members` to keep the status small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub members_omitted: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most members listed in a pool's status.
// NB: about 200 bytes each: 500 keep the status near 100 KB, far below the API server's
// object size limit (1.5 MB) at the largest pool allowed.
pub const MAX_STATUS_MEMBERS: usize = 500;

/// One member as the pool's status lists it (filled by the pool round from the member's own
/// status, [`crate::pool::round`]; the decision leaves the list as it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PoolMemberStatus {
    /// The member Proxy's name.
    pub name: String,
    /// The host it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Its phase.
    pub phase: crate::model::Phase,
    /// Its address on the host's network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The address the world sees its traffic from (the health check's echo target saw it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_ip: Option<String>,
    /// The declared egress address(es) it holds from its host's address pool (its
    /// `status.egressAddress`; absent when it holds none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_address: Vec<String>,
    /// It counts towards `availableReplicas` (healthy through itself).
    #[serde(default)]
    pub available: bool,
    /// It is quarantined (replaced, kept for inspection, not published).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quarantined: bool,
    /// The pool unpublished it at this time (RFC 3339) to remove it: it takes no new
    /// client and is deleted once `update.drainGrace` has passed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining_since: Option<String>,
}

impl PoolMemberStatus {
    /// The row of `m`: available only when it counts towards the pool (not quarantined).
    pub fn of_member(m: &crate::pool::member::Member) -> Self {
        Self {
            name: m.name.clone(),
            host: m.host.clone(),
            phase: m.phase,
            ip: m.ip.clone(),
            egress_ip: m.egress_ip.clone(),
            egress_address: m.egress_address.clone(),
            available: m.available && m.quarantine.is_none() && m.draining.is_none(),
            quarantined: m.quarantine.is_some(),
            draining_since: m
                .draining
                .map(|d| humantime::format_rfc3339_seconds(d.since).to_string()),
        }
    }
}

/// Consecutive member failures on one host (reset when a member there becomes available).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HostFailures {
    /// The host.
    pub host: String,
    /// Consecutive failures.
    pub count: u32,
    /// When the last one was seen (RFC 3339).
    pub last_failure: String,
    /// What the last failed member said (redacted, bounded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ProxyPoolStatus {
    /// Puts this status's `retiredAddresses` (of provider entry `entry`) in effect in the
    /// process's `registry` as the retirements of pool `key` (`NAMESPACE/NAME`), replacing
    /// what the pool had there; entries that do not parse are skipped.
    pub fn sync_retired(
        &self,
        registry: &egress_provider::libvirt::retired::RetiredAddresses,
        key: &str,
        entry: &str,
        now: std::time::SystemTime,
    ) {
        let entries = self.retired_addresses.iter().filter_map(|r| {
            Some(egress_provider::libvirt::retired::Retired {
                entry: entry.to_owned(),
                host: r.host.clone(),
                address: r.address.parse().ok()?,
                until: humantime::parse_rfc3339_weak(&r.until).ok()?,
                reason: format!("member {}: {}", r.member, r.reason),
                owner: String::new(),
            })
        });
        registry.sync(&format!("pool {key}"), entries, now);
    }

    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Sets a condition, keeping its transition time while its status value holds.
    pub fn set_condition(&mut self, new: Condition) {
        let mut new = new;
        if let Some(old) = self.conditions.iter_mut().find(|c| c.type_ == new.type_) {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        } else {
            self.conditions.push(new);
        }
    }
}
