//! The results: per address and zone, whether it is listed and since when, whether its check
//! fails and since when, and when it was last checked; the [`Change`]s each verdict makes;
//! counts per zone for the metrics.
//!
//! Guarantees:
//! - a failed check never ends a listing nor starts one: a listing starts with a `Listed`
//!   verdict and ends only with a `NotListed` one (a blocklist that is down or refuses the
//!   resolver does not delist anyone), and its `since` is the first `Listed` verdict's time
//!   (or a time seeded from a status written before a restart);
//! - each verdict costs O(1) (a hash lookup, an index): nothing depends on the number of
//!   addresses or Proxies; the per-zone listed counts are kept as verdicts change them, so the
//!   metrics read them without a scan;
//! - memory is bounded by the addresses of the last round times the zones: addresses that
//!   leave the fleet are dropped by [`Book::retain`] at the start of a round;
//! - a change of zones keeps the state of the zones that remain and drops the others.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;

use crate::codes::{FailureKind, Verdict};
use crate::zone::Zone;

/// A listing of one address in one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// When it was first seen listed.
    pub since: SystemTime,
    /// The answers of the last listing verdict.
    pub codes: Vec<Ipv4Addr>,
    /// Their labels.
    pub labels: Vec<String>,
}

/// A failing check of one address in one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// When the checks started failing.
    pub since: SystemTime,
    /// The last failure's kind.
    pub kind: FailureKind,
    /// The last failure's detail.
    pub detail: String,
}

/// One address in one zone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneState {
    /// The listing, while listed.
    pub listed: Option<Listing>,
    /// The failure, while the last check failed.
    pub failure: Option<Failure>,
    /// When the last check (of any outcome) ended.
    pub last_check: Option<SystemTime>,
}

/// What a verdict changed, for events and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The address became listed in the zone.
    Listed {
        /// The address.
        address: IpAddr,
        /// The zone.
        zone: Zone,
        /// The labels of the listing answers.
        labels: Vec<String>,
    },
    /// The address is no longer listed in the zone.
    Delisted {
        /// The address.
        address: IpAddr,
        /// The zone.
        zone: Zone,
        /// When the listing had started.
        since: SystemTime,
    },
    /// The checks of the address in the zone started failing.
    CheckFailing {
        /// The address.
        address: IpAddr,
        /// The zone.
        zone: Zone,
        /// Why.
        kind: FailureKind,
        /// Why, for people.
        detail: String,
    },
    /// The checks of the address in the zone answer again.
    CheckRecovered {
        /// The address.
        address: IpAddr,
        /// The zone.
        zone: Zone,
    },
}

impl Change {
    /// The address the change is about.
    pub fn address(&self) -> IpAddr {
        match self {
            Self::Listed { address, .. }
            | Self::Delisted { address, .. }
            | Self::CheckFailing { address, .. }
            | Self::CheckRecovered { address, .. } => *address,
        }
    }
}

/// Every address's results.
#[derive(Debug, Default)]
pub struct Book {
    zones: Vec<Zone>,
    entries: HashMap<IpAddr, Vec<ZoneState>>,
    /// Per zone index: addresses listed now.
    listed: Vec<u64>,
    /// Per zone index: addresses whose last check failed.
    failing: Vec<u64>,
}

impl Book {
    /// An empty book for `zones`.
    pub fn new(zones: Vec<Zone>) -> Self {
        let n = zones.len();
        Self {
            zones,
            entries: HashMap::new(),
            listed: vec![0; n],
            failing: vec![0; n],
        }
    }

    /// The zones, in the order verdicts index them.
    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    /// Replaces the zone list; the state of zones kept moves to their new index, the rest
    /// is dropped. O(addresses × zones), once per config change.
    pub fn set_zones(&mut self, zones: Vec<Zone>) {
        if zones == self.zones {
            return;
        }
        let from: Vec<Option<usize>> = zones
            .iter()
            .map(|z| self.zones.iter().position(|o| o == z))
            .collect();
        for states in self.entries.values_mut() {
            let old = std::mem::take(states);
            *states = from
                .iter()
                .map(|f| f.and_then(|i| old.get(i).cloned()).unwrap_or_default())
                .collect();
        }
        self.zones = zones;
        self.recount();
    }

