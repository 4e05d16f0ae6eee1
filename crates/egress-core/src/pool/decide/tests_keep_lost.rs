//! `rotation.egressAddress: Keep` and a member lost with its host: with a peer on the dead
//! host's segment, the replacement is created there at once, pinned to the lost member's
//! addresses and naming it; without a peer, or without Keep, it gets fresh addresses
//! elsewhere; the entry is used once; the lost member goes as soon as its host answers.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::net::IpAddr;

use egress_provider::model::HostState;

use super::tests::{Case, at, member, policy};
use super::*;

const KEEP: &str = "replicas: 2\nrotation:\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 1\n";

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

/// A pool of 2: web-a on h1 (192.0.2.1, dead since 950 s), web-b on h2; hosts h1, h2, h3;
/// h1 and `peer` (if any) on segment `lan`; the clock at 1010 s (past the 60 s budget).
fn case(spec: &str, peer: Option<&str>) -> Case {
    let mut a = member("web-a", "h1", 0);
    a.egress_address = vec!["192.0.2.1".into()];
    let mut b = member("web-b", "h2", 0);
    b.egress_address = vec!["192.0.2.2".into()];
    let mut c = Case::new(policy(spec), vec![a, b], &["h1", "h2", "h3"]);
    c.hosts[0].state = Some(HostState::Timeout);
    c.hosts[0].dead_since = Some(at(950));
    c.hosts[0].segment = Some("lan".into());
    for h in &mut c.hosts {
        if Some(h.name.as_str()) == peer {
            h.segment = Some("lan".into());
        }
    }
    c.now = at(1010);
    c
}

#[test]
fn a_lost_member_of_a_keep_pool_is_replaced_on_its_segment_peer_at_its_addresses() {
    let mut c = case(KEEP, Some("h2"));
    let d = c.run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    let cr = &d.creates[0];
    // h2, the peer, though h3 (off the segment) has fewer members.
    assert_eq!(cr.host, "h2");
    assert_eq!(cr.pin, vec![ip("192.0.2.1")]);
    assert_eq!(cr.replaces.as_deref(), Some("web-a"));
    assert!(d.deletes.is_empty(), "{:?}", d.deletes);
    // Used once: the entry is gone from the status, and the next round (the replacement
    // among the members, provisioning while it waits for the address) creates nothing more.
    assert!(
        d.status.pending_addresses.is_empty(),
        "{:?}",
        d.status.pending_addresses
    );
    let ev = d
        .events
        .iter()
        .find(|e| e.reason == crate::pool::status::reason::MEMBER_CREATED)
        .unwrap();
    assert!(
        ev.message.contains("replacing lost member web-a"),
        "{}",
        ev.message
    );
    c.status = d.status;
    let mut repl = super::tests::provisioning(member(&cr.name, "h2", 1010));
    repl.egress_address = Vec::new();
    c.members.push(repl);
    c.now = at(1020);
    let d = c.run();
    assert!(d.creates.is_empty(), "{:?}", d.creates);
    assert!(d.status.pending_addresses.is_empty());
    // The host answers: the lost member goes at once (its replacement cannot be available
    // while it holds the addresses), though the pool is below its minimum without it.
    c.status = d.status;
    c.hosts[0].state = Some(HostState::Ready);
    c.hosts[0].dead_since = None;
    c.members[1] = super::tests::provisioning(c.members[1].clone());
    let d = c.run();
    assert_eq!(
        d.deletes
            .iter()
            .map(|x| (x.name.as_str(), x.cause))
            .collect::<Vec<_>>(),
        [("web-a", DeleteCause::HostLost)]
    );
}

#[test]
fn without_a_segment_peer_or_without_keep_the_replacement_gets_fresh_addresses() {
    // No peer: h1 alone on its segment.
    let d = case(KEEP, None).run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    assert!(d.creates[0].pin.is_empty());
    assert_eq!(d.creates[0].replaces, None);
    assert!(d.status.pending_addresses.is_empty());
    // Not Keep: fresh, with a peer all the same.
    let d = case("replicas: 2\n", Some("h3")).run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    assert!(d.creates[0].pin.is_empty());
    assert_eq!(d.creates[0].replaces, None);
    assert!(d.status.pending_addresses.is_empty());
}

#[test]
fn a_peer_that_cannot_take_it_falls_back_to_a_fresh_replacement_elsewhere() {
    let mut c = case(KEEP, Some("h3"));
    c.hosts[2].state = Some(HostState::Unreachable);
    let d = c.run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    assert_eq!(d.creates[0].host, "h2");
    assert!(d.creates[0].pin.is_empty());
    assert_eq!(d.creates[0].replaces, None);
    assert!(d.status.pending_addresses.is_empty());
}

#[test]
fn a_lost_member_without_addresses_or_already_lost_leaves_no_entry() {
    let mut c = case(KEEP, Some("h3"));
    c.members[0].egress_address.clear();
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(d.creates[0].pin.is_empty());
    // Already lost in an earlier round (the entry was used then): nothing new.
    let mut c = case(KEEP, Some("h3"));
    let d = c.run();
    c.status = d.status;
    c.now = at(1020);
    let d = c.run();
    assert!(
        d.creates.iter().all(|x| x.replaces.is_none()),
        "{:?}",
        d.creates
    );
    assert!(d.status.pending_addresses.is_empty());
}
