//! The host check: is each host of an entry reachable and able to run our guests?
//!
//! Guarantees:
//! - **Reachable** means the pooled control connection is (re)dialed; any dial failure,
//!   including the dial budget running out, is [`HostState::Unreachable`] (finding L17).
//! - **Latency is the probe call only** (`CONNECT_GET_LIB_VERSION`, timed around the call): no
//!   dial, no teardown (finding L15). The check reuses the pooled connection, so it never
//!   dials a connection per round nor tears one down.
//! - **Timeout only for the host's own deadline** (finding L16): [`HostState::Timeout`] is
//!   reported when one of this host's calls hit its deadline, or when the host's own check
//!   budget ([`CheckOptions::host_budget`]) ran out after it connected; other failures keep
//!   their own state and reason.
//! - **The round deadline cannot mask a host's reason** (finding L17): [`CheckOptions::validate`]
//!   refuses a round timeout shorter than the worst case of the bounded fan-out
//!   (`ceil(hosts / max_parallel) × host_budget`), naming both values. A host still unfinished
//!   at the round deadline anyway (scheduling slop) is Unreachable if it had not connected,
//!   Timeout otherwise.
//! - **Bounded**: at most [`CheckOptions::max_parallel`] hosts at once; every call has
//!   [`CheckOptions::call_timeout`]; the check takes no operation slot (it must not queue
//!   behind imports) but holds the control connection only for a handful of cheap calls.
//! - **Bounded, redacted strings** (finding L18): the hostname is cut to
//!   [`MAX_HOSTNAME_CHARS`] with control characters replaced; errors are redacted and cut to
//!   [`MAX_ERROR_CHARS`].
//! - **What is missing is named** (finding M7): a virt type the host's `virtType` needs, UEFI
//!   when a catalogue image needs it, the configured network or bridge, the pool, and pool
//!   space at or below the reserve each add an entry to [`HostReport::missing`] and make the
//!   host [`HostState::Degraded`].
//! - Pool free space is `available − poolReserveGiB` read right after a pool refresh (finding
//!   M4: libvirt's figures are cached until refreshed). A refresh libvirtd refuses because the
//!   pool is busy (code 1, "pool … has asynchronous jobs running": a volume clone or build in
//!   progress, e.g. an image being published) is not a fault of the host: the check falls back
//!   to the figures of libvirt's last refresh, says so in a warning, and the host stays Ready.
//! - A configured bridge is looked up as a host interface (`INTERFACE_LOOKUP_BY_NAME`); when the
//!   host's libvirt has no interface driver it is left unverified (not missing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use libvirt_remote::{Client, proto, xdr};
use tokio::time::Instant;

use super::caps::{ARCH, kvm_usable, parse_domain_capabilities};
use super::classify::{classify, truncate};
use super::config::{Firmware, HostConfig, VirtType};
use super::hostpool::HostPool;
use crate::error::{ProviderError, Result};
use crate::model::{HostReport, HostState};

/// Longest hostname kept (DNS's limit for a full name).
pub const MAX_HOSTNAME_CHARS: usize = 253;

/// Longest error string kept in a report.
// NB: status conditions are read by humans; 512 characters hold the step, the host and the
// daemon's message, and keep a status patch small whatever the daemon says (finding L18).
pub const MAX_ERROR_CHARS: usize = 512;

/// Deadline of one check call by default (an entry's `timeouts.check` sets its own).
// NB: every call here is cheap (version, hostname, capabilities, lookups, one pool refresh of
// a directory); a healthy host answers in milliseconds. 10 s tolerates a loaded host. It is
// also what bounds how late a frozen host is *reported*: the first check round after the
// freeze reads Timeout within this long, or Unreachable sooner once keepalive killed the link
// (at most 30 s after the host last answered), so at most 30 s after the freeze with the
// default 30 s interval (the round ends by the link's death), at most interval + 10 s with a
// longer one (tests/frozen_host_budget.rs).
pub const DEFAULT_CHECK_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Budget for all of a host's calls after the dial, by default.
// NB: 9 calls at most; healthy hosts need well under a second. 20 s lets two slow calls
// through while bounding what a host that answers each call just before its deadline costs.
pub const DEFAULT_PROBE_BUDGET: Duration = Duration::from_secs(20);

