//! Table-driven tests of [`super::decide`]: one per rule, with fixture builders.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use egress_provider::error::ProviderError;
use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::model::{HostState, Instance, InstanceState, ProviderId};

use super::decide::{
    Action, AddressRoom, Decision, EVERY_FAMILY, EntryView, FAMILY_V4, FAMILY_V6, HostInfo,
    HostView, Inputs, Latch, Memory, Observed, OpView, decide, fmt_time, reason,
};
use super::test_fixtures::uid;
use super::{ControllerSettings, EventKind, ProxyCredentials, ProxyObject};
use crate::model::{
    ConditionStatus, Phase, ProxySettings, ProxySpec, ProxyStatus, Resources, condition,
};

const DIGEST: &str = "digest-1";

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn entry() -> LibvirtEntry {
    super::test_fixtures::entry(2)
}

/// A Proxy builder: `proxy().on_host("h1").with_image("debian-12")`.
#[derive(Clone)]
struct P(ProxyObject);

fn proxy() -> P {
    P(ProxyObject {
        namespace: "default".into(),
        name: "p1".into(),
        uid: uid(1),
        generation: 1,
        spec: std::sync::Arc::new(ProxySpec {
            provider: "home".into(),
            host: None,
            image: "debian-12".into(),
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
    })
}

impl P {
    fn on_host(mut self, h: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec).host = Some(h.into());
        self
    }
    fn with_image(mut self, i: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec).image = i.into();
        self
    }
    fn with_provider(mut self, p: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec).provider = p.into();
        self
    }
    fn with_disk(mut self, gib: u64) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec)
            .resources
            .disk_gib = Some(gib);
        self
    }
    fn with_vcpus(mut self, n: u32) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec).resources.vcpus = Some(n);
        self
    }
    fn generation(mut self, g: i64) -> Self {
        self.0.generation = g;
        self
    }
    fn deleting(mut self) -> Self {
        self.0.deleting = true;
        self
    }
    fn credentials_ref(mut self, r: &str) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec)
            .proxy
            .credentials_ref = Some(r.into());
        self
    }
    fn egress(mut self, a: &[&str]) -> Self {
        std::sync::Arc::make_mut(&mut self.0.spec).egress.address =
            a.iter().map(|s| (*s).to_owned()).collect();
        self
    }
    fn credentials(mut self) -> Self {
        self.0.credentials = Some(ProxyCredentials {
            username: "alice".into(),
            password: "pw-of-sixteen-chars".into(),
        });
        self
    }
}

fn id(h: &str) -> ProviderId {
    ProviderId {
        entry: "home".into(),
        host: h.into(),
        name: format!("ep-home-{}", uid(1).simple()),
    }
}

fn inst(h: &str, state: InstanceState, ip: Option<&str>) -> Instance {
    Instance {
        id: id(h),
        uid: uid(1),
        state,
        ip: ip.map(|s| s.parse().unwrap()),
        mac: "52:54:00:00:00:01".into(),
        egress: Vec::new(),
        address_note: None,
    }
}

fn running(h: &str) -> Instance {
    inst(h, InstanceState::Running, Some("192.0.2.10"))
}

fn provisioning(h: &str) -> Instance {
    inst(h, InstanceState::Provisioning, None)
}

/// A status as it is after `running(h)` was seen at `at`.
fn running_status(h: &str, at: SystemTime) -> ProxyStatus {
    ProxyStatus {
        phase: Phase::Running,
        host: Some(h.into()),
        provider_id: Some(id(h).to_string()),
        ip: Some("192.0.2.10".into()),
        ip_seen_at: Some(fmt_time(at)),
        observed_generation: 1,
        ..ProxyStatus::default()
    }
}

fn provisioning_status(h: &str, since: SystemTime) -> ProxyStatus {
    ProxyStatus {
        phase: Phase::Provisioning,
        host: Some(h.into()),
        provider_id: Some(id(h).to_string()),
        provisioning_since: Some(fmt_time(since)),
        observed_generation: 1,
        ..ProxyStatus::default()
    }
}

/// One decision's inputs, with defaults.
struct Case {
    obj: ProxyObject,
    status: ProxyStatus,
    entry: Option<LibvirtEntry>,
    digest: String,
    location: Option<ProviderId>,
    strays: Vec<String>,
    observed: Observed,
    op: OpView,
    hosts: BTreeMap<String, HostInfo>,
    /// Why each host is not Ready, as its last report said.
    reasons: BTreeMap<String, String>,
    /// Since when each dead host's checks found it dead.
    dead: BTreeMap<String, SystemTime>,
    memory: Memory,
    now: SystemTime,
    settings: ControllerSettings,
}

/// The case's hosts with their reasons.
#[derive(Debug)]
struct Hosts<'a> {
    info: &'a BTreeMap<String, HostInfo>,
    reasons: &'a BTreeMap<String, String>,
    dead: &'a BTreeMap<String, SystemTime>,
}

impl HostView for Hosts<'_> {
    fn info(&self, host: &str) -> HostInfo {
        self.info.info(host)
    }
    fn least_loaded(
        &self,
        entry: &LibvirtEntry,
        need: u8,
        eligible: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        self.info.least_loaded(entry, need, eligible)
    }
    fn reason(&self, host: &str) -> Option<String> {
        self.reasons.get(host).cloned()
    }
    fn dead_since(&self, host: &str) -> Option<SystemTime> {
        self.dead.get(host).copied()
    }
}

fn case(p: P) -> Case {
    let e = entry();
    Case {
        obj: p.0,
        status: ProxyStatus::default(),
        hosts: e
            .hosts
            .iter()
            .map(|h| (h.name.clone(), HostInfo::default()))
            .collect(),
        entry: Some(e),
        reasons: BTreeMap::new(),
        dead: BTreeMap::new(),
        digest: DIGEST.into(),
        location: None,
        strays: Vec::new(),
        observed: Observed::Unknown,
        op: OpView::Idle,
        memory: Memory::default(),
        now: t0(),
        settings: ControllerSettings::default(),
    }
}

