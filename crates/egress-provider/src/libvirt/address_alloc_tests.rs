use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::libvirt::address_pool::{AddressPool, FamilyPool, ParsedPool};

use super::*;

fn pool(v4_ranges: &[&str], v6_ranges: &[&str]) -> ParsedPool {
    let fam = |prefix: &str, gw: &str, r: &[&str]| {
        (!r.is_empty()).then(|| FamilyPool {
            prefix: prefix.into(),
            gateway: gw.into(),
            ranges: r.iter().map(|s| s.to_string()).collect(),
        })
    };
    AddressPool {
        ipv4: fam("203.0.113.0/28", "203.0.113.1", v4_ranges),
        ipv6: fam("2001:db8:1::/64", "2001:db8:1::1", v6_ranges),
        dns: vec![],
        access: None,
        hold_released: crate::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
    }
    .parse()
    .unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn fresh_addresses_go_in_ascending_order_once_each_and_asking_again_returns_the_same() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.3", "203.0.113.10"], &[]));
    assert_eq!(a.free(true), 3);
    assert_eq!(a.allocate("p1", true, None), Ok(ip("203.0.113.2")));
    assert_eq!(a.allocate("p1", true, None), Ok(ip("203.0.113.2")));
    assert_eq!(a.allocate("p2", true, None), Ok(ip("203.0.113.3")));
    assert_eq!(a.allocate("p3", true, None), Ok(ip("203.0.113.10")));
    assert_eq!(
        a.allocate("p4", true, None),
        Err(AllocError::Exhausted {
            family: "IPv4",
            size: 3
        })
    );
    assert_eq!(a.free(true), 0);
    assert_eq!(a.holder_of(ip("203.0.113.3")), Some("p2"));
}

#[test]
fn an_address_comes_back_only_when_released_and_fresh_ones_go_first() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.5"], &[]));
    let first = a.allocate("p1", true, None).unwrap();
    a.allocate("p2", true, None).unwrap();
    // p1's instance is being deleted but not confirmed gone: its address stays held.
    assert_ne!(a.allocate("p3", true, None).unwrap(), first);
    assert_eq!(a.release("p1"), vec![first]);
    // A fresh address (.5) before the released one (.2).
    assert_eq!(a.allocate("p4", true, None), Ok(ip("203.0.113.5")));
    assert_eq!(a.allocate("p5", true, None), Ok(first));
    assert!(a.release("nobody").is_empty());
}

#[test]
fn a_pinned_address_is_given_only_when_free_and_in_the_pool() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.5"], &[]));
    assert_eq!(
        a.allocate("p1", true, Some(ip("203.0.113.4"))),
        Ok(ip("203.0.113.4"))
    );
    assert_eq!(
        a.allocate("p2", true, Some(ip("203.0.113.4"))),
        Err(AllocError::Taken {
            address: ip("203.0.113.4"),
            holder: "p1".into()
        })
    );
    let e = a.allocate("p2", true, Some(ip("203.0.113.9"))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "203.0.113.9 is not in the host's address pool (ranges: 203.0.113.2-203.0.113.5)"
    );
    let e = a
        .allocate("p2", false, Some(ip("2001:db8:1::5")))
        .unwrap_err();
    assert!(e.to_string().contains("none for this family"), "{e}");
    assert_eq!(
        a.allocate("p1", true, Some(ip("203.0.113.5"))),
        Err(AllocError::HoldsAnother {
            holder: "p1".into(),
            held: ip("203.0.113.4"),
            asked: ip("203.0.113.5")
        })
    );
    // The cursor skips the pinned address.
    assert_eq!(a.allocate("p3", true, None), Ok(ip("203.0.113.2")));
    assert_eq!(a.allocate("p4", true, None), Ok(ip("203.0.113.3")));
    assert_eq!(a.allocate("p5", true, None), Ok(ip("203.0.113.5")));
    assert!(a.allocate("p6", true, None).is_err());
}

