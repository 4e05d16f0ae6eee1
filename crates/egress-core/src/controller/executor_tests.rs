//! Tests of the executor ([`super::Controller`]) over a scripted in-memory provider, with
//! tokio's paused clock: deadlines, in-flight tracking, per-host slots, shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::error::{ProviderError, Result};
use egress_provider::model::{
    CreateRequest, HostReport, Instance, InstanceState, OwnedInstance, Progress, ProviderId,
    ProxyUid,
};
use egress_provider::provider::Provider;

use super::decide::reason;
use super::test_fixtures::{entry, now, obj, report, uid};
use super::{Controller, ControllerSettings};
use crate::model::{Phase, ProxyStatus, condition};
use crate::providers::{ProviderHandle, Providers};

/// A provider whose calls hang while `hang` is set, and whose creates report progress.
#[derive(Default)]
struct Scripted {
    hang_get: AtomicBool,
    hang_create: AtomicBool,
    creates: AtomicU32,
    deletes: Mutex<Vec<String>>,
    made: Mutex<BTreeMap<ProxyUid, Instance>>,
    /// Each create's `reserved` addresses, by UID.
    reserved: Mutex<BTreeMap<ProxyUid, Vec<std::net::IpAddr>>>,
}

#[async_trait]
impl Provider for Scripted {
    fn entry(&self) -> &str {
        "home"
    }
    async fn create(&self, req: &CreateRequest, progress: &dyn Progress) -> Result<Instance> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        self.reserved
            .lock()
            .unwrap()
            .insert(req.uid, req.reserved.clone());
        progress.update(312 << 20, Some(1024 << 20));
        while self.hang_create.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let inst = Instance {
            id: ProviderId {
                entry: "home".into(),
                host: req.host.clone(),
                name: format!("ep-home-{}", req.uid.simple()),
            },
            uid: req.uid,
            state: InstanceState::Running,
            ip: Some("192.0.2.7".parse().unwrap()),
            mac: "52:54:00:00:00:07".into(),
            // What a host's address pool gives: the pinned addresses (none without a pin).
            egress: req.pinned_egress.clone(),
            address_note: None,
        };
        self.made.lock().unwrap().insert(req.uid, inst.clone());
        Ok(inst)
    }
    async fn get(&self, _id: &ProviderId, uid: &ProxyUid) -> Result<Instance> {
        if self.hang_get.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.made
            .lock()
            .unwrap()
            .get(uid)
            .cloned()
            .ok_or_else(|| ProviderError::not_found("gone"))
    }
    async fn delete(&self, host: &str, uid: &ProxyUid) -> Result<()> {
        self.deletes.lock().unwrap().push(host.to_owned());
        self.made.lock().unwrap().remove(uid);
        Ok(())
    }
    async fn list_owned(&self) -> Result<Vec<OwnedInstance>> {
        Ok(Vec::new())
    }
    async fn check(&self) -> Vec<HostReport> {
        Vec::new()
    }
}

fn controller(p: Arc<Scripted>, max_concurrent: u32) -> Controller {
    let h = ProviderHandle::new(entry(max_concurrent), p);
    Controller::new(
        Arc::new(Providers::from_handles([h])),
        ControllerSettings::default(),
    )
}

