//! Orphan GC end to end against libvirt-fake through the real `LibvirtProvider`: what is
//! collected, what is never touched (tampered marks, mismatched names, bases, foreign
//! volumes), a link dying mid-list, and the dry run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_core::gc::{Action, GcReport, GcSettings, ItemKind};
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, VirtType};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::cache;
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use egress_provider::{ProviderError, ProxyUid};
use libvirt_fake::{ConnHandle, DomainSpec, FakeLibvirt, PoolSpec, VolumeSpec, codes, domains};
use libvirt_remote::Transport;
use libvirt_remote::proto::procs;

const ENTRY: &str = "home";
const POOL: &str = "images";
/// Delay the fake adds to every reply in the mid-list cut test, so the cut lands while the
/// mark reads are in flight (ordering only; nothing asserts timing).
const CUT_DELAY: Duration = Duration::from_millis(20);
/// Deadline of each GC pass and each other single await of these tests.
// NB: a pass against the fake takes milliseconds; the provider's own budgets are far longer
// (minutes), so this turns a hang into a failure well before them.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

/// [`egress_core::gc::collect`] within [`STEP_DEADLINE`].
async fn collect(
    providers: &Providers,
    live: &HashSet<ProxyUid>,
    settings: &GcSettings,
    now: SystemTime,
) -> GcReport {
    tokio::time::timeout(
        STEP_DEADLINE,
        egress_core::gc::collect(providers, live, settings, now),
    )
    .await
    .expect("a GC pass finishes within its deadline")
}

/// Connects to the fake and keeps every connection's handle, so a test can cut the link.
struct FakeConnector {
    fake: FakeLibvirt,
    conns: Arc<Mutex<Vec<ConnHandle>>>,
}

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        let (t, h) = self.fake.duplex();
        self.conns.lock().unwrap().push(h);
        Ok(t)
    }
}

fn host() -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "h1.invalid".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

struct Setup {
    fake: FakeLibvirt,
    providers: Providers,
    conns: Arc<Mutex<Vec<ConnHandle>>>,
}

fn setup() -> Setup {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL)).unwrap();
    setup_on(fake)
}

/// A fresh operator (providers, pools, connections) over the host state of `fake`.
fn setup_on(fake: FakeLibvirt) -> Setup {
    let entry = LibvirtEntry {
        name: ENTRY.into(),
        hosts: vec![host()],
        images: BTreeMap::new(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let conns = Arc::new(Mutex::new(Vec::new()));
    let pool = HostPool::new(
        entry.clone(),
        Arc::new(FakeConnector {
            fake: fake.clone(),
            conns: conns.clone(),
        }),
        PoolOptions::default(),
    )
    .unwrap();
    let provider = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    let providers = Providers::from_handles([ProviderHandle::new(entry, Arc::new(provider))]);
    Setup {
        fake,
        providers,
        conns,
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

/// Long ago: every mark below is far older than the minimum age.
fn long_ago() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

/// A mark with any UID text, as libvirt hands it back.
fn mark_xml(uid_text: &str) -> String {
    format!(
        "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{uid_text}</uid>\n  \
         <entry>{ENTRY}</entry>\n  <createdAt>2023-11-14T22:13:20Z</createdAt>\n</instance>",
        mark::NAMESPACE
    )
}

/// The domain named for `named`, carrying a valid mark for `marked`.
fn domain(named: &ProxyUid, marked: &ProxyUid) -> DomainSpec {
    DomainSpec::new(names::domain(ENTRY, named))
        .metadata(mark::NAMESPACE, mark::render(marked, ENTRY, long_ago()))
}

fn add_disks(fake: &FakeLibvirt, u: &ProxyUid) {
    fake.add_volume(
        POOL,
        VolumeSpec::new(names::overlay(ENTRY, u), 1 << 30).format("qcow2"),
    )
    .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(names::seed(ENTRY, u), 1 << 20))
        .unwrap();
}

fn has_disks(fake: &FakeLibvirt, u: &ProxyUid) -> (bool, bool) {
    (
        fake.volume(POOL, &names::overlay(ENTRY, u)).is_some(),
        fake.volume(POOL, &names::seed(ENTRY, u)).is_some(),
    )
}

fn has_domain(fake: &FakeLibvirt, u: &ProxyUid) -> bool {
    fake.domain(&names::domain(ENTRY, u)).is_some()
}

fn base_name() -> String {
    names::base(
        ENTRY,
        names::ImageSource::Catalogue("debian-12"),
        &"a".repeat(64),
        egress_provider::libvirt::config::ImageFormat::Qcow2,
    )
}

/// A part whose name says it was started `secs` seconds after the epoch.
fn part_at(secs: u64) -> String {
    format!(
        "{}img-debian-12-unverified{}{secs}-0123456789abcdef",
        names::base_prefix(ENTRY),
        cache::PART_INFIX
    )
}

fn item<'a>(r: &'a GcReport, name: &str) -> &'a egress_core::gc::GcItem {
    r.items
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no item {name} in\n{r}"))
}

/// A host with one of everything; returns the UIDs (live, orphan instance, orphan volumes).
fn populate(fake: &FakeLibvirt) -> (ProxyUid, ProxyUid, ProxyUid) {
    let (live, orphan, vols_only) = (uid(1), uid(2), uid(3));
    for u in [live, orphan] {
        fake.add_domain(domain(&u, &u)).unwrap();
        add_disks(fake, &u);
    }
    add_disks(fake, &vols_only);
    let base = base_name();
    fake.add_volume(POOL, VolumeSpec::new(base.clone(), 1 << 30).format("qcow2"))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(cache::marker_name(&base), 1 << 30))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new("someone-elses-disk.qcow2", 1 << 30))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(part_at(1_700_000_000), 1 << 20))
        .unwrap();
    (live, orphan, vols_only)
}

