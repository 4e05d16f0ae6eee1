//! Per-entry limits on cached bases: a new base beyond `limits.maxBases` (or, for URL
//! images, `limits.maxUrlImages`) that no unused base can make room for is refused,
//! QuotaExceeded, naming the setting, before anything is downloaded; a base already cached
//! is still returned (libvirt-fake). Eviction itself: image_base_evict.rs.

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

use egress_provider::libvirt::config::{
    Firmware, GuestSettings, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, UrlImagePolicy,
};
use egress_provider::libvirt::image::{self, BulkConnect, FetchOptions, Target};
use egress_provider::{ErrorClass, NoProgress};
use image_fixtures::FakeBulk;
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
/// Bound for the test body.
// NB: four small imports into the in-memory fake: about a second; a minute covers a loaded
// 2-core CI machine.
const BUDGET: Duration = Duration::from_secs(60);

/// Defines a shut-off domain `name` whose disks' declared chains end in `bases`.
fn uses(fake: &FakeLibvirt, name: &str, bases: &[&str]) {
    let disks: String = bases
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
                 <source file='/elsewhere/{name}-{i}.qcow2'/><backingStore type='file'>\
                 <format type='qcow2'/><source file='{b}'/><backingStore/></backingStore>\
                 <target dev='vd{}'/></disk>",
                (b'a' + i as u8) as char
            )
        })
        .collect();
    fake.define_domain_xml(&format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><devices>{disks}</devices></domain>"
    ))
    .unwrap();
}

fn spec(url: &str, img: &[u8]) -> ImageSpec {
    ImageSpec {
        url: url.into(),
        sha256: Some(sha(img)),
        format: ImageFormat::Qcow2,
        firmware: Firmware::Bios,
        ca_file: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_base_beyond_max_bases_or_max_url_images_is_refused_before_any_download() {
    tokio::time::timeout(BUDGET, async {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(400 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        let server = ImageServer::start().await;
        let (a, b, u1, u2) = (
            qcow2(8 * MIB, 100),
            qcow2(8 * MIB, 200),
            qcow2(8 * MIB, 300),
            qcow2(8 * MIB, 400),
        );
        let ua = server.route("/a", Route::new(a.clone()));
        let ub = server.route("/b", Route::new(b.clone()));
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
        e.limits.max_bases = 3;
        e.limits.max_url_images = 1;
        e.images.insert("a".into(), spec(&ua, &a));
        e.images.insert("b".into(), spec(&ub, &b));
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
        let ba = image::ensure_base(&t, "a").await.unwrap();
        let bu1 = image::ensure_base(&t, &format!("{uu1}#sha256={}", sha(&u1)))
            .await
            .unwrap();
        // Both in use by a (foreign) domain, so neither can be evicted to make room.
        uses(&fake, "vm-a-u1", &[&ba.path, &bu1.path]);

        // A second URL image: over maxUrlImages (1), not over maxBases (3).
        let r = image::ensure_base(&t, &format!("{uu2}#sha256={}", sha(&u2))).await;
        let err = r.expect_err("over limits.maxUrlImages");
        assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
        assert!(err.message.contains("limits.maxUrlImages = 1"), "{err}");
        assert!(err.message.contains("/u2"), "names the image: {err}");
        assert_eq!(server.requests("/u2"), 0, "nothing downloaded");

        // A catalogue image is still allowed up to maxBases.
        let bb = image::ensure_base(&t, "b").await.unwrap();
        uses(&fake, "vm-b", &[&bb.path]);
        let mut e2 = e.clone();
        let c = qcow2(8 * MIB, 500);
        let uc = server.route("/c", Route::new(c.clone()));
        e2.images.insert("c".into(), spec(&uc, &c));
        let t2 = Target { entry: &e2, ..t };
        let r = image::ensure_base(&t2, "c").await;
        let err = r.expect_err("over limits.maxBases");
        assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
        assert!(err.message.contains("limits.maxBases = 3"), "{err}");
        assert!(
            err.message.contains("in use"),
            "says why none could go: {err}"
        );
        assert_eq!(server.requests("/c"), 0, "nothing downloaded");
        let before = fake.volumes(POOL).unwrap();

        // A base already cached is returned whatever the count.
        let again = image::ensure_base(&t2, "a").await.unwrap();
        assert!(!again.imported);
        assert_eq!(fake.volumes(POOL).unwrap(), before, "nothing created");
    })
    .await
    .expect("the base quota test exceeded its budget");
}
