//! The proxy health engine: every proxy with an address is checked *through itself* on an
//! interval — a tunnel through the proxy (HTTP CONNECT or SOCKS5, with its credentials) to a
//! check target that answers with the caller's address (`egress_web::echo`, or any target
//! of the same format) — recording success, the
//! probe's latency and the egress IP the world sees.
//!
//! Guarantees:
//! - **Bounded**: at most [`HealthSettings::concurrency`] probes at once (default
//!   [`DEFAULT_CONCURRENCY`]), each under [`HealthSettings::probe_timeout`]; a round of N
//!   proxies holds at most that many sockets. Between rounds nothing runs but a timer.
//! - **A fixed cadence**: a round starts `interval + U(0, jitter)` after the previous one
//!   *started* (the jitter drawn anew each round, so operators started together do not probe
//!   in lockstep), not after it ended: the round's own time does not stretch the time between
//!   two checks of a proxy. A round that takes longer than that is followed at once when it
//!   ends; rounds of one engine never overlap, and missed starts are dropped, never caught up
//!   in a burst.
//! - **Hysteresis**: a proxy becomes Healthy after [`HealthSettings::healthy_after`]
//!   consecutive successes and Unhealthy after [`HealthSettings::unhealthy_after`]
//!   consecutive failures; until the first decision it is Unknown. One failed probe never
//!   drops a working proxy from rotation, and one that was Healthy and failed comes back
//!   only after `healthy_after` passing rounds.
//! - **A new proxy's first pass is confirmed at once** ([`HealthSettings::recheck`]): a
//!   proxy never Healthy since its state was reset (new, re-created, at a new address) whose
//!   check passed is checked again in the same round, so with the defaults it is published
//!   in the round where it first answers rather than one interval later.
//! - **A failure is re-checked at once** ([`HealthSettings::recheck`]): a proxy not yet
//!   Unhealthy whose check failed is checked again in the same round, so with the defaults
//!   (two failures) a proxy that stopped answering leaves rotation within one round: within
//!   [`detection_bound`] of its death (interval, jitter and two connect deadlines while
//!   rounds take less than the interval and the connect deadlines), 9.5 s with the defaults.
//! - **A host declared down** ([`HealthEngine::hosts_reported`]) ends the wait at once: the next
//!   round starts, and there one failed check of a proxy on that host is enough (a proxy
//!   that still answers through itself stays published: its host's management connection is
//!   not its data path).
//! - **Egress verification**: when the spec sets `expectedEgress` (IP or CIDR), an answer from
//!   another address makes the proxy Unhealthy at once with reason `EgressMismatch` naming
//!   both (the traffic would leave from the wrong address: not a blip to ride out).
//!   When the instance holds declared egress addresses ([`ProbeTarget::declared`]), each is
//!   probed against its family's target and must be exactly what the target sees
//!   ([`declared`]).
//! - **State survives address gaps** (finding H3): a proxy's state is kept while it is not
//!   probed (its address read failed transiently, it is briefly Provisioning); it is reset
//!   only when the proxy's address changes or its driver reports a new instance
//!   ([`HealthEngine::new_instance`]: one re-created in place keeps its address, and a guest
//!   still booting must never read Healthy on its predecessor's results), and dropped by
//!   [`HealthEngine::forget`] / [`HealthEngine::retain`] when the Proxy is deleted.
//! - **Latency is the probe only** (finding L15): connect through the proxy to the answer;
//!   socket teardown is not timed.
//! - **Bounded strings** (finding L18): every error kept is redacted and cut to
//!   [`crate::model::MAX_MESSAGE_CHARS`].
//! - [`apply_to_status`] is pure: it writes the `health` block and the `Healthy` condition,
//!   and makes `Ready` = Running ∧ Healthy, keeping transition times while values hold.
//!
//! One piece (about 840 lines with its docs): the engine's round loop, its state per proxy
//! and the hysteresis that decides from it share one lock and one set of invariants; the
//! probe itself, the probes of declared addresses ([`declared`]) and the metrics already
//! live in submodules; the echo target is served by `egress-web`.

pub mod declared;
pub mod metrics;
pub mod probe;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::error::redact;
use egress_provider::model::{HostReport, HostState};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::controller::ProxyCredentials;
use crate::model::{
    Condition, ConditionStatus, HealthStatus, MAX_MESSAGE_CHARS, Phase, ProxyStatus, condition,
    parse_ip_or_cidr, prefix_contains, truncate,
};

