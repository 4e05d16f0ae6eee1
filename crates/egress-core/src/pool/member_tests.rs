//! Reading members from their Proxy status, and how members are named, hashed and specified.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::{Duration, SystemTime};

use super::member::{Member, MemberMeta, member_name, member_spec, template_hash};
use crate::model::{
    Condition, ConditionStatus, HealthStatus, Phase, ProxySpec, ProxyStatus, condition,
};
use crate::pool::spec::ProxyTemplate;

fn at(s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
}

fn meta() -> MemberMeta {
    MemberMeta {
        name: "web-bcdfgh".into(),
        host: Some("h1".into()),
        template_hash: "0123456789".into(),
        created: at(0),
        quarantine: None,
        deleting: false,
        drain: None,
    }
}

fn status(phase: Phase, ready: ConditionStatus, since: u64, healthy: Option<bool>) -> ProxyStatus {
    let mut st = ProxyStatus {
        phase,
        health: healthy.map(|h| HealthStatus {
            healthy: Some(h),
            ..HealthStatus::default()
        }),
        ..ProxyStatus::default()
    };
    let t = humantime::format_rfc3339_seconds(at(since)).to_string();
    st.set_condition(Condition::new(
        condition::READY,
        ready,
        "NotHealthy",
        "connect refused",
        &t,
        1,
    ));
    st
}

#[test]
fn a_member_is_available_only_when_ready_running_and_healthy_through_itself() {
    let ok = status(Phase::Running, ConditionStatus::True, 10, Some(true));
    let m = Member::observe(meta(), &ok, true);
    assert!(m.ready && m.available && m.unhealthy_since.is_none() && m.failure.is_none());
    // Ready but the health engine has no verdict: not available while health checks run...
    let unchecked = status(Phase::Running, ConditionStatus::True, 10, None);
    assert!(!Member::observe(meta(), &unchecked, true).available);
    // ...and available when they are off (Ready is all there is).
    assert!(Member::observe(meta(), &unchecked, false).available);
}

#[test]
fn an_unhealthy_or_paused_member_is_unhealthy_since_its_ready_condition_turned_false() {
    for phase in [Phase::Running, Phase::Paused] {
        let st = status(phase, ConditionStatus::False, 40, Some(false));
        let m = Member::observe(meta(), &st, true);
        assert_eq!(m.unhealthy_since, Some(at(40)), "{phase:?}");
        assert_eq!(m.failure.as_deref(), Some("connect refused"));
    }
    // Still provisioning: not unhealthy (the controller's provisioning deadline covers it).
    let st = status(Phase::Provisioning, ConditionStatus::False, 40, None);
    assert_eq!(Member::observe(meta(), &st, true).unhealthy_since, None);
    // Failed: its cause is kept for the pool's ReplicaFailure condition.
    let st = status(Phase::Failed, ConditionStatus::False, 40, None);
    assert_eq!(
        Member::observe(meta(), &st, true).failure.as_deref(),
        Some("connect refused")
    );
    // No Ready condition at all: unhealthy since it was created.
    let st = ProxyStatus {
        phase: Phase::Running,
        ..ProxyStatus::default()
    };
    assert_eq!(
        Member::observe(meta(), &st, true).unhealthy_since,
        Some(at(0))
    );
}

fn template() -> ProxySpec {
    serde_saphyr::from_str(
        "provider: home\nimage: debian-12\nproxy:\n  allowedClientCidrs: [10.0.0.0/8]\n",
    )
    .unwrap()
}

#[test]
fn the_template_hash_follows_the_template_and_the_credentials_only() {
    let t = ProxyTemplate {
        spec: template(),
        ..ProxyTemplate::default()
    };
    let h = template_hash(&t, "");
    assert_eq!(h.len(), 10);
    assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(template_hash(&t.clone(), ""), h, "stable");
    let mut t2 = t.clone();
    t2.spec.image = "debian-13".into();
    assert_ne!(template_hash(&t2, ""), h);
    assert_ne!(template_hash(&t, "creds-digest"), h);
    // The members' labels and annotations are part of the template too.
    let mut t3 = t.clone();
    t3.metadata.labels.insert("team".into(), "a".into());
    assert_ne!(template_hash(&t3, ""), h);
    let mut t4 = t.clone();
    t4.metadata.annotations.insert("note".into(), "x".into());
    assert_ne!(template_hash(&t4, ""), h);
    assert_ne!(template_hash(&t4, ""), template_hash(&t3, ""));
    // Without metadata the hash is the spec's alone, by the formula members made before
    // metadata existed carry: upgrading replaces no member.
    use sha2::{Digest, Sha256};
    let mut old = Sha256::new();
    old.update(serde_json::to_vec(&t.spec).unwrap());
    old.update([0]);
    let old: String = old.finalize()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(h, old, "the hash of a template without metadata changed");
}