#[test]
fn a_restart_rebuilds_from_the_listing_before_allocating_and_reports_double_claims() {
    let mut a = HostAddresses::new(&pool(
        &["203.0.113.2-203.0.113.5"],
        &["2001:db8:1::10-2001:db8:1::11"],
    ));
    let conflicts = a.rebuild([
        ("p1", ip("203.0.113.3")),
        ("p2", ip("203.0.113.2")),
        ("p3", ip("203.0.113.3")),
        ("p1", ip("2001:db8:1::11")),
        // Held outside the (narrowed) pool: recorded, not counted in the pool.
        ("p9", ip("203.0.113.12")),
    ]);
    assert_eq!(
        conflicts,
        vec![Conflict {
            address: ip("203.0.113.3"),
            kept: "p1".into(),
            refused: "p3".into()
        }]
    );
    assert_eq!(a.free(true), 2);
    assert_eq!(a.held(true), 3);
    assert_eq!(a.allocate("p4", true, None), Ok(ip("203.0.113.4")));
    assert_eq!(a.allocate("p4", false, None), Ok(ip("2001:db8:1::10")));
    assert_eq!(
        a.allocate("p5", false, None).unwrap_err().to_string(),
        "the host's IPv6 address pool is exhausted (2 addresses, all held)"
    );
    assert_eq!(
        a.release("p1"),
        vec![ip("203.0.113.3"), ip("2001:db8:1::11")]
    );
    assert_eq!(a.allocate("p5", false, None), Ok(ip("2001:db8:1::11")));
}

#[test]
fn an_ipv6_slash_64_costs_what_a_small_pool_costs() {
    let mut a = HostAddresses::new(&pool(
        &[],
        &["2001:db8:1::2-2001:db8:1:0:ffff:ffff:ffff:ffff"],
    ));
    assert_eq!(a.free(false), (1u128 << 64) - 2);
    for i in 0..10_000 {
        a.allocate(&format!("p{i}"), false, None).unwrap();
    }
    assert_eq!(a.held(false), 10_000);
    assert_eq!(a.allocate("x", false, None), Ok(ip("2001:db8:1::2712")));
}

/// Random allocate / pin / release sequences against a plain model: no address is ever held
/// by two holders, nothing is handed out before its release, and the free count equals a
/// recount.
#[test]
fn random_sequences_never_double_allocate_and_keep_counts() {
    let ranges = ["203.0.113.2-203.0.113.6", "203.0.113.9-203.0.113.11"];
    let all: Vec<IpAddr> = (2..=6)
        .chain(9..=11)
        .map(|n| ip(&format!("203.0.113.{n}")))
        .collect();
    for seed in 0..200u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut a = HostAddresses::new(&pool(&ranges, &[]));
        // The model: holder → address.
        let mut model: HashMap<String, IpAddr> = HashMap::new();
        for step in 0..300 {
            let holder = format!("p{}", rng.usize(0..12));
            match rng.u8(0..3) {
                0 => {
                    let r = a.allocate(&holder, true, None);
                    match (&r, model.get(&holder)) {
                        (Ok(got), Some(had)) => assert_eq!(got, had, "seed {seed} step {step}"),
                        (Ok(got), None) => {
                            assert!(
                                !model.values().any(|v| v == got),
                                "seed {seed} step {step}: {got} double"
                            );
                            model.insert(holder, *got);
                        }
                        (Err(AllocError::Exhausted { .. }), None) => {
                            assert_eq!(model.len(), all.len(), "seed {seed} step {step}")
                        }
                        (e, m) => panic!("seed {seed} step {step}: {e:?} with {m:?}"),
                    }
                }
                1 => {
                    let want = all[rng.usize(0..all.len())];
                    let r = a.allocate(&holder, true, Some(want));
                    let owner = model
                        .iter()
                        .find(|(_, v)| **v == want)
                        .map(|(k, _)| k.clone());
                    match (r, owner, model.get(&holder).copied()) {
                        (Ok(got), None, None) => {
                            assert_eq!(got, want);
                            model.insert(holder, got);
                        }
                        (Ok(got), Some(o), _) => {
                            assert!(o == holder && got == want, "seed {seed} step {step}")
                        }
                        (Err(AllocError::Taken { holder: h, .. }), Some(o), _) => assert_eq!(h, o),
                        (Err(AllocError::HoldsAnother { held, .. }), _, Some(had)) => {
                            assert_eq!(held, had)
                        }
                        (r, o, h) => {
                            panic!("seed {seed} step {step}: {r:?} owner {o:?} held {h:?}")
                        }
                    }
                }
                _ => {
                    let freed = a.release(&holder);
                    assert_eq!(freed, model.remove(&holder).into_iter().collect::<Vec<_>>());
                }
            }
            let by_addr: BTreeMap<IpAddr, &String> = model.iter().map(|(k, v)| (*v, k)).collect();
            assert_eq!(
                by_addr.len(),
                model.len(),
                "seed {seed} step {step}: double allocation"
            );
            for (addr, h) in &by_addr {
                assert_eq!(
                    a.holder_of(*addr),
                    Some(h.as_str()),
                    "seed {seed} step {step}"
                );
            }
            assert_eq!(
                a.free(true),
                (all.len() - model.len()) as u128,
                "seed {seed} step {step}"
            );
        }
    }
}