impl Case {
    fn status(mut self, s: ProxyStatus) -> Self {
        self.status = s;
        self
    }
    fn at(mut self, h: &str) -> Self {
        self.location = Some(id(h));
        self
    }
    /// Hosts where a second copy of the instance may remain.
    fn strays(mut self, hosts: &[&str]) -> Self {
        self.strays = hosts.iter().map(|h| (*h).to_owned()).collect();
        self
    }
    fn observed(mut self, o: Observed) -> Self {
        self.observed = o;
        self
    }
    fn op(mut self, o: OpView) -> Self {
        self.op = o;
        self
    }
    fn load(mut self, h: &str, load: usize, health: Option<HostState>) -> Self {
        self.hosts.insert(
            h.into(),
            HostInfo {
                load,
                health,
                ..HostInfo::default()
            },
        );
        self
    }
    /// Why `h`'s last report is not Ready.
    fn reason(mut self, h: &str, why: &str) -> Self {
        self.reasons.insert(h.into(), why.into());
        self
    }
    /// `h`'s address pool as reported: `pool` families, `full` of them exhausted.
    fn room(mut self, h: &str, pool: u8, full: u8) -> Self {
        self.hosts.entry(h.into()).or_default().addresses = AddressRoom { pool, full };
        self
    }
    fn memory(mut self, m: Memory) -> Self {
        self.memory = m;
        self
    }
    fn now(mut self, t: SystemTime) -> Self {
        self.now = t;
        self
    }
    fn no_entry(mut self) -> Self {
        self.entry = None;
        self
    }
    fn settings(mut self, f: impl FnOnce(&mut ControllerSettings)) -> Self {
        f(&mut self.settings);
        self
    }
    fn run(&self) -> Decision {
        let ev = self.entry.as_ref().map(|e| EntryView {
            config: e,
            config_digest: &self.digest,
        });
        decide(&Inputs {
            obj: &self.obj,
            status: &self.status,
            entry: ev.as_ref(),
            location: self.location.as_ref(),
            strays: &self.strays,
            observed: &self.observed,
            op: &self.op,
            hosts: &Hosts {
                info: &self.hosts,
                reasons: &self.reasons,
                dead: &self.dead,
            },
            memory: &self.memory,
            now: self.now,
            settings: &self.settings,
        })
    }
}

fn ready(d: &Decision) -> (ConditionStatus, String, String) {
    let c = d
        .status
        .condition(condition::READY)
        .expect("Ready condition");
    (c.status, c.reason.clone(), c.message.clone())
}

fn created_host(d: &Decision) -> (String, bool) {
    match &d.action {
        Action::Create { req, replace } => (req.host.clone(), *replace),
        other => panic!("expected a create, got {other:?}"),
    }
}

// ------------------------------------------------------------------ create and placement

#[test]
fn a_new_proxy_is_created_with_the_entry_defaults_and_rendered_user_data() {
    let d = case(proxy()).run();
    let Action::Create { req, replace } = &d.action else {
        panic!("{:?}", d.action)
    };
    assert!(!replace);
    assert_eq!((req.disk_gib, req.memory_mib, req.vcpus), (10, 512, 1));
    assert_eq!(req.image, "debian-12");
    assert_eq!(req.display_name, "default/p1");
    assert!(req.user_data.starts_with("#cloud-config\n"));
    assert!(req.user_data.contains("Allow 10.0.0.0/8"));
    assert_eq!(d.status.phase, Phase::Provisioning);
    assert_eq!(d.status.host.as_deref(), Some("h1"));
    assert_eq!(d.status.provisioning_since, Some(fmt_time(t0())));
    assert_eq!(ready(&d).1, reason::CREATING);
    assert_eq!(d.requeue_after, Some(d_settings().poll_provisioning));
}

fn d_settings() -> ControllerSettings {
    ControllerSettings::default()
}

#[test]
fn placement_follows_the_pin_then_the_fewest_proxies_then_the_name() {
    let table: Vec<(Case, &str)> = vec![
        (case(proxy()), "h1"),
        (case(proxy()).load("h1", 3, None).load("h2", 1, None), "h2"),
        (case(proxy()).load("h1", 2, None).load("h2", 2, None), "h1"),
        (case(proxy().on_host("h2")).load("h2", 9, None), "h2"),
    ];
    for (c, want) in table {
        assert_eq!(created_host(&c.run()).0, want);
    }
}

#[test]
fn placement_never_uses_a_host_whose_last_report_is_not_ready() {
    let c = case(proxy())
        .load("h1", 0, Some(HostState::Unreachable))
        .load("h2", 5, Some(HostState::Ready));
    assert_eq!(created_host(&c.run()).0, "h2");
    // All unhealthy (a Degraded host includes a pool below its reserve): nothing is placed;
    // the Proxy waits with a retryable reason naming each host's state.
    for p in [proxy(), proxy().on_host("h2")] {
        let d = case(p)
            .load("h1", 1, Some(HostState::Timeout))
            .load("h2", 0, Some(HostState::Degraded))
            .run();
        assert_eq!(d.action, Action::None, "all unhealthy: nothing placed");
        let ready = d.status.condition("Ready").unwrap();
        assert_eq!(ready.reason, "NoUsableHost");
        assert!(ready.message.contains("Degraded"), "{}", ready.message);
        assert!(d.requeue_after.is_some());
    }
}

#[test]
fn a_proxy_waiting_for_hosts_names_each_hosts_reason() {
    let reserve = "missing free space in storage pool default: 3.1 GiB free, at or below its \
                   4 GiB reserve (hosts[h1].poolReserveGiB)";
    let d = case(proxy())
        .load("h1", 0, Some(HostState::Degraded))
        .reason("h1", reserve)
        .load("h2", 0, Some(HostState::Unreachable))
        .reason("h2", "could not connect within 9.0s")
        .run();
    let (_, why, msg) = ready(&d);
    assert_eq!(why, "NoUsableHost");
    assert!(msg.contains(&format!("h1 Degraded: {reserve}")), "{msg}");
    assert!(
        msg.contains("h2 Unreachable: could not connect within 9.0s"),
        "{msg}"
    );
    // Pinned: the one host's reason.
    let d = case(proxy().on_host("h1"))
        .load("h1", 0, Some(HostState::Degraded))
        .reason("h1", reserve)
        .run();
    let (_, _, msg) = ready(&d);
    assert!(
        msg.contains(&format!("host h1 (spec.host) is Degraded: {reserve}")),
        "{msg}"
    );
}

#[test]
fn placement_prefers_free_addresses_among_equal_hosts_and_never_an_exhausted_pool() {
    let v4 = FAMILY_V4;
    let table: Vec<(Case, &str)> = vec![
        // Equal loads: the host with free addresses before the one without a pool.
        (case(proxy()).room("h2", v4, 0), "h2"),
        // Load still comes first.
        (
            case(proxy())
                .load("h1", 0, None)
                .load("h2", 1, None)
                .room("h2", v4, 0),
            "h1",
        ),
        // An exhausted pool is never chosen while another host has room, whatever its load.
        (
            case(proxy())
                .load("h1", 0, None)
                .room("h1", v4, v4)
                .load("h2", 7, None)
                .room("h2", v4, 0),
            "h2",
        ),
        // A dual-stack pool with only IPv6 exhausted blocks a Proxy that pins nothing ...
        (
            case(proxy())
                .room("h1", EVERY_FAMILY, FAMILY_V6)
                .load("h2", 3, None),
            "h2",
        ),
        // ... but not one that pins only an IPv4 address.
        (
            case(proxy().egress(&["203.0.113.7"]))
                .room("h1", EVERY_FAMILY, FAMILY_V6)
                .load("h2", 3, None),
            "h1",
        ),
    ];
    for (i, (c, want)) in table.into_iter().enumerate() {
        assert_eq!(created_host(&c.run()).0, want, "case {i}");
    }
}

