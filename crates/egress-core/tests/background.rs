//! The background workers both drivers run ([`egress_core::background`]), driven through
//! small test drivers: what each worker hands to its driver, when it skips, how it bounds
//! its waits and how it stops.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_core::background::config_watch::{self, Compare, Reload, WatchedFiles};
use egress_core::background::gc::{self as gc_worker, GcDriver};
use egress_core::background::host_checks::{self, HostCheckDriver, HostCheckSettings};
use egress_core::background::{Tasks, sleep_or_stop};
use egress_core::gc::{GcReport, GcSettings};
use egress_core::host_health::EntryCheck;
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::error::{ProviderError, Result as ProviderResult};
use egress_provider::model::{
    CreateRequest, HostReport, HostState, Instance, OwnedInstance, ProviderId,
};
use egress_provider::{Progress, Provider, ProxyUid};
use ep_operator_fixtures::FakeHosts;
use tokio_util::sync::CancellationToken;

/// Longest any test waits in real time for a worker to do something.
// NB: every worker here acts within milliseconds; 10 s only bounds a broken worker so the
// test fails instead of hanging.
const WAIT: Duration = Duration::from_secs(10);
/// Longest a paused-clock test waits (virtual time: costs nothing while the clock is paused).
// NB: above two GC intervals (600 s each) and a few host check rounds (35 s each).
const PAUSED_WAIT: Duration = Duration::from_secs(3600);