#[test]
fn a_retired_address_is_never_handed_out_pinned_or_free_and_comes_back_last() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.5"], &[]));
    let listed = a.allocate("old", true, None).unwrap();
    assert_eq!(listed, ip("203.0.113.2"));
    let retired = [listed, ip("203.0.113.3")];
    // Still held by the listed member: a replacement gets another one; the fresh retired
    // .3 is skipped too.
    assert_eq!(
        a.allocate_excluding("new", true, None, &[], &retired),
        Ok(ip("203.0.113.4"))
    );
    // The listed member is gone: its address is free, and still not handed out.
    a.release("old");
    assert_eq!(
        a.allocate_excluding("p3", true, None, &[], &retired),
        Ok(ip("203.0.113.5"))
    );
    assert_eq!(
        a.allocate_excluding("p4", true, None, &[], &retired),
        Err(AllocError::Exhausted {
            family: "IPv4",
            size: 4
        })
    );
    // Pinned: refused, whoever asks.
    assert_eq!(
        a.allocate_excluding("p4", true, Some(listed), &[], &retired),
        Err(AllocError::Retired { address: listed })
    );
    assert_eq!(a.held_by("p4", true), None, "a refusal holds nothing");
    // Retirement over: the retired addresses are free again (the skipped ones among the
    // released, so they come last).
    assert_eq!(a.allocate_excluding("p4", true, None, &[], &[]), Ok(listed));
    assert_eq!(a.allocate("p5", true, None), Ok(ip("203.0.113.3")));
}

#[test]
fn the_holder_of_a_retired_address_keeps_it() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.3"], &[]));
    let mine = a.allocate("old", true, None).unwrap();
    assert_eq!(
        a.allocate_excluding("old", true, None, &[], &[mine]),
        Ok(mine)
    );
    assert_eq!(
        a.allocate_excluding("old", true, Some(mine), &[], &[mine]),
        Ok(mine)
    );
}

#[test]
fn an_allocation_skips_reserved_addresses_and_they_stay_free_for_their_owners() {
    let mut a = HostAddresses::new(&pool(&["203.0.113.2-203.0.113.4"], &[]));
    let reserved = [ip("203.0.113.2"), ip("203.0.113.3")];
    assert_eq!(
        a.allocate_avoiding("p1", true, None, &reserved),
        Ok(ip("203.0.113.4"))
    );
    assert_eq!(
        a.allocate_avoiding("p2", true, None, &reserved),
        Err(AllocError::Exhausted {
            family: "IPv4",
            size: 3
        }),
        "only reserved ones left"
    );
    // The owners (pinning them) still get them.
    assert_eq!(
        a.allocate_avoiding("owner", true, Some(ip("203.0.113.3")), &reserved),
        Ok(ip("203.0.113.3"))
    );
    assert_eq!(a.allocate("p3", true, None), Ok(ip("203.0.113.2")));
}
