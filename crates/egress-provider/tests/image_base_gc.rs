//! Collecting unused bases (`Provider::collect_bases`, libvirt-fake): a base that an overlay
//! in the pool or a domain's disk chain on the host uses survives every pass, however long;
//! an unused one is removed (base, marker, data volume) once it has been unused for the
//! grace, counted from the first pass that found it unused (or from its upload for a one-shot
//! run), never before; a dry run removes nothing; a base whose last user went restarts its
//! count; a host that cannot be read is reported and nothing of it removed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use egress_provider::bases::{BaseAction, BaseGcSettings, BaseVerdict, UnusedClock};
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    Firmware, HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::{self, Base, BulkConnect, FetchOptions, Target};
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{NoProgress, Provider, ProviderError};
use image_fixtures::FakeBulk;
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec, VolumeSpec};
use libvirt_remote::Transport;

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
const MINUTE: Duration = Duration::from_secs(60);
/// Bound for each test body.
// NB: three small imports into the in-memory fake and a handful of passes; a minute covers a
// loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

fn host(name: &str) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
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

struct World {
    fake: FakeLibvirt,
    provider: LibvirtProvider,
    bases: BTreeMap<&'static str, Base>,
    _server: ImageServer,
}

/// A fake host `h1` whose pool holds the published bases of images `keys` (imported as if by
/// another process, so no create of this process has used them), and a provider of entry
/// `home` over it with the default grace (60 minutes).
async fn world(keys: &[&'static str]) -> World {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(800 * MIB).path("/pool"))
        .unwrap();
    let server = ImageServer::start().await;
    let mut e = image_fixtures::entry("home");
    for (i, k) in keys.iter().enumerate() {
        let img = qcow2(8 * MIB, (i + 1) * 100);
        let url = server.route(&format!("/{k}"), Route::new(img.clone()));
        e.images.insert(
            (*k).into(),
            ImageSpec {
                url,
                sha256: Some(sha(&img)),
                format: ImageFormat::Qcow2,
                firmware: Firmware::Bios,
                ca_file: None,
            },
        );
    }
    let bulk = FakeBulk(fake.clone());
    let client = bulk.open().await.unwrap();
    let pool = client.pool_lookup_by_name(POOL).await.unwrap();
    let fetch = FetchOptions {
        allow_loopback_for_tests: true,
        ..FetchOptions::default()
    };
    let mut bases = BTreeMap::new();
    for k in keys {
        // NB: imported under another host name: "handed to a create in this process" is
        // keyed by host, so nothing protects these bases on h1 but what the host shows.
        let t = Target {
            entry: &e,
            host: "elsewhere",
            client: &client,
            pool: &pool,
            reserve_bytes: 0,
            bulk: &bulk,
            progress: &NoProgress,
            fetch: &fetch,
        };
        bases.insert(*k, image::ensure_base(&t, k).await.unwrap());
    }
    client.close();
    e.hosts = vec![host("h1")];
    let provider = provider_over(&fake, e);
    World {
        fake,
        provider,
        bases,
        _server: server,
    }
}

fn provider_over(fake: &FakeLibvirt, e: LibvirtEntry) -> LibvirtProvider {
    let pool = HostPool::new(
        e,
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default())
}

/// The base's three volumes that are still in the pool.
fn left(fake: &FakeLibvirt, b: &Base) -> Vec<String> {
    let data = b.data_path.as_deref().unwrap().rsplit('/').next().unwrap();
    let mut v: Vec<String> = fake
        .volumes(POOL)
        .unwrap()
        .into_iter()
        .filter(|n| *n == b.name || *n == format!("{}.marker", b.name) || n == data)
        .collect();
    v.sort();
    v
}

fn settings(clock: UnusedClock, now: SystemTime) -> BaseGcSettings {
    BaseGcSettings {
        dry_run: false,
        clock,
        grace: None,
        now,
    }
}

fn verdict<'a>(vs: &'a [BaseVerdict], b: &Base) -> &'a BaseVerdict {
    vs.iter()
        .find(|v| v.name == b.name)
        .unwrap_or_else(|| panic!("no verdict on {}: {vs:#?}", b.name))
}

