//! A pool's members as its decision sees them: the member Proxies in the watch cache, plus
//! the pool's own creates and deletes the watch has not shown yet ([`PoolExpectations`]).
//!
//! Guarantees: pure (the clock is an input); a member the pool created counts (as Pending,
//! on its host, with its template hash) until the cache holds it or [`EXPECTATION_TTL`]
//! passed, so a decision made before the watch caught up never creates it again; a member
//! whose delete was sent counts as being deleted until the cache shows it so or gone (the
//! same bound), so it is not chosen for removal twice; a member the pool unpublished carries
//! its drain marker from then on (the cache's annotation, or the marker sent until the cache
//! shows it, within the same bound), so it leaves the budget once and is never unpublished
//! twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use egress_core::pool::member::{
    ANNOTATION_DRAIN, ANNOTATION_QUARANTINE, LABEL_TEMPLATE_HASH, Member, MemberMeta,
};
use egress_core::pool::{AvailabilityMemory, CreateMember};
use kube::{Resource, ResourceExt};

use super::EXPECTATION_TTL;
use crate::api::Proxy;

/// One pool's creates and deletes not seen in the cache yet.
#[derive(Debug, Default)]
pub(in crate::driver) struct PoolExpectations {
    /// Members created: name → (what was created, when).
    pub(in crate::driver) created: HashMap<String, (CreateMember, SystemTime)>,
    /// Members whose delete was sent: name → when.
    pub(in crate::driver) deleted: HashMap<String, SystemTime>,
    /// Members whose drain annotation was set: name → (its marker, when).
    pub(in crate::driver) unpublished: HashMap<String, (String, SystemTime)>,
    /// Members whose create-to-available time was recorded (by this process: a new leader
    /// starts with a fresh memory, which records nothing on its first round).
    pub(in crate::driver) availability: AvailabilityMemory,
}

fn fresh(t: SystemTime, now: SystemTime) -> bool {
    now.duration_since(t).unwrap_or_default() < EXPECTATION_TTL
}

fn to_system_time(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> SystemTime {
    t.map_or(SystemTime::UNIX_EPOCH, |t| SystemTime::from(t.0))
}

/// The members of a pool whose member Proxies in the cache are `objects`, with `exp` applied
/// (and pruned of what the cache now shows or what expired).
pub(in crate::driver) fn observe(
    objects: &[Arc<Proxy>],
    exp: &mut PoolExpectations,
    now: SystemTime,
    health_checks: bool,
    on_listed: egress_core::pool::spec::OnListed,
) -> Vec<Member> {
    let seen: HashSet<String> = objects.iter().map(|p| p.name_any()).collect();
    let deleting_in_cache: HashSet<String> = objects
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_some())
        .map(|p| p.name_any())
        .collect();
    exp.deleted
        .retain(|n, t| seen.contains(n) && !deleting_in_cache.contains(n) && fresh(*t, now));
    exp.created
        .retain(|n, (_, t)| !seen.contains(n) && fresh(*t, now));
    let marked: HashSet<String> = objects
        .iter()
        .filter(|p| p.annotations().contains_key(ANNOTATION_DRAIN))
        .map(|p| p.name_any())
        .collect();
    exp.unpublished
        .retain(|n, (_, t)| seen.contains(n) && !marked.contains(n) && fresh(*t, now));
    let mut members = Vec::with_capacity(objects.len() + exp.created.len());
    for p in objects {
        let name = p.name_any();
        let meta = MemberMeta {
            host: p.spec.host.clone(),
            template_hash: p
                .labels()
                .get(LABEL_TEMPLATE_HASH)
                .cloned()
                .unwrap_or_default(),
            created: to_system_time(p.meta().creation_timestamp.as_ref()),
            quarantine: p.annotations().get(ANNOTATION_QUARANTINE).cloned(),
            deleting: deleting_in_cache.contains(&name) || exp.deleted.contains_key(&name),
            drain: p
                .annotations()
                .get(ANNOTATION_DRAIN)
                .or_else(|| exp.unpublished.get(&name).map(|(m, _)| m))
                .cloned(),
            name,
        };
        let status = p.status.clone().unwrap_or_default();
        members.push(Member::observe_with(
            meta,
            &status,
            health_checks,
            on_listed,
        ));
    }
    for (name, (c, t)) in &exp.created {
        members.push(Member::expected(name, &c.host, &c.template_hash, *t));
    }
    members
}