    fn recount(&mut self) {
        let n = self.zones.len();
        self.listed = vec![0; n];
        self.failing = vec![0; n];
        for states in self.entries.values() {
            for (i, s) in states.iter().enumerate() {
                if s.listed.is_some()
                    && let Some(c) = self.listed.get_mut(i)
                {
                    *c += 1;
                }
                if s.failure.is_some()
                    && let Some(c) = self.failing.get_mut(i)
                {
                    *c += 1;
                }
            }
        }
    }

    /// Keeps only the addresses in `wanted` (the fleet's addresses at the start of a round).
    pub fn retain(&mut self, wanted: &HashSet<IpAddr>) {
        let before = self.entries.len();
        self.entries.retain(|ip, _| wanted.contains(ip));
        if self.entries.len() != before {
            self.recount();
        }
    }

    /// Seeds a listing known from before a restart (a status written earlier), so its
    /// `since` survives; the next verdict confirms or ends it.
    pub fn seed_listing(&mut self, address: IpAddr, zone: &Zone, since: SystemTime) {
        let Some(zi) = self.zones.iter().position(|z| z == zone) else {
            return;
        };
        let n = self.zones.len();
        let states = self
            .entries
            .entry(address)
            .or_insert_with(|| vec![ZoneState::default(); n]);
        if let Some(s) = states.get_mut(zi)
            && s.listed.is_none()
        {
            s.listed = Some(Listing {
                since,
                codes: Vec::new(),
                labels: Vec::new(),
            });
            if let Some(c) = self.listed.get_mut(zi) {
                *c += 1;
            }
        }
    }

    /// Records the verdict of `address` in zone `zi` at `now`; the change it made, if any.
    pub fn record(
        &mut self,
        address: IpAddr,
        zi: usize,
        verdict: Verdict,
        now: SystemTime,
    ) -> Option<Change> {
        let zone = self.zones.get(zi)?.clone();
        let n = self.zones.len();
        let states = self
            .entries
            .entry(address)
            .or_insert_with(|| vec![ZoneState::default(); n]);
        let s = states.get_mut(zi)?;
        s.last_check = Some(now);
        let was_failing = s.failure.is_some();
        let (change, listed_delta, failing_delta): (Option<Change>, i8, i8) = match verdict {
            Verdict::Failed { kind, detail } => {
                let change = (!was_failing).then(|| Change::CheckFailing {
                    address,
                    zone,
                    kind,
                    detail: detail.clone(),
                });
                let since = s.failure.as_ref().map_or(now, |f| f.since);
                s.failure = Some(Failure {
                    since,
                    kind,
                    detail,
                });
                (change, 0, i8::from(!was_failing))
            }
            Verdict::Listed { codes, labels } => {
                s.failure = None;
                let fail_delta = -i8::from(was_failing);
                match &mut s.listed {
                    Some(l) => {
                        l.codes = codes;
                        l.labels = labels;
                        (None, 0, fail_delta)
                    }
                    None => {
                        s.listed = Some(Listing {
                            since: now,
                            codes,
                            labels: labels.clone(),
                        });
                        (
                            Some(Change::Listed {
                                address,
                                zone,
                                labels,
                            }),
                            1,
                            fail_delta,
                        )
                    }
                }
            }
            Verdict::NotListed => {
                s.failure = None;
                let fail_delta = -i8::from(was_failing);
                match s.listed.take() {
                    Some(l) => (
                        Some(Change::Delisted {
                            address,
                            zone,
                            since: l.since,
                        }),
                        -1,
                        fail_delta,
                    ),
                    None if was_failing => (
                        Some(Change::CheckRecovered { address, zone }),
                        0,
                        fail_delta,
                    ),
                    None => (None, 0, fail_delta),
                }
            }
        };
        if let Some(c) = self.listed.get_mut(zi) {
            *c = c.saturating_add_signed(i64::from(listed_delta));
        }
        if let Some(c) = self.failing.get_mut(zi) {
            *c = c.saturating_add_signed(i64::from(failing_delta));
        }
        change
    }

    /// The state of `address`, per zone (in [`Self::zones`] order), if it was ever checked.
    pub fn get(&self, address: &IpAddr) -> Option<&[ZoneState]> {
        self.entries.get(address).map(Vec::as_slice)
    }

