//! Host health: every provider entry's hosts checked on an interval ([`check_all`]), turned
//! into plain rows ([`HostHealth`]) that standalone mode serves at `/hosts` and the
//! Kubernetes driver publishes as `ProviderHealth`, and the placement rule
//! ([`accepts_placements`]) the controller applies.
//!
//! Guarantees:
//! - **Bounded fan-out**: at most [`DEFAULT_MAX_PARALLEL_ENTRIES`] entries are checked at once;
//!   inside an entry the provider bounds its own hosts (`check.maxParallel`). Every entry's
//!   check runs under a deadline; an entry that misses it yields one row per host with state
//!   `Timeout` and a message naming the deadline, never a hang.
//! - **Per-host reasons first** (finding L16): a host's row carries the provider's own state
//!   for that host (`Unreachable`, `Timeout` only for its own deadline, `Degraded` with what is
//!   missing); only an entry whose whole check missed the round deadline is reported as a
//!   round `Timeout`, and the provider validates at load that its round deadline cannot cut a
//!   host's dial (finding L17).
//! - **Latency of the probe only** (finding L15): `latencyMs` is the provider's probe-call
//!   latency, never the round's or the dial's.
//! - **Bounded strings** (finding L18): hostname, versions, error and every `missing` item are
//!   re-cut here ([`MAX_REMOTE_STRING`]) whatever the provider did.
//! - **Placement**: a host accepts new proxies only when its last report is `Ready`, or before
//!   its first report. A pool at or below its reserve makes the provider report the host
//!   `Degraded` ("free space in storage pool …"), so it takes no new proxies either.

use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::Maintenance;
use egress_provider::model::{HostReport, HostState};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::model::truncate;
use crate::providers::{ProviderHandle, Providers};

/// Entries checked at once.
// NB: each entry already checks its hosts in parallel (8 by default); 4 entries at once keeps
// one round to a few dozen sockets even with many entries, and configs rarely have more.
pub const DEFAULT_MAX_PARALLEL_ENTRIES: usize = 4;
/// Longest remote string kept in a row.
// NB: DNS's limit for a hostname; error strings were already cut to 512 by the provider and
// are cut again to the model's message bound.
pub const MAX_REMOTE_STRING: usize = 253;
/// Most `missing` items kept.
// NB: a host lacks at most a handful of things (virt type, UEFI, network, bridge, pool, space).
pub const MAX_MISSING_ITEMS: usize = 16;

/// One host of one provider entry, as last checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostHealth {
    /// Provider entry.
    pub entry: String,
    /// Host name in the entry.
    pub host: String,
    /// `Ready`, `Unreachable`, `Timeout`, `Degraded`, or `Unknown` before the first check.
    pub state: String,
    /// Whether it takes new proxies ([`accepts_placements`]).
    pub accepts_placements: bool,
    /// Latency of the probe call only, milliseconds (finding L15).
    pub latency_ms: Option<u64>,
    /// The host's hostname (bounded).
    pub hostname: Option<String>,
    /// libvirt version.
    pub libvirt_version: Option<String>,
    /// Usable virt types.
    pub virt_types: Vec<String>,
    /// UEFI loader available.
    pub uefi: bool,
    /// Free pool space after the reserve, bytes.
    pub pool_free_bytes: Option<u64>,
    /// What is missing or low (each bounded).
    pub missing: Vec<String>,
    /// Last error (redacted by the provider, bounded).
    pub error: Option<String>,
    /// When this row was produced (RFC 3339); absent before the first check.
    pub checked_at: Option<String>,
    /// Maintenance progress ([`maintenance_state`]): `Cordoned`, `Draining (N left)` or
    /// `Drained`; absent for a host in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// Its address pool's usage per family (empty without an address pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<AddressPoolUsage>,
    /// An administrator's declaration that the host is dead and what the operator did with
    /// it, as its latest check of the entry saw it; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<HostFence>,
}

