//! The fleet page's short memory: per host, the last hour of "is the host Ready" and "how many
//! of its proxies are ready"; per ProxyPool, the last hour of "are all its members available"
//! and "how many are". Kept in memory and drawn as sparklines by [`crate::page`].
//!
//! Guarantees:
//! - **Bounded**: each series is a ring of at most [`HISTORY_SAMPLES`] samples, and at most
//!   [`MAX_SERIES`] series are kept (hosts first, then pools); a series whose host or pool left
//!   the status document is dropped at the next sample. Memory is O((hosts + pools) ×
//!   [`HISTORY_SAMPLES`]) whatever the number of proxies or of events.
//! - **Sampled, not event-driven**: [`run_sampler`] takes one sample every
//!   [`SAMPLE_INTERVAL`] from the same rows `/status` serves. A sample is one pass over the
//!   rows to count ready proxies per host, then O(hosts + pools) ring writes (a pool's sample
//!   is its status row's counts); nothing is done per reconcile or per health event. When the driver hands out the rows a chunk at a time
//!   ([`Endpoints::status_outline`]), the pass reads them that way and holds only the counts
//!   (O(hosts)), not the fleet's rows ([`sample`]).
//! - **Pure reads**: [`History::snapshot`] copies the rings out under a short lock; the page is
//!   rendered from the copy, never while holding the lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use egress_core::model::Phase;
use egress_provider::sync::lock;

use crate::endpoints::Endpoints;
use crate::status::{HostStatusRow, ProxyStatusRow, StatusDocument, entry_of};

/// Time between two samples.
// NB: the page shows "the last hour"; one sample a minute gives a readable 60-point
// sparkline and costs one status document per minute, the same as one page view.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(60);
/// Samples kept per series (one hour at [`SAMPLE_INTERVAL`]).
pub const HISTORY_SAMPLES: usize = 60;
/// Most series kept at once.
// NB: one series per configured host; 1024 hosts is far beyond a single operator's fleet and
// bounds the memory at ~1024 × 60 × 16 bytes ≈ 1 MiB even for a config gone wild.
pub const MAX_SERIES: usize = 1024;

/// What a series is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SeriesKey {
    /// A host of a provider entry: `(entry, host)`.
    Host(String, String),
    /// A ProxyPool: `(namespace, name)`.
    Pool(String, String),
}

/// One sample of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was taken (seconds since the Unix epoch).
    pub at_unix: u64,
    /// Whether the host was `Ready` (checked and accepting proxies); for a pool, whether all
    /// the members it wants were available.
    pub up: bool,
    /// Proxies placed there that were ready (Running and, when health checks run, healthy);
    /// for a pool, its available members.
    pub ready: u32,
    /// Proxies placed there in any phase; for a pool, the members it wants.
    pub total: u32,
}

/// A copy of every series, oldest sample first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistorySnapshot {
    /// The series by key.
    pub series: BTreeMap<SeriesKey, Vec<Sample>>,
}