/// Hosts checked at once by default (finding L19: bounded fan-out).
// NB: a check holds one socket and one small task per host; 32 checks the entries we expect
// (a handful to a few dozen hosts) in one wave, so the round takes one host's budget, while
// bounding tasks and sockets for very large entries. (At 8, an entry of 10 hosts with the
// default 10 s dial needed two waves, 100 s, more than the old fixed 60 s round timeout: every
// host of it read Degraded and received no placements.)
pub const DEFAULT_MAX_PARALLEL: usize = 32;

/// Slack added to the computed round timeout ([`CheckOptions::round_timeout`] `None`).
// NB: covers scheduling between waves on a loaded 2-core machine; small next to a host budget.
pub const ROUND_SLACK: Duration = Duration::from_secs(5);

/// `REMOTE_PROC_INTERFACE_LOOKUP_BY_NAME` (not wrapped by the client).
const PROC_INTERFACE_LOOKUP_BY_NAME: i32 = 128;
/// `VIR_ERR_NO_INTERFACE`.
const CODE_NO_INTERFACE: i32 = 57;
/// `VIR_ERR_NO_STORAGE_POOL`.
const CODE_NO_STORAGE_POOL: i32 = 49;
/// `VIR_ERR_NO_NETWORK`.
const CODE_NO_NETWORK: i32 = 43;
/// `VIR_ERR_OPERATION_INVALID` (refreshing an inactive pool).
const CODE_OPERATION_INVALID: i32 = 55;
/// `VIR_STORAGE_POOL_RUNNING`.
const POOL_RUNNING: u8 = 2;
/// `VIR_ERR_INTERNAL_ERROR`: what libvirtd answers a refresh of a pool with jobs running.
const CODE_INTERNAL_ERROR: i32 = 1;
/// The words of libvirtd's "pool '…' has asynchronous jobs running." (observed on 11.3).
const POOL_BUSY_TEXT: &str = "asynchronous jobs";

/// Settings of a check round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// Deadline of the whole round ([`check_all`]); `None` (the default) computes it from
    /// the entry: waves × one host's budget + [`ROUND_SLACK`], so it always covers every
    /// host's own deadlines (finding L17). A value set here is validated against them.
    pub round_timeout: Option<Duration>,
    /// Hosts checked at once.
    pub max_parallel: usize,
    /// Deadline of each call.
    pub call_timeout: Duration,
    /// Budget of all of a host's calls after its dial.
    pub probe_budget: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            round_timeout: None,
            max_parallel: DEFAULT_MAX_PARALLEL,
            call_timeout: DEFAULT_CHECK_CALL_TIMEOUT,
            probe_budget: DEFAULT_PROBE_BUDGET,
        }
    }
}

impl CheckOptions {
    /// One host's worst case: the pool's dial budget plus [`Self::probe_budget`].
    pub fn host_budget(&self, pool: &HostPool) -> Duration {
        pool.dial_budget().saturating_add(self.probe_budget)
    }

    /// The round deadline in effect for `pool`'s entry: the configured one, or the worst case
    /// of its waves plus [`ROUND_SLACK`].
    pub fn effective_round_timeout(&self, pool: &HostPool) -> Duration {
        match self.round_timeout {
            Some(t) => t,
            None => self.worst_case(pool).0.saturating_add(ROUND_SLACK),
        }
    }

    /// The worst case of a round (every host using its whole budget) and its wave count.
    fn worst_case(&self, pool: &HostPool) -> (Duration, u32) {
        let hosts = pool.entry().hosts.len().max(1);
        let waves = u32::try_from(hosts.div_ceil(self.max_parallel.max(1))).unwrap_or(u32::MAX);
        (self.host_budget(pool).saturating_mul(waves), waves)
    }