#[tokio::test]
async fn an_orphan_dated_in_the_future_is_collected_once_its_age_from_first_sight_passes_min_age() {
    // finding: L9
    let s = setup();
    let u = uid(9);
    s.fake
        .add_domain(DomainSpec::new(names::domain(ENTRY, &u)).metadata(
            mark::NAMESPACE,
            mark::render(
                &u,
                ENTRY,
                SystemTime::UNIX_EPOCH + Duration::from_secs(4_070_908_800), // 2099
            ),
        ))
        .unwrap();
    add_disks(&s.fake, &u);
    let settings = GcSettings {
        min_age: Duration::from_secs(1),
        dry_run: false,
        ..GcSettings::default()
    };
    let none = HashSet::new();
    let name = names::domain(ENTRY, &u);
    for pass in 0..2 {
        let r = collect(&s.providers, &none, &settings, SystemTime::now()).await;
        assert_eq!(item(&r, &name).action, Action::Kept, "pass {pass}: {r}");
        assert!(has_domain(&s.fake, &u));
    }
    // Past the minimum age since it was first seen; then the operator restarts (new
    // providers, new connections, nothing remembered in memory).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    drop(s.providers);
    let restarted = setup_on(s.fake.clone());
    let r = collect(&restarted.providers, &none, &settings, SystemTime::now()).await;
    assert_eq!(item(&r, &name).action, Action::Deleted, "{r}");
    assert!(!has_domain(&s.fake, &u));
    assert_eq!(has_disks(&s.fake, &u), (false, false), "with its disks");
}

#[tokio::test]
async fn orphan_instances_and_volumes_are_collected_and_nothing_else_is_touched() {
    // finding: M3, M2
    let s = setup();
    let (live, orphan, vols_only) = populate(&s.fake);
    let fresh_part = part_at(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    );
    s.fake
        .add_volume(POOL, VolumeSpec::new(fresh_part.clone(), 1 << 20))
        .unwrap();
    let live_set: HashSet<_> = [live].into_iter().collect();

    let r = collect(
        &s.providers,
        &live_set,
        &GcSettings::default(),
        SystemTime::now(),
    )
    .await;
    println!("{r}");

    assert!(has_domain(&s.fake, &live) && has_disks(&s.fake, &live) == (true, true));
    assert!(!has_domain(&s.fake, &orphan), "orphan instance collected");
    assert_eq!(
        has_disks(&s.fake, &orphan),
        (false, false),
        "with its disks"
    );
    assert_eq!(
        has_disks(&s.fake, &vols_only),
        (false, false),
        "orphan volumes"
    );
    assert!(
        s.fake.volume(POOL, &part_at(1_700_000_000)).is_none(),
        "stale part"
    );
    assert!(
        s.fake.volume(POOL, &fresh_part).is_some(),
        "an import may own it"
    );
    let base = base_name();
    assert!(s.fake.volume(POOL, &base).is_some(), "never a base");
    assert!(s.fake.volume(POOL, &cache::marker_name(&base)).is_some());
    assert!(s.fake.volume(POOL, "someone-elses-disk.qcow2").is_some());

    assert_eq!(
        item(&r, &names::domain(ENTRY, &orphan)).action,
        Action::Deleted
    );
    assert_eq!(item(&r, &names::domain(ENTRY, &live)).action, Action::Kept);
    assert_eq!(item(&r, &fresh_part).action, Action::Kept);
    assert!(
        !r.items.iter().any(|i| i.name.contains("someone")
            || (i.name == base && (i.kind != ItemKind::Base || i.action != Action::Kept))),
        "a base is only ever judged as a base, and this one is kept: {r}"
    );
    assert!(r.is_clean(), "{r}");
    // The listing is handed back for adoption: both domains, as listed before deletion.
    assert_eq!(r.entries[0].listed.len(), 2);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["items"][0]["entry"], ENTRY);
}

