//! Orphan GC against the REAL libvirtd through a real sshd: an orphan TCG domain of our scheme
//! and orphan volumes are collected; a foreign domain, a same-named domain without our mark,
//! a base and its marker are left; a dry run changes nothing. Every resource is uniquely
//! named (`ep-eptest…` domains and volumes in an `eptest-…` pool), printed first, and removed
//! on every path by Drop guards.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_core::gc::{Action, GcSettings, collect};
use egress_core::providers::{ProviderHandle, Providers};
use egress_provider::ProxyUid;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, ImageFormat, LibvirtEntry, Timeouts, VirtType};
use egress_provider::libvirt::hostpool::{HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::image::cache;
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use ep_test_support::cleanup::{self, DomainGuard, PoolFixture};
use ep_test_support::sshd::Sshd;

fn unique(tag: &str) -> String {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{tag}{:x}",
        (n as u64) ^ (u64::from(std::process::id()) << 20)
    )
}

/// A fresh UID: clock nanoseconds and a random word (uniqueness, not secrecy).
fn uid() -> ProxyUid {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    ProxyUid(uuid::Uuid::from_u128(
        n ^ (u128::from(cleanup::random_u32()) << 96),
    ))
}

fn providers(entry: &str, sshd: &Sshd, pool: &str) -> Providers {
    let host = HostConfig {
        name: "h1".into(),
        address: format!("127.0.0.1:{}", sshd.port),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: pool.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: Some(sshd.client_key_path.clone()),
        known_hosts_file: Some(sshd.known_hosts_path.clone()),
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    };
    let e = LibvirtEntry {
        name: entry.into(),
        hosts: vec![host],
        images: Default::default(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let pool = HostPool::new(
        e.clone(),
        Arc::new(SshConnector::new(&e.timeouts)),
        PoolOptions::default(),
    )
    .unwrap();
    let p = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    Providers::from_handles([ProviderHandle::new(e, Arc::new(p))])
}

/// Defines and starts a diskless, NIC-less TCG domain `name`, with `metadata` (if any).
fn define_and_start(name: &str, metadata: Option<&str>, dir: &std::path::Path) {
    let meta = metadata
        .map(|m| format!("<metadata>{m}</metadata>"))
        .unwrap_or_default();
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os>{meta}<devices></devices></domain>"
    );
    let path = dir.join(format!("{name}.xml"));
    std::fs::write(&path, xml).unwrap();
    cleanup::virsh_ok(&["define", path.to_str().unwrap()]);
    cleanup::virsh_ok(&["start", name]);
}

fn vol_create(pool: &str, name: &str, format: &str) {
    cleanup::virsh_ok(&["vol-create-as", pool, name, "1M", "--format", format]);
}

fn exists_domain(name: &str) -> bool {
    cleanup::domain_names().iter().any(|d| d == name)
}

fn files(pool: &PoolFixture) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&pool.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_collected_on_the_real_libvirtd_and_foreign_things_and_bases_are_left() {
    // finding: M3, M2, E2
    let entry = unique("eptest");
    let (orphan_dom, orphan_vols, unmarked, live) = (uid(), uid(), uid(), uid());
    let orphan_name = names::domain(&entry, &orphan_dom);
    let unmarked_name = names::domain(&entry, &unmarked);
    let live_name = names::domain(&entry, &live);
    let foreign = DomainGuard::new("gc-foreign");
    // (The guard printed the foreign domain's name; the pool fixture prints the pool's.)
    for d in [&orphan_name, &unmarked_name, &live_name] {
        println!("eptest: creating domain {d}");
    }
    let _guards =
        [&orphan_name, &unmarked_name, &live_name].map(|n| DomainGuard { name: n.clone() });
    let pool = PoolFixture::create("gc");
    println!(
        "eptest: created pool {} in {}",
        pool.name,
        pool.dir.display()
    );
    std::fs::set_permissions(&pool.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("eptest-scratch-")
        .tempdir()
        .unwrap();

    // Marks from long ago, so only the rules (not the minimum age) decide.
    let t = SystemTime::now() - Duration::from_secs(86_400);
    define_and_start(
        &orphan_name,
        Some(&mark::render(&orphan_dom, &entry, t)),
        scratch.path(),
    );
    define_and_start(
        &live_name,
        Some(&mark::render(&live, &entry, t)),
        scratch.path(),
    );
    // Named like ours, no mark: never ours (M2); its disks are not orphans either.
    define_and_start(&unmarked_name, None, scratch.path());
    define_and_start(&foreign.name, None, scratch.path());
    for u in [orphan_dom, orphan_vols, unmarked, live] {
        vol_create(&pool.name, &names::overlay(&entry, &u), "qcow2");
        vol_create(&pool.name, &names::seed(&entry, &u), "raw");
    }
    let base = names::base(
        &entry,
        names::ImageSource::Catalogue("tiny"),
        &"a".repeat(64),
        ImageFormat::Qcow2,
    );
    // A published base: a qcow2 overlay whose backing store is its (old) part, the data.
    let data_part = format!(
        "{}img-tiny-{}{}1600000000-00000000000000ff",
        names::base_prefix(&entry),
        "a".repeat(64),
        cache::PART_INFIX
    );
    vol_create(&pool.name, &data_part, "raw");
    let data_path = pool.file(&data_part);
    cleanup::virsh_ok(&[
        "vol-create-as",
        &pool.name,
        &base,
        "1M",
        "--format",
        "qcow2",
        "--backing-vol",
        data_path.to_str().unwrap(),
        "--backing-vol-format",
        "raw",
    ]);
    vol_create(&pool.name, &cache::marker_name(&base), "raw");
    let stale_part = format!(
        "{}img-tiny-unverified{}1700000000-0123456789abcdef",
        names::base_prefix(&entry),
        cache::PART_INFIX
    );
    vol_create(&pool.name, &stale_part, "raw");
    vol_create(&pool.name, "eptest-foreign-volume.img", "raw");
    let before = files(&pool);
    println!("eptest: volumes {before:?}");

    let sshd = Sshd::start();
    let ps = providers(&entry, &sshd, &pool.name);
    let live_set: HashSet<_> = [live].into_iter().collect();

    // A dry run changes nothing and names what would go. The orphan volumes were just made:
    // their timestamps make them younger than the minimum age, so they stay for now.
    // NB: the orphan rules only: the base step (an unused base goes once its grace is over,
    // an hour by default, which the pass's clock passes below) is tested with the provider's
    // image tests and `images gc`.
    let orphans_only = GcSettings {
        bases: None,
        ..GcSettings::default()
    };
    let dry = GcSettings {
        dry_run: true,
        ..orphans_only.clone()
    };
    let r = collect(&ps, &live_set, &dry, SystemTime::now()).await;
    println!("dry run:\n{r}");
    assert_eq!(files(&pool), before);
    assert!(exists_domain(&orphan_name));
    let would = |r: &egress_core::gc::GcReport| {
        let mut v: Vec<String> = r
            .with_action(Action::WouldDelete)
            .map(|i| i.name.clone())
            .collect();
        v.sort();
        v
    };
    // The unmarked domain's disks are kept by the plan itself (a domain of that name exists),
    // exactly as the real run's last check would keep them: dry run and real run agree.
    let mut want = vec![orphan_name.clone(), stale_part.clone()];
    want.sort();
    assert_eq!(would(&r), want, "{r}");
    let kept_for_domain = |r: &egress_core::gc::GcReport| {
        let mut v: Vec<String> = r
            .items
            .iter()
            .filter(|i| (i.action, i.rule) == (Action::Kept, "domain-exists"))
            .map(|i| i.name.clone())
            .collect();
        v.sort();
        v
    };
    let mut unmarked_disks = vec![
        names::overlay(&entry, &unmarked),
        names::seed(&entry, &unmarked),
    ];
    unmarked_disks.sort();
    assert_eq!(kept_for_domain(&r), unmarked_disks, "{r}");
    let young = r
        .items
        .iter()
        .find(|i| i.name == names::overlay(&entry, &orphan_vols))
        .unwrap();
    assert_eq!((young.action, young.rule), (Action::Kept, "young"), "{r}");

    // An hour later (the pass's clock), they would go too.
    let later = SystemTime::now() + Duration::from_secs(3600);
    let r = collect(&ps, &live_set, &dry, later).await;
    want.extend([
        names::overlay(&entry, &orphan_vols),
        names::seed(&entry, &orphan_vols),
    ]);
    want.sort();
    assert_eq!(would(&r), want, "{r}");
    assert_eq!(files(&pool), before);

    // The real pass.
    let r = collect(&ps, &live_set, &orphans_only, later).await;
    println!("real run:\n{r}");
    assert!(!exists_domain(&orphan_name), "orphan domain collected\n{r}");
    assert!(exists_domain(&live_name), "live domain kept");
    assert!(
        exists_domain(&unmarked_name),
        "unmarked domain never touched (M2)"
    );
    assert!(
        exists_domain(&foreign.name),
        "foreign domain never touched (M2)"
    );
    let left = files(&pool);
    for u in [orphan_dom, orphan_vols] {
        assert!(!left.iter().any(|f| f.contains(&u.simple())), "{left:?}");
    }
    for u in [unmarked, live] {
        assert!(left.contains(&names::overlay(&entry, &u)), "{left:?}");
        assert!(left.contains(&names::seed(&entry, &u)), "{left:?}");
    }
    assert!(left.contains(&base) && left.contains(&cache::marker_name(&base)));
    assert!(
        left.contains(&data_part),
        "a base's data part is never collected"
    );
    assert!(left.contains(&"eptest-foreign-volume.img".to_string()));
    assert!(!left.contains(&stale_part), "{left:?}");
    // The unmarked domain's disks are kept by the same rule as in the dry run: nothing fails.
    assert_eq!(r.with_action(Action::Failed).count(), 0, "{r}");
    assert_eq!(kept_for_domain(&r), unmarked_disks, "{r}");
}
