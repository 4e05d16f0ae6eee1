//! Host health drives placement, through the real provider `check()` over libvirt-fake and
//! the Controller: a host whose pool free space is at or below its reserve (reported
//! Degraded), or that is otherwise not Ready, receives no new proxies; with no usable host a
//! Proxy waits with `NoUsableHost` and nothing is created anywhere.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_core::controller::{Controller, ControllerSettings, ProxyObject};
use egress_core::host_health::{HostHealth, check_all};
use egress_core::model::{ProxySettings, ProxySpec, ProxyStatus, Resources, condition};
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use ep_operator_fixtures::{FakeHosts, GIB, POOL};
use libvirt_fake::FakeLibvirt;

const ENTRY: &str = "home";
const IMAGE: &str = "tiny";
/// Bound on one host-check round here (the fake answers in microseconds).
const CHECK_DEADLINE: Duration = Duration::from_secs(20);

fn digest() -> String {
    "ab".repeat(32)
}

struct Setup {
    fakes: BTreeMap<String, FakeLibvirt>,
    providers: Arc<Providers>,
    controller: Controller,
}

/// Two fake hosts (reserve 2 GiB, 4 slots) with the pool and a published base of IMAGE.
fn setup() -> Setup {
    let hosts = FakeHosts::new(ENTRY, &["h1", "h2"])
        .pool_reserve_gib(2)
        .max_concurrent(4)
        .short_timeouts()
        .published_image(IMAGE, &digest());
    let providers = Arc::new(hosts.providers());
    let settings = ControllerSettings {
        reconcile_deadline: Duration::from_secs(5),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        poll_provisioning: Duration::from_millis(20),
        poll_running: Duration::from_millis(20),
        ..ControllerSettings::default()
    };
    Setup {
        fakes: hosts.fakes().clone(),
        controller: Controller::new(Arc::clone(&providers), settings),
        providers,
    }
}

fn proxy(n: u8) -> ProxyObject {
    ProxyObject {
        namespace: "default".into(),
        name: format!("p{n}"),
        uid: ProxyUid::parse_strict(&format!("5c1d2f4e-0000-4000-8000-0000000000{n:02x}")).unwrap(),
        generation: 1,
        spec: std::sync::Arc::new(ProxySpec {
            provider: ENTRY.into(),
            host: None,
            image: IMAGE.into(),
            resources: Resources::default(),
            proxy: ProxySettings {
                allowed_client_cidrs: vec!["10.0.0.0/8".into()],
                ..ProxySettings::default()
            },
            egress: Default::default(),
        }),
        deleting: false,
        credentials: None,
        namespace_labels: None,
        replaces: None,
    }
}

/// One host-check round, recorded for placement as a driver does; returns the rows.
async fn check(s: &Setup) -> Vec<HostHealth> {
    let mut rows = Vec::new();
    for c in check_all(&s.providers, 4, CHECK_DEADLINE).await {
        let reports = c.reports.clone().expect("the fake answers in time");
        s.controller
            .record_host_reports(&c.handle.config.name, &reports);
        rows.extend(c.rows(CHECK_DEADLINE, SystemTime::now()));
    }
    rows
}

fn domains_on(s: &Setup, h: &str) -> usize {
    s.fakes[h].domains().len()
}

#[tokio::test]
async fn a_host_whose_pool_is_below_its_reserve_receives_no_new_proxies() {
    let s = setup();
    // h1's pool: 1 GiB free, below its 2 GiB reserve.
    s.fakes["h1"].set_pool_usage(POOL, 99 * GIB, GIB).unwrap();
    let rows = check(&s).await;
    let h1 = rows.iter().find(|r| r.host == "h1").unwrap();
    assert_eq!(h1.state, "Degraded", "{h1:?}");
    assert!(!h1.accepts_placements);
    assert!(
        h1.missing.iter().any(|m| m.contains("free space")),
        "{:?}",
        h1.missing
    );
    assert!(
        rows.iter()
            .find(|r| r.host == "h2")
            .unwrap()
            .accepts_placements
    );

    // h1 is the less loaded host by name order, yet every new Proxy goes to h2.
    for n in 1..=4 {
        let out = s
            .controller
            .reconcile(&proxy(n), &ProxyStatus::default(), SystemTime::now())
            .await;
        assert_eq!(
            out.status.host.as_deref(),
            Some("h2"),
            "p{n}: {:?}",
            out.status
        );
    }
    s.controller.shutdown(Duration::from_secs(10)).await;
    assert_eq!(domains_on(&s, "h1"), 0);
}

#[tokio::test]
async fn with_no_usable_host_a_proxy_waits_and_nothing_is_created_until_one_recovers() {
    let s = setup();
    for h in ["h1", "h2"] {
        s.fakes[h].set_pool_usage(POOL, 99 * GIB, GIB).unwrap();
    }
    let rows = check(&s).await;
    assert!(rows.iter().all(|r| r.state == "Degraded"), "{rows:?}");
    let out = s
        .controller
        .reconcile(&proxy(1), &ProxyStatus::default(), SystemTime::now())
        .await;
    let ready = out.status.condition(condition::READY).unwrap();
    assert_eq!(ready.reason, "NoUsableHost", "{ready:?}");
    assert!(ready.message.contains("h1 Degraded") && ready.message.contains("h2 Degraded"));
    // Each host's reason is on the Proxy, not only on the host's row: its pool at the reserve,
    // in GiB.
    for h in ["h1", "h2"] {
        assert!(
            ready.message.contains(&format!(
                "{h} Degraded: missing free space in storage pool {POOL}: 1.0 GiB free, at or \
                 below its 2 GiB reserve (hosts[{h}].poolReserveGiB)"
            )),
            "{}",
            ready.message
        );
    }
    assert!(out.requeue_after.is_some(), "retried, not latched");
    assert_eq!(domains_on(&s, "h1") + domains_on(&s, "h2"), 0);

    // h1 gets space back: the next check makes it usable and the Proxy is placed there.
    s.fakes["h1"]
        .set_pool_usage(POOL, 10 * GIB, 90 * GIB)
        .unwrap();
    let rows = check(&s).await;
    assert!(
        rows.iter()
            .find(|r| r.host == "h1")
            .unwrap()
            .accepts_placements
    );
    let out = s
        .controller
        .reconcile(&proxy(1), &out.status, SystemTime::now())
        .await;
    assert_eq!(out.status.host.as_deref(), Some("h1"), "{:?}", out.status);
    s.controller.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_unreachable_host_is_reported_with_its_own_reason_and_skipped() {
    // finding: L16
    let s = setup();
    s.fakes["h1"].faults().freeze();
    let rows = check(&s).await;
    let h1 = rows.iter().find(|r| r.host == "h1").unwrap();
    assert!(
        matches!(h1.state.as_str(), "Unreachable" | "Timeout"),
        "its own state, not a round timeout: {h1:?}"
    );
    assert!(
        !h1.error
            .clone()
            .unwrap_or_default()
            .contains("entry's check did not finish"),
        "{h1:?}"
    );
    assert_eq!(rows.iter().find(|r| r.host == "h2").unwrap().state, "Ready");
    let out = s
        .controller
        .reconcile(&proxy(1), &ProxyStatus::default(), SystemTime::now())
        .await;
    assert_eq!(out.status.host.as_deref(), Some("h2"));
    s.controller.shutdown(Duration::from_secs(10)).await;
}