#[test]
fn a_pinned_address_places_the_proxy_on_the_host_whose_pool_holds_it() {
    use egress_provider::libvirt::address_pool::{AddressPool, FamilyPool};
    let mut e = entry();
    e.hosts[1].address_pool = Some(AddressPool {
        ipv4: Some(FamilyPool {
            prefix: "203.0.113.0/24".into(),
            gateway: "203.0.113.1".into(),
            ranges: vec!["203.0.113.2-203.0.113.14".into()],
        }),
        ipv6: None,
        dns: vec![],
        access: None,
        hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
    });
    let with = |p: P| {
        let mut c = case(p).load("h1", 0, None).load("h2", 5, None);
        c.entry = Some(e.clone());
        c
    };
    // h2's pool holds it: h2, though h1 is less loaded.
    assert_eq!(
        created_host(&with(proxy().egress(&["203.0.113.7"])).run()).0,
        "h2"
    );
    // No pool holds it: placed by load (the create fails naming the pools).
    assert_eq!(
        created_host(&with(proxy().egress(&["198.51.100.7"])).run()).0,
        "h1"
    );
    // spec.host wins.
    assert_eq!(
        created_host(&with(proxy().egress(&["203.0.113.7"]).on_host("h1")).run()).0,
        "h1"
    );
    // The holder not Ready: the Proxy waits for it, saying why.
    let mut c = with(proxy().egress(&["203.0.113.7"])).load("h2", 5, Some(HostState::Unreachable));
    c.entry = Some(e.clone());
    let d = c.run();
    assert_eq!(d.action, Action::None);
    let (_, why, msg) = ready(&d);
    assert_eq!(why, "NoUsableHost");
    assert!(
        msg.contains("host h2 (its address pool holds spec.egress.address)"),
        "{msg}"
    );
    // Hosts of one segment share the pool: the first holder not Ready, the next one takes it
    // (whatever their load); both not Ready, it waits for the first.
    let mut seg = e.clone();
    seg.hosts[0].address_pool = seg.hosts[1].address_pool.clone();
    let on_segment = |h1: Option<HostState>, h2: Option<HostState>| {
        let mut c = case(proxy().egress(&["203.0.113.7"]))
            .load("h1", 0, h1)
            .load("h2", 5, h2);
        c.entry = Some(seg.clone());
        c.run()
    };
    assert_eq!(created_host(&on_segment(None, None)).0, "h1");
    assert_eq!(
        created_host(&on_segment(Some(HostState::Unreachable), None)).0,
        "h2"
    );
    let d = on_segment(Some(HostState::Timeout), Some(HostState::Unreachable));
    assert_eq!(d.action, Action::None);
    assert!(
        ready(&d)
            .2
            .contains("host h1 (its address pool holds spec.egress.address)"),
        "{:?}",
        ready(&d)
    );
}

#[test]
fn every_pool_exhausted_places_nothing_and_says_which_pools() {
    let d = case(proxy())
        .room("h1", FAMILY_V4, FAMILY_V4)
        .room("h2", EVERY_FAMILY, EVERY_FAMILY)
        .run();
    assert_eq!(d.action, Action::None);
    let (st, why, msg) = ready(&d);
    assert_eq!((st, why.as_str()), (ConditionStatus::False, "NoUsableHost"));
    assert!(
        msg.contains("h1 unchecked: its IPv4 address pool exhausted")
            && msg.contains("h2 unchecked: its IPv4 and IPv6 address pool exhausted"),
        "{msg}"
    );
}

#[test]
fn a_retry_leaves_a_host_whose_pool_is_now_known_exhausted() {
    let mut st = provisioning_status("h2", t0());
    st.provider_id = None;
    let d = case(proxy())
        .status(st)
        .load("h1", 4, None)
        .load("h2", 0, None)
        .room("h2", FAMILY_V4, FAMILY_V4)
        .run();
    assert_eq!(created_host(&d).0, "h1");
}

#[test]
fn an_exhausted_pool_at_create_is_a_retryable_condition_naming_host_and_pool() {
    let err =
        ProviderError::quota("the host's IPv4 address pool is exhausted (14 addresses, all held)");
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .op(OpView::CreateFinished {
            host: "h1".into(),
            result: Err(err),
        })
        .run();
    let (st, why, msg) = ready(&d);
    assert_eq!(
        (st, why.as_str()),
        (ConditionStatus::False, reason::QUOTA_EXCEEDED)
    );
    assert!(
        msg.contains("host h1") && msg.contains("IPv4 address pool is exhausted"),
        "{msg}"
    );
    assert_eq!(d.status.last_error().as_deref(), Some(msg.as_str()));
    assert!(d.requeue_after.is_some(), "retried, not latched");
}

#[test]
fn the_pinned_egress_goes_into_the_create_request_and_the_held_one_into_status() {
    let d = case(proxy().egress(&["203.0.113.7", "2001:db8::7"])).run();
    let Action::Create { req, .. } = &d.action else {
        panic!("{:?}", d.action)
    };
    assert_eq!(
        req.pinned_egress,
        [
            "203.0.113.7".parse::<std::net::IpAddr>().unwrap(),
            "2001:db8::7".parse().unwrap()
        ]
    );
    let mut held = running("h1");
    held.egress = vec!["203.0.113.9".parse().unwrap()];
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(held))
        .run();
    assert_eq!(d.status.egress_address, ["203.0.113.9"]);
    // A replacement forgets it until the new instance reports its own.
    let mut st = d.status.clone();
    st.provider_id = None;
    let d = case(proxy())
        .status(st)
        .at("h1")
        .observed(Observed::NotFound("gone".into()))
        .run();
    assert!(d.status.egress_address.is_empty(), "{:?}", d.status);
}

#[test]
fn an_address_source_that_failed_is_named_while_waiting_for_the_address() {
    let mut p = provisioning("h1");
    p.address_note = Some(
        "no address known yet (the host's ARP table failed: error dumping neighbor table: \
         Operation not permitted)"
            .into(),
    );
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(p))
        .run();
    let (st, why, msg) = ready(&d);
    assert_eq!(
        (st, why.as_str()),
        (ConditionStatus::False, "WaitingForAddress")
    );
    assert!(
        msg.contains(
            "waiting for it to report an address; no address known yet (the host's ARP \
                      table failed: error dumping neighbor table: Operation not permitted)"
        ),
        "{msg}"
    );
    assert_eq!(d.status.phase, Phase::Provisioning);
}