use self::metrics::HealthMetrics;
use self::probe::{CheckTarget, ProbeError, ProbeSuccess, ProxyEndpoint};
use egress_provider::sync::lock;

/// Probes in flight at once by default.
// NB: a probe mostly waits on the network (two round trips through the proxy); 64 sockets
// finish 1000 loopback proxies in well under a second and 1000 remote ones (~100 ms each) in
// ~2 s, while staying far below any fd limit and the echo's connection bound.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Time from one round's start to the next's by default (plus the jitter).
// NB: with the re-check and `unhealthy_after` = 2, a proxy that stopped answering leaves
// rotation within interval + jitter + 2 × connect deadline = 9.5 s ([`detection_bound`];
// rounds start on a fixed cadence, so their own time adds nothing while it stays under the
// 4 s of connect deadlines: well under a second for 1,000 proxies on a LAN). The price:
// 1,000 proxies cost ~190 probes/s (1,000 every 5.25 s on average; each one TCP connection
// into the proxy and one from it to the target), a few hundred KiB/s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Largest random addition to the time between round starts by default (10% of the
/// interval).
pub const DEFAULT_JITTER: Duration = Duration::from_millis(500);
/// Deadline of the TCP connect to the proxy by default.
// NB: a proxy's SYN-ACK comes in a round trip (well under 100 ms between a datacenter's
// hosts; ~300 ms across continents); 2 s tolerates one lost SYN (Linux resends it after 1 s)
// and bounds what a dead VM or host costs a probe.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of one probe by default.
// NB: a working proxy answers in well under a second even across continents (two round
// trips); 10 s tolerates a loaded guest and bounds what a black-holed proxy costs a slot.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Consecutive successes to become Healthy by default.
// NB: two, so a proxy that answers every other probe never re-enters rotation, while a new
// proxy joins in the round of its first success (its pass is re-checked at once).
pub const DEFAULT_HEALTHY_AFTER: u32 = 2;
/// Consecutive failures to become Unhealthy by default.
// NB: two, the second being the immediate re-check of the first: a lost probe (a guest GC
// pause, a dropped SYN within the connect deadline's retry) is forgiven when the re-check
// passes, and a dead proxy goes in one round rather than two or three intervals.
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 2;

/// How long after a proxy stops answering connections (its VM or host gone) it is
/// unpublished at worst, with `settings` and rounds that take at most `round` apart from the
/// dead proxy's own failing checks (the other proxies' checks; a round's whole time while
/// every proxy answers). Counted to the end of the round that decides, when the engine hands
/// the states to its driver.
///
/// Derivation, with `period = max(interval + jitter, round)` and `per_check` the probe and
/// its re-check each failing at the connect deadline ([`HealthSettings::connect_timeout`];
/// a proxy that accepts connections but never answers takes its probe deadline instead):
/// - the proxy's last passing check ran in a round that started before its death;
/// - rounds start on a fixed cadence ([`HealthEngine::run`]): the next round starts at most
///   `interval + jitter` after that start, or when that round ends if it took longer, so at
///   most `period` after the death (a woken round only starts earlier);
/// - in that round the proxy's checks start with the round (every proxy does while they
///   number at most [`HealthSettings::concurrency`]) and fail within `per_check`, and the
///   round ends when the last of its checks does: at most `max(per_check, round)` after its
///   start.
///
/// So the bound is `max(interval + jitter, round) + max(per_check, round)`: with the
/// defaults, 5.5 s + 4 s = 9.5 s for any round up to 4 s; only a round longer than that adds.
/// With more proxies than the concurrency a check may also wait for a free slot, up to
/// `round`, on top. With [`HealthSettings::recheck`] off, each of the remaining
/// `unhealthy_after − 1` failures takes a further round start, at most
/// `max(period, connect deadline)` later.
pub fn detection_bound(settings: &HealthSettings, round: Duration) -> Duration {
    let connect = settings.connect_timeout.min(settings.probe_timeout);
    let n = settings.unhealthy_after.max(1);
    let period = (settings.interval + settings.jitter).max(round);
    if settings.recheck {
        period + (connect * n).max(round)
    } else {
        period + period.max(connect) * (n - 1) + connect.max(round)
    }
}