#[tokio::test]
async fn domains_with_padded_or_recased_mark_uids_or_mismatched_names_are_never_deleted() {
    // finding: E2
    let s = setup();
    let (padded, upper, renamed, named_for) = (uid(0x10), uid(0x11), uid(0x12), uid(0x13));
    s.fake
        .add_domain(
            DomainSpec::new(names::domain(ENTRY, &padded))
                .metadata(mark::NAMESPACE, mark_xml(&format!(" {padded}\n"))),
        )
        .unwrap();
    s.fake
        .add_domain(
            DomainSpec::new(names::domain(ENTRY, &upper))
                .metadata(mark::NAMESPACE, mark_xml(&upper.canonical().to_uppercase())),
        )
        .unwrap();
    // A valid mark for `renamed` on the domain named for `named_for`.
    s.fake.add_domain(domain(&named_for, &renamed)).unwrap();
    for u in [padded, upper, named_for, renamed] {
        add_disks(&s.fake, &u);
    }

    // Nothing is live and every mark is ancient: only the checks protect them.
    let r = collect(
        &s.providers,
        &HashSet::new(),
        &GcSettings::default(),
        SystemTime::now(),
    )
    .await;
    println!("{r}");

    for u in [padded, upper, named_for] {
        assert!(has_domain(&s.fake, &u), "{u}\n{r}");
        assert_eq!(has_disks(&s.fake, &u), (true, true), "{u}\n{r}");
    }
    assert_eq!(has_disks(&s.fake, &renamed), (true, true), "{r}");
    let mismatched = item(&r, &names::domain(ENTRY, &named_for));
    assert_eq!(mismatched.action, Action::Kept);
    assert_eq!(mismatched.rule, "name-mismatch");
    // The disks of the tampered domains are not covered by a listed domain, but a domain with
    // their UID's name exists: the plan keeps them by the rule the provider's last check
    // applies, so nothing is attempted and nothing fails.
    let kept = item(&r, &names::overlay(ENTRY, &padded));
    assert_eq!(kept.action, Action::Kept, "{r}");
    assert_eq!(kept.rule, "domain-exists", "{r}");
    assert!(kept.reason.contains("exists"), "{}", kept.reason);
    assert_eq!(r.with_action(Action::Deleted).count(), 0, "{r}");
    assert_eq!(r.with_action(Action::Failed).count(), 0, "{r}");
}

/// Runs a dry run then a real run over one fake host state, twice (a second round must
/// agree too), and checks that each item's dry verdict matches the real one.
async fn dry_and_real_agree(s: &Setup, live: &HashSet<ProxyUid>) -> (GcReport, GcReport) {
    let dry = collect(
        &s.providers,
        live,
        &GcSettings {
            dry_run: true,
            ..GcSettings::default()
        },
        SystemTime::now(),
    )
    .await;
    let real = collect(
        &s.providers,
        live,
        &GcSettings::default(),
        SystemTime::now(),
    )
    .await;
    println!("dry:\n{dry}\nreal:\n{real}");
    assert_eq!(real.with_action(Action::Failed).count(), 0, "{real}");
    let verdicts = |r: &GcReport, del: Action| {
        let mut v: Vec<(String, bool)> = r
            .items
            .iter()
            .map(|i| (i.name.clone(), i.action == del))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        verdicts(&dry, Action::WouldDelete),
        verdicts(&real, Action::Deleted),
        "the dry run and the real run decided differently"
    );
    (dry, real)
}

