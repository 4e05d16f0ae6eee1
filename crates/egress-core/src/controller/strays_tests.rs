//! Tests of second copies ([`super::strays`]) over an in-memory provider that keeps instances
//! per host, with tokio's paused clock: a create whose answer is lost leaves a copy behind,
//! the Proxy comes up on another host, and the copy is deleted; listings never move a known
//! location; a deleted Proxy's delete covers every noted host.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_provider::error::{ProviderError, Result};
use egress_provider::model::{
    CreateRequest, HostReport, HostState, Instance, InstanceState, OwnedInstance, Progress,
    ProviderId, ProxyUid,
};
use egress_provider::provider::Provider;

use super::test_fixtures::{entry, now, obj as pinned_obj, report, uid};
use super::{Controller, ControllerSettings, Outcome, ProxyObject};
use crate::model::{Phase, ProxyStatus};
use crate::providers::{ProviderHandle, Providers};

/// Instances per host. A create on a host in `lose_answer` defines the instance and then
/// fails as if its answer was lost; deletes on a host in `refuse_delete` fail.
#[derive(Default)]
struct Hosts {
    made: Mutex<BTreeMap<(String, ProxyUid), Instance>>,
    lose_answer: Mutex<BTreeSet<String>>,
    refuse_delete: Mutex<BTreeSet<String>>,
    hang_delete: AtomicBool,
    deletes: Mutex<Vec<String>>,
}

impl Hosts {
    fn on(&self, host: &str) -> BTreeSet<ProxyUid> {
        let made = self.made.lock().unwrap();
        made.keys()
            .filter(|(h, _)| h == host)
            .map(|(_, u)| *u)
            .collect()
    }
    fn put(&self, host: &str, uid: ProxyUid) {
        self.made
            .lock()
            .unwrap()
            .insert((host.to_owned(), uid), instance(host, uid));
    }
}

fn instance(host: &str, uid: ProxyUid) -> Instance {
    Instance {
        id: ProviderId {
            entry: "home".into(),
            host: host.into(),
            name: format!("ep-home-{}", uid.simple()),
        },
        uid,
        state: InstanceState::Running,
        ip: Some("192.0.2.7".parse().unwrap()),
        mac: "52:54:00:00:00:07".into(),
        egress: Vec::new(),
        address_note: None,
    }
}

#[async_trait]
impl Provider for Hosts {
    fn entry(&self) -> &str {
        "home"
    }
    async fn create(&self, req: &CreateRequest, _progress: &dyn Progress) -> Result<Instance> {
        self.put(&req.host, req.uid);
        if self.lose_answer.lock().unwrap().contains(&req.host) {
            return Err(ProviderError::transient("connection closed"));
        }
        Ok(instance(&req.host, req.uid))
    }
    async fn get(&self, id: &ProviderId, uid: &ProxyUid) -> Result<Instance> {
        self.made
            .lock()
            .unwrap()
            .get(&(id.host.clone(), *uid))
            .cloned()
            .ok_or_else(|| ProviderError::not_found("gone"))
    }
    async fn delete(&self, host: &str, uid: &ProxyUid) -> Result<()> {
        while self.hang_delete.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.deletes.lock().unwrap().push(host.to_owned());
        if self.refuse_delete.lock().unwrap().contains(host) {
            return Err(ProviderError::transient("host unreachable"));
        }
        self.made.lock().unwrap().remove(&(host.to_owned(), *uid));
        Ok(())
    }
    async fn list_owned(&self) -> Result<Vec<OwnedInstance>> {
        Ok(Vec::new())
    }
    async fn check(&self) -> Vec<HostReport> {
        Vec::new()
    }
}

fn controller(p: Arc<Hosts>) -> Controller {
    let h = ProviderHandle::new(entry(4), p);
    Controller::new(
        Arc::new(Providers::from_handles([h])),
        ControllerSettings::default(),
    )
}

/// Proxy `p{n}`, placed by the controller.
fn obj(n: u8) -> ProxyObject {
    pinned_obj(n, None)
}

fn owned(host: &str, n: u8) -> OwnedInstance {
    OwnedInstance {
        id: instance(host, uid(n)).id,
        uid: uid(n),
        created_at: now(),
        name_matches_uid: true,
    }
}

/// Reconciles `o` `times` times (or until it is finalized), letting spawned work finish in
/// between.
async fn rounds(c: &Controller, o: &ProxyObject, status: ProxyStatus, times: u32) -> Outcome {
    rounds_at(c, o, status, times, now()).await
}