    /// Refuses settings under which the round deadline could cut a host before its own
    /// deadlines decide its state (finding L17). Permanent, naming the values to change.
    pub fn validate(&self, pool: &HostPool) -> Result<()> {
        if self.max_parallel == 0 || self.call_timeout.is_zero() || self.probe_budget.is_zero() {
            return Err(ProviderError::permanent(format!(
                "host check of entry {}: maxParallel, callTimeout and probeBudget must be \
                 non-zero (got {}, {:?}, {:?})",
                pool.entry().name,
                self.max_parallel,
                self.call_timeout,
                self.probe_budget
            )));
        }
        let host = self.host_budget(pool);
        let (need, waves) = self.worst_case(pool);
        let round = self.effective_round_timeout(pool);
        if round < need {
            return Err(ProviderError::permanent(format!(
                "host check of entry {}: the round timeout {}s is shorter than {}s, the worst \
                 case of {waves} wave(s) of {} host(s) at a time, each up to {}s (dial budget \
                 {}s = 3 × timeouts.dial, plus {}s of probes); raise the round timeout or \
                 lower timeouts.dial",
                pool.entry().name,
                round.as_secs_f64(),
                need.as_secs_f64(),
                self.max_parallel,
                host.as_secs_f64(),
                pool.dial_budget().as_secs_f64(),
                self.probe_budget.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// Checks one host with the default [`CheckOptions`] budgets. Never fails: every outcome is
/// a report.
pub async fn check_host(pool: &HostPool, host: &str) -> HostReport {
    check_host_with(pool, host, &CheckOptions::default()).await
}

/// Checks one host: bounded by its dial budget plus `opts.probe_budget`.
pub async fn check_host_with(pool: &HostPool, host: &str, opts: &CheckOptions) -> HostReport {
    let connected = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + opts.host_budget(pool);
    bounded_check(pool, host, opts, deadline, connected).await
}

/// Checks every host of the pool's entry, at most `opts.max_parallel` at once, in entry
/// order. Fails (Permanent) only when `opts` do not [`validate`](CheckOptions::validate).
pub async fn check_all(pool: &HostPool, opts: &CheckOptions) -> Result<Vec<HostReport>> {
    opts.validate(pool)?;
    let round_deadline = Instant::now() + opts.effective_round_timeout(pool);
    let names: Vec<String> = pool.entry().hosts.iter().map(|h| h.name.clone()).collect();
    let reports = futures_util::stream::iter(names)
        .map(|name| async move {
            let connected = Arc::new(AtomicBool::new(false));
            let own = Instant::now() + opts.host_budget(pool);
            let deadline = own.min(round_deadline);
            bounded_check(pool, &name, opts, deadline, connected).await
        })
        .buffered(opts.max_parallel)
        .collect::<Vec<_>>()
        .await;
    Ok(reports)
}

async fn bounded_check(
    pool: &HostPool,
    host: &str,
    opts: &CheckOptions,
    deadline: Instant,
    connected: Arc<AtomicBool>,
) -> HostReport {
    let started = Instant::now();
    match tokio::time::timeout_at(deadline, run_check(pool, host, opts, connected.clone())).await {
        Ok(r) => r,
        Err(_) => {
            let spent = started.elapsed().as_secs_f64();
            if connected.load(Ordering::Acquire) {
                report(
                    host,
                    HostState::Timeout,
                    format!("host {host}: the check did not finish within {spent:.1}s"),
                )
            } else {
                report(
                    host,
                    HostState::Unreachable,
                    format!("host {host}: could not connect within {spent:.1}s"),
                )
            }
        }
    }
}

fn report(host: &str, state: HostState, error: String) -> HostReport {
    HostReport {
        host: host.to_owned(),
        state,
        latency: None,
        hostname: None,
        libvirt_version: None,
        virt_types: Vec::new(),
        uefi: false,
        pool_free_bytes: None,
        missing: Vec::new(),
        error: Some(bound_error(&error)),
        addresses: Vec::new(),
    }
}

fn bound_error(s: &str) -> String {
    truncate(&crate::error::redact(s), MAX_ERROR_CHARS.saturating_sub(1))
}

/// Why a step stopped the check.
enum Stop {
    /// The call hit its own deadline.
    Timeout(String),
    /// The connection died.
    Lost(String),
}

/// A step's failure that does not stop the check.
struct Failed {
    err: ProviderError,
    code: Option<i32>,
}

type Step<T> = std::result::Result<std::result::Result<T, Failed>, Stop>;

async fn call<T>(
    limit: Duration,
    fut: impl Future<Output = libvirt_remote::Result<T>>,
    what: &str,
) -> Step<T> {
    match tokio::time::timeout(limit, fut).await {
        Err(_) => Err(Stop::Timeout(format!(
            "{what}: no answer within {}s",
            limit.as_secs_f64()
        ))),
        Ok(Ok(v)) => Ok(Ok(v)),
        Ok(Err(e)) if e.is_timeout() => Err(Stop::Timeout(classify(&e, what).message)),
        Ok(Err(e)) if e.is_connection() || e.is_protocol() => {
            Err(Stop::Lost(classify(&e, what).message))
        }
        Ok(Err(e)) => Ok(Err(Failed {
            err: classify(&e, what),
            code: e.libvirt_code(),
        })),
    }
}

fn sanitize_hostname(s: &str) -> String {
    let clean: String = s
        .trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    clean.chars().take(MAX_HOSTNAME_CHARS).collect()
}

fn version_string(v: u64) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1_000) % 1_000, v % 1_000)
}

async fn run_check(
    pool: &HostPool,
    host: &str,
    opts: &CheckOptions,
    connected: Arc<AtomicBool>,
) -> HostReport {
    let cfg = match pool.host(host) {
        Ok(c) => c.clone(),
        Err(e) => return report(host, HostState::Unreachable, e.message),
    };
    let client = match pool.control(host).await {
        Ok(c) => c,
        Err(e) => return report(host, HostState::Unreachable, e.message),
    };
    connected.store(true, Ordering::Release);
    let mut r = HostReport {
        host: host.to_owned(),
        state: HostState::Ready,
        latency: None,
        hostname: None,
        libvirt_version: None,
        virt_types: Vec::new(),
        uefi: false,
        pool_free_bytes: None,
        missing: Vec::new(),
        error: None,
        addresses: Vec::new(),
    };
    let budget = Instant::now() + opts.probe_budget;
    match tokio::time::timeout_at(budget, probe(pool, &cfg, &client, opts, &mut r)).await {
        Ok(Ok(())) => {}
        Ok(Err(Stop::Timeout(m))) => {
            r.state = HostState::Timeout;
            r.error = Some(m);
        }
        Ok(Err(Stop::Lost(m))) => {
            r.state = HostState::Unreachable;
            r.error = Some(m);
        }
        Err(_) => {
            r.state = HostState::Timeout;
            r.error = Some(format!(
                "host {host}: the probe calls did not finish within {}s",
                opts.probe_budget.as_secs_f64()
            ));
        }
    }
    if r.state == HostState::Ready && (!r.missing.is_empty() || r.error.is_some()) {
        r.state = HostState::Degraded;
    }
    r.error = r.error.as_deref().map(bound_error);
    r
}

fn note(r: &mut HostReport, e: &ProviderError) {
    if r.error.is_none() {
        r.error = Some(e.message.clone());
    }
}

async fn probe(
    pool: &HostPool,
    cfg: &HostConfig,
    client: &Client,
    opts: &CheckOptions,
    r: &mut HostReport,
) -> std::result::Result<(), Stop> {
    let h = &cfg.name;
    let t = opts.call_timeout;

    // The probe: the one timed call (finding L15).
    let start = Instant::now();
    let version = call(
        t,
        client.lib_version(),
        &format!("host {h}: reading the libvirt version"),
    )
    .await?;
    r.latency = Some(start.elapsed());
    match version {
        Ok(v) => r.libvirt_version = Some(version_string(v)),
        Err(f) => note(r, &f.err),
    }

    match call(
        t,
        client.hostname(),
        &format!("host {h}: reading the hostname"),
    )
    .await?
    {
        Ok(name) => r.hostname = Some(sanitize_hostname(&name)),
        Err(f) => note(r, &f.err),
    }

    // Virt types and UEFI, from the domain capabilities of each.
    for virt in ["kvm", "qemu"] {
        let what = format!("host {h}: reading {virt} domain capabilities");
        let xml = call(
            t,
            client.domain_capabilities(None, Some(ARCH), None, Some(virt)),
            &what,
        )
        .await?;
        // NB: a refusal is an answer (the virt type is unavailable), not an error.
        let Ok(xml) = xml else { continue };
        match parse_domain_capabilities(&xml) {
            Ok(d) => {
                let usable = match virt {
                    "kvm" => kvm_usable(&d),
                    _ => d.domain == virt,
                };
                if usable {
                    r.virt_types.push(virt.to_owned());
                    if d.loader_supported && !d.loaders.is_empty() {
                        r.uefi = true;
                    }
                }
            }
            Err(e) => note(
                r,
                &ProviderError::transient(format!("{what}: malformed answer: {e}")),
            ),
        }
    }
    let needs = match cfg.virt_type {
        VirtType::Kvm => Some("kvm"),
        VirtType::Qemu => Some("qemu"),
        VirtType::Auto => None,
    };
    match needs {
        Some(v) if !r.virt_types.iter().any(|x| x == v) => r
            .missing
            .push(format!("virt type {v} (hosts[{h}].virtType)")),
        None if r.virt_types.is_empty() => {
            r.missing.push("a usable virt type (kvm or qemu)".into())
        }
        _ => {}
    }
    let uefi_images: Vec<&str> = pool
        .entry()
        .images
        .iter()
        .filter(|(_, s)| s.firmware == Firmware::Uefi)
        .map(|(k, _)| k.as_str())
        .collect();
    if !r.uefi && !uefi_images.is_empty() {
        r.missing.push(format!(
            "UEFI firmware (a loader; needed by images {})",
            uefi_images.join(", ")
        ));
    }

    // Network or bridge.
    if let Some(net) = &cfg.network {
        let what = format!("host {h}: looking up network {net}");
        if let Err(f) = call(t, client.network_lookup_by_name(net), &what).await? {
            if f.code == Some(CODE_NO_NETWORK) {
                r.missing
                    .push(format!("network {net} (hosts[{h}].network)"));
            } else {
                note(r, &f.err);
            }
        }
    }
    if let Some(br) = &cfg.bridge {
        let what = format!("host {h}: looking up bridge {br}");
        let args = xdr::to_bytes(&proto::NameArgs { name: br.clone() });
        let looked = call(
            t,
            client
                .connection()
                .call_raw(PROC_INTERFACE_LOOKUP_BY_NAME, args),
            &what,
        )
        .await?;
        // NB: any refusal other than "no such interface" (no interface driver: codes 3, 84)
        // leaves the bridge unverified rather than missing.
        if let Err(f) = looked
            && f.code == Some(CODE_NO_INTERFACE)
        {
            r.missing.push(format!("bridge {br} (hosts[{h}].bridge)"));
        }
    }

    // Pool: refresh, then available − reserve.
    let p = &cfg.pool;
    let what = format!("host {h}: looking up storage pool {p}");
    let sp = match call(t, client.pool_lookup_by_name(p), &what).await? {
        Ok(sp) => sp,
        Err(f) => {
            if f.code == Some(CODE_NO_STORAGE_POOL) {
                r.missing
                    .push(format!("storage pool {p} (hosts[{h}].pool)"));
            } else {
                note(r, &f.err);
            }
            return Ok(());
        }
    };
    let what = format!("host {h}: refreshing storage pool {p}");
    if let Err(f) = call(t, client.pool_refresh(&sp), &what).await? {
        if f.code == Some(CODE_OPERATION_INVALID) {
            r.missing
                .push(format!("storage pool {p} is not active (hosts[{h}].pool)"));
            return Ok(());
        }
        if f.code == Some(CODE_INTERNAL_ERROR) && f.err.message.contains(POOL_BUSY_TEXT) {
            // NB: a clone or build in the pool blocks refreshes for its whole length; the
            // figures of the last refresh are still libvirt's best, so they are reported.
            tracing::warn!(host = %h, pool = %p, error = %f.err.message,
                "storage pool busy: free space is as of libvirt's last refresh");
        } else {
            note(r, &f.err);
        }
    }
    let what = format!("host {h}: reading storage pool {p}");
    match call(t, client.pool_info(&sp), &what).await? {
        Ok(info) if info.state.0 != POOL_RUNNING => {
            r.missing
                .push(format!("storage pool {p} is not active (hosts[{h}].pool)"));
        }
        Ok(info) => {
            let reserve = cfg.pool_reserve_gib.saturating_mul(1 << 30);
            let free = info.available.saturating_sub(reserve);
            r.pool_free_bytes = Some(free);
            if free == 0 {
                r.missing.push(format!(
                    "free space in storage pool {p}: {} free, at or below its {} GiB reserve \
                     (hosts[{h}].poolReserveGiB)",
                    human_bytes(info.available),
                    cfg.pool_reserve_gib
                ));
            }
        }
        Err(f) => note(r, &f.err),
    }
    Ok(())
}

/// `n` bytes for people: GiB or MiB with one decimal, else bytes.
fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    // NB: the casts only lose precision past 2^53 bytes, far beyond one decimal's worth.
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    if n >= GIB {
        format!("{:.1} GiB", f / GIB as f64)
    } else if n >= MIB {
        format!("{:.1} MiB", f / MIB as f64)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_read_in_gib_or_mib() {
        assert_eq!(human_bytes(3_328_599_654), "3.1 GiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
        assert_eq!(human_bytes(512), "512 bytes");
    }

    #[test]
    fn versions_read_as_major_minor_micro() {
        assert_eq!(version_string(11_003_000), "11.3.0");
        assert_eq!(version_string(9_010_002), "9.10.2");
    }

    #[test]
    fn hostnames_are_cut_and_stripped_of_control_characters() {
        // finding: L18
        let long = format!("a\nb{}", "x".repeat(1000));
        let h = sanitize_hostname(&long);
        assert_eq!(h.chars().count(), MAX_HOSTNAME_CHARS);
        assert!(h.starts_with("a?b"), "{h}");
    }
}