#[test]
fn a_pin_contradicting_expected_egress_is_an_invalid_spec() {
    let mut p = proxy().egress(&["203.0.113.7"]);
    std::sync::Arc::make_mut(&mut p.0.spec)
        .proxy
        .expected_egress = Some("198.51.100.0/24".into());
    let d = case(p).run();
    assert_eq!(d.action, Action::None);
    let (_, why, msg) = ready(&d);
    assert_eq!(why, reason::INVALID_SPEC);
    assert!(
        msg.contains("spec.egress.address") && msg.contains("198.51.100.0/24"),
        "{msg}"
    );
}

#[test]
fn a_vanished_instance_is_recreated_on_its_host() {
    let d = case(proxy())
        .status(running_status("h2", t0()))
        .at("h2")
        .observed(Observed::NotFound(
            "domain ep-home-x does not exist on host h2".into(),
        ))
        .run();
    assert_eq!(created_host(&d), ("h2".into(), false));
    assert!(
        ready(&d).2.contains("does not exist on host h2"),
        "{}",
        ready(&d).2
    );
    assert!(d.events.iter().any(|e| e.reason == reason::INSTANCE_LOST));
    assert_eq!(d.status.ip, None);
    assert_eq!(d.status.provider_id, None);
}

// ------------------------------------------------------------------ observation

#[test]
fn a_running_instance_with_an_address_makes_the_proxy_ready() {
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(running("h1")))
        .memory(Memory {
            failures: 3,
            latch: None,
        })
        .now(t0() + secs(40))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Running);
    assert_eq!(d.status.ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(d.status.provisioning_since, None);
    assert_eq!(ready(&d).0, ConditionStatus::True);
    assert_eq!(d.memory.failures, 0, "success resets the backoff");
    assert_eq!(d.requeue_after, Some(d_settings().poll_running));
    assert!(d.events.iter().any(|e| e.reason == reason::RUNNING));
}

#[test]
fn a_finished_create_is_picked_up_without_another_get() {
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .op(OpView::CreateFinished {
            host: "h1".into(),
            result: Ok(provisioning("h1")),
        })
        .now(t0() + secs(30))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Provisioning);
    assert_eq!(d.status.provider_id, Some(id("h1").to_string()));
    assert_eq!(ready(&d).1, reason::WAITING_FOR_ADDRESS);
}

#[test]
fn the_last_ip_is_kept_through_a_provisioning_gap_shorter_than_the_grace() {
    // finding: H3
    let seen = t0();
    let gap = case(proxy())
        .status(running_status("h1", seen))
        .at("h1")
        .observed(Observed::Found(provisioning("h1")));
    let d = gap.now(seen + secs(30)).run();
    assert_eq!(d.status.phase, Phase::Running);
    assert_eq!(d.status.ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(ready(&d).1, reason::ADDRESS_GAP);

    let d = case(proxy())
        .status(running_status("h1", seen))
        .at("h1")
        .observed(Observed::Found(provisioning("h1")))
        .now(seen + secs(90))
        .run();
    assert_eq!(d.status.phase, Phase::Provisioning);
    assert_eq!(d.status.ip, None);
    assert_eq!(d.status.provisioning_since, Some(fmt_time(seen + secs(90))));
}

#[test]
fn a_paused_instance_is_reported_and_never_destroyed() {
    // finding: M1
    let paused = inst(
        "h1",
        InstanceState::Paused {
            reason: "I/O error: host storage full".into(),
        },
        Some("192.0.2.10"),
    );
    let d = case(proxy())
        .status(running_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(paused.clone()))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Paused);
    assert!(ready(&d).2.contains("storage full"));
    // Even past the provisioning deadline, with the replace policy.
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(paused))
        .now(t0() + secs(3600))
        .run();
    assert_eq!(d.action, Action::None, "paused is never replaced");
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::PROVISIONING_TIMEOUT);
    assert!(m.contains("not running"), "{m}");
}

#[test]
fn a_stopped_instance_of_this_proxy_is_replaced_on_its_host() {
    // finding: M2
    let mut stopped = inst(
        "h2",
        InstanceState::Stopped {
            reason: "crashed".into(),
        },
        None,
    );
    stopped.egress = vec!["203.0.113.10".parse().unwrap()];
    let d = case(proxy())
        .status(running_status("h2", t0()))
        .at("h2")
        .observed(Observed::Found(stopped))
        .run();
    assert_eq!(created_host(&d), ("h2".into(), true));
    assert_eq!(d.status.phase, Phase::Provisioning);
    assert_eq!(ready(&d).1, reason::REPLACING);
    // Re-created in place, it asks for the address its stopped instance held.
    let Action::Create { req, .. } = &d.action else {
        panic!("{:?}", d.action)
    };
    assert_eq!(
        req.prefer_egress,
        vec!["203.0.113.10".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(req.pinned_egress.is_empty());
}

#[test]
fn a_stopped_instance_carrying_another_proxys_uid_is_never_touched() {
    // finding: M2
    let mut foreign = inst(
        "h1",
        InstanceState::Stopped {
            reason: "shutdown".into(),
        },
        None,
    );
    foreign.uid = uid(2);
    let d = case(proxy())
        .status(running_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(foreign))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(ready(&d).1, reason::FOREIGN_INSTANCE);
    assert!(d.memory.latch.is_some());
}

// ------------------------------------------------------------------ provisioning deadline

#[test]
fn no_address_past_the_deadline_names_what_is_missing_and_replaces_the_instance() {
    // finding: APX-1
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(provisioning("h1")))
        .now(t0() + secs(16 * 60))
        .run();
    assert_eq!(created_host(&d), ("h1".into(), true));
    let (st, r, m) = ready(&d);
    assert_eq!(
        (st, r.as_str()),
        (ConditionStatus::False, reason::PROVISIONING_TIMEOUT)
    );
    assert!(m.contains("no address was reported"), "{m}");
    assert!(m.contains("15m"), "{m}");
    assert_eq!(
        d.status.provisioning_since,
        Some(fmt_time(t0() + secs(16 * 60))),
        "the replacement is a new attempt"
    );
    // Just under the deadline: keep waiting.
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(provisioning("h1")))
        .now(t0() + secs(14 * 60))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(ready(&d).1, reason::WAITING_FOR_ADDRESS);
}

#[test]
fn with_the_failed_policy_an_expired_deadline_reports_failed_and_latches() {
    // finding: APX-1
    let d = case(proxy())
        .settings(|s| s.replace_on_deadline = false)
        .status(provisioning_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(provisioning("h1")))
        .now(t0() + secs(16 * 60))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(ready(&d).1, reason::PROVISIONING_TIMEOUT);
    assert_eq!(d.requeue_after, None);
    assert!(d.memory.latch.is_some());
}