/// A host declared dead by an administrator (standalone: a line of the `fenced-hosts` file;
/// Kubernetes: the `fence.egress-proxies.dev/HOST` annotation on the entry's ProviderHealth),
/// as the operator's latest check of the host's entry saw the declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostFence {
    /// Why (bounded).
    pub reason: String,
    /// [`FENCE_APPLIED`], [`FENCE_WAITING`] or [`FENCE_REMOVING`].
    pub state: String,
    /// When the operator applied it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<String>,
    /// The declared egress addresses applying it freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freed: Vec<String>,
    /// Why it is not applied, when the provider refused (bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What the host's instances held was freed for other hosts of its segment.
pub const FENCE_APPLIED: &str = "Applied";
/// Not applied (yet): the latest check did not find the host dead, or the provider refused.
pub const FENCE_WAITING: &str = "Waiting";
/// The host answered: the operator is removing the declaration (Kubernetes only; standalone
/// removes the line in the same step).
pub const FENCE_REMOVING: &str = "Removing";

impl HostFence {
    /// The declaration in a few words, as `egress-proxies status` prints it after the host's
    /// line: `declared dead: REASON (STATE…)`.
    pub fn describe(&self) -> String {
        let detail = match self.state.as_str() {
            FENCE_APPLIED => {
                let mut d = FENCE_APPLIED.to_owned();
                if let Some(at) = &self.applied_at {
                    d.push_str(&format!(" at {at}"));
                }
                if !self.freed.is_empty() {
                    d.push_str(&format!(", freed {}", self.freed.join(", ")));
                }
                d
            }
            FENCE_WAITING => match &self.message {
                Some(m) => format!("{FENCE_WAITING}: {m}"),
                None => format!(
                    "{FENCE_WAITING}: applied once a check finds the host Unreachable or Timeout"
                ),
            },
            FENCE_REMOVING => format!(
                "{FENCE_REMOVING}: the host answered; the declaration is being removed and \
                 frees nothing"
            ),
            other => other.to_owned(),
        };
        format!("declared dead: {} ({detail})", self.reason)
    }
}

/// How much of one family of a host's address pool is in use, as its last check saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressPoolUsage {
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// Allocatable addresses in the pool's ranges (at most `u64::MAX`).
    pub size: u64,
    /// Addresses held by instances.
    pub held: u64,
    /// Addresses not held but retired (not handed out either).
    pub retired: u64,
    /// Addresses free to hand out.
    pub free: u64,
}

impl AddressPoolUsage {
    /// The row of one family's usage.
    pub fn of(u: &egress_provider::model::AddressUsage) -> Self {
        let size = u64::try_from(u.size).unwrap_or(u64::MAX);
        Self {
            family: u.family.to_owned(),
            size,
            held: u.held,
            retired: u.retired,
            free: size.saturating_sub(u.held).saturating_sub(u.retired),
        }
    }
}

fn cut(s: &str) -> String {
    truncate(s, MAX_REMOTE_STRING)
}

fn state_name(s: HostState) -> &'static str {
    match s {
        HostState::Ready => "Ready",
        HostState::Unreachable => "Unreachable",
        HostState::Timeout => "Timeout",
        HostState::Degraded => "Degraded",
    }
}

/// Whether a host whose last state is `state` (`None`: never checked) takes new proxies.
pub fn accepts_placements(state: Option<HostState>) -> bool {
    matches!(state, None | Some(HostState::Ready))
}

/// Whether a host whose last state is `state` is dead: its connection was declared dead
/// (`Unreachable`) or its check ran out its deadline (`Timeout`). A `Degraded` host answers,
/// and a host never checked is not known to be dead.
pub fn is_dead(state: Option<HostState>) -> bool {
    matches!(state, Some(HostState::Unreachable | HostState::Timeout))
}