impl HistorySnapshot {
    /// The samples of one host (empty when there are none).
    pub fn host(&self, entry: &str, host: &str) -> &[Sample] {
        self.series
            .get(&SeriesKey::Host(entry.to_owned(), host.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    /// The samples of one pool (empty when there are none).
    pub fn pool(&self, namespace: &str, name: &str) -> &[Sample] {
        self.series
            .get(&SeriesKey::Pool(namespace.to_owned(), name.to_owned()))
            .map_or(&[], Vec::as_slice)
    }
}

/// The rings, shared by the sampler (writer) and the page (reader).
#[derive(Debug, Default)]
pub struct History {
    series: Mutex<BTreeMap<SeriesKey, VecDeque<Sample>>>,
}

/// Whether a proxy row counts as ready: Running, and healthy when the health engine decided.
///
/// NB: without health checks (`health` absent or undecided) a Running proxy counts, which is
/// what `/status`'s phase says; with them, an unhealthy one does not.
pub fn is_ready(phase: Phase, healthy: Option<bool>) -> bool {
    phase == Phase::Running && healthy != Some(false)
}

/// `(ready, total)` proxies per host row of `doc`, keyed by `(entry, host)`: one pass over the
/// rows. A proxy counts for its entry's host (from its provider ID); one without a provider ID
/// yet counts for every entry's host of that name.
pub fn proxy_counts(doc: &StatusDocument) -> BTreeMap<(String, String), (u32, u32)> {
    let mut counter = ProxyCounter::default();
    counter.add(&doc.proxies);
    counter.per_host(&doc.hosts)
}

/// [`proxy_counts`] fed a chunk of rows at a time: O(distinct (entry, host)) memory.
#[derive(Debug, Default)]
pub struct ProxyCounter {
    by: BTreeMap<(Option<String>, String), (u32, u32)>,
}

impl ProxyCounter {
    /// Counts `rows`. O(rows × log hosts).
    pub fn add(&mut self, rows: &[ProxyStatusRow]) {
        for p in rows {
            if let Some(h) = p.host.as_deref() {
                let key = (entry_of(p).map(str::to_owned), h.to_owned());
                let c = self.by.entry(key).or_insert((0, 0));
                c.1 = c.1.saturating_add(1);
                if is_ready(p.phase, p.health.as_ref().and_then(|h| h.healthy)) {
                    c.0 = c.0.saturating_add(1);
                }
            }
        }
    }

    /// `(ready, total)` per host row of `hosts`, keyed by `(entry, host)`.
    pub fn per_host(&self, hosts: &[HostStatusRow]) -> BTreeMap<(String, String), (u32, u32)> {
        hosts
            .iter()
            .map(|h| {
                let own = self
                    .by
                    .get(&(Some(h.entry.clone()), h.host.clone()))
                    .copied()
                    .unwrap_or((0, 0));
                let any = self
                    .by
                    .get(&(None, h.host.clone()))
                    .copied()
                    .unwrap_or((0, 0));
                (
                    (h.entry.clone(), h.host.clone()),
                    (own.0.saturating_add(any.0), own.1.saturating_add(any.1)),
                )
            })
            .collect()
    }
}

/// The samples `doc` gives, one per host row and one per pool row (series beyond
/// [`MAX_SERIES`] are left out, pools first).
pub fn samples_of(doc: &StatusDocument, at: SystemTime) -> BTreeMap<SeriesKey, Sample> {
    samples_from(&doc.hosts, &proxy_counts(doc), &doc.pools, at)
}

/// A pool's sample from its status row: available of desired members, `up` when all are.
pub fn pool_sample(p: &crate::status::PoolStatusRow, at_unix: u64) -> Sample {
    Sample {
        at_unix,
        up: p.status.available_replicas >= p.desired,
        ready: p.status.available_replicas,
        total: p.desired,
    }
}

/// [`samples_of`] `ep`'s status: its rows read a chunk at a time when the driver has an
/// outline ([`Endpoints::status_outline`]), so only the counts are held, else its whole
/// document.
pub fn sample(ep: &dyn Endpoints, at: SystemTime) -> BTreeMap<SeriesKey, Sample> {
    let Some((outline, uids)) = ep.status_outline() else {
        return samples_of(&ep.status(), at);
    };
    let mut counter = ProxyCounter::default();
    for chunk in uids.chunks(crate::stream::CHUNK_ROWS) {
        counter.add(&ep.status_rows(chunk));
    }
    samples_from(
        &outline.hosts,
        &counter.per_host(&outline.hosts),
        &outline.pools,
        at,
    )
}

fn samples_from(
    hosts: &[HostStatusRow],
    counts: &BTreeMap<(String, String), (u32, u32)>,
    pools: &[crate::status::PoolStatusRow],
    at: SystemTime,
) -> BTreeMap<SeriesKey, Sample> {
    let at_unix = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    hosts
        .iter()
        .take(MAX_SERIES)
        .map(|h| {
            let (ready, total) = counts
                .get(&(h.entry.clone(), h.host.clone()))
                .copied()
                .unwrap_or((0, 0));
            (
                SeriesKey::Host(h.entry.clone(), h.host.clone()),
                Sample {
                    at_unix,
                    up: h.state == "Ready",
                    ready,
                    total,
                },
            )
        })
        .chain(pools.iter().map(|p| {
            (
                SeriesKey::Pool(p.namespace.clone(), p.name.clone()),
                pool_sample(p, at_unix),
            )
        }))
        .take(MAX_SERIES)
        .collect()
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one sample per host and per pool of `doc`; drops the oldest sample of a full
    /// ring and every series whose host or pool is no longer in `doc`.
    pub fn record(&self, doc: &StatusDocument, at: SystemTime) {
        self.record_samples(samples_of(doc, at));
    }

    /// Appends `samples` (one per host and pool, [`sample`]) as [`History::record`] does.
    pub fn record_samples(&self, samples: BTreeMap<SeriesKey, Sample>) {
        let mut series = lock(&self.series);
        series.retain(|k, _| samples.contains_key(k));
        for (k, s) in samples {
            let ring = series
                .entry(k)
                .or_insert_with(|| VecDeque::with_capacity(HISTORY_SAMPLES));
            while ring.len() >= HISTORY_SAMPLES {
                ring.pop_front();
            }
            ring.push_back(s);
        }
    }

    /// A copy of every series.
    pub fn snapshot(&self) -> HistorySnapshot {
        let series = lock(&self.series);
        HistorySnapshot {
            series: series
                .iter()
                .map(|(k, v)| (k.clone(), v.iter().copied().collect()))
                .collect(),
        }
    }
}

/// Records a sample of `ep`'s status document at once and then every `interval`, until `stop`
/// fires.
pub async fn run_sampler(
    ep: Arc<dyn Endpoints>,
    history: Arc<History>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // NB: reading the rows is synchronous and short (snapshots under the driver's locks);
        // it runs on this task like a page request would.
        history.record_samples(sample(ep.as_ref(), SystemTime::now()));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::status::HostStatusRow;
    use egress_core::model::HealthStatus;

    fn host(name: &str, state: &str) -> HostStatusRow {
        HostStatusRow {
            entry: "e".into(),
            host: name.into(),
            state: state.into(),
            latency_ms: None,
            error: None,
            maintenance: None,
            addresses: Vec::new(),
            fenced: None,
        }
    }

    fn proxy(name: &str, host: &str, phase: Phase, healthy: Option<bool>) -> ProxyStatusRow {
        ProxyStatusRow {
            namespace: "default".into(),
            name: name.into(),
            uid: name.into(),
            phase,
            host: Some(host.into()),
            ip: None,
            provider_id: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: None,
            conditions: vec![],
            port: None,
            health: healthy.map(|h| HealthStatus {
                healthy: Some(h),
                ..HealthStatus::default()
            }),
            reputation: None,
            egress_address: Vec::new(),
        }
    }

    fn doc(hosts: Vec<HostStatusRow>, proxies: Vec<ProxyStatusRow>) -> StatusDocument {
        StatusDocument {
            generated_at: "t".into(),
            proxies,
            hosts,
            manifest_errors: vec![],
            pools: vec![],
        }
    }

    #[test]
    fn a_sample_counts_ready_proxies_per_host_and_the_host_state() {
        let d = doc(
            vec![host("h1", "Ready"), host("h2", "Degraded")],
            vec![
                proxy("a", "h1", Phase::Running, Some(true)),
                proxy("b", "h1", Phase::Running, Some(false)),
                proxy("c", "h1", Phase::Running, None),
                proxy("d", "h2", Phase::Pending, None),
            ],
        );
        let s = samples_of(&d, SystemTime::UNIX_EPOCH + Duration::from_secs(7));
        let h1 = s[&SeriesKey::Host("e".into(), "h1".into())];
        assert_eq!((h1.up, h1.ready, h1.total, h1.at_unix), (true, 2, 3, 7));
        let h2 = s[&SeriesKey::Host("e".into(), "h2".into())];
        assert_eq!((h2.up, h2.ready, h2.total), (false, 0, 1));
    }

    #[test]
    fn each_ring_keeps_only_the_last_hour_and_gone_hosts_are_dropped() {
        let h = History::new();
        let d = doc(vec![host("h1", "Ready"), host("h2", "Ready")], vec![]);
        for i in 0..(HISTORY_SAMPLES as u64 + 25) {
            h.record(&d, SystemTime::UNIX_EPOCH + Duration::from_secs(i));
        }
        let snap = h.snapshot();
        let s = snap.host("e", "h1");
        assert_eq!(s.len(), HISTORY_SAMPLES);
        assert_eq!(s[0].at_unix, 25, "the oldest samples went first");
        assert_eq!(s[HISTORY_SAMPLES - 1].at_unix, HISTORY_SAMPLES as u64 + 24);
        h.record(
            &doc(vec![host("h1", "Ready")], vec![]),
            SystemTime::UNIX_EPOCH,
        );
        let snap = h.snapshot();
        assert!(snap.host("e", "h2").is_empty(), "h2 left the document");
        assert_eq!(snap.series.len(), 1);
    }

    #[test]
    fn each_pool_gets_a_series_of_available_of_desired_members_and_a_gone_pool_is_dropped() {
        let pool = |name: &str, desired: u32, available: u32| crate::status::PoolStatusRow {
            namespace: "team".into(),
            name: name.into(),
            desired,
            status: egress_core::pool::ProxyPoolStatus {
                available_replicas: available,
                ..Default::default()
            },
            members: vec![],
            error: None,
        };
        let h = History::new();
        let mut d = doc(vec![host("h1", "Ready")], vec![]);
        d.pools = vec![pool("web", 3, 1), pool("api", 2, 2)];
        h.record(&d, SystemTime::UNIX_EPOCH + Duration::from_secs(60));
        d.pools = vec![pool("web", 3, 3)];
        h.record(&d, SystemTime::UNIX_EPOCH + Duration::from_secs(120));
        let snap = h.snapshot();
        let web: Vec<(bool, u32, u32, u64)> = snap
            .pool("team", "web")
            .iter()
            .map(|s| (s.up, s.ready, s.total, s.at_unix))
            .collect();
        assert_eq!(web, [(false, 1, 3, 60), (true, 3, 3, 120)]);
        assert!(snap.pool("team", "api").is_empty(), "api left the document");
        assert_eq!(snap.host("e", "h1").len(), 2, "hosts keep their series");
    }

    #[test]
    fn the_number_of_series_is_capped() {
        let h = History::new();
        let hosts = (0..MAX_SERIES + 10)
            .map(|i| host(&format!("h{i}"), "Ready"))
            .collect();
        h.record(&doc(hosts, vec![]), SystemTime::UNIX_EPOCH);
        assert_eq!(h.snapshot().series.len(), MAX_SERIES);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_samples_at_once_then_every_interval_and_stops() {
        struct One;
        impl Endpoints for One {
            fn status(&self) -> StatusDocument {
                doc(vec![host("h1", "Ready")], vec![])
            }
            fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
                String::new()
            }
            fn ready(&self) -> bool {
                true
            }
        }
        let h = Arc::new(History::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_sampler(
            Arc::new(One),
            Arc::clone(&h),
            SAMPLE_INTERVAL,
            stop.clone(),
        ));
        tokio::time::sleep(SAMPLE_INTERVAL * 3 + Duration::from_secs(1)).await;
        assert_eq!(h.snapshot().host("e", "h1").len(), 4);
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