#[test]
fn a_create_still_running_past_the_deadline_says_so_with_its_progress() {
    // finding: APX-1
    let op = OpView::Creating {
        host: "h1".into(),
        image: "debian-12".into(),
        started: t0(),
        progress: Some((312 << 20, Some(1024 << 20))),
    };
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .op(op.clone())
        .now(t0() + secs(60))
        .run();
    assert_eq!(d.action, Action::None);
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::CREATING);
    assert!(m.contains("importing image debian-12: 312/1024 MiB"), "{m}");

    let d = case(proxy())
        .settings(|s| s.replace_on_deadline = false)
        .status(provisioning_status("h1", t0()))
        .op(op)
        .now(t0() + secs(20 * 60))
        .run();
    assert_eq!(d.action, Action::Cancel);
    assert_eq!(d.status.phase, Phase::Failed);
    let m = ready(&d).2;
    assert!(m.contains("create still in progress on host h1"), "{m}");
}

// ------------------------------------------------------------------ failures

fn transient() -> ProviderError {
    ProviderError::transient("connection to https://bob:hunter2@h1.example/x?token=t reset")
}

#[test]
fn a_transient_failure_is_visible_keeps_phase_and_ip_and_backs_off_without_latching() {
    // finding: APX-2, D5
    let mut memory = Memory::default();
    let mut delays = Vec::new();
    for _ in 0..8 {
        let d = case(proxy())
            .status(running_status("h1", t0()))
            .at("h1")
            .observed(Observed::GetFailed(transient()))
            .memory(memory.clone())
            .run();
        assert_eq!(d.action, Action::None);
        assert_eq!(d.status.phase, Phase::Running, "phase unchanged");
        assert_eq!(d.status.ip.as_deref(), Some("192.0.2.10"), "IP kept");
        let (st, r, m) = ready(&d);
        assert_eq!(
            (st, r.as_str()),
            (ConditionStatus::False, reason::TRANSIENT_ERROR)
        );
        assert!(
            m.contains("reset") && !m.contains("hunter2") && !m.contains("token"),
            "{m}"
        );
        assert!(d.events.iter().all(|e| !e.message.contains("hunter2")));
        assert!(d.memory.latch.is_none(), "transient never latches");
        delays.push(d.requeue_after.unwrap().as_secs());
        memory = d.memory;
    }
    assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300]);
    // Non-latching: the next good observation clears it.
    let d = case(proxy())
        .status(running_status("h1", t0()))
        .at("h1")
        .observed(Observed::Found(running("h1")))
        .memory(memory)
        .run();
    assert_eq!(ready(&d).0, ConditionStatus::True);
    assert_eq!(d.memory.failures, 0);
}

#[test]
fn a_transient_create_failure_keeps_the_proxy_pending_and_retries() {
    // finding: APX-2
    let d = case(proxy())
        .status(provisioning_status("h1", t0()))
        .op(OpView::CreateFinished {
            host: "h1".into(),
            result: Err(ProviderError::quota(
                "pool images on host h1 has 1 GiB free",
            )),
        })
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Provisioning);
    assert_eq!(ready(&d).1, reason::QUOTA_EXCEEDED);
    assert_eq!(
        d.status.condition(condition::PROVISIONED).unwrap().reason,
        reason::QUOTA_EXCEEDED
    );
    assert_eq!(d.requeue_after, Some(secs(5)));
    // After the backoff the next reconcile (nothing known) creates again.
    let again = case(proxy()).status(d.status).memory(d.memory).run();
    assert!(matches!(again.action, Action::Create { .. }));
}

#[test]
fn a_failed_create_puts_its_cause_in_last_error_and_no_condition_still_says_creating() {
    // The create starts: both conditions say Creating.
    let started = case(proxy()).run();
    assert!(matches!(started.action, Action::Create { .. }));
    let provisioned = started.status.condition(condition::PROVISIONED).unwrap();
    assert_eq!(provisioned.reason, reason::CREATING);
    // It fails permanently with a long cause that carries a credential.
    let cause = format!(
        "image https://bob:hunter2@img.example/d.qcow2 is 9 GiB, larger than \
         resources.diskGiB (2 GiB) {}",
        "x".repeat(4000)
    );
    let failed = case(proxy())
        .status(started.status)
        .op(OpView::CreateFinished {
            host: "h1".into(),
            result: Err(ProviderError::permanent(cause)),
        })
        .run();
    assert_eq!(failed.status.phase, Phase::Failed);
    for c in &failed.status.conditions {
        assert_ne!(c.reason, reason::CREATING, "{c:?} while Failed");
    }
    let provisioned = failed.status.condition(condition::PROVISIONED).unwrap();
    assert_eq!(provisioned.reason, reason::PERMANENT_ERROR);
    let last = failed.status.last_error().unwrap();
    assert!(
        last.starts_with("creating the instance on host h1: image ")
            && last.contains("larger than resources.diskGiB"),
        "{last}"
    );
    assert!(!last.contains("hunter2"), "{last}");
    assert!(
        last.chars().count() <= crate::model::MAX_MESSAGE_CHARS,
        "bounded"
    );
}

#[test]
fn a_domain_kept_for_its_malformed_mark_is_not_reported_as_gone() {
    let why = "domain ep-home-x on host h1 carries no valid mark of entry home for Proxy \
               u1; it is not ours and is left alone";
    let d = case(proxy())
        .status(running_status("h1", t0()))
        .at("h1")
        .observed(Observed::NotFound(why.into()))
        .run();
    let m = ready(&d).2;
    assert!(!m.contains("no longer exists"), "{m}");
    assert!(
        m.contains("carries no valid mark") && m.contains("left alone"),
        "{m}"
    );
    assert!(d.events.iter().any(|e| e.message.contains("left alone")));
}

#[test]
fn a_permanent_failure_latches_until_the_generation_or_the_config_changes() {
    let failed = case(proxy())
        .status(provisioning_status("h1", t0()))
        .op(OpView::CreateFinished {
            host: "h1".into(),
            result: Err(ProviderError::permanent(
                "unsupported configuration: machine q35",
            )),
        })
        .run();
    assert_eq!(failed.status.phase, Phase::Failed);
    assert_eq!(failed.requeue_after, None);
    assert_eq!(
        failed.memory.latch,
        Some(Latch {
            generation: 1,
            config_digest: DIGEST.into()
        })
    );
    // Same generation and config: nothing happens, nothing is retried.
    let held = case(proxy())
        .status(failed.status.clone())
        .memory(failed.memory.clone())
        .run();
    assert_eq!(held.action, Action::None);
    assert_eq!(held.requeue_after, None);
    assert_eq!(held.status, failed.status);
    // A new generation releases it.
    let gen2 = case(proxy().generation(2))
        .status(failed.status.clone())
        .memory(failed.memory.clone())
        .run();
    assert!(matches!(gen2.action, Action::Create { .. }));
    assert!(gen2.events.iter().any(|e| e.reason == reason::RETRYING));
    // So does a config change.
    let mut c = case(proxy()).status(failed.status).memory(failed.memory);
    c.digest = "digest-2".into();
    assert!(matches!(c.run().action, Action::Create { .. }));
}