/// A host's maintenance progress as rows show it: `Cordoned`, `Draining (N left)` while
/// `left` Proxies' instances are still on it (pinned ones stay: see their `Ready`
/// condition), `Drained` once none is; `None` for a host in service.
pub fn maintenance_state(m: Maintenance, left: usize) -> Option<String> {
    match m {
        Maintenance::None => None,
        Maintenance::Cordon => Some("Cordoned".into()),
        Maintenance::Drain if left > 0 => Some(format!("Draining ({left} left)")),
        Maintenance::Drain => Some("Drained".into()),
    }
}

/// Sets each row's maintenance progress from `controller` (the config's `maintenance:` and
/// the Proxies on the host now); a host under maintenance accepts no placements. O(rows +
/// hosts of the entries the rows name).
pub fn annotate_maintenance(rows: &mut [HostHealth], controller: &crate::controller::Controller) {
    let mut entries: Vec<&str> = rows.iter().map(|r| r.entry.as_str()).collect();
    entries.sort_unstable();
    entries.dedup();
    let mut out: std::collections::HashMap<(String, String), (Maintenance, usize)> =
        std::collections::HashMap::new();
    for e in entries {
        for (host, m, left) in controller.hosts_in_maintenance(e) {
            out.insert((e.to_owned(), host), (m, left));
        }
    }
    for r in rows {
        match out.get(&(r.entry.clone(), r.host.clone())) {
            Some((m, left)) => {
                r.maintenance = maintenance_state(*m, *left);
                r.accepts_placements = false;
            }
            None => r.maintenance = None,
        }
    }
}

/// Why a host under `maintenance` takes no new proxies, in a few words.
pub fn maintenance_reason(m: Maintenance) -> &'static str {
    match m {
        Maintenance::None => "in service",
        Maintenance::Cordon => "cordoned (maintenance: Cordon)",
        Maintenance::Drain => "draining (maintenance: Drain)",
    }
}

impl HostHealth {
    /// The row of a host not checked yet.
    pub fn unknown(entry: &str, host: &str) -> Self {
        Self {
            entry: entry.to_owned(),
            host: host.to_owned(),
            state: "Unknown".into(),
            accepts_placements: true,
            latency_ms: None,
            hostname: None,
            libvirt_version: None,
            virt_types: Vec::new(),
            uefi: false,
            pool_free_bytes: None,
            missing: Vec::new(),
            error: None,
            checked_at: None,
            maintenance: None,
            addresses: Vec::new(),
            fenced: None,
        }
    }

    /// The row of one provider report, every string bounded (finding L18).
    pub fn from_report(entry: &str, r: &HostReport, now: SystemTime) -> Self {
        Self {
            entry: entry.to_owned(),
            host: r.host.clone(),
            state: state_name(r.state).into(),
            accepts_placements: accepts_placements(Some(r.state)),
            latency_ms: r
                .latency
                .map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX)),
            hostname: r.hostname.as_deref().map(cut),
            libvirt_version: r.libvirt_version.as_deref().map(cut),
            virt_types: r
                .virt_types
                .iter()
                .take(MAX_MISSING_ITEMS)
                .map(|s| cut(s))
                .collect(),
            uefi: r.uefi,
            pool_free_bytes: r.pool_free_bytes,
            missing: r
                .missing
                .iter()
                .take(MAX_MISSING_ITEMS)
                .map(|s| cut(s))
                .collect(),
            error: r
                .error
                .as_deref()
                .map(|e| truncate(e, crate::model::MAX_MESSAGE_CHARS)),
            checked_at: Some(humantime::format_rfc3339_seconds(now).to_string()),
            maintenance: None,
            addresses: r.addresses.iter().map(AddressPoolUsage::of).collect(),
            fenced: None,
        }
    }

    /// The row of a host whose entry's whole check missed `deadline`.
    pub fn round_timeout(entry: &str, host: &str, deadline: Duration, now: SystemTime) -> Self {
        Self {
            state: "Timeout".into(),
            accepts_placements: false,
            error: Some(format!(
                "the entry's check did not finish within {}s",
                deadline.as_secs()
            )),
            checked_at: Some(humantime::format_rfc3339_seconds(now).to_string()),
            ..Self::unknown(entry, host)
        }
    }
}