fn ready_reason(s: &ProxyStatus) -> String {
    s.condition(condition::READY).unwrap().reason.clone()
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_never_outlives_its_deadline_even_when_the_host_never_answers() {
    // finding: APX-3
    let p = Arc::new(Scripted::default());
    let c = controller(p.clone(), 2);
    let o = obj(1, None);
    let first = c.reconcile(&o, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the create finishes
    let st = c.reconcile(&o, &first.status, now()).await.status;
    assert_eq!(st.phase, Phase::Running);
    p.hang_get.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let out = c.reconcile(&o, &st, now()).await;
    let took = started.elapsed();
    assert!(
        took <= ControllerSettings::default().reconcile_deadline,
        "took {took:?}"
    );
    assert_eq!(out.status.phase, Phase::Running, "phase kept");
    assert_eq!(out.status.ip.as_deref(), Some("192.0.2.7"), "IP kept");
    assert_eq!(ready_reason(&out.status), reason::TRANSIENT_ERROR);
    assert!(out.requeue_after.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_create_runs_in_the_background_and_reconcile_reports_its_progress() {
    let p = Arc::new(Scripted::default());
    p.hang_create.store(true, Ordering::SeqCst);
    let c = controller(p.clone(), 2);
    let o = obj(1, None);
    let out = c.reconcile(&o, &ProxyStatus::default(), now()).await;
    assert_eq!(out.status.phase, Phase::Provisioning);
    tokio::task::yield_now().await;
    let out = c.reconcile(&o, &out.status, now()).await;
    let m = &out.status.condition(condition::READY).unwrap().message;
    assert!(m.contains("importing image debian-12: 312/1024 MiB"), "{m}");
    assert_eq!(c.metrics().creates_in_flight, 1);
    assert_eq!(
        p.creates.load(Ordering::SeqCst),
        1,
        "one create, not one per reconcile"
    );
    p.hang_create.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = c.reconcile(&o, &out.status, now()).await;
    assert_eq!(out.status.phase, Phase::Running);
    assert_eq!(c.metrics().creates_succeeded, 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_host_reports_host_busy_while_other_hosts_take_work() {
    // finding: H1
    let p = Arc::new(Scripted::default());
    p.hang_create.store(true, Ordering::SeqCst);
    let c = controller(p.clone(), 1);
    let a = c
        .reconcile(&obj(1, Some("h1")), &ProxyStatus::default(), now())
        .await;
    assert_eq!(ready_reason(&a.status), reason::CREATING);
    let b = c
        .reconcile(&obj(2, Some("h1")), &ProxyStatus::default(), now())
        .await;
    assert_eq!(ready_reason(&b.status), reason::HOST_BUSY);
    assert_eq!(b.status.phase, Phase::Pending);
    assert!(b.requeue_after.is_some());
    let other = c
        .reconcile(&obj(3, Some("h2")), &ProxyStatus::default(), now())
        .await;
    assert_eq!(ready_reason(&other.status), reason::CREATING);
    assert_eq!(c.metrics().host_busy, 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_starts_no_new_work_and_aborts_what_outlives_the_grace() {
    let p = Arc::new(Scripted::default());
    p.hang_create.store(true, Ordering::SeqCst);
    let c = controller(p.clone(), 2);
    let _ = c
        .reconcile(&obj(1, None), &ProxyStatus::default(), now())
        .await;
    c.shutdown(Duration::from_secs(5)).await;
    let out = c
        .reconcile(&obj(2, None), &ProxyStatus::default(), now())
        .await;
    assert_eq!(ready_reason(&out.status), reason::SHUTTING_DOWN);
    assert_eq!(p.creates.load(Ordering::SeqCst), 1);
    tokio::task::yield_now().await;
    assert_eq!(c.metrics().creates_in_flight, 0, "aborted after the grace");
}

#[tokio::test(start_paused = true)]
async fn the_controller_remembers_the_egress_the_provider_reported_until_the_instance_is_gone() {
    let p = Arc::new(Scripted::default());
    let c = controller(p.clone(), 2);
    let mut o = obj(1, None);
    std::sync::Arc::make_mut(&mut o.spec).egress.address =
        vec!["203.0.113.7".into(), "2001:db8::7".into()];
    let want: Vec<std::net::IpAddr> = vec![
        "203.0.113.7".parse().unwrap(),
        "2001:db8::7".parse().unwrap(),
    ];
    assert!(
        c.declared_egress(&o.uid).is_empty(),
        "nothing before a report"
    );
    let first = c.reconcile(&o, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the create finishes
    let st = c.reconcile(&o, &first.status, now()).await.status;
    assert_eq!(st.phase, Phase::Running);
    assert_eq!(c.declared_egress(&o.uid), want, "from the create's result");
    assert_eq!(st.egress_address, ["203.0.113.7", "2001:db8::7"]);
    // A status claiming other addresses changes nothing the controller remembers.
    let mut forged = st.clone();
    forged.egress_address = vec!["198.51.100.66".into()];
    let st = c.reconcile(&o, &forged, now()).await.status;
    assert_eq!(c.declared_egress(&o.uid), want, "from the provider's get");
    assert_eq!(st.egress_address, ["203.0.113.7", "2001:db8::7"]);
    // While the host does not answer, a forged status keeps only what the provider said.
    p.hang_get.store(true, Ordering::SeqCst);
    let out = c.reconcile(&o, &forged, now()).await;
    assert_eq!(
        out.status.egress_address,
        ["203.0.113.7", "2001:db8::7"],
        "{:?}",
        out.status
    );
    p.hang_get.store(false, Ordering::SeqCst);
    // The instance vanishes: the next get forgets its addresses.
    p.made.lock().unwrap().clear();
    let _ = c.reconcile(&o, &st, now()).await;
    assert!(c.declared_egress(&o.uid).is_empty());
    // And forgetting the Proxy drops them too.
    let o2 = {
        let mut o2 = obj(2, None);
        std::sync::Arc::make_mut(&mut o2.spec).egress.address = vec!["203.0.113.8".into()];
        o2
    };
    let first = c.reconcile(&o2, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = c.reconcile(&o2, &first.status, now()).await;
    assert_eq!(c.declared_egress(&o2.uid).len(), 1);
    c.forget(&o2.uid);
    assert!(c.declared_egress(&o2.uid).is_empty());
}

#[tokio::test(start_paused = true)]
async fn deleting_an_unplaced_proxy_reaches_every_host_then_finalizes() {
    // finding: M3
    let p = Arc::new(Scripted::default());
    let c = controller(p.clone(), 2);
    let mut o = obj(1, None);
    o.deleting = true;
    let out = c.reconcile(&o, &ProxyStatus::default(), now()).await;
    assert!(!out.finalized);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let out = c.reconcile(&o, &out.status, now()).await;
    assert!(out.finalized);
    let mut hosts = p.deletes.lock().unwrap().clone();
    hosts.sort();
    assert_eq!(hosts, ["h1", "h2"]);
}

#[tokio::test(start_paused = true)]
async fn a_proxy_whose_provider_was_edited_is_refused_and_then_deleted_where_it_lives() {
    // finding: M2, M3
    let home = Arc::new(Scripted::default());
    let away = Arc::new(Scripted::default());
    let mut away_entry = entry(2);
    away_entry.name = "away".into();
    let c = Controller::new(
        Arc::new(Providers::from_handles([
            ProviderHandle::new(entry(2), home.clone()),
            ProviderHandle::new(away_entry, away.clone()),
        ])),
        ControllerSettings::default(),
    );
    // The instance lives in entry "home" on h2 (as a restart would learn from the marks).
    c.adopt(
        "home",
        &[OwnedInstance {
            id: ProviderId {
                entry: "home".into(),
                host: "h2".into(),
                name: format!("ep-home-{}", uid(1).simple()),
            },
            uid: uid(1),
            created_at: now(),
            name_matches_uid: true,
        }],
    );
    let mut o = obj(1, None);
    std::sync::Arc::make_mut(&mut o.spec).provider = "away".into();
    o.generation = 2;
    let out = c.reconcile(&o, &ProxyStatus::default(), now()).await;
    assert_eq!(out.status.phase, Phase::Failed);
    assert_eq!(ready_reason(&out.status), reason::INVALID_SPEC);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        away.creates.load(Ordering::SeqCst),
        0,
        "nothing created on the new entry"
    );
    assert_eq!(home.creates.load(Ordering::SeqCst), 0);
    // Deleting the Proxy deletes where the instance is, not on the edited entry.
    o.deleting = true;
    let out = c.reconcile(&o, &out.status, now()).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let out = c.reconcile(&o, &out.status, now()).await;
    assert!(out.finalized);
    assert_eq!(*home.deletes.lock().unwrap(), ["h2"]);
    assert!(away.deletes.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_proxy_is_placed_on_the_host_with_the_fewest_instances_and_creates_in_flight() {
    let p = Arc::new(Scripted::default());
    let c = controller(p.clone(), 4);
    // p1 goes to h1 (a tie breaks by name) and finishes there.
    let a = c
        .reconcile(&obj(1, None), &ProxyStatus::default(), now())
        .await;
    assert_eq!(a.status.host.as_deref(), Some("h1"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a = c.reconcile(&obj(1, None), &a.status, now()).await;
    assert_eq!(a.status.phase, Phase::Running);
    // h1 holds one instance: p2 goes to h2, and its create in flight counts there at once.
    p.hang_create.store(true, Ordering::SeqCst);
    let b = c
        .reconcile(&obj(2, None), &ProxyStatus::default(), now())
        .await;
    assert_eq!(b.status.host.as_deref(), Some("h2"));
    // 1 and 1: the tie breaks by name again.
    let d = c
        .reconcile(&obj(3, None), &ProxyStatus::default(), now())
        .await;
    assert_eq!(d.status.host.as_deref(), Some("h1"));
    // 2 on h1, 1 on h2.
    let e = c
        .reconcile(&obj(4, None), &ProxyStatus::default(), now())
        .await;
    assert_eq!(e.status.host.as_deref(), Some("h2"));
}

#[tokio::test(start_paused = true)]
async fn a_host_last_reported_unreachable_gets_no_new_proxy_even_when_least_loaded() {
    let p = Arc::new(Scripted::default());
    p.hang_create.store(true, Ordering::SeqCst);
    let c = controller(p.clone(), 4);
    c.record_host_reports(
        "home",
        &[
            report("h1", egress_provider::model::HostState::Unreachable),
            report("h2", egress_provider::model::HostState::Ready),
        ],
    );
    for n in 1..=3 {
        let out = c
            .reconcile(&obj(n, None), &ProxyStatus::default(), now())
            .await;
        assert_eq!(out.status.host.as_deref(), Some("h2"), "proxy {n}");
    }
}

fn in_namespace(n: u8, ns: &str, pin: &[&str]) -> super::ProxyObject {
    let mut o = obj(n, None);
    o.namespace = ns.into();
    std::sync::Arc::make_mut(&mut o.spec).egress.address =
        pin.iter().map(|a| (*a).to_owned()).collect();
    o
}

#[tokio::test(start_paused = true)]
async fn a_pinned_address_is_reserved_and_held_for_its_namespace_after_its_proxy_goes() {
    let p = Arc::new(Scripted::default());
    let mut e = entry(4);
    // h1's pool: released addresses are held 10 minutes (the default).
    e.hosts[0].address_pool = Some(Default::default());
    let c = Controller::new(
        Arc::new(Providers::from_handles([ProviderHandle::new(e, p.clone())])),
        ControllerSettings::default(),
    );
    let addr: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    let a = in_namespace(1, "team-a", &["203.0.113.7"]);
    let first = c.reconcile(&a, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a_st = c.reconcile(&a, &first.status, now()).await.status;
    assert_eq!(a_st.phase, Phase::Running);
    assert_eq!(a_st.host.as_deref(), Some("h1"));
    // Another tenant pinning it waits, told nothing about whose it is.
    let b = in_namespace(2, "team-b", &["203.0.113.7"]);
    let out = c.reconcile(&b, &ProxyStatus::default(), now()).await;
    let cond = out.status.condition(condition::READY).unwrap();
    assert_eq!(cond.reason, reason::ADDRESS_RESERVED);
    assert!(
        cond.message.contains("pinned by another Proxy"),
        "{}",
        cond.message
    );
    assert!(
        !cond.message.contains("team-a") && !cond.message.contains(&a.uid.simple().to_string())
    );
    assert_eq!(
        p.creates.load(Ordering::SeqCst),
        1,
        "nothing started for it"
    );
    // A Proxy pinning nothing is never given it.
    let u = in_namespace(3, "team-b", &[]);
    let _ = c.reconcile(&u, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.reserved.lock().unwrap()[&u.uid], [addr]);
    // The owner goes: its address is held for its namespace.
    let mut gone = a.clone();
    gone.deleting = true;
    let mut st = c.reconcile(&gone, &a_st, now()).await.status;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let out = c.reconcile(&gone, &st, now()).await;
        st = out.status;
        if out.finalized {
            break;
        }
    }
    let out = c.reconcile(&b, &ProxyStatus::default(), now()).await;
    let cond = out.status.condition(condition::READY).unwrap();
    assert_eq!(cond.reason, reason::ADDRESS_RESERVED, "{}", cond.message);
    assert!(
        cond.message.contains("reserved for its previous holder"),
        "{}",
        cond.message
    );
    let u2 = in_namespace(4, "team-b", &[]);
    let _ = c.reconcile(&u2, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        p.reserved.lock().unwrap()[&u2.uid],
        [addr],
        "held: not allocated"
    );
    // After the hold, another tenant may pin it.
    let later = now() + Duration::from_secs(601);
    let out = c.reconcile(&b, &ProxyStatus::default(), later).await;
    assert_eq!(out.status.phase, Phase::Provisioning, "{:?}", out.status);
    // Within the hold its own namespace may (a pool's replacement keeping its address).
    let c2 = Controller::new(
        Arc::new(Providers::from_handles([ProviderHandle::new(
            {
                let mut e = entry(4);
                e.hosts[0].address_pool = Some(Default::default());
                e
            },
            Arc::new(Scripted::default()),
        )])),
        ControllerSettings::default(),
    );
    let a = in_namespace(1, "team-a", &["203.0.113.7"]);
    let first = c2.reconcile(&a, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a_st = c2.reconcile(&a, &first.status, now()).await.status;
    let mut gone = a.clone();
    gone.deleting = true;
    let mut st = a_st;
    for _ in 0..4 {
        let out = c2.reconcile(&gone, &st, now()).await;
        st = out.status;
        if out.finalized {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let repl = in_namespace(5, "team-a", &["203.0.113.7"]);
    let out = c2.reconcile(&repl, &ProxyStatus::default(), now()).await;
    assert_eq!(out.status.phase, Phase::Provisioning, "{:?}", out.status);
}

#[tokio::test(start_paused = true)]
async fn a_namespace_at_its_quota_gets_no_new_instance_but_replacements_go_on() {
    let p = Arc::new(Scripted::default());
    let mut e = entry(4);
    e.quotas.max_proxies_per_namespace = Some(1);
    let c = Controller::new(
        Arc::new(Providers::from_handles([ProviderHandle::new(e, p.clone())])),
        ControllerSettings::default(),
    );
    let one = in_namespace(1, "team-a", &[]);
    let first = c.reconcile(&one, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st = c.reconcile(&one, &first.status, now()).await.status;
    assert_eq!(st.phase, Phase::Running);
    let two = in_namespace(2, "team-a", &[]);
    let out = c.reconcile(&two, &ProxyStatus::default(), now()).await;
    let cond = out.status.condition(condition::READY).unwrap();
    assert_eq!(cond.reason, reason::QUOTA_EXCEEDED, "{}", cond.message);
    assert!(
        cond.message.contains("maxProxiesPerNamespace"),
        "{}",
        cond.message
    );
    assert_eq!(p.creates.load(Ordering::SeqCst), 1);
    // Another namespace is not affected.
    let other = in_namespace(3, "team-b", &[]);
    let out = c.reconcile(&other, &ProxyStatus::default(), now()).await;
    assert_eq!(out.status.phase, Phase::Provisioning);
    // The first one's instance vanishes: its replacement is not refused.
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.made.lock().unwrap().remove(&one.uid);
    let out = c.reconcile(&one, &st, now()).await;
    assert_eq!(out.status.phase, Phase::Provisioning, "{:?}", out.status);
}

#[tokio::test(start_paused = true)]
async fn while_the_pins_are_not_known_no_unpinned_create_starts_and_noted_pins_are_reserved() {
    let p = Arc::new(Scripted::default());
    let mut e = entry(4);
    e.hosts[0].address_pool = Some(Default::default());
    let c = Controller::new(
        Arc::new(Providers::from_handles([ProviderHandle::new(e, p.clone())])),
        ControllerSettings::default(),
    );
    let addr: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    // The driver is listing: an unpinned Proxy waits, a pinned one goes ahead.
    c.set_pins_known(false);
    let u = in_namespace(1, "team-a", &[]);
    let out = c.reconcile(&u, &ProxyStatus::default(), now()).await;
    assert!(out.requeue_after.is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.creates.load(Ordering::SeqCst), 0, "no unpinned create");
    let pinned = in_namespace(2, "team-a", &["203.0.113.8"]);
    let _ = c.reconcile(&pinned, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        p.creates.load(Ordering::SeqCst),
        1,
        "a pinned create starts"
    );
    // The list showed a Proxy pinning .7 that was never reconciled: the unpinned one, once
    // the pins are known, is created with .7 reserved.
    c.note_pins(&in_namespace(3, "team-b", &["203.0.113.7"]));
    c.set_pins_known(true);
    let _ = c.reconcile(&u, &ProxyStatus::default(), now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.creates.load(Ordering::SeqCst), 2);
    assert!(
        p.reserved.lock().unwrap()[&u.uid].contains(&addr),
        "{:?}",
        p.reserved.lock().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn a_hosts_dead_since_runs_while_its_reports_say_dead_and_restarts_on_an_answer() {
    use egress_provider::model::HostState;
    let c = controller(Arc::new(Scripted::default()), 4);
    let dead = |c: &Controller, h: &str| {
        c.pool_hosts("home")
            .into_iter()
            .find(|x| x.name == h)
            .and_then(|x| x.dead_since)
    };
    // Never checked (a fresh operator): no clock.
    assert_eq!(dead(&c, "h1"), None);
    c.record_host_reports("home", &[report("h1", HostState::Timeout)]);
    let first = dead(&c, "h1").expect("dead since the first dead report");
    std::thread::sleep(Duration::from_millis(5));
    // Dead again (another dead state): the clock keeps its start.
    c.record_host_reports("home", &[report("h1", HostState::Unreachable)]);
    assert_eq!(dead(&c, "h1"), Some(first));
    // One answer (Degraded answers too) ends it; the next dead report starts a new one.
    c.record_host_reports("home", &[report("h1", HostState::Degraded)]);
    assert_eq!(dead(&c, "h1"), None);
    std::thread::sleep(Duration::from_millis(5));
    c.record_host_reports("home", &[report("h1", HostState::Timeout)]);
    assert!(dead(&c, "h1").is_some_and(|t| t > first));
    // Another host's reports leave it alone.
    c.record_host_reports("home", &[report("h2", HostState::Ready)]);
    assert!(dead(&c, "h1").is_some());
    assert_eq!(dead(&c, "h2"), None);
}

#[tokio::test(start_paused = true)]
async fn a_hosts_ready_since_runs_while_its_reports_say_ready_and_restarts_on_any_other() {
    use egress_provider::model::HostState;
    let c = controller(Arc::new(Scripted::default()), 4);
    let ready = |c: &Controller, h: &str| {
        c.pool_hosts("home")
            .into_iter()
            .find(|x| x.name == h)
            .and_then(|x| x.ready_since)
    };
    assert_eq!(ready(&c, "h1"), None);
    c.record_host_reports("home", &[report("h1", HostState::Ready)]);
    let first = ready(&c, "h1").expect("ready since the first Ready report");
    std::thread::sleep(Duration::from_millis(5));
    c.record_host_reports("home", &[report("h1", HostState::Ready)]);
    assert_eq!(ready(&c, "h1"), Some(first));
    // Degraded (or dead) ends it; the next Ready report starts a new one.
    c.record_host_reports("home", &[report("h1", HostState::Degraded)]);
    assert_eq!(ready(&c, "h1"), None);
    std::thread::sleep(Duration::from_millis(5));
    c.record_host_reports("home", &[report("h1", HostState::Ready)]);
    assert!(ready(&c, "h1").is_some_and(|t| t > first));
    c.record_host_reports("home", &[report("h2", HostState::Timeout)]);
    assert!(ready(&c, "h1").is_some());
    assert_eq!(ready(&c, "h2"), None);
}