#[test]
fn spec_problems_are_permanent_conditions_naming_the_field_and_value() {
    let table: Vec<(Case, &str)> = vec![
        (
            case(proxy().with_provider("nope")).no_entry(),
            "spec.provider: \"nope\"",
        ),
        (case(proxy().on_host("h9")), "spec.host: \"h9\""),
        (case(proxy().with_image("fedora")), "spec.image: \"fedora\""),
        (
            case(proxy().with_image("https://evil.invalid/x.img")),
            "spec.image: \"https://evil.invalid/x.img\"",
        ),
        (case(proxy().with_disk(500)), "spec.resources.diskGiB: 500"),
        (case(proxy().with_vcpus(64)), "spec.resources.vcpus: 64"),
        (case(proxy().with_disk(0)), "spec.resources.diskGiB"),
    ];
    for (c, want) in table {
        let d = c.run();
        assert_eq!(d.action, Action::None, "{want}");
        assert_eq!(d.status.phase, Phase::Failed, "{want}");
        let (_, r, m) = ready(&d);
        assert_eq!(r, reason::INVALID_SPEC, "{want}");
        assert!(m.contains(want), "{want} not in {m}");
        assert!(d.memory.latch.is_some());
    }
}

#[test]
fn size_arithmetic_is_checked_even_when_the_limits_are_huge() {
    // finding: L20
    let mut c = case(proxy().with_disk(u64::MAX));
    if let Some(e) = c.entry.as_mut() {
        e.limits.disk_gib = u64::MAX;
    }
    let d = c.run();
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(ready(&d).2.contains("spec.resources.diskGiB"));
}

#[test]
fn missing_credentials_wait_with_backoff_instead_of_latching() {
    let d = case(proxy().credentials_ref("proxy-auth")).run();
    assert_eq!(d.action, Action::None);
    assert_eq!(ready(&d).1, reason::CREDENTIALS_MISSING);
    assert!(d.memory.latch.is_none());
    assert!(d.requeue_after.is_some());
    let d = case(proxy().credentials_ref("proxy-auth").credentials()).run();
    let Action::Create { req, .. } = d.action else {
        panic!()
    };
    assert!(
        req.user_data
            .contains("BasicAuth alice pw-of-sixteen-chars")
    );
}

#[test]
fn a_busy_host_read_leaves_the_status_alone_and_looks_again_soon() {
    // finding: H1
    let st = running_status("h1", t0());
    let d = case(proxy())
        .status(st.clone())
        .at("h1")
        .observed(Observed::HostBusy("h1".into()))
        .run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, st.phase);
    assert_eq!(d.requeue_after, Some(d_settings().poll_provisioning));
}

// ------------------------------------------------------------------ deletion

#[test]
fn deleting_with_no_provider_id_deletes_by_uid_on_every_host_of_the_entry() {
    // finding: M3
    let d = case(proxy().deleting()).run();
    assert_eq!(
        d.action,
        Action::Delete {
            hosts: vec!["h1".into(), "h2".into()]
        }
    );
    assert_eq!(d.status.phase, Phase::Terminating);
    assert!(!d.finalized);
}

#[test]
fn deleting_a_placed_proxy_deletes_on_its_host_and_aborts_a_create_in_flight() {
    // finding: M3
    let d = case(proxy().deleting()).at("h2").run();
    assert_eq!(
        d.action,
        Action::Delete {
            hosts: vec!["h2".into()]
        }
    );
    let d = case(proxy().deleting())
        .op(OpView::Creating {
            host: "h1".into(),
            image: "debian-12".into(),
            started: t0(),
            progress: None,
        })
        .run();
    assert_eq!(
        d.action,
        Action::Delete {
            hosts: vec!["h1".into()]
        }
    );
}

#[test]
fn deleting_a_placed_proxy_also_deletes_where_a_second_copy_may_remain() {
    let d = case(proxy().deleting())
        .at("h2")
        .strays(&["h1", "gone"])
        .run();
    assert_eq!(
        d.action,
        Action::Delete {
            hosts: vec!["h2".into(), "h1".into()]
        },
        "a host the entry no longer has is not addressed"
    );
    // Unplaced: every host anyway.
    let d = case(proxy().deleting()).strays(&["h2"]).run();
    assert_eq!(
        d.action,
        Action::Delete {
            hosts: vec!["h1".into(), "h2".into()]
        }
    );
}

#[test]
fn a_finished_delete_finalizes_and_a_failed_one_retries_with_backoff() {
    let d = case(proxy().deleting())
        .op(OpView::DeleteFinished { result: Ok(()) })
        .run();
    assert!(d.finalized);
    assert!(d.events.iter().any(|e| e.reason == reason::DELETED));
    let d = case(proxy().deleting())
        .op(OpView::DeleteFinished {
            result: Err(transient()),
        })
        .run();
    assert!(!d.finalized);
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Terminating);
    assert_eq!(d.requeue_after, Some(secs(5)));
    assert!(d.events.iter().any(|e| e.kind == EventKind::Warning));
}

#[test]
fn a_latched_proxy_can_still_be_deleted() {
    let d = case(proxy().deleting())
        .memory(Memory {
            failures: 0,
            latch: Some(Latch {
                generation: 1,
                config_digest: DIGEST.into(),
            }),
        })
        .run();
    assert!(matches!(d.action, Action::Delete { .. }));
}

#[test]
fn a_retry_after_a_failed_create_stays_on_the_same_host_unless_it_is_unhealthy() {
    let mut st = provisioning_status("h2", t0());
    st.provider_id = None;
    let d = case(proxy())
        .status(st.clone())
        .load("h1", 0, None)
        .load("h2", 5, None)
        .run();
    assert_eq!(
        created_host(&d).0,
        "h2",
        "converge the partial state where it is"
    );
    let d = case(proxy())
        .status(st)
        .load("h2", 5, Some(HostState::Unreachable))
        .run();
    assert_eq!(created_host(&d).0, "h1");
}

#[test]
fn a_changed_provider_entry_of_a_placed_proxy_is_refused_and_nothing_is_created() {
    // finding: M2
    // The instance lives in entry "other": acting on the new entry would leave it running,
    // out of GC's reach (its UID is live).
    let mut elsewhere = id("h1");
    elsewhere.entry = "other".into();
    let mut c = case(proxy()).status(running_status("h1", t0()));
    c.location = Some(elsewhere);
    let d = c.run();
    assert_eq!(d.action, Action::None);
    assert_eq!(d.status.phase, Phase::Failed);
    let (st, reason, msg) = ready(&d);
    assert_eq!(
        (st, reason.as_str()),
        (ConditionStatus::False, reason::INVALID_SPEC)
    );
    assert!(
        msg.contains("spec.provider") && msg.contains("\"other\""),
        "{msg}"
    );
    assert!(d.memory.latch.is_some());
}

