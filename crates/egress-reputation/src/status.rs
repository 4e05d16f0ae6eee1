//! What a Proxy's status shows of its egress addresses' reputation (`status.reputation`),
//! built from the [`Book`] for the Proxy's addresses.
//!
//! Guarantees: bounded (at most [`MAX_ADDRESSES`] addresses, each in at most the configured
//! zones, so at most 64 listings and 64 failures); sorted (address, then zone), so two
//! builds of the same state are equal and a status write happens only on a real change;
//! times in RFC 3339 (seconds).

use std::net::IpAddr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::book::Book;

/// Most addresses of one Proxy checked (two declared, two observed).
pub const MAX_ADDRESSES: usize = 4;

/// `status.reputation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProxyReputation {
    /// The addresses checked: the declared egress addresses and the ones the health check
    /// observed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 4)))]
    pub addresses: Vec<String>,
    /// Each listing: which address, in which zone, since when, with which answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64)))]
    pub listed: Vec<ListingStatus>,
    /// Each check that failed the last time (the blocklist refused, the resolver did not
    /// answer): nothing is known of that address in that zone meanwhile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64)))]
    pub failed: Vec<FailedCheck>,
    /// When the last check of any of the addresses ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
}

/// One listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListingStatus {
    /// The listed address.
    #[cfg_attr(feature = "schema", schemars(length(max = 45)))]
    pub address: String,
    /// The blocklist zone.
    #[cfg_attr(feature = "schema", schemars(length(max = 189)))]
    pub zone: String,
    /// When the listing was first seen (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub since: String,
    /// What the answers mean (the zone's labels, else the answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 16)))]
    pub codes: Vec<String>,
}

/// One failing check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FailedCheck {
    /// The address.
    #[cfg_attr(feature = "schema", schemars(length(max = 45)))]
    pub address: String,
    /// The blocklist zone.
    #[cfg_attr(feature = "schema", schemars(length(max = 189)))]
    pub zone: String,
    /// Since when the checks fail (RFC 3339).
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub since: String,
    /// Why, as a fixed word: `timeout`, `refused`, `servfail`, `network`, `error_answer`,
    /// `foreign_answer`, `other`.
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub reason: String,
    /// Why, for people (bounded).
    #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
    pub message: String,
}

/// What the reputation says in one word, for conditions and tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Summary {
    /// Not checked yet (or checks are off).
    Unchecked,
    /// Listed in these zones (sorted, unique).
    Listed(Vec<String>),
    /// Not listed anywhere, but some checks fail (so it may be).
    Failing,
    /// Checked everywhere, listed nowhere.
    Clean,
}

impl ProxyReputation {
    /// Builds the status of `addresses` from `book` (at most [`MAX_ADDRESSES`], duplicates
    /// folded). `None` when none of them was checked yet.
    pub fn from_book(book: &Book, addresses: &[IpAddr]) -> Option<Self> {
        let mut addrs: Vec<IpAddr> = addresses.to_vec();
        addrs.sort();
        addrs.dedup();
        addrs.truncate(MAX_ADDRESSES);
        let mut out = Self::default();
        let mut last: Option<SystemTime> = None;
        for ip in &addrs {
            out.addresses.push(ip.to_string());
            let Some(states) = book.get(ip) else {
                continue;
            };
            for (zone, s) in book.zones().iter().zip(states) {
                if let Some(t) = s.last_check {
                    last = Some(last.map_or(t, |l| l.max(t)));
                }
                if let Some(l) = &s.listed {
                    out.listed.push(ListingStatus {
                        address: ip.to_string(),
                        zone: zone.to_string(),
                        since: rfc3339(l.since),
                        codes: l.labels.iter().take(16).cloned().collect(),
                    });
                }
                if let Some(f) = &s.failure {
                    out.failed.push(FailedCheck {
                        address: ip.to_string(),
                        zone: zone.to_string(),
                        since: rfc3339(f.since),
                        reason: f.kind.label().to_owned(),
                        message: f.detail.chars().take(256).collect(),
                    });
                }
            }
        }
        let last = last?;
        out.last_check = Some(rfc3339(last));
        Some(out)
    }

    /// The one-word view.
    pub fn summary(&self) -> Summary {
        if !self.listed.is_empty() {
            let mut zones: Vec<String> = self.listed.iter().map(|l| l.zone.clone()).collect();
            zones.sort();
            zones.dedup();
            return Summary::Listed(zones);
        }
        if self.last_check.is_none() {
            return Summary::Unchecked;
        }
        if self.failed.is_empty() {
            Summary::Clean
        } else {
            Summary::Failing
        }
    }

    /// Whether `address` is listed in any zone.
    pub fn is_listed(&self, address: &str) -> bool {
        self.listed.iter().any(|l| l.address == address)
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use super::*;
    use crate::codes::{FailureKind, Verdict};
    use crate::zone::Zone;

    #[test]
    fn the_status_lists_listings_and_failures_of_the_proxys_addresses_only() {
        let zones = vec![
            Zone::parse("a.test").unwrap(),
            Zone::parse("b.test").unwrap(),
        ];
        let mut b = Book::new(zones);
        let mine: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        b.record(
            mine,
            0,
            Verdict::Listed {
                codes: vec![Ipv4Addr::new(127, 0, 0, 2)],
                labels: vec!["SBL".into()],
            },
            t,
        );
        b.record(
            mine,
            1,
            Verdict::Failed {
                kind: FailureKind::ErrorAnswer,
                detail: "127.255.255.254: open resolver".into(),
            },
            t + Duration::from_secs(1),
        );
        b.record(other, 0, Verdict::NotListed, t);
        let r = ProxyReputation::from_book(&b, &[mine, mine]).unwrap();
        assert_eq!(r.addresses, ["192.0.2.1"]);
        assert_eq!(r.listed.len(), 1);
        assert_eq!(r.listed[0].zone, "a.test");
        assert_eq!(r.listed[0].since, "2023-11-14T22:13:20Z");
        assert_eq!(r.listed[0].codes, ["SBL"]);
        assert_eq!(r.failed[0].reason, "error_answer");
        assert_eq!(r.last_check.as_deref(), Some("2023-11-14T22:13:21Z"));
        assert_eq!(r.summary(), Summary::Listed(vec!["a.test".into()]));
        let clean = ProxyReputation::from_book(&b, &[other]).unwrap();
        assert_eq!(clean.summary(), Summary::Clean);
        assert!(ProxyReputation::from_book(&b, &["192.0.2.9".parse().unwrap()]).is_none());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["listed"][0]["address"], "192.0.2.1");
        assert_eq!(json["lastCheck"], "2023-11-14T22:13:21Z");
    }
}
