//! The check engine against a real authoritative DNS server (nsd, `.ci/setup-host`) serving
//! test blocklist zones on a private port of 127.0.0.1: listings, non-listings, the
//! blocklists' error answers (127.255.255.252/254/255), answers outside 127.0.0.0/8, a zone
//! the server refuses, a resolver that never answers and one that went away.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime};

use egress_reputation::book::Book;
use egress_reputation::codes::{FailureKind, Verdict};
use egress_reputation::config::{RawReputation, Settings, validate};
use egress_reputation::status::{ProxyReputation, Summary};
use egress_reputation::{Resolver, run_round};
use ep_test_support::nsd::{Nsd, TestZone};
use tokio::time::Instant;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn code(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn settings(resolver: SocketAddr, zones: &str, timeout: &str) -> Settings {
    let yaml =
        format!("resolvers: ['{resolver}']\ntimeout: {timeout}\nconcurrency: 4\nzones:\n{zones}");
    let raw: RawReputation = serde_saphyr::from_str(&yaml).unwrap();
    let (s, w) = validate(&raw);
    assert!(w.is_empty(), "{w:?}");
    s.unwrap()
}

const ZONES: &str = "\
- name: bl.test
  codes:
  - {answer: 127.0.0.2, means: listed, label: SBL}
  - {answer: 127.0.0.4-127.0.0.7, means: listed, label: XBL}
  - {answer: 127.0.0.10/31, means: notListed, label: PBL}
- name: other.test
- name: absent.test
";

/// Every (address, zone) verdict of one round.
async fn round(s: &Settings, addrs: &[IpAddr]) -> HashMap<(IpAddr, usize), Verdict> {
    let resolver = Resolver::new(&s.resolvers, s.timeout, s.concurrency).unwrap();
    let mut out = HashMap::new();
    let report = run_round(
        &resolver,
        &s.zones,
        addrs.iter().copied(),
        s.concurrency,
        Instant::now() + Duration::from_secs(60),
        |a, z, v| {
            assert!(out.insert((a, z), v).is_none());
        },
    )
    .await;
    assert_eq!(report.queries as usize, addrs.len() * s.zones.len());
    out
}

fn failed(v: &Verdict) -> FailureKind {
    match v {
        Verdict::Failed { kind, .. } => *kind,
        other => panic!("expected a failed check, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_dns_server_s_answers_are_each_classified() {
    let bl = TestZone::new("bl.test")
        .list(ip("192.0.2.1"), code("127.0.0.2"))
        .list(ip("192.0.2.3"), code("127.255.255.254"))
        .list(ip("192.0.2.4"), code("127.255.255.252"))
        .list(ip("192.0.2.5"), code("127.255.255.255"))
        .list(ip("192.0.2.6"), code("10.0.0.1"))
        .list(ip("192.0.2.7"), code("127.0.0.10"))
        .list(ip("192.0.2.8"), code("127.0.0.2"))
        .list(ip("192.0.2.8"), code("127.0.0.5"))
        // Listed, but one answer is an error code: the whole check failed.
        .list(ip("192.0.2.10"), code("127.0.0.2"))
        .list(ip("192.0.2.10"), code("127.255.255.254"))
        // The name exists with a TXT record only: no A record, not listed.
        .line("9.2.0.192 IN TXT \"no A here\"")
        .list(ip("2001:db8::1"), code("127.0.0.2"));
    let other = TestZone::new("other.test").list(ip("192.0.2.2"), code("127.0.0.3"));
    let nsd = Nsd::start(None, &[bl, other]);
    let s = settings(nsd.addr(), ZONES, "3s");
    let addrs: Vec<IpAddr> = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "192.0.2.5",
        "192.0.2.6",
        "192.0.2.7",
        "192.0.2.8",
        "192.0.2.9",
        "192.0.2.10",
        "2001:db8::1",
        "2001:db8::2",
    ]
    .into_iter()
    .map(ip)
    .collect();
    let v = round(&s, &addrs).await;
    let at = |a: &str, z: usize| v[&(ip(a), z)].clone();

    assert_eq!(
        at("192.0.2.1", 0),
        Verdict::Listed {
            codes: vec![code("127.0.0.2")],
            labels: vec!["SBL".into()]
        }
    );
    assert_eq!(at("192.0.2.1", 1), Verdict::NotListed);
    assert_eq!(at("192.0.2.2", 0), Verdict::NotListed);
    // A zone without a table: RFC 5782's rule, any 127/8 answer is a listing.
    assert_eq!(
        at("192.0.2.2", 1),
        Verdict::Listed {
            codes: vec![code("127.0.0.3")],
            labels: vec!["127.0.0.3".into()]
        }
    );
    for (a, word) in [
        ("192.0.2.3", "public or open resolver"),
        ("192.0.2.4", "typing error"),
        ("192.0.2.5", "over quota"),
        ("192.0.2.10", "public or open resolver"),
    ] {
        match at(a, 0) {
            Verdict::Failed {
                kind: FailureKind::ErrorAnswer,
                detail,
            } => assert!(detail.contains(word), "{a}: {detail}"),
            other => panic!("{a}: {other:?}"),
        }
    }
    assert_eq!(failed(&at("192.0.2.6", 0)), FailureKind::ForeignAnswer);
    assert_eq!(
        at("192.0.2.7", 0),
        Verdict::NotListed,
        "PBL is notListed here"
    );
    assert_eq!(
        at("192.0.2.8", 0),
        Verdict::Listed {
            codes: vec![code("127.0.0.2"), code("127.0.0.5")],
            labels: vec!["SBL".into(), "XBL".into()]
        }
    );
    assert_eq!(at("192.0.2.9", 0), Verdict::NotListed, "NODATA");
    assert!(matches!(at("2001:db8::1", 0), Verdict::Listed { .. }));
    assert_eq!(at("2001:db8::2", 0), Verdict::NotListed);
    // nsd serves no absent.test: it refuses, and that is a failed check for every address.
    for a in &addrs {
        assert_eq!(failed(&v[&(*a, 2)]), FailureKind::Refused, "{a}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_that_never_answers_is_a_failed_check_within_the_timeout() {
    // A socket that reads nothing: queries vanish.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let s = settings(silent.local_addr().unwrap(), "- name: bl.test\n", "1s");
    let started = std::time::Instant::now();
    let v = round(&s, &[ip("192.0.2.1"), ip("2001:db8::1")]).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    for verdict in v.values() {
        assert_eq!(failed(verdict), FailureKind::Timeout);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_went_away_neither_lists_nor_delists() {
    let a = ip("198.51.100.7");
    let mut nsd = Nsd::start(None, &[TestZone::new("bl.test").list(a, code("127.0.0.2"))]);
    let s = settings(nsd.addr(), "- name: bl.test\n", "1s");
    let mut book = Book::new(s.zones.iter().map(|z| z.zone.clone()).collect());
    let t0 = SystemTime::now();
    for (ad, z, v) in round(&s, &[a])
        .await
        .into_iter()
        .map(|((a, z), v)| (a, z, v))
    {
        book.record(ad, z, v, t0);
    }
    let r = ProxyReputation::from_book(&book, &[a]).unwrap();
    assert_eq!(r.summary(), Summary::Listed(vec!["bl.test".into()]));

    // The server is gone: the check fails, the listing stands with its first time.
    nsd.stop();
    let t1 = t0 + Duration::from_secs(60);
    for ((ad, z), v) in round(&s, &[a]).await {
        assert!(matches!(v, Verdict::Failed { .. }), "{v:?}");
        book.record(ad, z, v, t1);
    }
    let r = ProxyReputation::from_book(&book, &[a]).unwrap();
    assert_eq!(r.summary(), Summary::Listed(vec!["bl.test".into()]));
    assert_eq!(
        r.listed[0].since,
        humantime::format_rfc3339_seconds(t0).to_string()
    );
    assert_eq!(r.failed.len(), 1);

    // Back, without the listing: delisted.
    nsd.serve(&[TestZone::new("bl.test")]);
    let t2 = t1 + Duration::from_secs(60);
    for ((ad, z), v) in round(&s, &[a]).await {
        assert_eq!(v, Verdict::NotListed);
        book.record(ad, z, v, t2);
    }
    let r = ProxyReputation::from_book(&book, &[a]).unwrap();
    assert_eq!(r.summary(), Summary::Clean);
}
