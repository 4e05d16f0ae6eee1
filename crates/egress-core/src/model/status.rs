//! What the operator reports about a Proxy: its phase, its conditions and its status, with
//! the health engine's view of it.
//!
//! Guarantees: status messages are redacted on the way in ([`Condition::new`] and
//! [`ProxyStatus::set_condition`] pass every message through
//! [`egress_provider::error::redact`] and truncate it to [`MAX_MESSAGE_CHARS`]), so status
//! never carries credentials (finding D5) or unbounded remote strings (finding L18); a
//! condition's transition time moves only when its status value changes.

use egress_provider::error::redact;
use serde::{Deserialize, Serialize};

/// Longest message kept in a condition (finding L18).
// NB: enough for a classified provider error with its host, setting and both sizes; status
// objects stay small when hundreds of proxies fail the same way.
pub const MAX_MESSAGE_CHARS: usize = 1024;
/// Where a Proxy is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Phase {
    /// Not yet placed or created.
    #[default]
    Pending,
    /// Created; waiting for it to run and report an address.
    Provisioning,
    /// Running with an address.
    Running,
    /// Paused by the hypervisor (e.g. storage full); never destroyed for it.
    Paused,
    /// A permanent failure or an expired provisioning deadline; see the conditions.
    Failed,
    /// Being deleted.
    Terminating,
}

impl Phase {
    /// The name shown in status tables and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Provisioning => "Provisioning",
            Self::Running => "Running",
            Self::Paused => "Paused",
            Self::Failed => "Failed",
            Self::Terminating => "Terminating",
        }
    }
}

/// Condition types a Proxy reports.
pub mod condition {
    /// The instance exists on a host.
    pub const PROVISIONED: &str = "Provisioned";
    /// The proxy answers through itself (set by the health engine).
    pub const HEALTHY: &str = "Healthy";
    /// Usable by clients.
    pub const READY: &str = "Ready";
    /// An egress address is listed in a configured DNS blocklist (set by the reputation
    /// checks).
    pub const LISTED: &str = "Listed";
}

/// A condition's truth value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ConditionStatus {
    /// Holds.
    True,
    /// Does not hold.
    False,
    /// Not known yet.
    Unknown,
}

/// One condition, as in Kubernetes' `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Provisioned`, `Healthy` or `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// True / False / Unknown.
    pub status: ConditionStatus,
    /// A CamelCase reason (stable: used as an event reason and a metrics label).
    pub reason: String,
    /// Human-readable, redacted, bounded.
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
    /// The spec generation this condition was computed from.
    pub observed_generation: i64,
}

impl Condition {
    /// A condition with a redacted, truncated message.
    pub fn new(
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        now: &str,
        generation: i64,
    ) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: truncate(&redact(message), MAX_MESSAGE_CHARS),
            last_transition_time: now.to_owned(),
            observed_generation: generation,
        }
    }
}

/// What the operator reports about a Proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Where the Proxy is in its life: `Pending`, `Provisioning`, `Running`, `Paused` (the
    /// hypervisor paused it, e.g. storage full; never destroyed for it), `Failed` (see the
    /// conditions) or `Terminating`.
    pub phase: Phase,
    /// The host the instance is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Where the instance is: `libvirt://ENTRY/HOST/NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The instance's address (kept through short Provisioning gaps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The declared egress address(es) the instance holds from its host's address pool (at
    /// most one IPv4 and one IPv6 address; absent when the host has no pool). The health
    /// check expects exactly these as the egress the world sees (`health.egressIp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_address: Vec<String>,
    /// `Provisioned`, `Healthy` and `Ready`, each with a stable reason (also the Event reason)
    /// and a redacted message.
    // NB: a map keyed by `type` for server-side apply, as Kubernetes' own conditions are.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"]
    )))]
    pub conditions: Vec<Condition>,
    /// The spec generation last acted on.
    #[serde(default)]
    pub observed_generation: i64,
    /// When the current provisioning attempt began (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_since: Option<String>,
    /// When the address was last seen (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_seen_at: Option<String>,
    /// What the proxy health engine last saw through the proxy (absent while health checks
    /// are off or before the first check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// The reputation of the proxy's egress addresses (declared and observed) in the
    /// configured DNS blocklists: which are listed in which zone since when, which checks
    /// fail, and the last check (absent while no blocklist is configured or before the first
    /// check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reputation: Option<egress_reputation::ProxyReputation>,
}

/// The proxy health engine's view of one Proxy, as published in its status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    /// `true` healthy, `false` unhealthy, absent until enough consecutive results decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// The address the check target saw the last successful check come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_ip: Option<String>,
    /// With declared egress addresses (`egressAddress`): the address the check target saw
    /// through each family's probe, in the order of `egressAddress` (the first is `egressIp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_ips: Vec<String>,
    /// When the last check finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// Latency of the last successful probe (connect through the proxy to the answer), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Consecutive failed checks (0 after a success).
    #[serde(default)]
    pub consecutive_failures: u32,
    /// Consecutive successful checks (0 after a failure).
    #[serde(default)]
    pub consecutive_successes: u32,
    /// Why the last check failed (redacted, bounded), absent after a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl ProxyStatus {
    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// What `lastError` (and the LAST ERROR column of `egress-proxies status`) shows: the
    /// message of the first False condition that has one (but `Listed`, whose False means
    /// clean). The controller sets the failing condition and every condition still claiming
    /// progress to the cause, so this is the cause, not a stale "creating"; redacted and at most [`MAX_MESSAGE_CHARS`] characters
    /// (as every condition message is).
    pub fn last_error(&self) -> Option<String> {
        self.conditions
            .iter()
            // NB: `Listed` False is the good state (no blocklist lists the addresses).
            .find(|c| {
                c.status == ConditionStatus::False
                    && c.type_ != condition::LISTED
                    && !c.message.is_empty()
            })
            .map(|c| truncate(&c.message, MAX_MESSAGE_CHARS))
    }

    /// Sets a condition; keeps its transition time when the status value does not change.
    /// The message is redacted and truncated.
    pub fn set_condition(&mut self, new: Condition) {
        let mut new = new;
        new.message = truncate(&redact(&new.message), MAX_MESSAGE_CHARS);
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

/// Truncates `s` to at most `max` characters, marking the cut (finding L18).
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
