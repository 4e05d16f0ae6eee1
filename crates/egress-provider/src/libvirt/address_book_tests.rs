//! Tests of [`super::AddressBook`].

use super::*;
use crate::libvirt::address_pool::{AddressPool, FamilyPool};

fn book(ranges: &[&str]) -> AddressBook {
    let pool = AddressPool {
        ipv4: Some(FamilyPool {
            prefix: "203.0.113.0/24".into(),
            gateway: "203.0.113.1".into(),
            ranges: ranges.iter().map(|r| r.to_string()).collect(),
        }),
        ipv6: None,
        dns: vec![],
        access: None,
        hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
    };
    let mut pools = HashMap::new();
    pools.insert("h1".to_owned(), pool.parse().unwrap());
    AddressBook {
        pools,
        ..AddressBook::default()
    }
}

fn claim(domain: &str, a: &str) -> Claim {
    Claim {
        domain: domain.into(),
        addresses: vec![a.parse().unwrap()],
    }
}

fn held(b: &AddressBook) -> u64 {
    b.usage("h1")[0].held
}

#[test]
fn nothing_is_allocated_before_the_first_listing() {
    let b = book(&["203.0.113.10-203.0.113.20"]);
    let e = b.allocate("h1", "dA", &[]).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(b.usage("h1").is_empty(), "unknown before a listing");
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("theirs", "203.0.113.10")],
    );
    let g = b.allocate("h1", "dA", &[]).unwrap().unwrap();
    assert_eq!(g.addresses, vec!["203.0.113.11".parse::<IpAddr>().unwrap()]);
}

#[test]
fn a_listing_releases_only_holders_it_no_longer_shows_whose_creates_ended_before_it() {
    let b = book(&["203.0.113.10-203.0.113.20"]);
    b.apply_listing("h1", b.listing_started("h1"), &[]);
    let a = b.allocate("h1", "dA", &[]).unwrap().unwrap();
    // A listing that ran while A's create was in flight (its domain not defined yet).
    b.apply_listing("h1", b.listing_started("h1"), &[]);
    assert_eq!(held(&b), 1, "an in-flight create keeps its address");
    let other = b.allocate("h1", "dB", &[]).unwrap().unwrap();
    assert_ne!(other.addresses, a.addresses);
    drop(other);
    // A listing that started before A's create ended, and completed after.
    let before_end = b.listing_started("h1");
    drop(a);
    b.apply_listing("h1", before_end, &[claim("dB", "203.0.113.11")]);
    assert_eq!(
        held(&b),
        2,
        "a listing older than the create's end proves nothing"
    );
    // A listing that shows the holder keeps it.
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dA", "203.0.113.10"), claim("dB", "203.0.113.11")],
    );
    assert_eq!(held(&b), 2);
    // A complete listing after the create ended that no longer shows it: gone.
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dB", "203.0.113.11")],
    );
    assert_eq!(held(&b), 1);
    // A claim the book did not know (another process's instance) is held from now on.
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dB", "203.0.113.11"), claim("theirs", "203.0.113.12")],
    );
    assert_eq!(held(&b), 2);
}

#[test]
fn a_deleted_holders_address_is_free_again() {
    let b = book(&["203.0.113.10"]);
    b.apply_listing("h1", b.listing_started("h1"), &[]);
    drop(b.allocate("h1", "dA", &[]).unwrap());
    let e = b.allocate("h1", "dB", &[]).unwrap_err();
    assert_eq!(e.class, crate::error::ErrorClass::QuotaExceeded, "{e}");
    b.release_deleted("h1", "dA");
    assert!(b.allocate("h1", "dB", &[]).unwrap().is_some());
}

