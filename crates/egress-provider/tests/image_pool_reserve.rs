//! The pool reserve holds while streaming: an image served without any length is stopped,
//! QuotaExceeded, the moment it would cross the pool's free space less `poolReserveGiB`, and
//! its temporary volume is removed (libvirt-fake only: the shared real pool is never filled).

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
use image_support::{GetLength, Head, ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
/// Bound for each test body.
// NB: one import of a few tens of MiB into the in-memory fake: a second or two; a minute
// covers a loaded 2-core CI machine.
const BUDGET: Duration = Duration::from_secs(60);

fn entry(url: &str, img: &[u8]) -> LibvirtEntry {
    let mut images = BTreeMap::new();
    images.insert(
        "deb".to_owned(),
        ImageSpec {
            url: url.into(),
            sha256: Some(sha(img)),
            format: ImageFormat::Qcow2,
            firmware: Firmware::Bios,
            ca_file: None,
        },
    );
    LibvirtEntry {
        name: "home".into(),
        hosts: Vec::new(),
        images,
        url_images: UrlImagePolicy::default(),
        // The cap is far above the pool's room: only the reserve can stop this stream.
        max_image_bytes: 1 << 40,
        guest: GuestSettings::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_any_length_is_stopped_before_it_crosses_the_pool_reserve_and_removed() {
    tokio::time::timeout(BUDGET, async {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(40 * MIB).path("/pool"))
            .unwrap();
        let bulk = FakeBulk(fake.clone());
        let client = bulk.open().await.unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        let server = ImageServer::start().await;
        // 48 MiB, no length in HEAD or GET: the pool has 40 MiB, 10 of them reserved.
        let img = qcow2(64 * MIB, 48 * MIB as usize);
        let mut r = Route::new(img.clone());
        r.head = Head::NoLength;
        r.get_len = GetLength::None;
        let url = server.route("/nolen.qcow2", r);
        let e = entry(&url, &img);
        let fetch = FetchOptions::default();
        let t = Target {
            entry: &e,
            host: "h1",
            client: &client,
            pool: &pool,
            reserve_bytes: 10 * MIB,
            bulk: &bulk,
            progress: &NoProgress,
            fetch: &fetch,
        };
        let r = image::ensure_base(&t, "deb").await;
        let err = r.expect_err("the stream must be stopped at the reserve");
        assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
        assert!(err.message.contains("poolReserveGiB"), "{err}");
        assert!(
            err.message.contains("/nolen.qcow2"),
            "names the image: {err}"
        );
        assert!(
            err.message.contains(&format!("{} bytes of room", 30 * MIB)),
            "the room is free space less the reserve: {err}"
        );
        assert!(
            fake.volumes(POOL).unwrap().is_empty(),
            "the part volume is removed: {:?}",
            fake.volumes(POOL).unwrap()
        );

        // The same image fits once the reserve leaves room for it.
        let t = Target {
            reserve_bytes: 0,
            ..t
        };
        let small = qcow2(64 * MIB, 20 * MIB as usize);
        let mut r = Route::new(small.clone());
        r.head = Head::NoLength;
        r.get_len = GetLength::None;
        let url = server.route("/small.qcow2", r);
        let e2 = entry(&url, &small);
        let t = Target { entry: &e2, ..t };
        let b = image::ensure_base(&t, "deb").await.unwrap();
        assert!(b.imported);
    })
    .await
    .expect("the pool reserve test exceeded its budget");
}
