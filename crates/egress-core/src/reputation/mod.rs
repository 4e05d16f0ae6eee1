//! Egress address reputation in the operator: the [`ReputationService`] both drivers share
//! (the settings in effect, the results book, the resolver, the metrics), the addresses each
//! Proxy is checked at ([`addresses_of`]), and what a round's results do to a Proxy's status
//! ([`apply_to_status`]: `status.reputation`, the `Listed` condition, the Event of a change).
//! The check engine itself (zones, answers, queries, rounds) is the `egress-reputation`
//! crate; the worker that runs a round every `interval` is
//! [`crate::background::reputation`].
//!
//! Guarantees:
//! - the addresses checked are the ones the operator itself knows: the declared egress
//!   addresses the provider reported and the egress the health check observed through the
//!   proxy — never an address read back from a status someone else may write;
//! - one round queries each distinct address once per zone, however many Proxies share it;
//!   building one Proxy's view costs O(its addresses × zones), independent of the fleet;
//! - no lock is held across a query: the book's std mutex is taken per verdict and per view.

mod apply;
pub mod metrics;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use egress_provider::ProxyUid;
use egress_reputation::book::{Book, Change};
use egress_reputation::config::Settings;
use egress_reputation::round::RoundReport;
use egress_reputation::{Resolver, run_round};
use tokio::time::Instant;

pub use self::apply::{apply_to_status, reason};
use self::metrics::ReputationMetrics;
use crate::health::ProxyHealth;
/// The check engine (zones, answers, queries, rounds, the results book).
pub use egress_reputation as engine;
pub use egress_reputation::ProxyReputation;

/// One Proxy to check: its key and the addresses it is seen at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReputationTarget {
    /// The Proxy.
    pub uid: ProxyUid,
    /// `namespace/name`, for logs.
    pub key: String,
    /// Its declared and observed egress addresses (see [`addresses_of`]).
    pub addresses: Vec<IpAddr>,
}

/// The addresses a Proxy is checked at: the declared egress addresses its instance holds
/// (as the provider reported them) and the egress addresses the health check observed
/// through it, each once, in that order, at most four.
pub fn addresses_of(declared: &[IpAddr], health: Option<&ProxyHealth>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(4);
    let observed = health
        .map(|h| h.egress_ips.iter().copied().chain(h.egress_ip))
        .into_iter()
        .flatten();
    for a in declared.iter().copied().chain(observed) {
        if !out.contains(&a) && out.len() < egress_reputation::status::MAX_ADDRESSES {
            out.push(a);
        }
    }
    out
}

/// The addresses Proxy `uid` is checked at, as this process knows them: the declared egress
/// addresses `controller` holds for its instance and the egress `health` (the proxy health
/// engine, when health checks are on) observed through it ([`addresses_of`]). Both drivers
/// use it, so both check the same addresses.
pub fn proxy_addresses(
    controller: &crate::controller::Controller,
    health: Option<&crate::health::HealthEngine>,
    uid: &ProxyUid,
) -> Vec<IpAddr> {
    let observed = health.and_then(|e| e.get(uid));
    addresses_of(&controller.declared_egress(uid), observed.as_ref())
}

/// What a round did, for the driver.
#[derive(Debug, Clone, Default)]
pub struct RoundDone {
    /// The verdicts that changed an address's state.
    pub changes: Vec<Change>,
    /// The round's counts.
    pub report: RoundReport,
}