/// Condition reasons the engine sets.
pub mod reason {
    /// Enough consecutive probes succeeded.
    pub const PROBE_SUCCEEDED: &str = "ProbeSucceeded";
    /// Enough consecutive probes failed (the last failure's reason is in the message).
    pub const PROBE_FAILED: &str = "ProbeFailed";
    /// The target saw an address outside `spec.proxy.expectedEgress`.
    pub const EGRESS_MISMATCH: &str = "EgressMismatch";
    /// Not decided yet (too few results).
    pub const AWAITING_PROBE: &str = "AwaitingProbe";
    /// Not Running: nothing to check.
    pub const NOT_RUNNING: &str = "NotRunning";
    /// `Ready` is False because the proxy is not (yet) healthy.
    pub const NOT_HEALTHY: &str = "NotHealthy";
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct HealthSettings {
    /// Where probes go (and, with declared egress addresses, where IPv4 ones go).
    pub target: CheckTarget,
    /// Where the probe of a declared IPv6 egress address goes: a target the proxy reaches
    /// over IPv6 only (an IPv6 literal, or a name with only AAAA records). `None`: `target`.
    pub target_ipv6: Option<CheckTarget>,
    /// Time from one round's start to the next's (a round that takes longer is followed at
    /// once when it ends).
    pub interval: Duration,
    /// Largest random addition to `interval`, drawn anew for each round.
    pub jitter: Duration,
    /// Probes in flight at once (at least 1 is used).
    pub concurrency: usize,
    /// Deadline of one probe.
    pub probe_timeout: Duration,
    /// Deadline of a probe's TCP connect to the proxy (at most `probe_timeout` is used).
    pub connect_timeout: Duration,
    /// Check a proxy again at once, in the same round, when its check failed and it is not
    /// Unhealthy yet, or when it passed and the proxy was never Healthy since its state was
    /// reset (on by default).
    pub recheck: bool,
    /// Consecutive successes to become Healthy (at least 1 is used).
    pub healthy_after: u32,
    /// Consecutive failures to become Unhealthy (at least 1 is used).
    pub unhealthy_after: u32,
    /// Where to dial a proxy reported at an address (`None`: the address itself). For an
    /// operator that reaches its proxies through a translation (a port forward, NAT); the
    /// tests map guest addresses onto loopback listeners with it. State and status keep the
    /// reported address.
    pub dial_map: Option<fn(SocketAddr) -> SocketAddr>,
}

impl HealthSettings {
    /// Defaults for `target`.
    pub fn new(target: CheckTarget) -> Self {
        Self {
            target,
            target_ipv6: None,
            interval: DEFAULT_INTERVAL,
            jitter: DEFAULT_JITTER,
            concurrency: DEFAULT_CONCURRENCY,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            recheck: true,
            healthy_after: DEFAULT_HEALTHY_AFTER,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
            dial_map: None,
        }
    }
}

/// A proxy's decided state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealthState {
    /// Not enough results yet.
    #[default]
    Unknown,
    /// Usable.
    Healthy,
    /// Not usable; see the reason.
    Unhealthy,
}

/// One proxy's health as the engine keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyHealth {
    /// Decided state.
    pub state: HealthState,
    /// Reason of the decided state ([`reason`]), or of the last failure while Unknown.
    pub reason: String,
    /// Human-readable detail (redacted, bounded).
    pub message: String,
    /// The address last probed (a change resets the state).
    pub probed: Option<SocketAddr>,
    /// Egress IP of the last successful probe.
    pub egress_ip: Option<IpAddr>,
    /// With declared egress addresses: the egress seen by each family's probe of the last
    /// successful check, in the order of the declared addresses (`egress_ip` is the first).
    pub egress_ips: Vec<IpAddr>,
    /// Latency of the last successful probe.
    pub latency: Option<Duration>,
    /// When the last probe finished.
    pub last_check: Option<SystemTime>,
    /// Consecutive failures.
    pub consecutive_failures: u32,
    /// Consecutive successes.
    pub consecutive_successes: u32,
    /// The last failure, while failing.
    pub last_error: Option<String>,
    /// Whether it was Healthy since its state was last reset (a new instance or address):
    /// until then a passing check is confirmed at once ([`HealthEngine::round`]).
    pub was_healthy: bool,
}

