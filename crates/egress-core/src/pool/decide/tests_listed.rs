//! `reputation.onListed`: `Replace` replaces a member whose declared egress address is
//! listed through the update budget (the pool never drops below it), retires the address
//! until `retire_for` has passed and ends the retirement then; a listing of an observed
//! address only, or with `Ignore`, changes nothing; `Keep` never pins a listed address.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::Duration;

use super::tests::{Case, at, member, policy};
use super::*;
use crate::pool::status::{RetiredAddress, condition};

fn listed(mut m: Member, declared: &str, listed: &str) -> Member {
    m.egress_address = vec![declared.into()];
    m.listed = vec![listed.into()];
    m.listed_note = format!("{listed} in bl.test (SBL) since 2027-01-15T08:00:00Z");
    m
}

fn names(d: &PoolDecision) -> Vec<(&str, DeleteCause)> {
    d.deletes
        .iter()
        .map(|x| (x.name.as_str(), x.cause))
        .collect()
}

const REPLACE: &str = "replicas: 2\nreputation:\n  onListed: Replace\n";

#[test]
fn replace_surges_first_retires_the_address_and_removes_the_member_once_replaced() {
    let mut c = Case::new(
        policy(REPLACE),
        vec![
            listed(member("web-a", "h1", 0), "192.0.2.1", "192.0.2.1"),
            member("web-b", "h2", 0),
        ],
        &["h1", "h2"],
    );
    // Round 1: a replacement is created (surge); the listed member stays (both available
    // are needed: maxUnavailable 0); its address is retired at once.
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(d.creates[0].pin.is_empty(), "a fresh address");
    assert!(d.deletes.is_empty());
    let r: &RetiredAddress = &d.status.retired_addresses[0];
    assert_eq!(
        (r.host.as_str(), r.address.as_str(), r.member.as_str()),
        ("h1", "192.0.2.1", "web-a")
    );
    assert!(r.reason.contains("bl.test (SBL)"), "{}", r.reason);
    assert_eq!(
        humantime::parse_rfc3339(&r.until).unwrap(),
        c.now + c.policy.retire_for
    );
    assert!(d.events.iter().any(|e| e.reason == reason::ADDRESS_RETIRED));
    assert_eq!(
        d.status.condition(condition::PROGRESSING).unwrap().reason,
        reason::REPLACING_LISTED
    );

    // Round 2: the replacement is not available yet: nothing more (no second retirement, no
    // second create, no removal).
    c.status = d.status.clone();
    let mut young = member(&d.creates[0].name, &d.creates[0].host, 1000);
    young.available = false;
    young.ready = false;
    c.members.push(young.clone());
    let d2 = c.run();
    assert!(d2.creates.is_empty() && d2.deletes.is_empty(), "{d2:?}");
    assert_eq!(d2.status.retired_addresses.len(), 1);

    // Round 3: it is available: the listed member goes (cause listed), 2 available remain.
    c.status = d2.status.clone();
    c.members.pop();
    c.members
        .push(member(&young.name, &young.host.clone().unwrap(), 1000));
    let d3 = c.run();
    assert_eq!(names(&d3), [("web-a", DeleteCause::Listed)]);
    assert!(d3.creates.is_empty());
    assert_eq!(d3.status.retired_addresses.len(), 1);
}

#[test]
fn the_budget_holds_when_every_member_is_listed() {
    // Three listed members, maxSurge 1, maxUnavailable 0: one replacement at a time, and no
    // listed member goes before a replacement is available.
    let mut c = Case::new(
        policy("replicas: 3\nreputation:\n  onListed: Replace\n"),
        (0..3)
            .map(|i| {
                let a = format!("192.0.2.{}", i + 1);
                listed(member(&format!("web-{i}"), "h1", 0), &a, &a)
            })
            .collect(),
        &["h1"],
    );
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(d.deletes.is_empty());
    assert_eq!(
        d.status.retired_addresses.len(),
        3,
        "every listed address is retired"
    );
    // With the replacement available, exactly one listed member goes.
    c.status = d.status.clone();
    c.members
        .push(member(&d.creates[0].name, &d.creates[0].host, 1000));
    let d2 = c.run();
    assert_eq!(d2.deletes.len(), 1, "3 of the 4 available stay");
    assert!(d2.creates.is_empty(), "replicas + maxSurge members exist");
    // Once it is gone, the next replacement.
    c.status = d2.status.clone();
    let gone = d2.deletes[0].name.clone();
    c.members.retain(|m| m.name != gone);
    let d3 = c.run();
    assert_eq!(d3.creates.len(), 1, "the next replacement");
    assert!(
        d3.deletes.is_empty(),
        "no listed member goes before it is available"
    );
}

#[test]
fn retirements_end_at_their_time_and_the_round_wakes_for_it() {
    let mut c = Case::new(
        policy(REPLACE),
        vec![member("web-a", "h1", 0), member("web-b", "h1", 0)],
        &["h1"],
    );
    c.status.retired_addresses = vec![
        RetiredAddress {
            host: "h1".into(),
            address: "192.0.2.9".into(),
            member: "web-x".into(),
            reason: "listed".into(),
            since: "2027-01-01T00:00:00Z".into(),
            until: crate::controller::decide::fmt_time(at(1500)),
        },
        RetiredAddress {
            host: "h1".into(),
            address: "192.0.2.8".into(),
            member: "web-y".into(),
            reason: "listed".into(),
            since: "2027-01-01T00:00:00Z".into(),
            until: crate::controller::decide::fmt_time(at(900)),
        },
    ];
    let d = c.run();
    assert_eq!(
        d.status.retired_addresses.len(),
        1,
        "the one past its time ended"
    );
    assert_eq!(d.status.retired_addresses[0].address, "192.0.2.9");
    assert_eq!(d.requeue_after, Some(Duration::from_secs(500)));
    c.now = at(1500);
    c.status = d.status;
    assert!(c.run().status.retired_addresses.is_empty());
}

#[test]
fn an_observed_only_listing_or_ignore_changes_nothing() {
    // Listed at an address the member does not hold from the pool (a shared NAT address): a
    // replacement would leave from it too.
    let c = Case::new(
        policy(REPLACE),
        vec![
            listed(member("web-a", "h1", 0), "192.0.2.1", "198.51.100.7"),
            member("web-b", "h1", 0),
        ],
        &["h1"],
    );
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert!(d.status.retired_addresses.is_empty());
    let c = Case::new(
        policy("replicas: 2\n"),
        vec![
            listed(member("web-a", "h1", 0), "192.0.2.1", "192.0.2.1"),
            member("web-b", "h1", 0),
        ],
        &["h1"],
    );
    let d = c.run();
    assert!(d.creates.is_empty() && d.deletes.is_empty());
    assert!(d.status.retired_addresses.is_empty());
}

#[test]
fn keep_never_pins_a_listed_address() {
    let mut c = Case::new(
        policy(
            "replicas: 2\nrotation:\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 1\n\
             reputation:\n  onListed: Replace\n",
        ),
        vec![
            listed(member("web-a", "h1", 0), "192.0.2.1", "192.0.2.1"),
            member("web-b", "h2", 0),
        ],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(names(&d), [("web-a", DeleteCause::Listed)]);
    assert!(
        d.status.pending_addresses.is_empty(),
        "nothing kept for a listed member"
    );
    // Once it is gone, its replacement gets a fresh address.
    c.status = d.status.clone();
    c.members.remove(0);
    let d2 = c.run();
    assert_eq!(d2.creates.len(), 1);
    assert!(d2.creates[0].pin.is_empty());
}