/// The reputation checks' shared state. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct ReputationService {
    settings: RwLock<Arc<Settings>>,
    /// The resolver built for the settings it was built with (rebuilt when they change).
    resolver: Mutex<Option<(Arc<Settings>, Resolver)>>,
    book: Mutex<Book>,
    metrics: ReputationMetrics,
    last_round: Mutex<Option<SystemTime>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ReputationService {
    /// A service with `settings` in effect, reporting into `metrics`.
    pub fn new(settings: Settings, metrics: ReputationMetrics) -> Self {
        let zones = settings.zones.iter().map(|z| z.zone.clone()).collect();
        metrics.set_zones(&settings);
        Self {
            settings: RwLock::new(Arc::new(settings)),
            resolver: Mutex::new(None),
            book: Mutex::new(Book::new(zones)),
            metrics,
            last_round: Mutex::new(None),
        }
    }

    /// The settings in effect.
    pub fn settings(&self) -> Arc<Settings> {
        Arc::clone(&self.settings.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether checks run (some zone is configured).
    pub fn enabled(&self) -> bool {
        self.settings().enabled()
    }

    /// Puts new settings in effect (a config reload); the book keeps the zones that remain.
    pub fn set_settings(&self, settings: Settings) {
        if *self.settings() == settings {
            return;
        }
        let zones = settings.zones.iter().map(|z| z.zone.clone()).collect();
        self.metrics.set_zones(&settings);
        lock(&self.book).set_zones(zones);
        *self
            .settings
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(settings);
    }

    /// The metrics.
    pub fn metrics(&self) -> &ReputationMetrics {
        &self.metrics
    }

    /// When the last round ended.
    pub fn last_round(&self) -> Option<SystemTime> {
        *lock(&self.last_round)
    }

    /// The status view of `addresses` (`None` before their first check or with checks off).
    pub fn view(&self, addresses: &[IpAddr]) -> Option<ProxyReputation> {
        if !self.enabled() {
            return None;
        }
        ProxyReputation::from_book(&lock(&self.book), addresses)
    }

    /// The status view of Proxy `uid`'s addresses ([`proxy_addresses`]); `None` with checks
    /// off or before their first check.
    pub fn proxy_view(
        &self,
        controller: &crate::controller::Controller,
        health: Option<&crate::health::HealthEngine>,
        uid: &ProxyUid,
    ) -> Option<ProxyReputation> {
        if !self.enabled() {
            return None;
        }
        self.view(&proxy_addresses(controller, health, uid))
    }

    /// Seeds the listings a Proxy's stored status shows (written before a restart), so their
    /// `since` survives the restart.
    pub fn seed(&self, status: &ProxyReputation) {
        let mut book = lock(&self.book);
        for l in &status.listed {
            let (Ok(ip), Ok(zone)) = (
                l.address.parse::<IpAddr>(),
                egress_reputation::zone::Zone::parse(&l.zone),
            ) else {
                continue;
            };
            if let Ok(since) = humantime::parse_rfc3339(&l.since) {
                book.seed_listing(ip, &zone, since);
            }
        }
    }

    fn resolver(&self, settings: &Arc<Settings>) -> Option<Resolver> {
        let mut r = lock(&self.resolver);
        if let Some((s, res)) = r.as_ref()
            && s == settings
        {
            return Some(res.clone());
        }
        match Resolver::new(&settings.resolvers, settings.timeout, settings.concurrency) {
            Ok(res) => {
                *r = Some((Arc::clone(settings), res.clone()));
                Some(res)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reputation checks skipped");
                None
            }
        }
    }

    /// One round over `targets` (nothing when checks are off): every distinct address in
    /// every zone, bounded by the settings' concurrency and by `interval` as the round's
    /// deadline. Records each verdict in the book and the metrics; forgets addresses no
    /// target has any more.
    pub async fn round(&self, targets: &[ReputationTarget]) -> Option<RoundDone> {
        let wanted: HashSet<IpAddr> = targets
            .iter()
            .flat_map(|t| t.addresses.iter().copied())
            .collect();
        lock(&self.book).retain(&wanted);
        self.check(wanted).await
    }

    /// A round over the addresses of `targets` never checked yet (a new Proxy's, a changed
    /// egress): they are known within a poll instead of an interval. `None` when there are
    /// none (or checks are off).
    pub async fn round_new(&self, targets: &[ReputationTarget]) -> Option<RoundDone> {
        let fresh: HashSet<IpAddr> = {
            let book = lock(&self.book);
            targets
                .iter()
                .flat_map(|t| t.addresses.iter().copied())
                .filter(|a| book.get(a).is_none())
                .collect()
        };
        if fresh.is_empty() {
            return None;
        }
        self.check(fresh).await
    }

    async fn check(&self, wanted: HashSet<IpAddr>) -> Option<RoundDone> {
        let settings = self.settings();
        if !settings.enabled() {
            return None;
        }
        let resolver = self.resolver(&settings)?;
        let deadline = Instant::now() + settings.interval;
        let mut changes = Vec::new();
        let report = run_round(
            &resolver,
            &settings.zones,
            wanted.iter().copied(),
            settings.concurrency,
            deadline,
            |address, zi, verdict| {
                if let Some(z) = settings.zones.get(zi) {
                    self.metrics.checked(z.zone.as_str(), &verdict);
                }
                if let Some(c) = lock(&self.book).record(address, zi, verdict, SystemTime::now()) {
                    changes.push(c);
                }
            },
        )
        .await;
        {
            let book = lock(&self.book);
            self.metrics.round_done(&book, report.elapsed);
        }
        *lock(&self.last_round) = Some(SystemTime::now());
        Some(RoundDone { changes, report })
    }
}

#[cfg(test)]
mod tests;