/// A provider whose `check` takes `delay` (forever when `None`) and counts checks in flight;
/// it has no instances and refuses to create any.
struct TimedCheck {
    entry: String,
    hosts: Vec<String>,
    delay: Option<Duration>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

#[async_trait]
impl Provider for TimedCheck {
    fn entry(&self) -> &str {
        &self.entry
    }
    async fn create(&self, _: &CreateRequest, _: &dyn Progress) -> ProviderResult<Instance> {
        Err(ProviderError::permanent(
            "this test provider creates nothing",
        ))
    }
    async fn get(&self, _: &ProviderId, _: &ProxyUid) -> ProviderResult<Instance> {
        Err(ProviderError::not_found(
            "this test provider has no instances",
        ))
    }
    async fn delete(&self, _: &str, _: &ProxyUid) -> ProviderResult<()> {
        Ok(())
    }
    async fn list_owned(&self) -> ProviderResult<Vec<OwnedInstance>> {
        Ok(Vec::new())
    }
    async fn check(&self) -> Vec<HostReport> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        match self.delay {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.hosts
            .iter()
            .map(|h| HostReport {
                host: h.clone(),
                state: HostState::Ready,
                latency: Some(Duration::from_millis(1)),
                hostname: None,
                libvirt_version: None,
                virt_types: Vec::new(),
                uefi: false,
                pool_free_bytes: None,
                missing: Vec::new(),
                error: None,
                addresses: Vec::new(),
            })
            .collect()
    }
}

/// Providers of `n` entries (`e0`, `e1`, …) of two hosts each, every check taking `delay`;
/// returns the in-flight and most-in-flight counters.
fn timed_providers(
    n: usize,
    delay: Option<Duration>,
) -> (Providers, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handles = (0..n).map(|i| {
        let name = format!("e{i}");
        let config = FakeHosts::new(&name, &["h1", "h2"]).entry().clone();
        let provider = Arc::new(TimedCheck {
            entry: name,
            hosts: vec!["h1".into(), "h2".into()],
            delay,
            in_flight: Arc::clone(&in_flight),
            most_in_flight: Arc::clone(&most),
        });
        ProviderHandle::new(config, provider)
    });
    (Providers::from_handles(handles), in_flight, most)
}

/// Records what the host check worker hands over.
struct CheckLog {
    providers: Arc<Providers>,
    in_flight: Arc<AtomicUsize>,
    /// (entry, reports present, checks in flight when handed over)
    entries: Mutex<Vec<(String, bool, usize)>>,
    rounds: AtomicUsize,
}

impl HostCheckDriver for CheckLog {
    fn providers(&self) -> Arc<Providers> {
        Arc::clone(&self.providers)
    }
    async fn entry_checked(&self, check: EntryCheck, _now: SystemTime) {
        let busy = self.in_flight.load(Ordering::SeqCst);
        self.entries.lock().unwrap().push((
            check.handle.config.name.clone(),
            check.reports.is_some(),
            busy,
        ));
    }
    async fn round_done(&self, _providers: &Providers) {
        self.rounds.fetch_add(1, Ordering::SeqCst);
    }
}

async fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn one_entry_at_a_time_hands_each_result_over_before_the_next_check_starts() {
    let (providers, in_flight, most) = timed_providers(3, Some(Duration::from_secs(1)));
    let log = Arc::new(CheckLog {
        providers: Arc::new(providers),
        in_flight,
        entries: Mutex::new(Vec::new()),
        rounds: AtomicUsize::new(0),
    });
    let stop = CancellationToken::new();
    let settings = HostCheckSettings {
        interval: Duration::from_secs(30),
        deadline: Duration::from_secs(5),
        max_parallel_entries: 1,
    };
    let task = tokio::spawn(host_checks::run(Arc::clone(&log), settings, stop.clone()));
    until("one round", PAUSED_WAIT, || {
        log.rounds.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    let entries = log.entries.lock().unwrap().clone();
    assert_eq!(entries.len(), 3, "{entries:?}");
    for (entry, has_reports, busy) in &entries {
        assert!(has_reports, "{entry} was checked within its deadline");
        assert_eq!(
            *busy, 0,
            "{entry}: another check ran while its result was handed over"
        );
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two checks at once");
}

#[tokio::test(start_paused = true)]
async fn entries_are_checked_in_parallel_up_to_the_limit() {
    let (providers, in_flight, most) = timed_providers(5, Some(Duration::from_secs(1)));
    let log = Arc::new(CheckLog {
        providers: Arc::new(providers),
        in_flight,
        entries: Mutex::new(Vec::new()),
        rounds: AtomicUsize::new(0),
    });
    let stop = CancellationToken::new();
    let settings = HostCheckSettings {
        interval: Duration::from_secs(30),
        deadline: Duration::from_secs(5),
        max_parallel_entries: 3,
    };
    let task = tokio::spawn(host_checks::run(Arc::clone(&log), settings, stop.clone()));
    until("one round", PAUSED_WAIT, || {
        log.rounds.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert_eq!(log.entries.lock().unwrap().len(), 5);
    assert_eq!(most.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_check_that_never_answers_reaches_the_driver_as_a_timeout_and_the_rounds_go_on() {
    let (providers, in_flight, _) = timed_providers(1, None);
    let log = Arc::new(CheckLog {
        providers: Arc::new(providers),
        in_flight,
        entries: Mutex::new(Vec::new()),
        rounds: AtomicUsize::new(0),
    });
    let stop = CancellationToken::new();
    let settings = HostCheckSettings {
        interval: Duration::from_secs(30),
        deadline: Duration::from_secs(5),
        max_parallel_entries: 4,
    };
    let task = tokio::spawn(host_checks::run(Arc::clone(&log), settings, stop.clone()));
    until("two rounds", PAUSED_WAIT, || {
        log.rounds.load(Ordering::SeqCst) == 2
    })
    .await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    let entries = log.entries.lock().unwrap().clone();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|(_, has_reports, _)| !has_reports));
    let check = EntryCheck {
        handle: log.providers.get("e0").unwrap().clone(),
        reports: None,
    };
    let timeouts = host_checks::timeout_reports(&check);
    assert_eq!(
        timeouts
            .iter()
            .map(|r| (r.host.as_str(), r.state))
            .collect::<Vec<_>>(),
        [("h1", HostState::Timeout), ("h2", HostState::Timeout)]
    );
}

/// A GC driver whose live set is given or refused, recording every pass.
struct GcLog {
    providers: Arc<Providers>,
    live: Mutex<Option<HashSet<ProxyUid>>>,
    asked: AtomicUsize,
    passes: AtomicUsize,
}

impl GcDriver for GcLog {
    fn providers(&self) -> Arc<Providers> {
        Arc::clone(&self.providers)
    }
    async fn live_set(&self) -> Option<HashSet<ProxyUid>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.live.lock().unwrap().clone()
    }
    fn collected(&self, report: &GcReport) {
        assert_eq!(report.entries.len(), 1, "{report}");
        self.passes.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn gc_waits_one_interval_and_skips_every_pass_without_a_complete_live_set() {
    let (providers, _, _) = timed_providers(1, Some(Duration::ZERO));
    let log = Arc::new(GcLog {
        providers: Arc::new(providers),
        live: Mutex::new(None),
        asked: AtomicUsize::new(0),
        passes: AtomicUsize::new(0),
    });
    let stop = CancellationToken::new();
    let interval = Duration::from_secs(600);
    let task = tokio::spawn(gc_worker::run(
        Arc::clone(&log),
        GcSettings::default(),
        interval,
        stop.clone(),
    ));
    tokio::time::sleep(interval - Duration::from_secs(1)).await;
    assert_eq!(
        log.asked.load(Ordering::SeqCst),
        0,
        "no pass before one interval"
    );
    until("two skipped passes", PAUSED_WAIT, || {
        log.asked.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(
        log.passes.load(Ordering::SeqCst),
        0,
        "skipped: nothing collected"
    );
    *log.live.lock().unwrap() = Some(HashSet::new());
    until("a pass", PAUSED_WAIT, || {
        log.passes.load(Ordering::SeqCst) >= 1
    })
    .await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

fn write(path: &std::path::Path, text: &str, modified: SystemTime) {
    std::fs::write(path, text).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(modified).unwrap();
}

#[test]
fn content_fingerprints_see_content_and_stamp_fingerprints_see_size_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let t1 = t0 + Duration::from_secs(60);
    write(&config, "aaaa", t0);
    let by = |compare| WatchedFiles {
        config: config.clone(),
        dirs: Vec::new(),
        compare,
    };
    let (content, stamp) = (by(Compare::Content), by(Compare::SizeAndModified));
    let (c0, s0) = (content.fingerprint(), stamp.fingerprint());
    write(&config, "aaaa", t1);
    assert_eq!(content.fingerprint(), c0, "same content, new time");
    assert_ne!(stamp.fingerprint(), s0, "same content, new time");
    write(&config, "bbbb", t0);
    assert_ne!(content.fingerprint(), c0, "new content, same size and time");
    assert_eq!(stamp.fingerprint(), s0, "new content, same size and time");
}

#[test]
fn a_key_two_levels_down_in_a_watched_directory_changes_the_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    let ssh = dir.path().join("ssh");
    std::fs::create_dir_all(ssh.join("..data")).unwrap();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    write(&config, "c", t0);
    write(&ssh.join("..data").join("id_ed25519"), "key-1", t0);
    let w = WatchedFiles {
        config,
        dirs: vec![ssh.clone()],
        compare: Compare::Content,
    };
    let before = w.fingerprint();
    write(&ssh.join("..data").join("id_ed25519"), "key-2", t0);
    assert_ne!(w.fingerprint(), before);
}

#[tokio::test]
async fn a_changed_config_reloads_once_and_a_refused_reload_keeps_the_running_providers() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(&config, "good-1").unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let reload: Reload = {
        let (config, attempts) = (config.clone(), Arc::clone(&attempts));
        Arc::new(move || {
            attempts.fetch_add(1, Ordering::SeqCst);
            let text = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
            if text.starts_with("bad") {
                return Err("refused".into());
            }
            Ok(Providers::from_handles([]))
        })
    };
    let reloaded = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let task = {
        let reloaded = Arc::clone(&reloaded);
        tokio::spawn(config_watch::run(
            WatchedFiles {
                config: config.clone(),
                dirs: Vec::new(),
                compare: Compare::Content,
            },
            Duration::from_millis(20),
            reload,
            move |_| {
                reloaded.fetch_add(1, Ordering::SeqCst);
            },
            egress_core::metrics::Metrics::new(),
            stop.clone(),
        ))
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        0,
        "the starting files are not a change"
    );
    std::fs::write(&config, "bad-1").unwrap();
    until("the refused reload", WAIT, || {
        attempts.load(Ordering::SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "an unchanged file is not retried"
    );
    assert_eq!(reloaded.load(Ordering::SeqCst), 0);
    std::fs::write(&config, "good-2").unwrap();
    until("the good reload", WAIT, || {
        reloaded.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_worker_even_one_that_ignores_its_stop_token() {
    let stop = CancellationToken::new();
    let mut workers = Tasks::new(stop.clone());
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    {
        let (a, stop) = (Arc::clone(&a), workers.stop_token());
        workers.spawn("polite", async move {
            while sleep_or_stop(Duration::from_secs(1), &stop).await {
                a.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    {
        let b = Arc::clone(&b);
        workers.spawn("deaf", async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                b.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    tokio::time::timeout(WAIT, workers.shutdown())
        .await
        .unwrap();
    assert!(stop.is_cancelled());
    let (a_at, b_at) = (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst));
    assert_eq!((a_at, b_at), (3, 3));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)),
        (a_at, b_at),
        "nothing runs after shutdown"
    );
}
