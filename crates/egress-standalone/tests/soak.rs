//! Soak: standalone mode against four libvirt-fake hosts while faults are injected at random
//! (frozen hosts, closed connections, slow calls, ENOSPC mid-upload, a silent guest agent) and
//! Proxies are added and removed, for a bounded time. At the end, with the faults cleared:
//! every wanted Proxy is Running and no other is listed, nothing is left on any host but the
//! wanted Proxies' domains and disks (and the published bases), the process's tokio task
//! count, open file descriptors and RSS are back within a bound of what they were once the
//! first Proxies ran, and no status message seen during the run exceeded its bound.
//!
//! Seeded: the seed is printed first; `EP_SOAK_SEED=N` replays a run (the same random
//! choices; timing on a loaded machine still varies). `EP_SOAK_SECS=N` sets the fault phase's
//! length (default [`DEFAULT_SOAK`]); `cargo test -p egress-standalone --test soak --
//! --ignored` runs the long variant ([`LONG_SOAK`]). Every wait has a deadline.
//!
//! The operator's log (`EP_SOAK_LOG`, a tracing filter, default `info`) goes to the test
//! harness's capture: a failing run prints it with the failure, a passing one drops it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_core::gc::GcSettings;
use egress_core::model::{MAX_MESSAGE_CHARS, Phase};
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::ProviderError;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_standalone::manifests::uid_for;
use egress_web::status::StatusDocument;
use ep_operator_fixtures::{
    FakeHosts, GIB, POOL, SHORT_PERMIT_WAIT, qcow2_image, standalone_options, start_standalone,
    status, wait_status, write_proxy_manifest,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{ConnHandle, FakeLibvirt};
use libvirt_remote::Transport;

const ENTRY: &str = "soak";
const HOSTS: [&str; 4] = ["h1", "h2", "h3", "h4"];
const IMAGES: [&str; 2] = ["tiny", "small"];
/// Proxy names drawn from `p0..p{NAMES-1}`.
const NAMES: usize = 10;
/// Length of the fault phase in CI.
// NB: ~2 minutes: long enough for every fault kind to hit every host several times at one
// action per STEP, short enough for CI on 2 cores.
const DEFAULT_SOAK: Duration = Duration::from_secs(120);
/// Length of the fault phase of the `--ignored` variant.
const LONG_SOAK: Duration = Duration::from_secs(30 * 60);
/// One random action (maybe a fault, maybe a manifest change) per step.
// NB: 250 ms is a few controller polls (200 ms): changes overlap work in flight.
const STEP: Duration = Duration::from_millis(250);
/// How long one injected fault lasts, at most (a random share of it, at least 1/8).
// NB: 4 s exceeds the short call budget (1 s), so frozen and slow hosts make calls time out
// and work give up, not merely wait.
const MAX_FAULT: Duration = Duration::from_secs(4);
/// Bound on the final convergence (and on every other wait here).
// NB: after the faults stop, convergence takes seconds; 180 s absorbs backoffs capped at
// 1 s, an hour-long import deadline never in play (5 s here) and a loaded CI machine.
const CONVERGE: Duration = Duration::from_secs(180);
/// Period of the "DHCP" task.
const DHCP_PERIOD: Duration = Duration::from_millis(50);
/// Period of status samples during the fault phase (each checked for message bounds).
const SAMPLE: Duration = Duration::from_secs(2);
/// How long the end measurement waits for tasks, descriptors and RSS to come back.
// NB: work in flight winds down within a controller poll or two once converged; 30 s is
// generous and keeps a leak's failure quick.
const SETTLE: Duration = Duration::from_secs(30);
/// Tokio tasks allowed above the baseline at the end.
// NB: the baseline already holds each host connection's tasks and the periodic workers; at
// rest the count returns to it (measured: within 1 either way), and the wait below lets
// work in flight finish; a leak per fault or per create is dozens even in a short run.
const TASK_SLACK: usize = 6;
/// Open descriptors allowed above the baseline at the end (same reasoning as tasks).
const FD_SLACK: usize = 6;
/// RSS allowed above the baseline at the end, KiB.
// NB: the allocator keeps freed pages; 192 MiB is far below what a per-operation leak
// reaches over a soak and far above the allocator's retention measured here (tens of MiB).
const RSS_SLACK_KIB: u64 = 192 * 1024;

/// SplitMix64: small, seeded, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Connects each host to its fake and keeps the handles, so a fault can close them.
#[derive(Clone, Default)]
struct Conns {
    fakes: BTreeMap<String, FakeLibvirt>,
    open: Arc<Mutex<Vec<(String, ConnHandle)>>>,
}

#[async_trait]
impl Connector for Conns {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        let f = self
            .fakes
            .get(&host.name)
            .ok_or_else(|| ProviderError::permanent(format!("no fake for {}", host.name)))?;
        let (t, h) = f.duplex();
        let mut open = self.open.lock().unwrap();
        open.retain(|(_, c)| c.is_open());
        open.push((host.name.clone(), h));
        Ok(t)
    }
}