// ------------------------------------------------------------------ tenancy

fn with_entry(mut c: Case, f: impl FnOnce(&mut LibvirtEntry)) -> Case {
    if let Some(e) = c.entry.as_mut() {
        f(e);
    }
    c
}

fn names(ns: &[&str]) -> egress_provider::libvirt::config::Namespaces {
    egress_provider::libvirt::config::Namespaces {
        namespaces: ns.iter().map(|s| (*s).to_owned()).collect(),
        namespace_selector: None,
    }
}

fn access(ns: &[&str]) -> egress_provider::libvirt::config::EntryAccess {
    egress_provider::libvirt::config::EntryAccess {
        namespaces: ns.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

#[test]
fn a_namespace_the_entry_does_not_admit_gets_a_condition_and_nothing_is_created() {
    let d = with_entry(case(proxy()), |e| {
        e.access = Some(access(&["team-a", "team-b"]));
    })
    .run();
    assert_eq!(d.action, Action::None);
    let (s, r, m) = ready(&d);
    assert_eq!(
        (s, r.as_str()),
        (ConditionStatus::False, reason::NOT_ENTITLED)
    );
    assert!(
        m.contains("namespace \"default\"") && m.contains("\"home\""),
        "{m}"
    );
    assert!(
        !m.contains("team-a") && !m.contains("team-b"),
        "names no other tenant: {m}"
    );
    assert!(d.memory.latch.is_some(), "until the config or spec changes");
    // Listed by name, or matched by a namespace label selector (labels the driver knows).
    let ok = with_entry(case(proxy()), |e| e.access = Some(access(&["default"]))).run();
    created_host(&ok);
    let mut p = proxy();
    p.0.namespace_labels = Some(std::sync::Arc::new(
        [("tenant".to_owned(), "gold".to_owned())].into(),
    ));
    let sel = with_entry(case(p.clone()), |e| {
        e.access = Some(egress_provider::libvirt::config::EntryAccess {
            namespace_selector: Some(egress_provider::libvirt::config::LabelSelector {
                match_labels: [("tenant".to_owned(), "gold".to_owned())].into(),
            }),
            ..Default::default()
        });
    })
    .run();
    created_host(&sel);
}

#[test]
fn hosts_a_namespace_may_not_use_are_never_chosen_or_pinned() {
    // h1 is less loaded but granted to another namespace: h2.
    let c = with_entry(case(proxy()).load("h2", 5, None), |e| {
        e.hosts[0].access = Some(names(&["team-a"]));
    });
    assert_eq!(created_host(&c.run()).0, "h2");
    // Pinned to it: refused by name of host and namespace only.
    let d = with_entry(case(proxy().on_host("h1")), |e| {
        e.hosts[0].access = Some(names(&["team-a"]));
    })
    .run();
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::NOT_ENTITLED, "{m}");
    assert!(
        m.starts_with("spec.host: host \"h1\"") && !m.contains("team-a"),
        "{m}"
    );
    // No host left at all.
    let d = with_entry(case(proxy()), |e| {
        for h in &mut e.hosts {
            h.access = Some(names(&["team-a"]));
        }
    })
    .run();
    assert_eq!(ready(&d).1, reason::NOT_ENTITLED);
    assert_eq!(d.action, Action::None);
}

#[test]
fn features_are_granted_per_namespace() {
    let granted = |f: &mut egress_provider::libvirt::config::EntryAccess| {
        f.namespaces = vec!["default".into()];
    };
    // URL images.
    let url = proxy().with_image(&format!(
        "https://img.example/a.qcow2#sha256={}",
        "a".repeat(64)
    ));
    let d = with_entry(case(url.clone()), |e| {
        e.url_images.enabled = true;
        let mut a = access(&[]);
        granted(&mut a);
        a.url_images = Some(names(&["team-a"]));
        e.access = Some(a);
    })
    .run();
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::NOT_ENTITLED, "{m}");
    assert!(
        m.starts_with("spec.image:") && m.contains("access.urlImages"),
        "{m}"
    );
    // Internal networks: lifted for a granted namespace only.
    let run = |grant: &[&str]| {
        let d = with_entry(case(proxy()), |e| {
            e.policy.allowed_internal_cidrs = vec!["10.5.0.0/16".into()];
            let mut a = access(&[]);
            granted(&mut a);
            a.internal_cidrs = Some(names(grant));
            e.access = Some(a);
        })
        .run();
        let Action::Create { req, .. } = d.action else {
            panic!("{:?}", d.action)
        };
        (req.lift_internal, req.user_data.contains("10.5.0.0/16"))
    };
    assert_eq!(run(&["default"]), (true, true));
    assert_eq!(run(&["team-a"]), (false, false));
    // Declared addresses: a pin, and hosts with a pool.
    let d = with_entry(case(proxy().egress(&["203.0.113.7"])), |e| {
        let mut a = access(&[]);
        granted(&mut a);
        a.address_pools = Some(names(&["team-a"]));
        e.access = Some(a);
    })
    .run();
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::NOT_ENTITLED, "{m}");
    assert!(m.contains("access.addressPools"), "{m}");
}

#[test]
fn a_host_full_by_memory_is_skipped_and_named_when_none_has_room() {
    // h1 (less loaded) has 1024 MiB for this entry, 768 placed; the Proxy needs 512.
    let c = with_entry(case(proxy()).load("h2", 4, None), |e| {
        e.hosts[0].capacity.memory_mib = Some(1024);
    });
    let mut c = c;
    c.hosts.get_mut("h1").unwrap().used_memory_mib = 768;
    assert_eq!(created_host(&c.run()).0, "h2");
    // Room for exactly this one: taken.
    c.hosts.get_mut("h1").unwrap().used_memory_mib = 512;
    assert_eq!(created_host(&c.run()).0, "h1");
    // Both full (h2 by vCPUs): nothing created, the reason names each host's shortage.
    let mut c = with_entry(case(proxy()), |e| {
        e.hosts[0].capacity.memory_mib = Some(1024);
        e.hosts[1].capacity.vcpus = Some(4);
    });
    c.hosts.get_mut("h1").unwrap().used_memory_mib = 1000;
    c.hosts.get_mut("h2").unwrap().used_vcpus = 4;
    let d = c.run();
    assert_eq!(d.action, Action::None);
    let (_, r, m) = ready(&d);
    assert_eq!(r, reason::NO_USABLE_HOST, "{m}");
    assert!(
        m.contains("h1") && m.contains("full by memory (1000 of 1024 MiB placed, 512 MiB needed)"),
        "{m}"
    );
    assert!(m.contains("full by vCPUs (4 of 4 placed, 1 needed)"), "{m}");
    // Its own instance on the host is not counted twice (a replacement fits where it is).
    let mut c = with_entry(case(proxy()).at("h1"), |e| {
        e.hosts[0].capacity.memory_mib = Some(1024);
        e.hosts[1].capacity.memory_mib = Some(0);
    });
    c.hosts.get_mut("h1").unwrap().used_memory_mib = 1024;
    c.observed = Observed::NotFound("gone".into());
    assert_eq!(created_host(&c.run()).0, "h1");
}