#[tokio::test]
async fn the_dry_run_and_the_real_run_decide_the_same_for_a_domain_kept_for_its_malformed_mark() {
    let s = setup();
    let (live, orphan, vols_only) = populate(&s.fake);
    let malformed = uid(0x20);
    s.fake
        .add_domain(
            DomainSpec::new(names::domain(ENTRY, &malformed))
                .metadata(mark::NAMESPACE, "<instance xmlns=\"x\"><uid>not-a-uid"),
        )
        .unwrap();
    add_disks(&s.fake, &malformed);
    let live: HashSet<ProxyUid> = [live].into_iter().collect();
    let (dry, real) = dry_and_real_agree(&s, &live).await;
    for n in [
        names::overlay(ENTRY, &malformed),
        names::seed(ENTRY, &malformed),
    ] {
        assert_eq!(item(&dry, &n).action, Action::Kept, "{dry}");
        assert_eq!(item(&real, &n).action, Action::Kept, "{real}");
    }
    assert!(has_domain(&s.fake, &malformed));
    assert_eq!(has_disks(&s.fake, &malformed), (true, true));
    // The real orphans went, and a second round (nothing left to collect) agrees again.
    assert!(!has_domain(&s.fake, &orphan));
    assert_eq!(has_disks(&s.fake, &vols_only), (false, false));
    let (_, again) = dry_and_real_agree(&s, &live).await;
    assert_eq!(again.with_action(Action::Deleted).count(), 0, "{again}");
}

#[tokio::test]
async fn a_link_that_dies_mid_list_deletes_nothing() {
    // finding: M15
    let s = setup();
    let (_live, orphan, vols_only) = populate(&s.fake);
    for n in 0x20..0x30 {
        let u = uid(n);
        s.fake.add_domain(domain(&u, &u)).unwrap();
    }
    s.fake.faults().delay_replies(Some(CUT_DELAY));
    let (live, settings) = (HashSet::new(), GcSettings::default());
    let (r, ()) = tokio::join!(
        collect(&s.providers, &live, &settings, SystemTime::now()),
        async {
            tokio::time::timeout(
                STEP_DEADLINE,
                s.fake.wait_for_calls(procs::DOMAIN_GET_METADATA, 3),
            )
            .await
            .expect("the listing reads marks");
            for h in s.conns.lock().unwrap().iter() {
                h.close();
            }
        }
    );
    println!("{r}");
    assert!(has_domain(&s.fake, &orphan));
    assert_eq!(has_disks(&s.fake, &orphan), (true, true));
    assert_eq!(has_disks(&s.fake, &vols_only), (true, true));
    assert!(s.fake.volume(POOL, &part_at(1_700_000_000)).is_some());
    assert!((0x20..0x30).all(|n| has_domain(&s.fake, &uid(n))));
    assert_eq!(r.items.len(), 1, "{r}");
    assert_eq!(r.items[0].kind, ItemKind::Entry);
    assert_eq!(r.items[0].rule, "instance-list-failed");
    assert!(r.entries[0].instances_error.is_some() && r.entries[0].listed.is_empty());
    assert!(!r.is_clean());
}

#[tokio::test]
async fn a_failed_volume_list_keeps_every_volume_but_still_collects_orphan_instances() {
    // finding: M15
    let s = setup();
    let (_live, orphan, vols_only) = populate(&s.fake);
    s.fake.faults().fail_calls(
        procs::STORAGE_POOL_LIST_ALL_VOLUMES,
        codes::INTERNAL_ERROR,
        domains::STORAGE,
        "internal error: listing failed",
        None,
    );
    let r = collect(
        &s.providers,
        &HashSet::new(),
        &GcSettings::default(),
        SystemTime::now(),
    )
    .await;
    println!("{r}");
    assert!(!has_domain(&s.fake, &orphan), "{r}");
    assert_eq!(has_disks(&s.fake, &vols_only), (true, true), "{r}");
    assert!(s.fake.volume(POOL, &part_at(1_700_000_000)).is_some());
    assert!(r.entries[0].volumes_error.is_some());
}