/// Notes a member delete the API server answered (`accepted`: it took the delete; otherwise
/// the member was gone or replaced); true when it is the member's first delete, to count as
/// a replacement: not a delete already sent and not yet shown by the watch, nor one the
/// cache already shows.
pub(in crate::driver) fn note_delete(
    exp: &mut PoolExpectations,
    p: &Proxy,
    accepted: bool,
    now: SystemTime,
) -> bool {
    let first = accepted
        && p.meta().deletion_timestamp.is_none()
        && !exp.deleted.contains_key(&p.name_any());
    exp.deleted.insert(p.name_any(), now);
    first
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use std::time::Duration;

    use egress_core::model::Phase;

    use egress_core::pool::spec::OnListed;
    use egress_core::pool::{PoolInputs, ProxyPoolSpec, ProxyPoolStatus, decide};

    use super::*;

    fn member(name: &str, deleting: bool) -> Arc<Proxy> {
        let mut v = serde_json::json!({
            "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {LABEL_TEMPLATE_HASH: "h1"}},
            "spec": {"provider": "home", "image": "tiny", "host": "a"},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z".into();
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn creates(members: &[Member], replicas: u32, now: SystemTime) -> usize {
        let spec: ProxyPoolSpec = serde_saphyr::from_str(&format!(
            "replicas: {replicas}\ntemplate:\n  spec:\n    provider: home\n    image: tiny\n    \
             proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n"
        ))
        .unwrap();
        let policy = spec.validate().unwrap();
        let hosts = [egress_core::pool::PoolHost {
            name: "a".into(),
            state: Some(egress_provider::model::HostState::Ready),
            maintenance: Default::default(),
            dead_since: None,
            ready_since: None,
            segment: None,
        }];
        decide(&PoolInputs {
            name: "web",
            generation: 1,
            policy: &policy,
            template_hash: "h1",
            members,
            hosts: &hosts,
            status: &ProxyPoolStatus::default(),
            credentials_present: true,
            now,
        })
        .creates
        .len()
    }

    #[test]
    fn a_create_the_watch_has_not_shown_counts_until_it_is_seen_or_expires() {
        let now = SystemTime::now();
        let mut exp = PoolExpectations::default();
        let c = CreateMember {
            name: "web-bcdfgh".into(),
            host: "a".into(),
            template_hash: "h1".into(),
            pin: Vec::new(),
            replaces: None,
        };
        exp.created.insert(c.name.clone(), (c, now));
        // Not in the cache yet: counted, so the next round creates nothing more.
        let m = observe(&[], &mut exp, now, false, OnListed::Ignore);
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].phase, m[0].host.as_deref()),
            (Phase::Pending, Some("a"))
        );
        assert_eq!(creates(&m, 1, now), 0, "created again: {m:?}");
        // Seen: the cache's object alone.
        let m = observe(
            &[member("web-bcdfgh", false)],
            &mut exp,
            now,
            false,
            OnListed::Ignore,
        );
        assert_eq!(m.len(), 1);
        assert!(exp.created.is_empty());
        // Never seen: forgotten after the TTL (the pool creates it again).
        let c = CreateMember {
            name: "web-lost".into(),
            host: "a".into(),
            template_hash: "h1".into(),
            pin: Vec::new(),
            replaces: None,
        };
        exp.created.insert(c.name.clone(), (c, now));
        let later = now + EXPECTATION_TTL + Duration::from_secs(1);
        assert!(observe(&[], &mut exp, later, false, OnListed::Ignore).is_empty());
        assert!(exp.created.is_empty());
    }

    #[test]
    fn a_delete_the_watch_has_not_shown_counts_as_deleting() {
        let now = SystemTime::now();
        let mut exp = PoolExpectations::default();
        exp.deleted.insert("web-a".into(), now);
        let m = observe(
            &[member("web-a", false)],
            &mut exp,
            now,
            false,
            OnListed::Ignore,
        );
        assert!(m[0].deleting);
        // The cache shows the deletion: the expectation goes, the member is still deleting.
        let m = observe(
            &[member("web-a", true)],
            &mut exp,
            now,
            false,
            OnListed::Ignore,
        );
        assert!(m[0].deleting && exp.deleted.is_empty());
    }

    #[test]
    fn an_unpublish_the_watch_has_not_shown_counts_until_it_is_seen() {
        let now = SystemTime::now();
        let marker = egress_core::pool::Drain {
            since: now,
            cause: egress_core::pool::DeleteCause::Template,
        }
        .marker();
        let mut exp = PoolExpectations::default();
        exp.unpublished
            .insert("web-a".into(), (marker.clone(), now));
        // Not in the cache yet: the member carries the marker (not available, draining).
        let m = observe(
            &[member("web-a", false)],
            &mut exp,
            now,
            false,
            OnListed::Ignore,
        );
        assert!(m[0].draining.is_some() && !m[0].available, "{m:?}");
        // The cache shows the annotation: the expectation goes, the marker stays.
        let mut v = serde_json::to_value(&*member("web-a", false)).unwrap();
        v["metadata"]["annotations"] = serde_json::json!({ ANNOTATION_DRAIN: marker });
        let annotated: Arc<Proxy> = Arc::new(serde_json::from_value(v).unwrap());
        let m = observe(&[annotated], &mut exp, now, false, OnListed::Ignore);
        assert!(
            m[0].draining.is_some() && exp.unpublished.is_empty(),
            "{m:?}"
        );
        // Expired without being seen: forgotten.
        exp.unpublished.insert("web-b".into(), (marker, now));
        let later = now + EXPECTATION_TTL + Duration::from_secs(1);
        let m = observe(
            &[member("web-b", false)],
            &mut exp,
            later,
            false,
            OnListed::Ignore,
        );
        assert!(m[0].draining.is_none() && exp.unpublished.is_empty());
    }

    #[test]
    fn a_delete_counts_once_not_when_retried_seen_or_refused() {
        let now = SystemTime::now();
        let mut exp = PoolExpectations::default();
        // Gone or replaced (404/409): not this pool's delete.
        assert!(!note_delete(&mut exp, &member("web-x", false), false, now));
        exp.deleted.clear();
        // Taken: counted, and remembered until the watch shows it.
        assert!(note_delete(&mut exp, &member("web-a", false), true, now));
        // Sent again before the watch shows it: not counted again.
        assert!(!note_delete(&mut exp, &member("web-a", false), true, now));
        // The cache shows it deleting (the expectation pruned): not counted again.
        let _ = observe(
            &[member("web-a", true)],
            &mut exp,
            now,
            false,
            OnListed::Ignore,
        );
        assert!(exp.deleted.is_empty());
        assert!(!note_delete(&mut exp, &member("web-a", true), true, now));
    }
}
