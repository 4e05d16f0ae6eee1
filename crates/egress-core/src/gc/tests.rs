//! Tests of the pure GC [`plan`](super::plan()): one per rule, over small listings.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::names;
use egress_provider::model::{OwnedInstance, OwnedVolume, VolumeKind};
use egress_provider::{ProviderId, ProxyUid};

use super::{EntryListing, GcSettings, ItemKind, Planned, Reason, Target, plan};

const T0: u64 = 1_790_000_000;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn inst(u: ProxyUid, created: u64) -> OwnedInstance {
    OwnedInstance {
        id: ProviderId {
            entry: "home".into(),
            host: "h1".into(),
            name: names::domain("home", &u),
        },
        uid: u,
        created_at: at(created),
        name_matches_uid: true,
    }
}

fn vol(kind: VolumeKind, name: String, uid: Option<ProxyUid>, created: Option<u64>) -> OwnedVolume {
    OwnedVolume {
        entry: "home".into(),
        host: "h1".into(),
        name,
        kind,
        uid,
        age_since: created.map(at),
        domain_exists: false,
    }
}

fn listing(instances: Vec<OwnedInstance>, volumes: Vec<OwnedVolume>) -> EntryListing {
    EntryListing {
        entry: "home".into(),
        import_deadline: Duration::from_secs(1800),
        instances: Ok(instances),
        volumes: Ok(volumes),
    }
}

fn settings() -> GcSettings {
    GcSettings::default()
}

/// The plan for one instance, old enough, with nothing live.
fn one(i: OwnedInstance, live: &[ProxyUid], now: u64) -> Planned {
    let live: HashSet<_> = live.iter().copied().collect();
    let p = plan(&[listing(vec![i], vec![])], &live, &settings(), at(now));
    assert_eq!(p.len(), 1, "{p:?}");
    p.into_iter().next().unwrap()
}

#[test]
fn an_old_instance_of_no_live_proxy_is_deleted_through_its_uid() {
    let u = uid(1);
    let p = one(inst(u, T0), &[], T0 + 3600);
    assert_eq!(p.reason, Reason::OrphanInstance);
    assert_eq!(
        p.delete,
        Some(Target::Instance {
            host: "h1".into(),
            uid: u
        })
    );
}

#[test]
fn an_instance_of_a_live_proxy_is_kept() {
    let u = uid(1);
    let p = one(inst(u, T0), &[u], T0 + 3600);
    assert_eq!((p.delete, p.reason), (None, Reason::Live));
}

#[test]
fn an_instance_younger_than_the_minimum_age_is_kept_and_a_future_mark_counts_as_young() {
    let u = uid(1);
    let p = one(inst(u, T0), &[], T0 + 599);
    assert!(
        p.delete.is_none()
            && matches!(
                p.reason,
                Reason::Young {
                    age_secs: 599,
                    min_secs: 600
                }
            ),
        "{p:?}"
    );
    // A time slightly ahead (a mark within the provider's skew tolerance) reads as age zero.
    // A mark far in the future never reaches the plan as such: the listing restamps it, and
    // that it is then collected is proven end to end in tests/gc_fake.rs.
    let p = one(inst(u, T0 + 30), &[], T0);
    assert!(
        p.delete.is_none() && matches!(p.reason, Reason::Young { age_secs: 0, .. }),
        "{p:?}"
    );
    let p = one(inst(u, T0), &[], T0 + 600);
    assert!(
        p.delete.is_some(),
        "exactly the minimum age is old enough: {p:?}"
    );
}

#[test]
fn an_instance_whose_name_is_not_derived_from_its_uid_is_never_deleted() {
    // finding: E2
    let u = uid(1);
    let canonical = names::domain("home", &u);
    let other = names::domain("home", &uid(2));
    for (name, flag) in [
        (canonical.to_uppercase(), false),
        (format!(" {canonical}"), false),
        (format!("{canonical}\n"), false),
        (other.clone(), false),
        // Even if a provider got the flag wrong, the plan re-derives the name.
        (other, true),
        (canonical.replace("ep-home-", "ep-lab-"), true),
    ] {
        let mut i = inst(u, T0);
        i.id.name = name.clone();
        i.name_matches_uid = flag;
        let p = one(i, &[], T0 + 86_400);
        assert!(p.delete.is_none(), "{name:?}: {p:?}");
        assert_eq!(
            p.reason,
            Reason::NameMismatch {
                expected: canonical.clone()
            },
            "{name:?}"
        );
    }
}

#[test]
fn a_failed_instance_list_deletes_nothing_of_that_entry_but_other_entries_proceed() {
    // finding: M15
    let u = uid(1);
    let mut broken = listing(
        vec![],
        vec![vol(
            VolumeKind::Overlay,
            names::overlay("home", &u),
            Some(u),
            None,
        )],
    );
    broken.instances = Err("Transient: link died while listing".into());
    let mut ok = listing(vec![], vec![]);
    ok.entry = "lab".into();
    let mut i = inst(uid(3), T0);
    i.id.entry = "lab".into();
    i.id.name = names::domain("lab", &uid(3));
    ok.instances = Ok(vec![i]);
    let p = plan(&[broken, ok], &HashSet::new(), &settings(), at(T0 + 86_400));
    let home: Vec<_> = p.iter().filter(|x| x.entry == "home").collect();
    assert_eq!(home.len(), 1, "{home:?}");
    assert_eq!(home[0].kind, ItemKind::Entry);
    assert!(home[0].delete.is_none());
    assert!(matches!(home[0].reason, Reason::InstanceListFailed(_)));
    assert!(p.iter().any(|x| x.entry == "lab" && x.delete.is_some()));
}