    /// Per zone: the addresses listed there now.
    pub fn listed_counts(&self) -> impl Iterator<Item = (&Zone, u64)> {
        self.zones.iter().zip(self.listed.iter().copied())
    }

    /// Per zone: the addresses whose last check there failed.
    pub fn failing_counts(&self) -> impl Iterator<Item = (&Zone, u64)> {
        self.zones.iter().zip(self.failing.iter().copied())
    }

    /// Addresses in the book.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the book is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn listed() -> Verdict {
        Verdict::Listed {
            codes: vec![Ipv4Addr::new(127, 0, 0, 2)],
            labels: vec!["SBL".into()],
        }
    }

    fn failed() -> Verdict {
        Verdict::Failed {
            kind: FailureKind::ErrorAnswer,
            detail: "127.255.255.254".into(),
        }
    }

    fn zones() -> Vec<Zone> {
        vec![
            Zone::parse("a.test").unwrap(),
            Zone::parse("b.test").unwrap(),
        ]
    }

    #[test]
    fn a_listing_starts_once_and_ends_only_with_a_clean_answer() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mut b = Book::new(zones());
        assert!(matches!(
            b.record(ip, 0, listed(), t(10)),
            Some(Change::Listed { .. })
        ));
        assert_eq!(b.record(ip, 0, listed(), t(20)), None);
        // A failed check neither ends the listing nor moves its start.
        assert!(matches!(
            b.record(ip, 0, failed(), t(30)),
            Some(Change::CheckFailing { .. })
        ));
        assert_eq!(b.record(ip, 0, failed(), t(35)), None);
        let s = &b.get(&ip).unwrap()[0];
        assert_eq!(s.listed.as_ref().unwrap().since, t(10));
        assert_eq!(s.failure.as_ref().unwrap().since, t(30));
        assert_eq!(
            b.listed_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [1, 0]
        );
        assert_eq!(
            b.failing_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [1, 0]
        );
        assert!(matches!(
            b.record(ip, 0, Verdict::NotListed, t(40)),
            Some(Change::Delisted { since, .. }) if since == t(10)
        ));
        assert_eq!(
            b.listed_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [0, 0]
        );
        assert_eq!(
            b.failing_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [0, 0]
        );
        assert_eq!(b.get(&ip).unwrap()[0].last_check, Some(t(40)));
    }

    #[test]
    fn a_failure_alone_never_lists_and_recovers_quietly() {
        let ip: IpAddr = "2001:db8::7".parse().unwrap();
        let mut b = Book::new(zones());
        b.record(ip, 1, failed(), t(1));
        assert!(b.get(&ip).unwrap()[1].listed.is_none());
        assert!(matches!(
            b.record(ip, 1, Verdict::NotListed, t(2)),
            Some(Change::CheckRecovered { .. })
        ));
        assert_eq!(b.record(ip, 1, Verdict::NotListed, t(3)), None);
    }

    #[test]
    fn retain_and_zone_changes_keep_counts_right() {
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        let mut b = Book::new(zones());
        b.record(a, 0, listed(), t(1));
        b.record(a, 1, listed(), t(1));
        b.record(c, 1, listed(), t(1));
        assert_eq!(
            b.listed_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [1, 2]
        );
        b.retain(&HashSet::from([c]));
        assert_eq!(b.len(), 1);
        assert_eq!(
            b.listed_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [0, 1]
        );
        // b.test moves to index 0, a.test goes, c.test comes.
        b.set_zones(vec![
            Zone::parse("b.test").unwrap(),
            Zone::parse("c.test").unwrap(),
        ]);
        assert_eq!(
            b.listed_counts().map(|(_, n)| n).collect::<Vec<_>>(),
            [1, 0]
        );
        assert_eq!(b.get(&c).unwrap()[0].listed.as_ref().unwrap().since, t(1));
    }

    #[test]
    fn a_seeded_listing_keeps_its_start() {
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let mut b = Book::new(zones());
        b.seed_listing(a, &zones()[0], t(5));
        assert_eq!(b.record(a, 0, listed(), t(100)), None);
        assert_eq!(b.get(&a).unwrap()[0].listed.as_ref().unwrap().since, t(5));
        assert_eq!(b.listed_counts().next().unwrap().1, 1);
    }
}
