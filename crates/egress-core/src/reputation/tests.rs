#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use egress_reputation::status::{FailedCheck, ListingStatus};

use super::*;
use crate::controller::EventKind;
use crate::health::{HealthState, ProxyHealth};
use crate::model::{ConditionStatus, ProxyStatus, condition};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn t(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
}

fn listed(zone: &str) -> ListingStatus {
    ListingStatus {
        address: "192.0.2.1".into(),
        zone: zone.into(),
        since: "2023-11-14T22:13:20Z".into(),
        codes: vec!["SBL".into()],
    }
}

fn view(listings: Vec<ListingStatus>, failed: Vec<FailedCheck>) -> ProxyReputation {
    ProxyReputation {
        addresses: vec!["192.0.2.1".into()],
        listed: listings,
        failed,
        last_check: Some("2023-11-14T22:13:20Z".into()),
    }
}

fn failing() -> FailedCheck {
    FailedCheck {
        address: "192.0.2.1".into(),
        zone: "bl.test".into(),
        since: "2023-11-14T22:13:20Z".into(),
        reason: "error_answer".into(),
        message: "127.255.255.254: open resolver".into(),
    }
}

fn listed_condition(st: &ProxyStatus) -> (ConditionStatus, String) {
    let c = st.condition(condition::LISTED).unwrap();
    (c.status, c.reason.clone())
}

#[test]
fn addresses_are_the_declared_then_the_observed_each_once() {
    let h = ProxyHealth {
        state: HealthState::Healthy,
        egress_ip: Some(ip("192.0.2.1")),
        egress_ips: vec![ip("192.0.2.1"), ip("2001:db8::1")],
        ..ProxyHealth::default()
    };
    assert_eq!(
        addresses_of(&[ip("192.0.2.1")], Some(&h)),
        [ip("192.0.2.1"), ip("2001:db8::1")]
    );
    assert_eq!(addresses_of(&[], None), Vec::<IpAddr>::new());
    let nat = ProxyHealth {
        egress_ip: Some(ip("198.51.100.9")),
        ..ProxyHealth::default()
    };
    assert_eq!(addresses_of(&[], Some(&nat)), [ip("198.51.100.9")]);
}

#[test]
fn the_condition_and_events_follow_the_listings() {
    let mut st = ProxyStatus::default();
    // Not checked yet: Unknown, no event.
    assert_eq!(apply_to_status(&mut st, None, true, t(0), 1), None);
    assert_eq!(
        listed_condition(&st),
        (ConditionStatus::Unknown, reason::NOT_CHECKED.into())
    );
    // Clean first: False, no event.
    assert_eq!(
        apply_to_status(&mut st, Some(view(vec![], vec![])), true, t(1), 1),
        None
    );
    assert_eq!(
        listed_condition(&st),
        (ConditionStatus::False, reason::NOT_LISTED.into())
    );
    // Listed: True, one Warning.
    let ev = apply_to_status(
        &mut st,
        Some(view(vec![listed("bl.test")], vec![])),
        true,
        t(2),
        1,
    )
    .unwrap();
    assert_eq!(
        (ev.kind, ev.reason.as_str()),
        (EventKind::Warning, "Listed")
    );
    assert!(
        ev.message
            .contains("192.0.2.1 is listed in bl.test (SBL) since"),
        "{}",
        ev.message
    );
    assert_eq!(
        listed_condition(&st),
        (ConditionStatus::True, reason::LISTED.into())
    );
    assert_eq!(st.reputation.as_ref().unwrap().listed.len(), 1);
    // Unchanged: no event; a second zone: another Warning; a failure beside a listing: none.
    assert_eq!(
        apply_to_status(
            &mut st,
            Some(view(vec![listed("bl.test")], vec![])),
            true,
            t(3),
            1
        ),
        None
    );
    let two = vec![listed("bl.test"), listed("other.test")];
    assert_eq!(
        apply_to_status(&mut st, Some(view(two.clone(), vec![])), true, t(4), 1)
            .unwrap()
            .reason,
        "Listed"
    );
    assert_eq!(
        apply_to_status(&mut st, Some(view(two, vec![failing()])), true, t(5), 1),
        None
    );
    // Delisted everywhere: False and a Normal event.
    let ev = apply_to_status(&mut st, Some(view(vec![], vec![])), true, t(6), 1).unwrap();
    assert_eq!(
        (ev.kind, ev.reason.as_str()),
        (EventKind::Normal, "Delisted")
    );
    // Checks failing with nothing listed: Unknown, one Warning, then quiet.
    let ev = apply_to_status(&mut st, Some(view(vec![], vec![failing()])), true, t(7), 1).unwrap();
    assert_eq!(ev.reason, "ReputationCheckFailed");
    assert!(ev.message.contains("open resolver"), "{}", ev.message);
    assert_eq!(
        listed_condition(&st),
        (ConditionStatus::Unknown, reason::CHECK_FAILED.into())
    );
    assert_eq!(
        apply_to_status(&mut st, Some(view(vec![], vec![failing()])), true, t(8), 1),
        None
    );
    // Checks switched off: the condition and the block go.
    assert_eq!(apply_to_status(&mut st, None, false, t(9), 1), None);
    assert!(st.condition(condition::LISTED).is_none());
    assert!(st.reputation.is_none());
}

#[test]
fn a_service_without_zones_checks_nothing() {
    let svc = ReputationService::new(Default::default(), metrics::ReputationMetrics::new());
    assert!(!svc.enabled());
    assert_eq!(svc.view(&[ip("192.0.2.1")]), None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let targets = vec![ReputationTarget {
        uid: egress_provider::ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-708677289501")
            .unwrap(),
        key: "ns/p".into(),
        addresses: vec![ip("192.0.2.1")],
    }];
    assert!(rt.block_on(svc.round(&targets)).is_none());
}