/// One entry's check result.
#[derive(Debug, Clone)]
pub struct EntryCheck {
    /// The entry checked.
    pub handle: ProviderHandle,
    /// Its reports, or `None` when the whole check missed the deadline.
    pub reports: Option<Vec<HostReport>>,
}

impl EntryCheck {
    /// The rows of this check (one per configured host on a timeout).
    pub fn rows(&self, deadline: Duration, now: SystemTime) -> Vec<HostHealth> {
        let entry = &self.handle.config.name;
        match &self.reports {
            Some(rs) => rs
                .iter()
                .map(|r| HostHealth::from_report(entry, r, now))
                .collect(),
            None => self
                .handle
                .config
                .hosts
                .iter()
                .map(|h| HostHealth::round_timeout(entry, &h.name, deadline, now))
                .collect(),
        }
    }
}

/// Checks every entry of `providers`, at most `max_parallel` entries at once, each within
/// `deadline`.
pub async fn check_all(
    providers: &Providers,
    max_parallel: usize,
    deadline: Duration,
) -> Vec<EntryCheck> {
    futures_util::stream::iter(providers.iter().cloned())
        .map(|h| async move {
            let reports = tokio::time::timeout(deadline, h.provider.check())
                .await
                .ok();
            EntryCheck { handle: h, reports }
        })
        .buffer_unordered(max_parallel.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_declaration_is_described_with_its_reason_and_what_the_operator_did_with_it() {
        let mut f = HostFence {
            reason: "rack 4 unplugged".into(),
            state: FENCE_APPLIED.into(),
            applied_at: Some("2026-01-01T00:00:00Z".into()),
            freed: vec!["203.0.113.10".into()],
            message: None,
        };
        assert_eq!(
            f.describe(),
            "declared dead: rack 4 unplugged (Applied at 2026-01-01T00:00:00Z, freed \
             203.0.113.10)"
        );
        f.state = FENCE_WAITING.into();
        assert_eq!(
            f.describe(),
            "declared dead: rack 4 unplugged (Waiting: applied once a check finds the host \
             Unreachable or Timeout)"
        );
        f.message = Some("no segment".into());
        assert_eq!(
            f.describe(),
            "declared dead: rack 4 unplugged (Waiting: no segment)"
        );
        f.state = FENCE_REMOVING.into();
        assert!(
            f.describe()
                .starts_with("declared dead: rack 4 unplugged (Removing: the host answered"),
            "{}",
            f.describe()
        );
    }

    fn report(state: HostState) -> HostReport {
        HostReport {
            host: "h1".into(),
            state,
            latency: Some(Duration::from_micros(1500)),
            hostname: Some("x".repeat(10_000)),
            libvirt_version: Some("11.3.0".into()),
            virt_types: vec!["qemu".into()],
            uefi: true,
            pool_free_bytes: Some(0),
            missing: vec!["free space in storage pool p: 0 bytes".into()],
            error: Some("e".repeat(10_000)),
            addresses: Vec::new(),
        }
    }

    #[test]
    fn rows_bound_every_remote_string() {
        // finding: L18
        let r = HostHealth::from_report("e", &report(HostState::Degraded), SystemTime::UNIX_EPOCH);
        assert_eq!(r.hostname.unwrap().chars().count(), MAX_REMOTE_STRING);
        assert!(r.error.unwrap().chars().count() <= crate::model::MAX_MESSAGE_CHARS);
        assert_eq!(r.latency_ms, Some(1));
        assert_eq!(r.state, "Degraded");
        assert!(!r.accepts_placements);
    }

    #[test]
    fn only_ready_or_unchecked_hosts_accept_placements() {
        assert!(accepts_placements(None));
        assert!(accepts_placements(Some(HostState::Ready)));
        for s in [
            HostState::Degraded,
            HostState::Unreachable,
            HostState::Timeout,
        ] {
            assert!(!accepts_placements(Some(s)), "{s:?}");
        }
    }
}