/// h1 and h2 on one segment, sharing 203.0.113.10-203.0.113.20.
fn segment_book() -> AddressBook {
    let one = book(&["203.0.113.10-203.0.113.20"]);
    let pool = one.pools.get("h1").unwrap().clone();
    let mut b = AddressBook {
        pools: HashMap::from([("h1".to_owned(), pool.clone()), ("h2".to_owned(), pool)]),
        ..AddressBook::default()
    };
    for h in ["h1", "h2"] {
        b.segment_of.insert(h.to_owned(), "segment:s".to_owned());
    }
    b.members.insert(
        "segment:s".to_owned(),
        vec!["h1".to_owned(), "h2".to_owned()],
    );
    b
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

#[test]
fn a_segment_hands_nothing_out_until_every_host_listed_then_allocates_segment_wide() {
    let b = segment_book();
    b.apply_listing("h2", b.listing_started("h2"), &[]);
    let e = b.allocate("h2", "dB", &[]).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.message.contains("waiting for h1"), "{e}");
    assert!(
        b.usage("h2").is_empty(),
        "unknown while h1 was never listed"
    );
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dA", "203.0.113.10")],
    );
    let g = b.allocate("h2", "dB", &[]).unwrap().unwrap();
    assert_eq!(
        g.addresses,
        vec![ip("203.0.113.11")],
        "h1's holding counts on h2"
    );
    drop(g);
    assert_eq!(b.usage("h1")[0].held, 2, "one pool for the segment");
    assert_eq!(b.usage("h2")[0].held, 2);
}

#[test]
fn a_held_address_moves_to_another_host_only_once_its_instance_is_gone_or_fenced() {
    let b = segment_book();
    b.apply_listing("h2", b.listing_started("h2"), &[]);
    // One Proxy's domain has the same name on both hosts: still two holders.
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dP", "203.0.113.10")],
    );
    for _ in 0..3 {
        let e = b.allocate("h2", "dP", &[ip("203.0.113.10")]).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.message.contains("waiting for host h1"), "{e}");
        assert!(e.message.contains("fenced"), "{e}");
    }
    // h2's own listings never release what h1 holds.
    b.apply_listing("h2", b.listing_started("h2"), &[]);
    assert_eq!(
        b.holder_host("h2", ip("203.0.113.10")).as_deref(),
        Some("h1")
    );
    // (a) h1 answers and no longer lists it: the address moves.
    b.apply_listing("h1", b.listing_started("h1"), &[]);
    let g = b
        .allocate("h2", "dP", &[ip("203.0.113.10")])
        .unwrap()
        .unwrap();
    assert_eq!(g.addresses, vec![ip("203.0.113.10")]);
    drop(g);
    assert_eq!(
        b.holder_host("h1", ip("203.0.113.10")).as_deref(),
        Some("h2")
    );
}

#[test]
fn a_fence_releases_the_hosts_holdings_and_its_next_listing_cannot_take_them_back() {
    let b = segment_book();
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dP", "203.0.113.10")],
    );
    b.apply_listing("h2", b.listing_started("h2"), &[]);
    assert!(b.allocate("h2", "dP", &[ip("203.0.113.10")]).is_err());
    assert_eq!(
        b.fence("h1", "fence command exited 0"),
        vec![ip("203.0.113.10")]
    );
    assert!(b.fenced("h1").is_some());
    drop(
        b.allocate("h2", "dP", &[ip("203.0.113.10")])
            .unwrap()
            .unwrap(),
    );
    // h1 comes back with the old domain still defined: the address stays with h2's.
    b.apply_listing(
        "h1",
        b.listing_started("h1"),
        &[claim("dP", "203.0.113.10")],
    );
    assert_eq!(
        b.holder_host("h1", ip("203.0.113.10")).as_deref(),
        Some("h2")
    );
    assert!(b.fenced("h1").is_none(), "a listing replaces the fence");
}

#[test]
fn a_fenced_host_that_was_never_listed_lets_its_segment_hand_out_addresses() {
    let b = segment_book();
    b.apply_listing("h2", b.listing_started("h2"), &[]);
    assert!(b.allocate("h2", "dB", &[]).is_err());
    b.fence("h1", "declared dead by an administrator");
    let g = b.allocate("h2", "dB", &[]).unwrap().unwrap();
    assert_eq!(g.addresses, vec![ip("203.0.113.10")]);
}
