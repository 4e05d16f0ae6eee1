//! Making room in the base cache: over `limits.maxBases` / `limits.maxUrlImages`, the oldest
//! bases nothing on the host uses are removed (base, marker, data volume) before a new one is
//! imported; a base any domain's disk chain names — a foreign domain's included, running or
//! shut off — or any pool volume backs onto, or one just handed to a create, is never
//! removed; a domain whose chain cannot be seen stops eviction on the host (libvirt-fake).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::libvirt::config::{
    Firmware, GuestSettings, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, UrlImagePolicy,
};
use egress_provider::libvirt::image::{self, Base, BulkConnect, FetchOptions, Target};
use egress_provider::{ErrorClass, NoProgress, ProviderError};
use image_fixtures::FakeBulk;
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use libvirt_remote::{Client, OpenOptions};

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
/// Bound for the test body.
// NB: a handful of small imports into the in-memory fake and four 1.1 s pauses (ages are
// whole seconds in the data volumes' names); a minute covers a loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);
/// Long enough that the next upload's name carries a later second.
const NEXT_SECOND: Duration = Duration::from_millis(1100);

/// A shut-off domain `name` whose disk's declared chain ends in `base_path`.
fn domain_using(fake: &FakeLibvirt, name: &str, base_path: &str) {
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

fn base_vols(fake: &FakeLibvirt, b: &Base) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_unused_bases_make_room_and_a_base_in_use_is_never_removed() {
    tokio::time::timeout(BUDGET, async {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(800 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        let server = ImageServer::start().await;
        let mut e = LibvirtEntry {
            name: "home".into(),
            hosts: Vec::new(),
            images: BTreeMap::new(),
            url_images: UrlImagePolicy {
                enabled: true,
                allowed_hosts: vec![format!("127.0.0.1:{}", server.addr.port())],
            },
            max_image_bytes: 64 * MIB,
            guest: GuestSettings::default(),
            timeouts: Timeouts::default(),
            defaults: Default::default(),
            limits: Default::default(),
            policy: Default::default(),
            access: None,
            quotas: Default::default(),
        };
        e.limits.max_bases = 3;
        e.limits.max_url_images = 2;
        let mut imgs = BTreeMap::new();
        for (k, seed) in [
            ("a", 1usize),
            ("b", 2),
            ("c", 3),
            ("d", 4),
            ("e", 5),
            ("f", 6),
        ] {
            let img = qcow2(8 * MIB, seed * 100);
            let url = server.route(&format!("/{k}"), Route::new(img.clone()));
            e.images.insert(
                k.into(),
                ImageSpec {
                    url,
                    sha256: Some(sha(&img)),
                    format: ImageFormat::Qcow2,
                    firmware: Firmware::Bios,
                    ca_file: None,
                },
            );
            imgs.insert(k, img);
        }
        let fetch = FetchOptions {
            allow_loopback_for_tests: true,
            ..FetchOptions::default()
        };
        let t = Target {
            entry: &e,
            host: "h1",
            client: &client,
            pool: &pool,
            reserve_bytes: 0,
            bulk: &bulk,
            progress: &NoProgress,
            fetch: &fetch,
        };
        // NB: "recently handed to a create" protects every base for ten minutes in this
        // process; the bases here are imported on another host name, so that protection
        // applies to the test's second part only.
        let on = |host: &'static str| Target { host, ..t };
        let a = image::ensure_base(&on("import"), "a").await.unwrap();
        tokio::time::sleep(NEXT_SECOND).await;
        let b = image::ensure_base(&on("import"), "b").await.unwrap();
        tokio::time::sleep(NEXT_SECOND).await;
        let c = image::ensure_base(&on("import"), "c").await.unwrap();
        tokio::time::sleep(NEXT_SECOND).await;
        // The oldest, a, is in use by a foreign shut-off domain's disk chain.
        domain_using(&fake, "someone-elses-vm", &a.path);

        // d needs room: a is older but in use, so b (the oldest unused) goes, whole.
        let d = image::ensure_base(&on("h1"), "d").await.unwrap();
        assert!(d.imported);
        assert!(
            base_vols(&fake, &b).is_empty(),
            "b removed with marker and data"
        );
        assert_eq!(base_vols(&fake, &a).len(), 3, "a (in use) kept");
        assert_eq!(
            base_vols(&fake, &c).len(),
            3,
            "c kept (one removal was enough)"
        );

        // An overlay in the pool backed by c (no domain yet: a create in progress, or another
        // tool's) keeps c; d was just handed out on h1 (a create may be building on it).
        let ov = format!(
            "<volume><name>someone-elses-overlay.qcow2</name><capacity unit='bytes'>{}</capacity>\
             <target><format type='qcow2'/></target><backingStore><path>{}</path>\
             <format type='qcow2'/></backingStore></volume>",
            8 * MIB,
            c.path
        );
        client.vol_create_xml(&pool, &ov, 0).await.unwrap();
        let r = image::ensure_base(&on("h1"), "e").await;
        let err = r.expect_err("nothing can go");
        assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
        assert!(err.message.contains("limits.maxBases = 3"), "{err}");
        assert!(err.message.contains("in use"), "{err}");
        assert_eq!(server.requests("/e"), 0, "nothing downloaded");
        for k in [&a, &c, &d] {
            assert_eq!(base_vols(&fake, k).len(), 3, "{} kept", k.name);
        }
        // Seen from another host name (d not handed out there), d is the one that can go.
        let e2 = image::ensure_base(&on("import"), "e").await.unwrap();
        assert!(e2.imported);
        assert!(base_vols(&fake, &d).is_empty(), "d removed");
        for k in [&a, &c, &e2] {
            assert_eq!(base_vols(&fake, k).len(), 3, "{} kept", k.name);
        }
        // A running domain whose live XML names e's data volume keeps e too.
        let dom = fake
            .define_domain_xml(&format!(
                "<domain type='qemu'><name>running-vm</name><memory unit='MiB'>64</memory>\
                 <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>\
                 <disk type='file' device='disk'><driver type='raw'/>\
                 <source file='{}'/><target dev='vda'/></disk></devices></domain>",
                e2.data_path.as_deref().unwrap()
            ))
            .unwrap();
        client.domain_create(&dom).await.unwrap();
        // (on a third host name: nothing was handed out there)
        let r = image::ensure_base(&on("h2"), "f").await;
        assert_eq!(r.unwrap_err().class, ErrorClass::QuotaExceeded);
        assert_eq!(server.requests("/f"), 0);

        // A shut-off domain whose qcow2 disk lies outside the pool, chain undeclared: no
        // chain can be seen, so nothing is evicted on this host and the message says why.
        client
            .vol_delete(&handle(&pool, "someone-elses-overlay.qcow2"), 0)
            .await
            .unwrap();
        fake.define_domain_xml(
            "<domain type='qemu'><name>opaque-vm</name><memory unit='MiB'>64</memory>\
             <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>\
             <disk type='file' device='disk'><driver type='qcow2'/>\
             <source file='/var/lib/elsewhere/opaque.qcow2'/><target dev='vda'/></disk>\
             </devices></domain>",
        )
        .unwrap();
        let r = image::ensure_base(&on("h2"), "f").await;
        let err = r.unwrap_err();
        assert_eq!(err.class, ErrorClass::QuotaExceeded);
        assert!(err.message.contains("opaque-vm"), "{err}");
        assert_eq!(base_vols(&fake, &c).len(), 3, "c kept");
        let _ = imgs;
    })
    .await
    .expect("within the budget");
}

fn handle(
    pool: &libvirt_remote::proto::StoragePool,
    name: &str,
) -> libvirt_remote::proto::StorageVol {
    egress_provider::libvirt::image::cache::handle(pool, name, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_url_images_only_an_unused_url_image_base_makes_room() {
    tokio::time::timeout(BUDGET, async {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(400 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        let server = ImageServer::start().await;
        let (a, u1, u2) = (
            qcow2(8 * MIB, 100),
            qcow2(8 * MIB, 200),
            qcow2(8 * MIB, 300),
        );
        let ua = server.route("/a", Route::new(a.clone()));
        let uu1 = server.route("/u1", Route::new(u1.clone()));
        let uu2 = server.route("/u2", Route::new(u2.clone()));
        let mut e = LibvirtEntry {
            name: "home".into(),
            hosts: Vec::new(),
            images: BTreeMap::new(),
            url_images: UrlImagePolicy {
                enabled: true,
                allowed_hosts: vec![format!("127.0.0.1:{}", server.addr.port())],
            },
            max_image_bytes: 64 * MIB,
            guest: GuestSettings::default(),
            timeouts: Timeouts::default(),
            defaults: Default::default(),
            limits: Default::default(),
            policy: Default::default(),
            access: None,
            quotas: Default::default(),
        };
        e.limits.max_bases = 10;
        e.limits.max_url_images = 1;
        e.images.insert(
            "a".into(),
            ImageSpec {
                url: ua,
                sha256: Some(sha(&a)),
                format: ImageFormat::Qcow2,
                firmware: Firmware::Bios,
                ca_file: None,
            },
        );
        let fetch = FetchOptions {
            allow_loopback_for_tests: true,
            ..FetchOptions::default()
        };
        let t = Target {
            entry: &e,
            host: "import",
            client: &client,
            pool: &pool,
            reserve_bytes: 0,
            bulk: &bulk,
            progress: &NoProgress,
            fetch: &fetch,
        };
        let ba = image::ensure_base(&t, "a").await.unwrap();
        tokio::time::sleep(NEXT_SECOND).await;
        let b1 = image::ensure_base(&t, &format!("{uu1}#sha256={}", sha(&u1)))
            .await
            .unwrap();
        // The catalogue base a is older and unused, but only a URL-image base frees a URL
        // image's room.
        let b2 = image::ensure_base(
            &Target { host: "h1", ..t },
            &format!("{uu2}#sha256={}", sha(&u2)),
        )
        .await
        .unwrap();
        assert!(b2.imported);
        assert!(base_vols(&fake, &b1).is_empty(), "u1 removed");
        assert_eq!(base_vols(&fake, &ba).len(), 3, "a kept");
        assert_eq!(base_vols(&fake, &b2).len(), 3);
    })
    .await
    .expect("within the budget");
}

mod real {
    //! The same on the real libvirtd (its unix socket), in a private pool of the test's own.
    use super::*;
    use crate::image_fixtures::virsh;
    use std::path::PathBuf;
    use std::process::Command;

    fn unique(what: &str) -> String {
        crate::image_fixtures::unique(&format!("evict-{what}"))
    }

    /// A transient dir pool and a domain name of the test's own; both removed on drop.
    struct Guard {
        pool: String,
        dir: PathBuf,
        domain: String,
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = virsh(&["undefine", &self.domain]);
            let _ = virsh(&["pool-destroy", &self.pool]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    struct UnixBulk;

    #[async_trait]
    impl BulkConnect for UnixBulk {
        async fn open(&self) -> Result<Client, ProviderError> {
            let t = libvirt_remote::transport::unix::connect(
                "/run/libvirt/libvirt-sock",
                Duration::from_secs(10),
            )
            .await
            .map_err(|e| ProviderError::transient(format!("unix: {e}")))?;
            Client::open(t, OpenOptions::default())
                .await
                .map_err(|e| ProviderError::transient(format!("libvirt open: {e}")))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_real_daemon_keeps_a_base_a_shut_off_domain_uses_and_evicts_the_oldest_unused() {
        let g = Guard {
            pool: unique("pool"),
            dir: std::env::temp_dir().join(unique("dir")),
            domain: unique("vm"),
        };
        println!("eptest: pool {} domain {}", g.pool, g.domain);
        std::fs::create_dir_all(&g.dir).unwrap();
        let out = virsh(&[
            "pool-create-as",
            &g.pool,
            "dir",
            "--target",
            g.dir.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "pool-create-as: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::timeout(BUDGET, async {
            let bulk = UnixBulk;
            let client = bulk.open().await.unwrap();
            let pool = client.pool_lookup_by_name(&g.pool).await.unwrap();
            let server = ImageServer::start().await;
            let mut e = LibvirtEntry {
                name: "eptestev".into(),
                hosts: Vec::new(),
                images: BTreeMap::new(),
                url_images: Default::default(),
                max_image_bytes: 64 * MIB,
                guest: GuestSettings::default(),
                timeouts: Timeouts::default(),
                defaults: Default::default(),
                limits: Default::default(),
                policy: Default::default(),
                access: None,
                quotas: Default::default(),
            };
            e.limits.max_bases = 2;
            let scratch = tempfile::tempdir().unwrap();
            for (k, size) in [("a", "4M"), ("b", "5M"), ("c", "6M")] {
                // NB: the real daemon runs qemu-img on the data: a real qcow2, by qemu-img.
                let f = scratch.path().join(k);
                let st = Command::new("qemu-img")
                    .args(["create", "-q", "-f", "qcow2"])
                    .arg(&f)
                    .arg(size)
                    .status()
                    .unwrap();
                assert!(st.success());
                let img = std::fs::read(&f).unwrap();
                let url = server.route(&format!("/{k}"), Route::new(img.clone()));
                e.images.insert(
                    k.into(),
                    ImageSpec {
                        url,
                        sha256: Some(sha(&img)),
                        format: ImageFormat::Qcow2,
                        firmware: Firmware::Bios,
                        ca_file: None,
                    },
                );
            }
            let fetch = FetchOptions {
                allow_loopback_for_tests: true,
                ..FetchOptions::default()
            };
            let t = Target {
                entry: &e,
                host: "real-import",
                client: &client,
                pool: &pool,
                reserve_bytes: 0,
                bulk: &bulk,
                progress: &NoProgress,
                fetch: &fetch,
            };
            let a = image::ensure_base(&t, "a").await.unwrap();
            tokio::time::sleep(NEXT_SECOND).await;
            let b = image::ensure_base(&t, "b").await.unwrap();
            // A shut-off domain whose disk is an overlay outside the pool, its chain declared
            // down to a's base: libvirt keeps the declared chain in the definition.
            let xml = format!(
                "<domain type='qemu'><name>{}</name><memory unit='MiB'>64</memory>\
                 <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>\
                 <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
                 <source file='{}/elsewhere.qcow2'/><backingStore type='file'>\
                 <format type='qcow2'/><source file='{}'/><backingStore/></backingStore>\
                 <target dev='vda' bus='virtio'/></disk></devices></domain>",
                g.domain,
                std::env::temp_dir().display(),
                a.path
            );
            let dom = client.domain_define_xml(&xml, 0).await.unwrap();
            let _ = dom;
            let files = |b: &Base| {
                let data = b.data_path.as_deref().unwrap().to_owned();
                [b.path.clone(), format!("{}.marker", b.path), data]
                    .into_iter()
                    .filter(|p| std::path::Path::new(p).exists())
                    .count()
            };
            assert_eq!((files(&a), files(&b)), (3, 3));
            // c needs room; a is the oldest but in use: b goes. Seen from another host name,
            // so "recently handed out" does not protect them.
            let c = image::ensure_base(
                &Target {
                    host: "real-h1",
                    ..t
                },
                "c",
            )
            .await
            .unwrap();
            assert!(c.imported);
            assert_eq!(files(&a), 3, "a (in use by the shut-off domain) kept");
            assert_eq!(files(&b), 0, "b removed: base, marker and data");
            assert_eq!(files(&c), 3);
        })
        .await
        .expect("within the budget");
    }
}
