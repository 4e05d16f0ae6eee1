//! Orphan GC with installation identity, against libvirt-fake through the real
//! `LibvirtProvider`: another installation's instances and disks are never touched; a mark
//! written before installation identity existed is adopted (rewritten with our ID) by the
//! first pass, which keeps it, and is collected by a later pass only as our own orphan.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_core::gc::{Action, GcReport, GcSettings};
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, VirtType};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use egress_provider::{ProviderError, ProxyUid};
use libvirt_fake::{DomainSpec, FakeLibvirt, PoolSpec, VolumeSpec};
use libvirt_remote::Transport;

const ENTRY: &str = "home";
const POOL: &str = "images";
const OURS: &str = "site-a";
const THEIRS: &str = "site-b";
/// Deadline of each GC pass (milliseconds against the fake; a hang fails instead).
const STEP_DEADLINE: Duration = Duration::from_secs(60);

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.duplex().0)
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

/// The operator of installation `id` over the host state of `fake`.
fn operator(fake: &FakeLibvirt, id: &str) -> Providers {
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
    let pool = HostPool::new(
        entry.clone(),
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    let provider = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default())
        .with_installation(id)
        .unwrap();
    Providers::from_handles([ProviderHandle::new(entry, Arc::new(provider))])
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn long_ago() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn add_instance(fake: &FakeLibvirt, u: &ProxyUid, mark_xml: String) {
    fake.add_domain(DomainSpec::new(names::domain(ENTRY, u)).metadata(mark::NAMESPACE, mark_xml))
        .unwrap();
    fake.add_volume(
        POOL,
        VolumeSpec::new(names::overlay(ENTRY, u), 1 << 30).format("qcow2"),
    )
    .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(names::seed(ENTRY, u), 1 << 20))
        .unwrap();
}

fn intact(fake: &FakeLibvirt, u: &ProxyUid) -> bool {
    fake.domain(&names::domain(ENTRY, u)).is_some()
        && fake.volume(POOL, &names::overlay(ENTRY, u)).is_some()
        && fake.volume(POOL, &names::seed(ENTRY, u)).is_some()
}

async fn pass(p: &Providers, settings: &GcSettings) -> GcReport {
    tokio::time::timeout(
        STEP_DEADLINE,
        egress_core::gc::collect(p, &HashSet::new(), settings, SystemTime::now()),
    )
    .await
    .expect("a GC pass finishes within its deadline")
}

fn action(r: &GcReport, u: &ProxyUid) -> Option<Action> {
    let name = names::domain(ENTRY, u);
    r.items.iter().find(|i| i.name == name).map(|i| i.action)
}

#[tokio::test]
async fn gc_never_touches_another_installations_instances_and_adopts_unclaimed_marks_first() {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL)).unwrap();
    let (theirs, ours, unclaimed) = (uid(1), uid(2), uid(3));
    let their_mark = mark::render_for(&theirs, ENTRY, Some(THEIRS), long_ago());
    add_instance(&fake, &theirs, their_mark.clone());
    add_instance(
        &fake,
        &ours,
        mark::render_for(&ours, ENTRY, Some(OURS), long_ago()),
    );
    add_instance(
        &fake,
        &unclaimed,
        mark::render(&unclaimed, ENTRY, long_ago()),
    );
    let settings = GcSettings {
        min_age: Duration::from_secs(1),
        dry_run: false,
        ..GcSettings::default()
    };
    let op = operator(&fake, OURS);

    let first = pass(&op, &settings).await;
    assert_eq!(action(&first, &ours), Some(Action::Deleted), "{first}");
    assert!(!intact(&fake, &ours) && fake.domain(&names::domain(ENTRY, &ours)).is_none());
    assert_eq!(action(&first, &theirs), None, "not even listed: {first}");
    assert!(intact(&fake, &theirs), "another installation's: {first}");
    assert_eq!(
        action(&first, &unclaimed),
        Some(Action::Kept),
        "the pass that adopts a mark never collects it: {first}"
    );
    assert!(intact(&fake, &unclaimed));
    let rewritten = fake
        .domain_metadata(&names::domain(ENTRY, &unclaimed), mark::NAMESPACE)
        .unwrap();
    let m = mark::parse(&rewritten, ENTRY, SystemTime::now()).unwrap();
    assert_eq!(m.installation.as_deref(), Some(OURS), "{rewritten}");

    // Later passes: the adopted mark is ours (an orphan of ours: collected); the other
    // installation's instance is still untouched, its mark as it wrote it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = pass(&op, &settings).await;
    assert_eq!(
        action(&second, &unclaimed),
        Some(Action::Deleted),
        "{second}"
    );
    assert!(intact(&fake, &theirs), "{second}");
    assert_eq!(
        fake.domain_metadata(&names::domain(ENTRY, &theirs), mark::NAMESPACE)
            .unwrap(),
        their_mark
    );
    // The other installation's operator sees its own instance (and only it).
    let their_op = operator(&fake, THEIRS);
    let r = pass(
        &their_op,
        &GcSettings {
            min_age: Duration::from_secs(1),
            dry_run: true,
            ..GcSettings::default()
        },
    )
    .await;
    assert!(action(&r, &theirs).is_some(), "{r}");
}