#[tokio::test]
async fn a_dry_run_deletes_nothing_and_says_what_would_go_and_why() {
    let s = setup();
    let (live, orphan, vols_only) = populate(&s.fake);
    let before = {
        let mut v = s.fake.volumes(POOL).unwrap();
        v.sort();
        v
    };
    let settings = GcSettings {
        dry_run: true,
        ..GcSettings::default()
    };
    let r = collect(
        &s.providers,
        &[live].into_iter().collect(),
        &settings,
        SystemTime::now(),
    )
    .await;
    println!("{r}");
    let mut after = s.fake.volumes(POOL).unwrap();
    after.sort();
    assert_eq!(before, after);
    assert!(has_domain(&s.fake, &orphan));
    assert!(r.dry_run);
    let would: Vec<_> = r
        .with_action(Action::WouldDelete)
        .map(|i| i.name.clone())
        .collect();
    let mut want = vec![
        names::domain(ENTRY, &orphan),
        names::overlay(ENTRY, &vols_only),
        names::seed(ENTRY, &vols_only),
        part_at(1_700_000_000),
    ];
    want.sort();
    let mut would_sorted = would.clone();
    would_sorted.sort();
    assert_eq!(would_sorted, want, "{r}");
    let text = r.to_string();
    assert!(
        text.contains(&format!(
            "{ENTRY} h1 {} instance: would delete (no live Proxy has this UID",
            names::domain(ENTRY, &orphan)
        )),
        "{text}"
    );
}

#[tokio::test]
async fn a_part_that_a_published_base_uses_as_its_data_is_never_collected() {
    let s = setup();
    let data = part_at(1_700_000_000);
    let leftover = part_at(1_700_000_001);
    for p in [&data, &leftover] {
        s.fake
            .add_volume(POOL, VolumeSpec::new(p.clone(), 1 << 20))
            .unwrap();
    }
    let data_path = s.fake.volume(POOL, &data).unwrap().path;
    let base = base_name();
    s.fake
        .add_volume(
            POOL,
            VolumeSpec::new(base.clone(), 1 << 30)
                .format("qcow2")
                .backing(data_path),
        )
        .unwrap();
    // Published: its marker records the base's size (an unmarked one this old is collected).
    s.fake
        .add_volume(POOL, VolumeSpec::new(cache::marker_name(&base), 1 << 30))
        .unwrap();
    let r = collect(
        &s.providers,
        &HashSet::new(),
        &GcSettings::default(),
        SystemTime::now(),
    )
    .await;
    println!("{r}");
    assert!(s.fake.volume(POOL, &data).is_some(), "base data kept\n{r}");
    assert!(s.fake.volume(POOL, &base).is_some());
    assert!(
        s.fake.volume(POOL, &leftover).is_none(),
        "leftover swept\n{r}"
    );
    assert!(!r.items.iter().any(|i| i.name == data), "never listed\n{r}");
}

#[tokio::test]
async fn the_provider_refuses_to_delete_a_volume_that_is_not_an_orphan_of_its_scheme() {
    // finding: M2, E2
    use egress_provider::model::{OwnedVolume, VolumeKind};
    let s = setup();
    let provider = s.providers.get(ENTRY).unwrap().provider.clone();
    let base = base_name();
    let data = part_at(1_700_000_000);
    s.fake
        .add_volume(POOL, VolumeSpec::new(data.clone(), 1 << 20))
        .unwrap();
    let data_path = s.fake.volume(POOL, &data).unwrap().path;
    s.fake
        .add_volume(
            POOL,
            VolumeSpec::new(base.clone(), 1 << 30)
                .format("qcow2")
                .backing(data_path),
        )
        .unwrap();
    let u = uid(5);
    let upper = names::overlay(ENTRY, &u).to_uppercase();
    s.fake
        .add_volume(POOL, VolumeSpec::new(upper.clone(), 1 << 20))
        .unwrap();
    let forged = |name: &str, kind, uid| OwnedVolume {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: name.into(),
        kind,
        uid,
        age_since: None,
        domain_exists: false,
    };
    for v in [
        forged(&base, VolumeKind::Part, None),
        forged(&cache::marker_name(&base), VolumeKind::Part, None),
        forged(&data, VolumeKind::Part, None),
        forged(&upper, VolumeKind::Overlay, Some(u)),
        // The name says seed of `u`, the listing said overlay: refused.
        forged(&names::seed(ENTRY, &u), VolumeKind::Overlay, Some(u)),
    ] {
        let e = tokio::time::timeout(STEP_DEADLINE, provider.delete_orphan_volume(&v))
            .await
            .expect("a refusal comes within the deadline")
            .unwrap_err();
        assert!(e.is_permanent() && e.message.contains("refusing"), "{e}");
    }
    assert!(s.fake.volume(POOL, &base).is_some());
    assert!(s.fake.volume(POOL, &data).is_some());
    assert!(s.fake.volume(POOL, &upper).is_some());
}