#[test]
fn member_names_are_derived_distinct_and_valid_and_a_member_is_pinned_with_the_pool_credentials() {
    let a = member_name("web", "0123456789", at(0), 0);
    assert_eq!(a, member_name("web", "0123456789", at(0), 0));
    assert_ne!(a, member_name("web", "0123456789", at(0), 1));
    assert_ne!(a, member_name("web", "0123456789", at(1), 0));
    let long = "a".repeat(super::validate::MAX_POOL_NAME);
    let n = member_name(&long, "x", at(0), 7);
    assert_eq!(n.len(), 63);
    assert!(crate::model::is_dns_subdomain(&n), "{n}");
    let s = member_spec(&template(), "h2", &[], Some("web-credentials"));
    assert_eq!(s.host.as_deref(), Some("h2"));
    assert_eq!(s.proxy.credentials_ref.as_deref(), Some("web-credentials"));
    assert!(s.validate().is_empty());
    assert!(s.egress.address.is_empty());
    // A replacement under `rotation.egressAddress: Keep` pins its predecessor's addresses.
    let pin = ["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()];
    let s = member_spec(&template(), "h2", &pin, None);
    assert_eq!(s.egress.address, vec!["192.0.2.7", "2001:db8::7"]);
    assert!(s.validate().is_empty(), "{:?}", s.validate());
    assert_eq!(
        member_spec(&template(), "h2", &[], None)
            .proxy
            .credentials_ref,
        None
    );
}

#[test]
fn a_member_and_its_status_row_carry_its_declared_egress_addresses() {
    let mut st = status(Phase::Running, ConditionStatus::True, 10, Some(true));
    assert!(Member::observe(meta(), &st, true).egress_address.is_empty());
    st.egress_address = vec!["203.0.113.7".into(), "2001:db8::7".into()];
    let m = Member::observe(meta(), &st, true);
    assert_eq!(m.egress_address, ["203.0.113.7", "2001:db8::7"]);
    let row = super::status::PoolMemberStatus::of_member(&m);
    assert_eq!(row.egress_address, ["203.0.113.7", "2001:db8::7"]);
    // In the pool's status as `egressAddress`, left out when it holds none.
    let json = serde_json::to_value(&row).unwrap();
    assert_eq!(json["egressAddress"][1], "2001:db8::7");
    st.egress_address.clear();
    let row = super::status::PoolMemberStatus::of_member(&Member::observe(meta(), &st, true));
    assert!(
        serde_json::to_value(&row)
            .unwrap()
            .get("egressAddress")
            .is_none()
    );
}

#[test]
fn unpublish_makes_a_listed_member_unavailable_without_starting_autohealing() {
    use crate::pool::spec::OnListed;
    let mut st = status(Phase::Running, ConditionStatus::True, 10, Some(true));
    st.egress_address = vec!["192.0.2.1".into()];
    st.reputation = Some(egress_reputation::ProxyReputation {
        addresses: vec!["192.0.2.1".into()],
        listed: vec![egress_reputation::status::ListingStatus {
            address: "192.0.2.1".into(),
            zone: "bl.test".into(),
            since: "2027-01-15T08:00:00Z".into(),
            codes: vec!["SBL".into()],
        }],
        failed: vec![],
        last_check: Some("2027-01-15T08:00:00Z".into()),
    });
    let m = Member::observe_with(meta(), &st, true, OnListed::Unpublish);
    assert!(!m.available, "not published while listed");
    assert!(
        m.unhealthy_since.is_none(),
        "a listing is not a health failure"
    );
    assert_eq!(m.listed, ["192.0.2.1"]);
    assert_eq!(m.listed_declared(), ["192.0.2.1"]);
    assert!(
        m.listed_note.contains("192.0.2.1 in bl.test (SBL) since"),
        "{}",
        m.listed_note
    );
    for policy in [OnListed::Ignore, OnListed::Replace] {
        assert!(
            Member::observe_with(meta(), &st, true, policy).available,
            "{policy:?}"
        );
    }
    // A listing of an observed address it does not hold: nothing to retire.
    st.egress_address = vec!["192.0.2.2".into()];
    assert!(
        Member::observe(meta(), &st, true)
            .listed_declared()
            .is_empty()
    );
}