/// What one check (one probe, or one per declared family) decided, before hysteresis.
enum Outcome {
    /// It passed: the egress seen (the addresses, as shown) and the latency.
    Succeeded { egress: String, latency: Duration },
    /// It failed: the condition reason and message, and whether it decides at once.
    Failed {
        reason: &'static str,
        message: String,
        immediate: bool,
    },
}

/// What one probe found, before hysteresis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// Answered from this address.
    Ok(ProbeSuccess),
    /// Failed.
    Failed(ProbeError),
}

impl ProxyHealth {
    /// Records one probe of `addr` at `now`, applying hysteresis and the egress expectation.
    pub fn record(
        &mut self,
        addr: SocketAddr,
        result: &ProbeResult,
        expected: Option<&str>,
        settings: &HealthSettings,
        now: SystemTime,
    ) {
        let outcome = match result {
            ProbeResult::Ok(s) => {
                self.observed(addr, s.egress_ip, Vec::new(), s.latency);
                match expected {
                    Some(want) if !egress_matches(want, s.egress_ip) => Outcome::Failed {
                        reason: reason::EGRESS_MISMATCH,
                        message: format!(
                            "the check target saw {} but spec.proxy.expectedEgress is {want}",
                            s.egress_ip
                        ),
                        immediate: true,
                    },
                    _ => Outcome::Succeeded {
                        egress: s.egress_ip.to_string(),
                        latency: s.latency,
                    },
                }
            }
            ProbeResult::Failed(e) => Outcome::Failed {
                reason: reason::PROBE_FAILED,
                message: format!("{} ({})", e, e.reason()),
                immediate: false,
            },
        };
        self.decide(addr, outcome, settings, now);
    }

    /// Keeps what a successful probe of `addr` saw (a new address resets the state first).
    fn observed(&mut self, addr: SocketAddr, ip: IpAddr, all: Vec<IpAddr>, latency: Duration) {
        self.reset_for(addr);
        self.egress_ip = Some(ip);
        self.egress_ips = all;
        self.latency = Some(latency);
    }

    /// A new instance (or the first probe): nothing known about it yet.
    fn reset_for(&mut self, addr: SocketAddr) {
        if self.probed != Some(addr) {
            *self = Self {
                probed: Some(addr),
                ..Self::default()
            };
        }
    }

    /// Applies one check's outcome with hysteresis (a failure marked `immediate` decides at
    /// once).
    fn decide(
        &mut self,
        addr: SocketAddr,
        outcome: Outcome,
        settings: &HealthSettings,
        now: SystemTime,
    ) {
        self.reset_for(addr);
        self.last_check = Some(now);
        match outcome {
            Outcome::Failed {
                reason: reason_,
                message,
                immediate,
            } => {
                self.consecutive_successes = 0;
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                let msg = truncate(&redact(&message), MAX_MESSAGE_CHARS);
                self.last_error = Some(msg.clone());
                if immediate || self.consecutive_failures >= settings.unhealthy_after.max(1) {
                    self.state = HealthState::Unhealthy;
                    self.reason = reason_.to_owned();
                    self.message = msg;
                } else if self.state == HealthState::Unknown {
                    self.reason = reason_.to_owned();
                    self.message = msg;
                }
            }
            Outcome::Succeeded { egress, latency } => {
                self.consecutive_failures = 0;
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                self.last_error = None;
                if self.consecutive_successes >= settings.healthy_after.max(1) {
                    self.state = HealthState::Healthy;
                    self.was_healthy = true;
                    self.reason = reason::PROBE_SUCCEEDED.to_owned();
                    self.message = format!(
                        "through the proxy in {} ms; egress IP {egress}",
                        latency.as_millis()
                    );
                }
            }
        }
    }

    /// Makes the state Unhealthy now after a failed check (`why` says what made one failure
    /// enough), keeping the failure's message. A no-op when already Unhealthy.
    fn fail_now(&mut self, why: &str) {
        if self.state == HealthState::Unhealthy || self.consecutive_failures == 0 {
            return;
        }
        let last = self.last_error.clone().unwrap_or_default();
        self.state = HealthState::Unhealthy;
        self.reason = reason::PROBE_FAILED.to_owned();
        self.message = truncate(&format!("{last}; {why}"), MAX_MESSAGE_CHARS);
    }