#[test]
fn a_failed_volume_list_deletes_no_volume_but_instances_are_still_swept() {
    // finding: M15
    let mut l = listing(vec![inst(uid(1), T0)], vec![]);
    l.volumes = Err("Transient: pool listing timed out".into());
    let p = plan(&[l], &HashSet::new(), &settings(), at(T0 + 86_400));
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].delete.is_some());
    assert!(p[1].delete.is_none() && matches!(p[1].reason, Reason::VolumeListFailed(_)));
}

#[test]
fn orphan_overlays_and_seeds_are_collected_unless_live_or_carried_by_a_listed_domain() {
    // finding: M3
    let (orphan, live_u, with_dom) = (uid(1), uid(2), uid(3));
    let mut vols = vec![];
    for u in [orphan, live_u, with_dom] {
        vols.push(vol(
            VolumeKind::Overlay,
            names::overlay("home", &u),
            Some(u),
            None,
        ));
        vols.push(vol(
            VolumeKind::Seed,
            names::seed("home", &u),
            Some(u),
            None,
        ));
    }
    // The domain of `with_dom` is kept (young), and its disks with it.
    let l = listing(vec![inst(with_dom, T0 + 86_000)], vols);
    let live: HashSet<_> = [live_u].into_iter().collect();
    let p = plan(&[l], &live, &settings(), at(T0 + 86_400));
    let deleted: Vec<_> = p
        .iter()
        .filter(|x| x.delete.is_some())
        .map(|x| x.name.clone())
        .collect();
    assert_eq!(
        deleted,
        vec![
            names::overlay("home", &orphan),
            names::seed("home", &orphan)
        ]
    );
    assert!(
        p.iter()
            .filter(|x| x.uid == Some(live_u))
            .all(|x| x.reason == Reason::Live)
    );
    assert!(
        !p.iter()
            .any(|x| x.uid == Some(with_dom) && x.kind != ItemKind::Instance)
    );
}

#[test]
fn an_orphan_volume_changed_within_the_minimum_age_is_kept() {
    let u = uid(1);
    let now = T0 + 86_400;
    let fresh = vol(
        VolumeKind::Overlay,
        names::overlay("home", &u),
        Some(u),
        Some(now - 60),
    );
    let p = plan(
        &[listing(vec![], vec![fresh])],
        &HashSet::new(),
        &settings(),
        at(now),
    );
    assert!(p[0].delete.is_none(), "{p:?}");
    assert!(matches!(p[0].reason, Reason::Young { age_secs: 60, .. }));
}

#[test]
fn a_volume_whose_uid_is_on_another_hosts_domain_is_still_an_orphan_on_this_host() {
    let u = uid(1);
    let mut i = inst(u, T0 + 86_000);
    i.id.host = "h2".into();
    let l = listing(
        vec![i],
        vec![vol(
            VolumeKind::Overlay,
            names::overlay("home", &u),
            Some(u),
            None,
        )],
    );
    let p = plan(&[l], &HashSet::new(), &settings(), at(T0 + 86_400));
    assert!(
        p.iter()
            .any(|x| x.kind == ItemKind::Overlay && x.delete.is_some()),
        "{p:?}"
    );
}

#[test]
fn parts_are_collected_only_after_the_import_deadline_plus_the_minimum_age() {
    let name = |s: u64| format!("ep-home-base-img-deb-unverified.part-{s}-0123456789abcdef");
    let now = T0 + 100_000;
    let stale = vol(VolumeKind::Part, name(now - 2400), None, Some(now - 2400));
    let running = vol(VolumeKind::Part, name(now - 2399), None, Some(now - 2399));
    let p = plan(
        &[listing(vec![], vec![stale, running])],
        &HashSet::new(),
        &settings(),
        at(now),
    );
    assert_eq!(p[0].reason, Reason::StalePart);
    assert!(p[0].delete.is_some());
    assert!(
        p[1].delete.is_none() && matches!(p[1].reason, Reason::Young { .. }),
        "{:?}",
        p[1]
    );
}

#[test]
fn a_volume_name_that_is_also_of_another_entrys_scheme_is_kept() {
    // Entry "home" and entry "home-base-img" share a pool: a part of the latter also
    // reads as a part of "home".
    let name = "ep-home-base-img-base-img-k-unverified.part-100-0123456789abcdef".to_owned();
    let l = listing(vec![], vec![vol(VolumeKind::Part, name, None, Some(100))]);
    let mut other = listing(vec![], vec![]);
    other.entry = "home-base-img".into();
    let p = plan(&[l, other], &HashSet::new(), &settings(), at(T0));
    assert!(p[0].delete.is_none());
    assert_eq!(
        p[0].reason,
        Reason::Ambiguous {
            other: "home-base-img".into()
        }
    );
}