/// A shut-off domain outside the pool whose declared disk chain ends in `base_path` (a
/// foreign VM built by hand on our base).
fn foreign_domain_on(fake: &FakeLibvirt, name: &str, base_path: &str) {
    fake.define_domain_xml(&format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><devices>\
         <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
         <source file='/var/lib/elsewhere/{name}.qcow2'/><backingStore type='file'>\
         <format type='qcow2'/><source file='{base_path}'/><backingStore/></backingStore>\
         <target dev='vda'/></disk></devices></domain>"
    ))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_in_use_survives_every_pass_and_an_unused_one_goes_after_its_grace() {
    tokio::time::timeout(BUDGET, async {
        let w = world(&["used-by-overlay", "used-by-domain", "unused"]).await;
        let (by_overlay, by_domain, unused) = (
            &w.bases["used-by-overlay"],
            &w.bases["used-by-domain"],
            &w.bases["unused"],
        );
        // An overlay in the pool backed by the first base, with no domain (a Proxy's root
        // disk whose domain is not defined yet, or another tool's).
        w.fake
            .add_volume(
                POOL,
                VolumeSpec::new("someones-overlay.qcow2", 8 * MIB)
                    .format("qcow2")
                    .backing(by_overlay.path.clone()),
            )
            .unwrap();
        foreign_domain_on(&w.fake, "someone-elses-vm", &by_domain.path);
        let t0 = SystemTime::now();

        // First pass: the unused base starts its grace; nothing is removed.
        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, t0))
            .await;
        println!("pass at t0: {v:#?}");
        assert_eq!(v.len(), 3, "{v:#?}");
        let o = verdict(&v, by_overlay);
        assert_eq!(
            (o.action, o.rule),
            (BaseAction::Kept, "base-in-use"),
            "{o:?}"
        );
        assert!(o.reason.contains("someones-overlay.qcow2"), "{o:?}");
        let d = verdict(&v, by_domain);
        assert_eq!(
            (d.action, d.rule),
            (BaseAction::Kept, "base-in-use"),
            "{d:?}"
        );
        assert!(d.reason.contains("someone-elses-vm"), "{d:?}");
        let u = verdict(&v, unused);
        assert_eq!(
            (u.action, u.rule),
            (BaseAction::Kept, "base-in-grace"),
            "{u:?}"
        );
        assert_eq!(left(&w.fake, unused).len(), 3);

        // Just short of the grace (60 minutes by default): still kept.
        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, t0 + 59 * MINUTE))
            .await;
        assert_eq!(verdict(&v, unused).rule, "base-in-grace", "{v:#?}");
        assert_eq!(left(&w.fake, unused).len(), 3);

        // A dry run past the grace says what would go and removes nothing.
        let mut dry = settings(UnusedClock::FirstSeen, t0 + 61 * MINUTE);
        dry.dry_run = true;
        let v = w.provider.collect_bases(&dry).await;
        assert_eq!(
            verdict(&v, unused).action,
            BaseAction::WouldRemove,
            "{v:#?}"
        );
        assert_eq!(left(&w.fake, unused).len(), 3, "a dry run removes nothing");

        // Past the grace: the unused base goes, all three of its volumes; the others stay.
        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, t0 + 61 * MINUTE))
            .await;
        println!("pass at t0 + 61 min: {v:#?}");
        let u = verdict(&v, unused);
        assert_eq!(
            (u.action, u.rule),
            (BaseAction::Removed, "base-unused"),
            "{u:?}"
        );
        assert_eq!(left(&w.fake, unused), Vec::<String>::new());
        assert_eq!(left(&w.fake, by_overlay).len(), 3);
        assert_eq!(left(&w.fake, by_domain).len(), 3);

        // Days later, the bases in use are still there.
        for days in [1u32, 30] {
            let now = t0 + 24 * 60 * MINUTE * days;
            let v = w
                .provider
                .collect_bases(&settings(UnusedClock::FirstSeen, now))
                .await;
            assert_eq!(v.len(), 2, "{v:#?}");
            assert!(v.iter().all(|x| x.action == BaseAction::Kept), "{v:#?}");
            assert_eq!(left(&w.fake, by_overlay).len(), 3);
            assert_eq!(left(&w.fake, by_domain).len(), 3);
        }
    })
    .await
    .expect("within the test budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_restarts_when_the_last_user_goes_and_a_one_shot_run_counts_from_the_upload() {
    tokio::time::timeout(BUDGET, async {
        let w = world(&["a"]).await;
        let a = &w.bases["a"];
        w.fake
            .add_volume(
                POOL,
                VolumeSpec::new("overlay-on-a.qcow2", 8 * MIB)
                    .format("qcow2")
                    .backing(a.path.clone()),
            )
            .unwrap();
        let t0 = SystemTime::now();
        // In use for a day: every pass keeps it.
        for h in [0u32, 12, 24] {
            let v = w
                .provider
                .collect_bases(&settings(UnusedClock::FirstSeen, t0 + 60 * MINUTE * h))
                .await;
            assert_eq!(verdict(&v, a).rule, "base-in-use", "{v:#?}");
        }
        // Its overlay goes at t0 + 24 h: the grace starts at the first pass that sees it
        // unused, not at its upload a day earlier.
        let c = FakeBulk(w.fake.clone()).open().await.unwrap();
        let pool = c.pool_lookup_by_name(POOL).await.unwrap();
        let ov = c
            .vol_lookup_by_name(&pool, "overlay-on-a.qcow2")
            .await
            .unwrap();
        c.vol_delete(&ov, 0).await.unwrap();
        let day = t0 + 24 * 60 * MINUTE;
        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, day + MINUTE))
            .await;
        assert_eq!(verdict(&v, a).rule, "base-in-grace", "{v:#?}");
        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, day + 30 * MINUTE))
            .await;
        assert_eq!(verdict(&v, a).rule, "base-in-grace", "{v:#?}");
        assert_eq!(left(&w.fake, a).len(), 3);

        // A one-shot run (another process: no earlier pass) counts from the upload: a base
        // uploaded just now is in its grace, and with no grace it goes at once.
        let mut e = image_fixtures::entry("home");
        e.hosts = vec![host("h1")];
        let one_shot = provider_over(&w.fake, e);
        let now = SystemTime::now();
        let v = one_shot
            .collect_bases(&settings(UnusedClock::Upload, now))
            .await;
        let x = verdict(&v, a);
        assert_eq!(x.rule, "base-in-grace", "{x:?}");
        assert!(x.reason.contains("counted from its upload"), "{x:?}");
        let mut no_grace = settings(UnusedClock::Upload, now);
        no_grace.grace = Some(Duration::ZERO);
        let v = one_shot.collect_bases(&no_grace).await;
        assert_eq!(verdict(&v, a).action, BaseAction::Removed, "{v:#?}");
        assert_eq!(left(&w.fake, a), Vec::<String>::new());
    })
    .await
    .expect("within the test budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_be_read_is_reported_and_the_others_are_still_collected() {
    tokio::time::timeout(BUDGET, async {
        let w = world(&["a"]).await;
        let a = &w.bases["a"];
        // A second host whose pool does not exist.
        let mut e = image_fixtures::entry("home");
        let mut bad = host("h2");
        bad.pool = "no-such-pool".into();
        e.hosts = vec![host("h1"), bad];
        let p = provider_over(&w.fake, e);
        let mut s = settings(UnusedClock::Upload, SystemTime::now());
        s.grace = Some(Duration::ZERO);
        let v = p.collect_bases(&s).await;
        println!("{v:#?}");
        let h2 = v.iter().find(|x| x.host == "h2").expect("a verdict for h2");
        assert_eq!(
            (h2.name.as_str(), h2.action, h2.rule),
            ("*", BaseAction::Failed, "base-host-failed"),
            "{h2:?}"
        );
        assert!(h2.reason.contains("no-such-pool"), "{h2:?}");
        assert_eq!(verdict(&v, a).action, BaseAction::Removed, "{v:#?}");
    })
    .await
    .expect("within the test budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_left_without_its_marker_goes_once_no_import_can_be_publishing_it() {
    // finding: H4
    // An import that died between creating its base and marking it (a crash, a host failing at
    // that moment in another process, or before a restart) leaves the final name without its
    // marker: every later import of the image on that host would wait for a marker nobody
    // writes. Kept while an import may still be publishing it, removed (base and data) once
    // its upload is older than timeouts.imageImport plus the grace, unless something uses it.
    tokio::time::timeout(BUDGET, async {
        let w = world(&["dead", "dead-in-use"]).await;
        let (dead, used) = (&w.bases["dead"], &w.bases["dead-in-use"]);
        let c = FakeBulk(w.fake.clone()).open().await.unwrap();
        let pool = c.pool_lookup_by_name(POOL).await.unwrap();
        for b in [dead, used] {
            let m = c
                .vol_lookup_by_name(&pool, &format!("{}.marker", b.name))
                .await
                .unwrap();
            c.vol_delete(&m, 0).await.unwrap();
        }
        w.fake
            .add_volume(
                POOL,
                VolumeSpec::new("overlay-on-unmarked.qcow2", 8 * MIB)
                    .format("qcow2")
                    .backing(used.path.clone()),
            )
            .unwrap();
        let limit = image_fixtures::entry("home").timeouts.image_import + 60 * MINUTE;
        let t0 = SystemTime::now();

        for at in [t0, t0 + limit - MINUTE] {
            let v = w
                .provider
                .collect_bases(&settings(UnusedClock::FirstSeen, at))
                .await;
            let d = verdict(&v, dead);
            assert_eq!(
                (d.action, d.rule),
                (BaseAction::Kept, "base-unpublished"),
                "{d:?}"
            );
            assert!(d.reason.contains("may still be publishing"), "{d:?}");
            assert_eq!(verdict(&v, used).rule, "base-in-use", "{v:#?}");
            assert_eq!(left(&w.fake, dead).len(), 2);
        }

        let mut dry = settings(UnusedClock::FirstSeen, t0 + limit + MINUTE);
        dry.dry_run = true;
        let v = w.provider.collect_bases(&dry).await;
        assert_eq!(verdict(&v, dead).action, BaseAction::WouldRemove, "{v:#?}");
        assert_eq!(left(&w.fake, dead).len(), 2, "a dry run removes nothing");

        let v = w
            .provider
            .collect_bases(&settings(UnusedClock::FirstSeen, t0 + limit + MINUTE))
            .await;
        println!("pass past the limit: {v:#?}");
        let d = verdict(&v, dead);
        assert_eq!(
            (d.action, d.rule),
            (BaseAction::Removed, "base-unpublished"),
            "{d:?}"
        );
        assert_eq!(left(&w.fake, dead), Vec::<String>::new());
        let u = verdict(&v, used);
        assert_eq!(
            (u.action, u.rule),
            (BaseAction::Kept, "base-in-use"),
            "{u:?}"
        );
        assert!(u.reason.contains("overlay-on-unmarked.qcow2"), "{u:?}");
        assert_eq!(left(&w.fake, used).len(), 2);
    })
    .await
    .expect("within the test budget");
}