    /// The status block published for this state.
    pub fn to_status(&self) -> HealthStatus {
        HealthStatus {
            healthy: match self.state {
                HealthState::Unknown => None,
                HealthState::Healthy => Some(true),
                HealthState::Unhealthy => Some(false),
            },
            egress_ip: self.egress_ip.map(|i| i.to_string()),
            egress_ips: self.egress_ips.iter().map(ToString::to_string).collect(),
            last_check: self
                .last_check
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            latency_ms: self
                .latency
                .map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX)),
            consecutive_failures: self.consecutive_failures,
            consecutive_successes: self.consecutive_successes,
            last_error: self.last_error.clone(),
        }
    }
}

/// Whether any probe of a check failed.
fn any_failed(probes: &[declared::Probed]) -> bool {
    probes
        .iter()
        .any(|p| matches!(p.result, ProbeResult::Failed(_)))
}

/// Whether `ip` is the expected egress (`want`: an IP or a CIDR). An unparsable `want` never
/// matches (spec validation refuses it before it gets here).
pub fn egress_matches(want: &str, ip: IpAddr) -> bool {
    parse_ip_or_cidr(want.trim()).is_some_and(|(net, len)| prefix_contains(net, len, ip))
}

/// One proxy to probe this round.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The Proxy.
    pub uid: ProxyUid,
    /// `namespace/name` (metrics label, logs).
    pub key: String,
    /// Provider entry it runs under (per-host metrics: host names are unique per entry).
    pub entry: String,
    /// Host it runs on (per-host metrics).
    pub host: String,
    /// How to reach it.
    pub endpoint: ProxyEndpoint,
    /// `spec.proxy.expectedEgress`.
    pub expected_egress: Option<String>,
    /// The declared egress addresses its instance holds (`status.egressAddress`): each is
    /// probed on its own and must be what the check target sees. Empty: one probe.
    pub declared: Vec<IpAddr>,
}

impl ProbeTarget {
    /// The target for a Proxy in `status` (Running with an address), or `None` when there is
    /// nothing to probe now (not Running, no address, an address that does not parse).
    pub fn of(
        uid: ProxyUid,
        key: String,
        entry: &str,
        spec: &crate::model::ProxySettings,
        credentials: Option<&ProxyCredentials>,
        status: &ProxyStatus,
    ) -> Option<Self> {
        if status.phase != Phase::Running {
            return None;
        }
        let ip: IpAddr = status.ip.as_deref()?.parse().ok()?;
        Some(Self {
            uid,
            key,
            entry: entry.to_owned(),
            host: status.host.clone().unwrap_or_default(),
            endpoint: ProxyEndpoint {
                addr: SocketAddr::new(ip, spec.port),
                protocol: spec.protocol,
                credentials: credentials.cloned(),
            },
            expected_egress: spec.expected_egress.clone(),
            declared: status
                .egress_address
                .iter()
                .filter_map(|a| a.parse().ok())
                .collect(),
        })
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Proxies probed.
    pub probed: usize,
    /// Probes that succeeded (egress matching).
    pub succeeded: usize,
    /// Proxies checked a second time because their first check failed.
    pub rechecked: usize,
    /// Wall time of the round.
    pub elapsed: Duration,
    /// The Proxies this round turned Unhealthy (from Healthy or Unknown), with their keys
    /// (`namespace/name`): only transitions, not Proxies that stay Unhealthy.
    pub became_unhealthy: Vec<(ProxyUid, String)>,
}

/// The engine: per-proxy state and the round runner. Share it in an `Arc`.
#[derive(Debug)]
pub struct HealthEngine {
    settings: HealthSettings,
    states: Mutex<HashMap<ProxyUid, ProxyHealth>>,
    metrics: HealthMetrics,
    /// Hosts (entry, host) last reported down ([`HealthEngine::hosts_reported`]).
    down: Mutex<HashSet<(String, String)>>,
    /// Ends the wait for the next round early (a host went down).
    wake: tokio::sync::Notify,
}

impl HealthEngine {
    /// An engine with no state yet, its metrics in a registry of their own (exported
    /// nowhere). No I/O.
    pub fn new(settings: HealthSettings) -> Self {
        Self::with_metrics(settings, HealthMetrics::new())
    }

