//! One check round: every address in every zone, with bounded concurrency and a deadline for
//! the whole round.
//!
//! Guarantees:
//! - at most `concurrency` queries are in flight at once; the (address, zone) pairs are
//!   produced lazily, so a round's memory is the queries in flight plus what the caller keeps
//!   of each verdict, never a future per pair up front;
//! - the round ends by its deadline: a query still running then is abandoned and recorded
//!   as failed (`timeout`), and the pairs not yet started are recorded as failed without a
//!   query; every pair gets exactly one verdict, delivered to the caller's `record`;
//! - a round's cost is one query per (address, zone) pair: nothing in it depends on how
//!   many Proxies share an address.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use crate::codes::{FailureKind, Outcome, Verdict, classify};
use crate::config::ZoneSettings;
use crate::lookup::Resolver;
use crate::zone::query_name;

/// Something that answers blocklist queries: the [`Resolver`], or a stand-in in tests.
pub trait Query: Send + Sync {
    /// The outcome of the `A` query for `name`.
    fn query(&self, name: &str) -> impl Future<Output = Outcome> + Send;
}

impl Query for Resolver {
    fn query(&self, name: &str) -> impl Future<Output = Outcome> + Send {
        Resolver::query(self, name)
    }
}

/// What a round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Pairs checked (queries sent).
    pub queries: u64,
    /// Pairs whose verdict was a listing.
    pub listed: u64,
    /// Pairs not listed.
    pub not_listed: u64,
    /// Pairs whose check failed (including those the deadline cut).
    pub failed: u64,
    /// Pairs never sent because the round's deadline had passed.
    pub skipped: u64,
    /// Wall time of the round.
    pub elapsed: Duration,
}

/// Checks every address of `addresses` in every zone of `zones`, at most `concurrency`
/// queries at a time, ending by `deadline`; hands each verdict to `record(address, zone
/// index, verdict)` as it comes.
pub async fn run_round<Q, I, R>(
    query: &Q,
    zones: &[ZoneSettings],
    addresses: I,
    concurrency: usize,
    deadline: Instant,
    mut record: R,
) -> RoundReport
where
    Q: Query,
    I: IntoIterator<Item = IpAddr>,
    R: FnMut(IpAddr, usize, Verdict),
{
    let started = Instant::now();
    let pairs = addresses
        .into_iter()
        .flat_map(|ip| (0..zones.len()).map(move |z| (ip, z)));
    let mut report = RoundReport::default();
    let mut results = futures_util::stream::iter(pairs)
        .map(|(ip, zi)| async move {
            let Some(zone) = zones.get(zi) else {
                return (ip, zi, None);
            };
            if Instant::now() >= deadline {
                return (ip, zi, None);
            }
            let name = query_name(ip, &zone.zone);
            let outcome = match tokio::time::timeout_at(deadline, query.query(&name)).await {
                Ok(o) => o,
                Err(_) => Outcome::Failed(
                    FailureKind::Timeout,
                    "the check round's deadline passed before the answer".into(),
                ),
            };
            (ip, zi, Some(classify(&zone.codes, outcome)))
        })
        .buffer_unordered(concurrency.max(1));
    while let Some((ip, zi, verdict)) = results.next().await {
        let verdict = match verdict {
            Some(v) => {
                report.queries += 1;
                v
            }
            None => {
                report.skipped += 1;
                Verdict::Failed {
                    kind: FailureKind::Timeout,
                    detail: "not checked: the check round's deadline passed first".into(),
                }
            }
        };
        match &verdict {
            Verdict::Listed { .. } => report.listed += 1,
            Verdict::NotListed => report.not_listed += 1,
            Verdict::Failed { .. } => report.failed += 1,
        }
        record(ip, zi, verdict);
    }
    report.elapsed = started.elapsed();
    report
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::codes::ZoneCodes;
    use crate::zone::Zone;

    /// Answers after `delay`: listed for names starting with `2.`, else no record; counts the
    /// queries in flight and the most at once.
    struct Slow {
        delay: Duration,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Query for Slow {
        fn query(&self, name: &str) -> impl Future<Output = Outcome> + Send {
            let listed = name.starts_with("2.");
            let (now, most, delay) = (self.now.clone(), self.most.clone(), self.delay);
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                now.fetch_sub(1, Ordering::SeqCst);
                if listed {
                    Outcome::Answers(vec!["127.0.0.2".parse().unwrap()])
                } else {
                    Outcome::NoRecord
                }
            }
        }
    }

    fn zones(n: usize) -> Vec<ZoneSettings> {
        (0..n)
            .map(|i| ZoneSettings {
                zone: Zone::parse(&format!("z{i}.test")).unwrap(),
                codes: ZoneCodes::default(),
            })
            .collect()
    }

    fn addrs(n: u32) -> Vec<IpAddr> {
        (0..n)
            .map(|i| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn every_pair_gets_one_verdict_and_concurrency_is_bounded() {
        let q = Slow {
            delay: Duration::from_millis(100),
            now: Arc::default(),
            most: Arc::default(),
        };
        let mut seen: HashMap<(IpAddr, usize), Verdict> = HashMap::new();
        let report = run_round(
            &q,
            &zones(3),
            addrs(50),
            7,
            Instant::now() + Duration::from_secs(3600),
            |ip, z, v| assert!(seen.insert((ip, z), v).is_none()),
        )
        .await;
        assert_eq!(seen.len(), 150);
        assert_eq!(report.queries, 150);
        assert_eq!(report.skipped, 0);
        assert_eq!(q.most.load(Ordering::SeqCst), 7);
        // 10.0.0.2 reversed starts with "2.": listed in every zone.
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(matches!(seen[&(two, 1)], Verdict::Listed { .. }));
        assert_eq!(report.listed, 3);
        assert_eq!(report.not_listed, 147);
    }

    #[tokio::test(start_paused = true)]
    async fn the_round_ends_by_its_deadline_and_records_what_it_cut() {
        let q = Slow {
            delay: Duration::from_secs(1),
            now: Arc::default(),
            most: Arc::default(),
        };
        let start = Instant::now();
        let mut n = 0;
        let mut cut = 0;
        // 100 pairs, 10 at a time, 1 s each: 10 s of work, 2.5 s of deadline.
        let report = run_round(
            &q,
            &zones(1),
            addrs(100),
            10,
            start + Duration::from_millis(2500),
            |_, _, v| {
                n += 1;
                if let Verdict::Failed { kind, .. } = v {
                    assert_eq!(kind, FailureKind::Timeout);
                    cut += 1;
                }
            },
        )
        .await;
        assert_eq!(n, 100);
        assert!(Instant::now() - start <= Duration::from_millis(2600));
        assert_eq!(report.queries + report.skipped, 100);
        assert_eq!(report.failed, cut);
        // 20 answered in time, 10 cut in flight, the rest never sent.
        assert_eq!(report.listed + report.not_listed, 20);
        assert_eq!(report.skipped, 70);
    }
}