impl Conns {
    fn close_all(&self, host: &str) {
        for (h, c) in self.open.lock().unwrap().iter() {
            if h == host {
                c.close();
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Freeze,
    Close,
    Slow,
    Enospc,
    AgentSilent,
}

const FAULTS: [Fault; 5] = [
    Fault::Freeze,
    Fault::Close,
    Fault::Slow,
    Fault::Enospc,
    Fault::AgentSilent,
];

fn inject(conns: &Conns, f: &FakeLibvirt, host: &str, fault: Fault, rng: &mut Rng) {
    let faults = f.faults();
    match fault {
        Fault::Freeze => faults.freeze(),
        Fault::Close => {
            faults.close_after_open(true);
            conns.close_all(host);
        }
        Fault::Slow => faults.delay_replies(Some(Duration::from_millis(20 + rng.below(400)))),
        Fault::Enospc => faults.fail_uploads_after(Some(rng.below(64 << 10))),
        Fault::AgentSilent => faults.agent_unresponsive(true),
    }
}

fn clear(f: &FakeLibvirt, fault: Fault) {
    let faults = f.faults();
    match fault {
        Fault::Freeze => faults.thaw(),
        Fault::Close => faults.close_after_open(false),
        Fault::Slow => faults.delay_replies(None),
        Fault::Enospc => faults.fail_uploads_after(None),
        Fault::AgentSilent => faults.agent_unresponsive(false),
    }
}

/// Tokio tasks alive in this runtime.
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Panics when a message of `d` exceeds its bound.
fn check_bounds(d: &StatusDocument) {
    for p in &d.proxies {
        if let Some(e) = &p.last_error {
            assert!(
                e.chars().count() <= MAX_MESSAGE_CHARS,
                "{}: lastError of {} chars",
                p.name,
                e.chars().count()
            );
        }
        for c in &p.conditions {
            assert!(
                c.message.chars().count() <= MAX_MESSAGE_CHARS,
                "{}: {} message of {} chars",
                p.name,
                c.type_,
                c.message.chars().count()
            );
        }
    }
    for h in &d.hosts {
        if let Some(e) = &h.error {
            assert!(
                e.chars().count() <= MAX_MESSAGE_CHARS,
                "host {}: error of {} chars",
                h.host,
                e.chars().count()
            );
        }
    }
}

fn converged(wanted: &BTreeSet<String>) -> impl Fn(&StatusDocument) -> bool + '_ {
    move |d| {
        let listed: BTreeSet<&str> = d.proxies.iter().map(|p| p.name.as_str()).collect();
        listed == wanted.iter().map(String::as_str).collect()
            && d.proxies.iter().all(|p| p.phase == Phase::Running)
    }
}

/// Every domain and every volume that is not a published base's, across the fakes.
fn leftovers(fakes: &BTreeMap<String, FakeLibvirt>) -> (Vec<String>, Vec<String>) {
    let prefix = names::base_prefix(ENTRY);
    let mut doms = Vec::new();
    let mut vols = Vec::new();
    for f in fakes.values() {
        doms.extend(f.domains().into_iter().map(|d| d.name));
        let all = f.volumes(POOL).unwrap();
        let backing: HashSet<String> = all
            .iter()
            .filter(|v| v.starts_with(&prefix))
            .filter_map(|v| f.volume(POOL, v).and_then(|i| i.backing))
            .collect();
        for v in all {
            let published = v.starts_with(&prefix)
                && (!v.contains(".part-")
                    || f.volume(POOL, &v)
                        .is_some_and(|i| backing.contains(&i.path)));
            if !published {
                vols.push(v);
            }
        }
    }
    doms.sort();
    vols.sort();
    (doms, vols)
}

fn seed() -> u64 {
    std::env::var("EP_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

async fn soak(length: Duration) {
    let filter = std::env::var("EP_SOAK_LOG").unwrap_or_else(|_| "info".into());
    // NB: one subscriber per test process; the second soak of a run keeps the first's.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(false)
        .with_test_writer()
        .try_init();
    let seed = seed();
    println!("soak seed {seed} (replay with EP_SOAK_SEED={seed}), fault phase {length:?}");
    let mut rng = Rng(seed);

    let server = ImageServer::start().await;
    let hosts = IMAGES
        .iter()
        .fold(FakeHosts::new(ENTRY, &HOSTS), |h, name| {
            // Distinct contents, so each image is its own base and its own upload.
            let body = qcow2(2 * GIB, 4096 + h.entry().images.len() * 512);
            let url = server.route(&format!("/{name}.qcow2"), Route::new(body.clone()));
            h.image(name, qcow2_image(url, sha(&body)))
        });
    let mut entry: LibvirtEntry = hosts.entry().clone();
    entry.timeouts = ep_operator_fixtures::SHORT_TIMEOUTS;
    let conns = Conns {
        fakes: hosts.fakes().clone(),
        open: Arc::default(),
    };
    let pool = HostPool::new(
        entry.clone(),
        Arc::new(conns.clone()),
        PoolOptions {
            permit_wait: SHORT_PERMIT_WAIT,
        },
    )
    .unwrap();
    let provider = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    let providers = Providers::from_handles([ProviderHandle::new(entry, Arc::new(provider))]);
    let _dhcp = hosts.start_dhcp(DHCP_PERIOD);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = standalone_options(dir.path());
    opts.workers = 4;
    opts.gc_interval = Duration::from_secs(1);
    opts.gc = GcSettings {
        min_age: Duration::from_secs(1),
        dry_run: false,
        ..GcSettings::default()
    };

    let name = |i: u64| format!("p{i}");
    let write = |n: &str, rng: &mut Rng| {
        let image = IMAGES[rng.below(IMAGES.len() as u64) as usize];
        write_proxy_manifest(dir.path(), n, ENTRY, image, None);
    };
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for i in 0..(NAMES as u64 / 2) {
        write(&name(i), &mut rng);
        wanted.insert(name(i));
    }
    let r = start_standalone(opts, providers).await;
    wait_status(
        r.addr,
        "the first Proxies Running",
        CONVERGE,
        converged(&wanted),
    )
    .await;
    let (tasks0, fds0, rss0) = (tasks(), fds(), rss_kib());
    println!("baseline: {tasks0} tasks, {fds0} fds, {rss0} KiB RSS");

    // The fault phase.
    let fakes = hosts.fakes().clone();
    let mut active: Vec<(String, Fault, Instant)> = Vec::new();
    let mut injected: BTreeMap<Fault, u32> = BTreeMap::new();
    let (mut added, mut removed) = (0u32, 0u32);
    let t0 = Instant::now();
    let mut last_sample = Instant::now();
    while t0.elapsed() < length {
        let now = Instant::now();
        active.retain(|(h, f, until)| {
            if *until <= now {
                clear(&fakes[h], *f);
                false
            } else {
                true
            }
        });
        if rng.chance(35) {
            let h = HOSTS[rng.below(HOSTS.len() as u64) as usize].to_owned();
            let f = FAULTS[rng.below(FAULTS.len() as u64) as usize];
            let max = MAX_FAULT.as_millis() as u64;
            let d = Duration::from_millis(max / 8 + rng.below(max - max / 8));
            inject(&conns, &fakes[&h], &h, f, &mut rng);
            *injected.entry(f).or_default() += 1;
            active.push((h, f, now + d));
        }
        if rng.chance(40) {
            let n = name(rng.below(NAMES as u64));
            if wanted.remove(&n) {
                std::fs::remove_file(dir.path().join(format!("{n}.yaml"))).unwrap();
                removed += 1;
            } else {
                write(&n, &mut rng);
                wanted.insert(n);
                added += 1;
            }
        }
        if last_sample.elapsed() >= SAMPLE {
            last_sample = Instant::now();
            // The status endpoint answers (within its HTTP deadline) whatever the hosts do.
            check_bounds(&status(r.addr).await);
        }
        tokio::time::sleep(STEP).await;
    }
    println!("faults injected: {injected:?}; proxies added {added}, removed {removed}");
    for (h, f, _) in active.drain(..) {
        clear(&fakes[&h], f);
    }
    for f in fakes.values() {
        f.faults().clear();
    }

    // Convergence: exactly the wanted Proxies, all Running; nothing else on any host.
    wait_status(
        r.addr,
        "exactly the wanted Proxies Running after the faults stopped",
        CONVERGE,
        converged(&wanted),
    )
    .await;
    println!(
        "converged {:?} after the faults stopped",
        t0.elapsed() - length
    );
    let uids: Vec<_> = wanted.iter().map(|n| uid_for("default", n)).collect();
    let mut want_doms: Vec<String> = uids.iter().map(|u| names::domain(ENTRY, u)).collect();
    want_doms.sort();
    let mut want_vols: Vec<String> = uids
        .iter()
        .flat_map(|u| [names::overlay(ENTRY, u), names::seed(ENTRY, u)])
        .collect();
    want_vols.sort();
    let t1 = Instant::now();
    loop {
        let left = leftovers(&fakes);
        if left == (want_doms.clone(), want_vols.clone()) {
            break;
        }
        assert!(
            t1.elapsed() < CONVERGE,
            "leftovers never went: {left:?}\nwanted: {want_doms:?} {want_vols:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "no leftovers {:?} after the faults stopped",
        t0.elapsed() - length
    );
    let d = status(r.addr).await;
    check_bounds(&d);
    assert!(converged(&wanted)(&d), "{d:#?}");

    // Resources back within a bound of the baseline (tasks and descriptors may take a
    // moment to wind down after the last work).
    let t2 = Instant::now();
    loop {
        let (t, f, m) = (tasks(), fds(), rss_kib());
        if t <= tasks0 + TASK_SLACK && f <= fds0 + FD_SLACK && m <= rss0 + RSS_SLACK_KIB {
            println!("end: {t} tasks, {f} fds, {m} KiB RSS");
            break;
        }
        assert!(
            t2.elapsed() < SETTLE,
            "resources not back: tasks {t} (baseline {tasks0}), fds {f} (baseline {fds0}), \
             RSS {m} KiB (baseline {rss0})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    r.stop(CONVERGE).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_faults_and_churn_every_wanted_proxy_runs_and_nothing_leaks() {
    let length = std::env::var("EP_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(DEFAULT_SOAK, Duration::from_secs);
    soak(length).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long soak (30 minutes); run with --ignored"]
async fn a_long_soak_under_random_faults_and_churn_converges_without_leaks() {
    soak(LONG_SOAK).await;
}
