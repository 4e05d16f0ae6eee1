//! `rotation.egressAddress: Keep`: the old member goes first, its replacement takes its
//! addresses on its host once it is gone; no surge; quarantine and scale-in keep nothing;
//! an unusable host falls back to fresh addresses; `Fresh` (the default) is unchanged.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::net::IpAddr;

use egress_provider::model::HostState;

use super::tests::{Case, member, policy};
use super::*;

const KEEP: &str =
    "replicas: 2\nrotation:\n  maxAge: 10m\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 1\n";

fn with_addr(mut m: Member, a: &str) -> Member {
    m.egress_address = vec![a.into()];
    m
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

/// h1's member is older than maxAge (created at 0, now 1000 s > 10 m); h2's is young.
fn aged_case(spec: &str) -> Case {
    Case::new(
        policy(spec),
        vec![
            with_addr(member("web-old", "h1", 0), "192.0.2.1"),
            with_addr(member("web-new", "h2", 900), "192.0.2.2"),
        ],
        &["h1", "h2"],
    )
}

#[test]
fn keep_deletes_first_then_pins_the_same_address_on_the_same_host() {
    let mut c = aged_case(KEEP);
    // Round 1: no surge; the old member is deleted and its address remembered.
    let d = c.run();
    assert!(d.creates.is_empty(), "surged: {:?}", d.creates);
    assert_eq!(d.deletes.len(), 1);
    assert_eq!(
        (d.deletes[0].name.as_str(), d.deletes[0].cause),
        ("web-old", DeleteCause::Age)
    );
    assert_eq!(d.status.pending_addresses.len(), 1);
    assert_eq!(d.status.pending_addresses[0].host, "h1");
    assert_eq!(d.status.pending_addresses[0].addresses, vec!["192.0.2.1"]);
    // Round 2: still being deleted: it holds its slot, nothing created, memory kept.
    c.status = d.status;
    c.members[0].deleting = true;
    let d = c.run();
    assert!(
        d.creates.is_empty(),
        "created while the old one exists: {:?}",
        d.creates
    );
    assert!(d.deletes.is_empty());
    assert_eq!(d.status.pending_addresses.len(), 1);
    // Round 3 (as after a restart: the memory is the status): gone, so the replacement
    // takes its address on its host, and the entry is used up.
    c.status = d.status;
    c.members.remove(0);
    let d = c.run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    assert_eq!(d.creates[0].host, "h1");
    assert_eq!(d.creates[0].pin, vec![ip("192.0.2.1")]);
    assert!(d.status.pending_addresses.is_empty());
}

#[test]
fn keep_pins_a_template_replacement_too() {
    let mut c = Case::new(
        policy(KEEP),
        vec![
            with_addr(member("web-a", "h1", 900), "2001:db8::1"),
            with_addr(member("web-b", "h2", 900), "192.0.2.2"),
        ],
        &["h1", "h2"],
    );
    c.hash = "bbbbbbbbbb".into();
    let d = c.run();
    assert!(d.creates.is_empty(), "surged: {:?}", d.creates);
    assert_eq!(d.deletes.len(), 1, "{:?}", d.deletes);
    assert_eq!(d.deletes[0].cause, DeleteCause::Template);
    let gone = d.deletes[0].name.clone();
    c.status = d.status;
    c.members.retain(|m| m.name != gone);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    let want = if gone == "web-a" {
        ("h1", ip("2001:db8::1"))
    } else {
        ("h2", ip("192.0.2.2"))
    };
    assert_eq!((d.creates[0].host.as_str(), d.creates[0].pin[0]), want);
    assert_eq!(d.creates[0].template_hash, "bbbbbbbbbb");
}

#[test]
fn fresh_is_the_default_and_surges_with_new_addresses() {
    let d =
        aged_case("replicas: 2\nrotation:\n  maxAge: 10m\nupdate:\n  maxUnavailable: 1\n").run();
    assert_eq!(d.creates.len(), 1, "{:?}", d.creates);
    assert!(d.creates[0].pin.is_empty());
    assert!(d.status.pending_addresses.is_empty());
}

#[test]
fn an_unusable_host_falls_back_to_a_fresh_address_elsewhere() {
    let mut c = aged_case(KEEP);
    let d = c.run();
    c.status = d.status;
    c.members.remove(0);
    c.hosts[0].state = Some(HostState::Unreachable);
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert_eq!(d.creates[0].host, "h2");
    assert!(d.creates[0].pin.is_empty());
    assert!(d.status.pending_addresses.is_empty());
}

#[test]
fn quarantine_and_scale_in_keep_no_address() {
    // Quarantine: the VM keeps its address; its replacement gets a fresh one.
    let mut m = with_addr(member("web-q", "h1", 900), "192.0.2.1");
    m.quarantine = Some("inspect".into());
    let c = Case::new(
        policy(KEEP),
        vec![m, with_addr(member("web-b", "h2", 900), "192.0.2.2")],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(d.creates.len(), 1);
    assert!(d.creates[0].pin.is_empty());
    assert!(d.status.pending_addresses.is_empty());
    // Scale-in.
    let c = Case::new(
        policy(&KEEP.replace("replicas: 2", "replicas: 1")),
        vec![
            with_addr(member("web-a", "h1", 800), "192.0.2.1"),
            with_addr(member("web-b", "h2", 900), "192.0.2.2"),
        ],
        &["h1", "h2"],
    );
    let d = c.run();
    assert_eq!(d.deletes.len(), 1);
    assert_eq!(d.deletes[0].cause, DeleteCause::ScaleIn);
    assert!(d.status.pending_addresses.is_empty());
}