    /// An engine with no state yet recording into `metrics` (the operator registry's,
    /// [`crate::metrics::Metrics::health`]). No I/O.
    pub fn with_metrics(settings: HealthSettings, metrics: HealthMetrics) -> Self {
        Self {
            settings,
            states: Mutex::new(HashMap::new()),
            metrics,
            down: Mutex::new(HashSet::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &HealthSettings {
        &self.settings
    }

    /// Its metrics.
    pub fn metrics(&self) -> &HealthMetrics {
        &self.metrics
    }

    /// Probes every target (at most `concurrency` at once) and records the results.
    /// Proxies not in `targets` keep their state (finding H3). With
    /// [`HealthSettings::recheck`], a target is checked again at once when its check failed
    /// and it is not Unhealthy yet, or when its check passed and it was never Healthy since
    /// its state was reset (new, re-created, or at a new address); on a host reported down,
    /// one failed check makes it Unhealthy.
    pub async fn round(&self, targets: Vec<ProbeTarget>) -> RoundReport {
        let start = tokio::time::Instant::now();
        let settings = &self.settings;
        let probed = targets.len();
        let down = lock(&self.down).clone();
        let mut results = futures_util::stream::iter(targets)
            .map(|t| {
                let host_down = down.contains(&(t.entry.clone(), t.host.clone()));
                async move {
                    let first = declared::probe_target(&t, settings).await;
                    let again =
                        if settings.recheck && !host_down && self.recheck(&t, any_failed(&first)) {
                            Some(declared::probe_target(&t, settings).await)
                        } else {
                            None
                        };
                    (t, host_down, first, again)
                }
            })
            .buffer_unordered(settings.concurrency.max(1));
        let mut succeeded = 0;
        let mut rechecked = 0;
        let mut became_unhealthy = Vec::new();
        while let Some((t, host_down, first, again)) = results.next().await {
            let now = SystemTime::now();
            rechecked += usize::from(again.is_some());
            let checks: Vec<&Vec<declared::Probed>> =
                std::iter::once(&first).chain(again.as_ref()).collect();
            let health = {
                let mut states = lock(&self.states);
                let h = states.entry(t.uid).or_default();
                let before = h.state;
                for probes in &checks {
                    declared::record_target(h, &t, probes, settings, now);
                }
                if host_down && any_failed(&first) {
                    h.fail_now(&format!("its host {} is reported down", t.host));
                }
                if before != HealthState::Unhealthy && h.state == HealthState::Unhealthy {
                    became_unhealthy.push((t.uid, t.key.clone()));
                }
                h.clone()
            };
            if health.consecutive_failures == 0 {
                succeeded += 1;
            }
            for declared::Probed { result, .. } in checks.iter().flat_map(|c| c.iter()) {
                self.metrics
                    .observe(&t.key, &t.entry, &t.host, result, health.state);
            }
            tracing::debug!(proxy = %t.key, state = ?health.state, reason = %health.reason, "health probe");
        }
        self.count_states();
        RoundReport {
            probed,
            succeeded,
            rechecked,
            elapsed: start.elapsed(),
            became_unhealthy,
        }
    }

    /// Whether a check of `t` that `failed` (or passed) is checked again at once: a failure
    /// of a proxy not Unhealthy yet (a lost probe is forgiven, a dead proxy goes in one
    /// round), and a pass of one never Healthy since its last reset (with `healthy_after` 2,
    /// a new or re-created proxy joins in the round where it first answers, not one interval
    /// later). A proxy that was Healthy and failed needs `healthy_after` passing rounds to
    /// come back.
    fn recheck(&self, t: &ProbeTarget, failed: bool) -> bool {
        let states = lock(&self.states);
        // NB: a state kept for another address is reset by this check's record.
        let h = states
            .get(&t.uid)
            .filter(|h| h.probed == Some(t.endpoint.addr));
        if failed {
            h.is_none_or(|h| h.state != HealthState::Unhealthy)
        } else {
            // NB: `was_healthy` is set with the Healthy state and reset with it.
            self.settings.healthy_after > 1 && h.is_none_or(|h| !h.was_healthy)
        }
    }

    /// The last host check of `entry`: a host reported `Unreachable` (its connection declared
    /// dead) or `Timeout` is down, any other state is not. A host newly down ends the wait
    /// for the next round at once (reported during a round, the next one starts as soon as it
    /// ends), and in that round one failed check of a proxy on it makes the proxy Unhealthy.
    /// O(hosts reported).
    pub fn hosts_reported(&self, entry: &str, hosts: &[HostReport]) {
        let mut newly_down = false;
        {
            let mut d = lock(&self.down);
            for r in hosts {
                let key = (entry.to_owned(), r.host.clone());
                if matches!(r.state, HostState::Unreachable | HostState::Timeout) {
                    newly_down |= d.insert(key);
                } else {
                    d.remove(&key);
                }
            }
        }
        if newly_down {
            self.wake.notify_one();
        }
    }

    /// Refreshes the per-state gauge from the states kept.
    fn count_states(&self) {
        let states: Vec<HealthState> = lock(&self.states).values().map(|h| h.state).collect();
        self.metrics.set_states(states);
    }

    /// The current state of `uid`.
    pub fn get(&self, uid: &ProxyUid) -> Option<ProxyHealth> {
        lock(&self.states).get(uid).cloned()
    }

    /// Drops what is known of `uid`'s instance (a new one is being created, possibly on the
    /// same address): it is decided afresh by its own checks, never Healthy on the old
    /// instance's results. Its metrics stay.
    pub fn new_instance(&self, uid: &ProxyUid) {
        if lock(&self.states).remove(uid).is_some() {
            self.count_states();
        }
    }

    /// Merges what this engine knows of `uid` into the status a reconcile produced
    /// ([`apply_to_status`]); when that reconcile started a new instance
    /// (`instance_started`), the old instance's state is dropped first
    /// ([`new_instance`](Self::new_instance)), so the new one reads `Healthy` only on its own
    /// checks. Both drivers merge a reconcile's outcome through this.
    pub fn merge_reconcile(
        &self,
        uid: &ProxyUid,
        status: &mut ProxyStatus,
        previous: &ProxyStatus,
        instance_started: bool,
        now: SystemTime,
        generation: i64,
    ) {
        if instance_started {
            self.new_instance(uid);
        }
        apply_to_status(
            status,
            self.get(uid).as_ref(),
            Some(previous),
            now,
            generation,
        );
    }

    /// Forgets a deleted Proxy.
    pub fn forget(&self, uid: &ProxyUid, key: &str) {
        lock(&self.states).remove(uid);
        self.metrics.forget(key);
        self.count_states();
    }

    /// Keeps only the Proxies for which `live` holds (the others were deleted).
    pub fn retain(&self, live: impl Fn(&ProxyUid) -> bool) {
        lock(&self.states).retain(|u, _| live(u));
        self.count_states();
    }

    /// The time from a round's start to the next's: interval plus a random share of the
    /// jitter.
    pub fn next_period(&self) -> Duration {
        let j = self.settings.jitter.as_millis();
        let extra = u64::try_from(j)
            .ok()
            .filter(|j| *j > 0)
            .map_or(0, |j| fastrand::u64(0..=j));
        self.settings.interval + Duration::from_millis(extra)
    }

    /// Runs rounds until `stop`: each round probes `targets()` and then calls `after_round`
    /// (the driver merges the new states into status there). Rounds start on a fixed
    /// cadence: [`HealthEngine::next_period`] after the previous one started, at once when the
    /// previous one took longer (never two at once, missed starts dropped), and early when a
    /// host is newly reported down.
    pub async fn run(
        self: Arc<Self>,
        targets: impl Fn() -> Vec<ProbeTarget> + Send,
        after_round: impl Fn(&RoundReport) + Send,
        stop: CancellationToken,
    ) {
        let engine = &*self;
        on_cadence(
            move || engine.next_period(),
            &engine.wake,
            &stop,
            move || engine.round(targets()),
            move |r: RoundReport| {
                engine.metrics.round_done(r.elapsed);
                after_round(&r);
            },
        )
        .await;
    }
}

/// Runs rounds until `stop`, on a fixed cadence: each `round()` starts `period()` (drawn
/// anew each time) after the previous one *started*, or as soon as the previous one ended
/// when it took longer, or as soon as `wake` is notified (a notification during a round ends
/// the wait after it); `after` gets each round's result as it ends. One round at a time,
/// never overlapping. Missed starts are dropped rather than caught up (as
/// `tokio::time::MissedTickBehavior::Delay`): after an overrun the next round starts at once
/// and the cadence restarts from that start, so an overrun neither leaves an idle gap (which
/// `Skip`'s realignment to the old grid would, lengthening detection) nor causes a burst of
/// back-to-back catch-up rounds (which `Burst` would: a load spike on every proxy). `stop`
/// ends a round under way and the wait.
async fn on_cadence<R, Fut>(
    period: impl Fn() -> Duration,
    wake: &tokio::sync::Notify,
    stop: &CancellationToken,
    mut round: impl FnMut() -> Fut,
    mut after: impl FnMut(R),
) where
    Fut: std::future::Future<Output = R>,
{
    loop {
        let next = tokio::time::Instant::now() + period();
        let r = tokio::select! {
            () = stop.cancelled() => return,
            r = round() => r,
        };
        after(r);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            () = wake.notified() => {}
        }
    }
}

/// Merges a health state into `status` (pure): sets `status.health`, the `Healthy` condition
/// and `Ready` = Running ∧ Healthy. `previous` is the status before the reconcile that
/// produced `status`: a `Ready` whose value did not change keeps its transition time.
pub fn apply_to_status(
    status: &mut ProxyStatus,
    health: Option<&ProxyHealth>,
    previous: Option<&ProxyStatus>,
    now: SystemTime,
    generation: i64,
) {
    let now_s = humantime::format_rfc3339_seconds(now).to_string();
    status.health = health.map(ProxyHealth::to_status);
    let running = status.phase == Phase::Running;
    let (st, reason_, msg) = match (running, health) {
        (false, _) => (
            ConditionStatus::Unknown,
            reason::NOT_RUNNING,
            "the proxy is not running".to_owned(),
        ),
        (true, Some(h)) if h.state == HealthState::Healthy => {
            (ConditionStatus::True, h.reason.as_str(), h.message.clone())
        }
        (true, Some(h)) if h.state == HealthState::Unhealthy => {
            (ConditionStatus::False, h.reason.as_str(), h.message.clone())
        }
        (true, Some(h)) => (
            ConditionStatus::Unknown,
            reason::AWAITING_PROBE,
            if h.message.is_empty() {
                "waiting for enough consecutive health checks".to_owned()
            } else {
                format!(
                    "waiting for enough consecutive health checks; last: {}",
                    h.message
                )
            },
        ),
        (true, None) => (
            ConditionStatus::Unknown,
            reason::AWAITING_PROBE,
            "not checked yet".to_owned(),
        ),
    };
    status.set_condition(Condition::new(
        condition::HEALTHY,
        st,
        reason_,
        &msg,
        &now_s,
        generation,
    ));
    // Ours to lift: Ready was set False only because the proxy was not healthy yet.
    let held_by_us = status
        .condition(condition::READY)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason == reason::NOT_HEALTHY);
    if held_by_us && running && st == ConditionStatus::True {
        status.set_condition(Condition::new(
            condition::READY,
            ConditionStatus::True,
            crate::controller::decide::reason::RUNNING,
            &format!("running and healthy: {msg}"),
            &now_s,
            generation,
        ));
        return;
    }
    let ready_true = status
        .condition(condition::READY)
        .is_some_and(|c| c.status == ConditionStatus::True);
    if ready_true && st != ConditionStatus::True {
        let m = format!("running, but not healthy: {msg}");
        let mut c = Condition::new(
            condition::READY,
            ConditionStatus::False,
            reason::NOT_HEALTHY,
            &m,
            &now_s,
            generation,
        );
        if let Some(p) = previous.and_then(|p| p.condition(condition::READY))
            && p.status == ConditionStatus::False
        {
            c.last_transition_time = p.last_transition_time.clone();
        }
        // Replace outright: the transition time was chosen above.
        if let Some(old) = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == condition::READY)
        {
            *old = c;
        }
    } else if ready_true
        && let Some(p) = previous.and_then(|p| p.condition(condition::READY))
        && p.status == ConditionStatus::True
        && let Some(cur) = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == condition::READY)
    {
        cur.last_transition_time = p.last_transition_time.clone();
    }
}

/// The `ip:port` of every healthy proxy in `rows`, one per line (the `/healthy.txt` body and
/// the EndpointSlice's member list). IPv6 addresses are bracketed.
pub fn healthy_endpoints<'a>(
    rows: impl IntoIterator<Item = (&'a ProxyStatus, u16)>,
) -> Vec<SocketAddr> {
    rows.into_iter()
        .filter(|(st, _)| {
            st.phase == Phase::Running && st.health.as_ref().and_then(|h| h.healthy) == Some(true)
        })
        .filter_map(|(st, port)| {
            let ip: IpAddr = st.ip.as_deref()?.parse().ok()?;
            Some(SocketAddr::new(ip, port))
        })
        .collect()
}

#[cfg(test)]
mod tests;