/// [`rounds`] with the reconciles' clock at `at`.
async fn rounds_at(
    c: &Controller,
    o: &ProxyObject,
    mut status: ProxyStatus,
    times: u32,
    at: SystemTime,
) -> Outcome {
    let mut out = None;
    for _ in 0..times {
        let r = c.reconcile(o, &status, at).await;
        status = r.status.clone();
        let done = r.finalized;
        out = Some(r);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    out.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_copy_left_by_a_create_whose_answer_was_lost_is_deleted_once_the_proxy_runs_elsewhere() {
    let p = Arc::new(Hosts::default());
    p.lose_answer.lock().unwrap().insert("h1".into());
    let c = controller(p.clone());
    let o = obj(1);
    // The first create goes to h1 (both idle, by name), defines the instance there and its
    // answer is lost; h1 then looks unreachable, so the next attempt goes to h2.
    let first = rounds(&c, &o, ProxyStatus::default(), 2).await;
    assert_eq!(first.status.host.as_deref(), Some("h1"));
    assert_eq!(
        p.on("h1"),
        BTreeSet::from([uid(1)]),
        "the lost create left a copy"
    );
    c.record_host_reports("home", &[report("h1", HostState::Unreachable)]);
    let out = rounds(&c, &o, first.status, 4).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(out.status.host.as_deref(), Some("h2"));
    assert_eq!(p.on("h2"), BTreeSet::from([uid(1)]));
    assert!(p.on("h1").is_empty(), "the copy on h1 was deleted");
    assert_eq!(c.metrics().duplicate_deletes_ok, 1);
    // Once swept, nothing more is addressed there.
    let before = p.deletes.lock().unwrap().len();
    rounds(&c, &o, out.status, 3).await;
    assert_eq!(
        p.deletes.lock().unwrap().len(),
        before,
        "no further deletes"
    );
}

#[tokio::test(start_paused = true)]
async fn a_create_that_succeeds_where_an_earlier_one_was_lost_keeps_its_instance() {
    let p = Arc::new(Hosts::default());
    p.lose_answer.lock().unwrap().insert("h1".into());
    let c = controller(p.clone());
    let o = obj(1);
    let first = rounds(&c, &o, ProxyStatus::default(), 2).await;
    // h1 answers again: the retry goes to h1 (sticky) and converges there.
    p.lose_answer.lock().unwrap().clear();
    let out = rounds(&c, &o, first.status, 6).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(out.status.host.as_deref(), Some("h1"));
    assert_eq!(
        p.on("h1"),
        BTreeSet::from([uid(1)]),
        "never swept from under itself"
    );
    assert!(p.deletes.lock().unwrap().is_empty(), "{:?}", p.deletes);
}

#[tokio::test(start_paused = true)]
async fn a_listing_showing_one_uid_on_two_hosts_adopts_one_and_deletes_the_other() {
    let p = Arc::new(Hosts::default());
    p.put("h1", uid(1));
    p.put("h2", uid(1));
    let c = controller(p.clone());
    c.adopt("home", &[owned("h1", 1), owned("h2", 1)]);
    let out = rounds(&c, &obj(1), ProxyStatus::default(), 3).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(out.status.host.as_deref(), Some("h1"));
    assert_eq!(p.on("h1"), BTreeSet::from([uid(1)]));
    assert!(p.on("h2").is_empty(), "the second copy was deleted");
}

#[tokio::test(start_paused = true)]
async fn of_two_listed_copies_the_newest_is_adopted_whatever_the_listing_order() {
    for order in [["h1", "h2"], ["h2", "h1"]] {
        let p = Arc::new(Hosts::default());
        p.put("h1", uid(1));
        p.put("h2", uid(1));
        let c = controller(p.clone());
        // h2's copy is the newer one: the Proxy was made there after a create on h1 was lost.
        let listed: Vec<OwnedInstance> = order
            .iter()
            .map(|h| OwnedInstance {
                created_at: if *h == "h2" {
                    now() + Duration::from_secs(60)
                } else {
                    now()
                },
                ..owned(h, 1)
            })
            .collect();
        c.adopt("home", &listed);
        let out = rounds(&c, &obj(1), ProxyStatus::default(), 3).await;
        assert_eq!(out.status.host.as_deref(), Some("h2"), "listed {order:?}");
        assert_eq!(p.on("h2"), BTreeSet::from([uid(1)]));
        assert!(p.on("h1").is_empty(), "the older copy was deleted");
    }
}

#[tokio::test(start_paused = true)]
async fn a_listing_older_than_a_create_never_moves_the_proxy_back() {
    let p = Arc::new(Hosts::default());
    let c = controller(p.clone());
    let o = obj(1);
    c.record_host_reports("home", &[report("h1", HostState::Unreachable)]);
    let out = rounds(&c, &o, ProxyStatus::default(), 2).await;
    assert_eq!(out.status.host.as_deref(), Some("h2"));
    // A listing taken before shows a copy on h1 (say, from before a restart).
    p.put("h1", uid(1));
    c.adopt("home", &[owned("h1", 1)]);
    let out = rounds(&c, &o, out.status, 3).await;
    assert_eq!(out.status.host.as_deref(), Some("h2"), "the location stays");
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(p.on("h2"), BTreeSet::from([uid(1)]));
    assert!(p.on("h1").is_empty(), "the listed copy was deleted");
}

#[tokio::test(start_paused = true)]
async fn a_failed_sweep_is_retried_after_backoff_and_the_proxy_stays_running() {
    let p = Arc::new(Hosts::default());
    p.put("h1", uid(1));
    p.put("h2", uid(1));
    p.refuse_delete.lock().unwrap().insert("h2".into());
    let c = controller(p.clone());
    c.adopt("home", &[owned("h1", 1), owned("h2", 1)]);
    let o = obj(1);
    let out = rounds(&c, &o, ProxyStatus::default(), 3).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(c.metrics().duplicate_deletes_failed, 1);
    // Within the backoff, no new attempt.
    let out = rounds(&c, &o, out.status, 2).await;
    assert_eq!(c.metrics().duplicate_deletes_failed, 1, "backing off");
    p.refuse_delete.lock().unwrap().clear();
    let later = now() + ControllerSettings::default().backoff_max;
    let out = rounds_at(&c, &o, out.status, 2, later).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert!(p.on("h2").is_empty());
    assert_eq!(p.on("h1"), BTreeSet::from([uid(1)]));
}

#[tokio::test(start_paused = true)]
async fn no_create_starts_while_a_sweep_runs() {
    let p = Arc::new(Hosts::default());
    p.put("h1", uid(1));
    p.put("h2", uid(1));
    let c = controller(p.clone());
    c.adopt("home", &[owned("h1", 1), owned("h2", 1)]);
    let o = obj(1);
    p.hang_delete.store(true, Ordering::SeqCst);
    let out = rounds(&c, &o, ProxyStatus::default(), 1).await;
    assert_eq!(out.status.phase, Phase::Running);
    // The instance on h1 vanishes while the sweep of h2 hangs: no create may start yet.
    p.made.lock().unwrap().remove(&("h1".to_owned(), uid(1)));
    let out = rounds(&c, &o, out.status, 3).await;
    assert_eq!(c.metrics().creates_started, 0, "no create during the sweep");
    p.hang_delete.store(false, Ordering::SeqCst);
    let out = rounds(&c, &o, out.status, 5).await;
    assert_eq!(c.metrics().creates_started, 1);
    assert_eq!(out.status.phase, Phase::Running);
    let everywhere: usize = ["h1", "h2"].iter().map(|h| p.on(h).len()).sum();
    assert_eq!(everywhere, 1, "exactly one instance");
}

#[tokio::test(start_paused = true)]
async fn deleting_a_proxy_deletes_every_copy_noted_for_it() {
    let p = Arc::new(Hosts::default());
    p.lose_answer.lock().unwrap().insert("h1".into());
    let c = controller(p.clone());
    let mut o = obj(1);
    let first = rounds(&c, &o, ProxyStatus::default(), 2).await;
    c.record_host_reports("home", &[report("h1", HostState::Unreachable)]);
    // The Proxy comes up on h2; h1's copy stays (its deletes fail for now).
    p.refuse_delete.lock().unwrap().insert("h1".into());
    let status = rounds(&c, &o, first.status, 4).await.status;
    assert_eq!(status.host.as_deref(), Some("h2"));
    assert_eq!(p.on("h1"), BTreeSet::from([uid(1)]));
    p.refuse_delete.lock().unwrap().clear();
    o.deleting = true;
    let out = rounds(&c, &o, status, 3).await;
    assert!(out.finalized, "{:?}", out.status);
    assert!(
        p.on("h1").is_empty() && p.on("h2").is_empty(),
        "nothing left"
    );
}

#[tokio::test(start_paused = true)]
async fn a_proxy_restored_while_its_delete_failed_ends_with_one_instance() {
    let p = Arc::new(Hosts::default());
    p.put("h1", uid(1));
    let c = controller(p.clone());
    c.adopt("home", &[owned("h1", 1)]);
    let mut o = obj(1);
    let out = rounds(&c, &o, ProxyStatus::default(), 2).await;
    assert_eq!(out.status.host.as_deref(), Some("h1"));
    // Deleted while h1 refuses; the delete fails; then the Proxy is wanted again and h1 looks
    // unreachable, so it comes up on h2.
    p.refuse_delete.lock().unwrap().insert("h1".into());
    o.deleting = true;
    let out = rounds(&c, &o, out.status, 1).await;
    o.deleting = false;
    c.record_host_reports("home", &[report("h1", HostState::Unreachable)]);
    let out = rounds(&c, &o, out.status, 3).await;
    assert_eq!(out.status.host.as_deref(), Some("h2"));
    assert_eq!(p.on("h1"), BTreeSet::from([uid(1)]), "h1 kept its copy");
    p.refuse_delete.lock().unwrap().clear();
    // After the backoff of the attempt that failed while h1 refused.
    let later = now() + ControllerSettings::default().backoff_max;
    let out = rounds_at(&c, &o, out.status, 3, later).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(p.on("h2"), BTreeSet::from([uid(1)]));
    assert!(p.on("h1").is_empty(), "the old copy was deleted");
}

#[tokio::test(start_paused = true)]
async fn a_new_term_keeps_the_copy_the_status_names_while_the_old_terms_sweep_deletes_the_other() {
    let p = Arc::new(Hosts::default());
    let o = obj(1);
    // The old term (or the process before a restart) runs the Proxy on h1; a listing then
    // shows a newer copy of it on h2 (left by an earlier create whose answer was lost).
    let old = controller(p.clone());
    let running = rounds(&old, &o, ProxyStatus::default(), 2).await;
    assert_eq!(running.status.host.as_deref(), Some("h1"));
    p.put("h2", uid(1));
    let listed = [
        owned("h1", 1),
        OwnedInstance {
            created_at: now() + Duration::from_secs(60),
            ..owned("h2", 1)
        },
    ];
    old.adopt("home", &listed);
    // Its sweep of h2 starts and is still in flight when leadership passes.
    p.hang_delete.store(true, Ordering::SeqCst);
    let status = rounds(&old, &o, running.status, 1).await.status;
    assert_eq!(status.host.as_deref(), Some("h1"));
    // The new term lists before its first reconcile: newest first would pick h2, the copy
    // the old term is deleting, and sweep h1, the one in use.
    let new = controller(p.clone());
    new.adopt("home", &listed);
    let status = rounds(&new, &o, status, 1).await.status;
    p.hang_delete.store(false, Ordering::SeqCst);
    let out = rounds(&new, &o, status, 6).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(out.status.host.as_deref(), Some("h1"), "{:?}", out.status);
    assert_eq!(
        p.on("h1"),
        BTreeSet::from([uid(1)]),
        "the copy in use stays"
    );
    assert!(p.on("h2").is_empty(), "the other copy was deleted");
    assert_eq!(
        new.metrics().creates_started,
        0,
        "the new term recreated the Proxy"
    );
    assert!(
        !p.deletes.lock().unwrap().iter().any(|h| h == "h1"),
        "h1 was addressed by a delete: {:?}",
        p.deletes
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_status_naming_a_listed_copy_the_newest_copy_stays_the_choice() {
    let p = Arc::new(Hosts::default());
    p.put("h1", uid(1));
    p.put("h2", uid(1));
    let c = controller(p.clone());
    c.adopt(
        "home",
        &[
            owned("h1", 1),
            OwnedInstance {
                created_at: now() + Duration::from_secs(60),
                ..owned("h2", 1)
            },
        ],
    );
    // The status names a host with no listed copy (h3): the listing's choice stands.
    let status = ProxyStatus {
        provider_id: Some(instance("h3", uid(1)).id.to_string()),
        ..ProxyStatus::default()
    };
    let out = rounds(&c, &obj(1), status, 3).await;
    assert_eq!(out.status.host.as_deref(), Some("h2"));
    assert!(p.on("h1").is_empty(), "the older copy was deleted");
}