/// A published base of image `key` whose data volume was uploaded at `secs` (unix), as the
/// import protocol leaves it: data part, base backed by it, marker of the same capacity.
fn publish(fake: &FakeLibvirt, key: &str, secs: u64) -> String {
    let data = format!(
        "{}img-{key}-{}{}{secs}-0123456789abcdef",
        names::base_prefix(ENTRY),
        "b".repeat(64),
        cache::PART_INFIX
    );
    fake.add_volume(POOL, VolumeSpec::new(data.clone(), 1 << 20))
        .unwrap();
    let data_path = fake.volume(POOL, &data).unwrap().path;
    let base = names::base(
        ENTRY,
        names::ImageSource::Catalogue(key),
        &"b".repeat(64),
        egress_provider::libvirt::config::ImageFormat::Qcow2,
    );
    fake.add_volume(
        POOL,
        VolumeSpec::new(base.clone(), 1 << 30)
            .format("qcow2")
            .backing(data_path),
    )
    .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(cache::marker_name(&base), 1 << 30))
        .unwrap();
    base
}

#[tokio::test]
async fn every_pass_collects_the_bases_nothing_uses_once_their_grace_is_over() {
    let s = setup();
    let t0 = SystemTime::now();
    let secs = t0.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let used = publish(&s.fake, "used", secs);
    let unused = publish(&s.fake, "unused", secs);
    let used_path = s.fake.volume(POOL, &used).unwrap().path;
    s.fake
        .add_volume(
            POOL,
            VolumeSpec::new("someones-overlay.qcow2", 1 << 30)
                .format("qcow2")
                .backing(used_path),
        )
        .unwrap();
    let none = HashSet::new();
    // The first pass starts the unused base's grace (60 minutes by default).
    let r = collect(&s.providers, &none, &GcSettings::default(), t0).await;
    println!("{r}");
    let (u, k) = (item(&r, &unused), item(&r, &used));
    assert_eq!(
        (u.kind, u.action, u.rule),
        (ItemKind::Base, Action::Kept, "base-in-grace"),
        "{r}"
    );
    assert_eq!((k.action, k.rule), (Action::Kept, "base-in-use"), "{r}");
    // A dry run past the grace says it would go.
    let later = t0 + Duration::from_secs(61 * 60);
    let dry = GcSettings {
        dry_run: true,
        ..GcSettings::default()
    };
    let r = collect(&s.providers, &none, &dry, later).await;
    assert_eq!(item(&r, &unused).action, Action::WouldDelete, "{r}");
    assert!(s.fake.volume(POOL, &unused).is_some());
    // Past the grace: removed, with its marker; the one in use stays.
    let r = collect(&s.providers, &none, &GcSettings::default(), later).await;
    println!("{r}");
    assert_eq!(item(&r, &unused).action, Action::Deleted, "{r}");
    assert!(s.fake.volume(POOL, &unused).is_none());
    assert!(s.fake.volume(POOL, &cache::marker_name(&unused)).is_none());
    assert!(s.fake.volume(POOL, &used).is_some());
    assert_eq!(item(&r, &used).action, Action::Kept, "{r}");
    assert!(r.is_clean(), "{r}");
    // Without the base step (the `gc` command), bases are not looked at.
    let no_bases = GcSettings {
        bases: None,
        ..GcSettings::default()
    };
    let r = collect(&s.providers, &none, &no_bases, later).await;
    assert!(!r.items.iter().any(|i| i.kind == ItemKind::Base), "{r}");
}