// ------------------------------------------------------------------ host maintenance

impl Case {
    /// `h`'s `maintenance:` in the entry.
    fn maintenance(mut self, h: &str, m: egress_provider::libvirt::config::Maintenance) -> Self {
        if let Some(e) = self.entry.as_mut()
            && let Some(c) = e.hosts.iter_mut().find(|c| c.name == h)
        {
            c.maintenance = m;
        }
        self
    }
}

#[test]
fn a_cordoned_or_draining_host_gets_no_new_proxy_and_a_waiting_proxy_says_why() {
    use egress_provider::libvirt::config::Maintenance;
    for (m, word) in [
        (Maintenance::Cordon, "cordoned"),
        (Maintenance::Drain, "draining"),
    ] {
        // The least loaded host is out of service: the other one is taken.
        let c = case(proxy()).load("h2", 5, None).maintenance("h1", m);
        assert_eq!(created_host(&c.run()).0, "h2", "{m:?}");
        // Both out, or the pinned host out: nothing placed, each host's reason named.
        let d = case(proxy())
            .maintenance("h1", m)
            .maintenance("h2", Maintenance::Cordon)
            .run();
        assert_eq!(d.action, Action::None);
        let (_, why, msg) = ready(&d);
        assert_eq!(why, "NoUsableHost");
        assert!(msg.contains(&format!("h1 unchecked: {word}")), "{msg}");
        assert!(msg.contains("h2 unchecked: cordoned"), "{msg}");
        let d = case(proxy().on_host("h1")).maintenance("h1", m).run();
        assert_eq!(d.action, Action::None);
        let (_, _, msg) = ready(&d);
        assert!(msg.contains("host h1 (spec.host) is unchecked: "), "{msg}");
        assert!(msg.contains(word), "{msg}");
    }
}

#[test]
fn a_running_proxy_on_a_draining_host_is_re_placed_unless_pinned_or_nowhere_to_go() {
    use egress_provider::libvirt::config::Maintenance;
    let on_h1 = |p: P| {
        case(p)
            .status(running_status("h1", t0()))
            .at("h1")
            .observed(Observed::Found(running("h1")))
            .now(t0() + secs(40))
    };
    // Cordoned: it stays.
    let d = on_h1(proxy()).maintenance("h1", Maintenance::Cordon).run();
    assert_eq!(d.action, Action::None);
    assert_eq!(ready(&d).1, reason::RUNNING);
    // Draining, unpinned: a create on the other host (not a replace in place).
    let d = on_h1(proxy()).maintenance("h1", Maintenance::Drain).run();
    assert_eq!(created_host(&d), ("h2".to_owned(), false));
    assert_eq!(d.status.host.as_deref(), Some("h2"));
    assert!(
        ready(&d).2.contains("host h1 is draining"),
        "{:?}",
        ready(&d)
    );
    // Draining, pinned: it stays, Ready, saying so.
    let d = on_h1(proxy().on_host("h1"))
        .maintenance("h1", Maintenance::Drain)
        .run();
    assert_eq!(d.action, Action::None);
    let (st, why, msg) = ready(&d);
    assert_eq!(
        (st, why.as_str()),
        (ConditionStatus::True, reason::ON_DRAINING_HOST)
    );
    assert!(msg.contains("pinned to it (spec.host)"), "{msg}");
    assert_eq!(d.status.phase, Phase::Running);
    // Draining, nowhere to go: it stays, Ready, saying so.
    let d = on_h1(proxy())
        .maintenance("h1", Maintenance::Drain)
        .maintenance("h2", Maintenance::Cordon)
        .run();
    assert_eq!(d.action, Action::None);
    let (st, why, msg) = ready(&d);
    assert_eq!(
        (st, why.as_str()),
        (ConditionStatus::True, reason::ON_DRAINING_HOST)
    );
    assert!(msg.contains("no other host takes new proxies"), "{msg}");
    assert_eq!(d.status.host.as_deref(), Some("h1"));
}

// ------------------------------------------------------------------ a dead host

#[test]
fn a_read_that_fails_on_a_dead_host_names_the_host_since_when_and_its_error_until_it_answers() {
    let since = t0() - Duration::from_secs(90);
    let mut c = case(proxy())
        .status(running_status("h1", t0()))
        .at("h1")
        .observed(Observed::GetFailed(transient()))
        .load("h1", 1, Some(HostState::Unreachable))
        .reason("h1", "connection declared dead by keepalive");
    // The host's row is not dead yet: the provider's own failure.
    assert_eq!(ready(&c.run()).1, reason::TRANSIENT_ERROR);
    c.dead.insert("h1".into(), since);
    let d = c.run();
    let (st, r, m) = ready(&d);
    assert_eq!(
        (st, r.as_str()),
        (ConditionStatus::False, reason::HOST_UNREACHABLE)
    );
    assert_eq!(
        m,
        format!(
            "host h1 Unreachable since {}: connection declared dead by keepalive; reading \
             instance {} failed, its last status is kept until the host answers",
            fmt_time(since),
            id("h1")
        )
    );
    assert_eq!(
        d.status.phase,
        Phase::Running,
        "phase kept, as a Pod on a NotReady node"
    );
    assert_eq!(d.status.ip.as_deref(), Some("192.0.2.10"), "IP kept");
    assert!(d.memory.latch.is_none(), "never latches");
    assert_eq!(
        d.requeue_after,
        Some(Duration::from_secs(5)),
        "retried with backoff"
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == reason::HOST_UNREACHABLE)
    );
    // A check that ran out its deadline says Timeout.
    let c = c.load("h1", 1, Some(HostState::Timeout));
    assert!(
        ready(&c.run()).2.starts_with("host h1 Timeout since "),
        "{:?}",
        ready(&c.run())
    );
    // The host answers again: the next read is what counts.
    let mut back = c.observed(Observed::Found(running("h1")));
    back.dead.clear();
    back.hosts.insert("h1".into(), HostInfo::default());
    let (st, r, _) = ready(&back.run());
    assert_eq!((st, r.as_str()), (ConditionStatus::True, reason::RUNNING));
}
