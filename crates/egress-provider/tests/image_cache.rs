//! The base-image cache against libvirt-fake (fault paths) and the real libvirtd through a
//! real sshd, with images served by a local HTTP server on 127.0.0.1 that can lie.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::libvirt::config::{
    Firmware, ImageFormat, ImageSpec, LibvirtEntry, UrlImagePolicy,
};
use egress_provider::libvirt::image::{
    self, Base, BulkConnect, FetchOptions, Target, cache, fetch, source,
};
use egress_provider::libvirt::names;
use egress_provider::{ErrorClass, NoProgress, ProviderError};
use image_fixtures::entry;
use image_support::{GetLength, Head, ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, JournalEntry, PoolSpec};
use libvirt_remote::proto::{StoragePool, procs};
use libvirt_remote::{Client, OpenOptions};

const POOL: &str = "images";
const MIB: u64 = 1 << 20;

fn spec(url: &str, sha256: Option<&str>, format: ImageFormat) -> ImageSpec {
    ImageSpec {
        url: url.into(),
        sha256: sha256.map(str::to_owned),
        format,
        firmware: Firmware::Bios,
        ca_file: None,
    }
}

/// Opens fresh connections to the fake; counts them; can kill a "pooled" client on open.
struct FakeBulk {
    fake: FakeLibvirt,
    opens: AtomicU64,
    kill_on_open: std::sync::Mutex<Option<Client>>,
}

#[async_trait]
impl BulkConnect for FakeBulk {
    async fn open(&self) -> Result<Client, ProviderError> {
        self.opens.fetch_add(1, Ordering::SeqCst);
        if let Some(c) = self.kill_on_open.lock().unwrap().take() {
            c.close();
        }
        Client::open(self.fake.connect_duplex(), OpenOptions::default())
            .await
            .map_err(|e| ProviderError::transient(e.to_string()))
    }
}

struct Fx {
    fake: FakeLibvirt,
    client: Client,
    pool: StoragePool,
    bulk: FakeBulk,
    server: ImageServer,
    fetch: FetchOptions,
}

impl Fx {
    async fn new() -> Self {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(400 * MIB).path("/pool"))
            .unwrap();
        let client = Client::open(fake.connect_duplex(), OpenOptions::default())
            .await
            .unwrap();
        let pool = client.pool_lookup_by_name(POOL).await.unwrap();
        Self {
            bulk: FakeBulk {
                fake: fake.clone(),
                opens: AtomicU64::new(0),
                kill_on_open: std::sync::Mutex::new(None),
            },
            fake,
            client,
            pool,
            server: ImageServer::start().await,
            fetch: FetchOptions {
                stall_timeout: Duration::from_secs(2),
                ..FetchOptions::default()
            },
        }
    }

    fn target<'a>(&'a self, e: &'a LibvirtEntry, host: &'a str) -> Target<'a> {
        Target {
            entry: e,
            host,
            client: &self.client,
            pool: &self.pool,
            reserve_bytes: 0,
            bulk: &self.bulk,
            progress: &NoProgress,
            fetch: &self.fetch,
        }
    }

    async fn ensure(&self, e: &LibvirtEntry, image: &str) -> Result<Base, ProviderError> {
        image::ensure_base(&self.target(e, "h1"), image).await
    }

    fn volumes(&self) -> Vec<String> {
        self.fake.volumes(POOL).unwrap()
    }

    /// Parts no volume uses as its backing store (a published base's data volume is kept).
    fn parts(&self) -> Vec<String> {
        let used: Vec<String> = self
            .volumes()
            .iter()
            .filter_map(|v| self.fake.volume(POOL, v).and_then(|i| i.backing))
            .collect();
        self.volumes()
            .into_iter()
            .filter(|v| v.contains(".part-") && !used.contains(&format!("/pool/{v}")))
            .collect()
    }

    /// The image bytes behind published base `name`: it is a qcow2 overlay whose backing
    /// store is the verified data volume (the publish copies nothing).
    fn base_bytes(&self, name: &str) -> Vec<u8> {
        let b = self.fake.volume(POOL, name).expect("base exists");
        assert_eq!(b.format, "qcow2", "a base is a qcow2 overlay: {b:?}");
        let data = b.backing.expect("a base has a backing store");
        let data = data
            .strip_prefix("/pool/")
            .expect("the data volume is in the pool");
        assert!(data.contains(".part-"), "backed by its data volume: {data}");
        self.fake.volume_content(POOL, data).unwrap()
    }
}

fn class(r: &Result<Base, ProviderError>) -> ErrorClass {
    r.as_ref()
        .err()
        .map(|e| e.class)
        .expect("expected an error")
}

// ---------------------------------------------------------------- publish protocol (H4, M13)

#[tokio::test]
async fn a_pinned_image_is_imported_once_published_with_its_marker_and_reused() {
    // finding: H4
    let fx = Fx::new().await;
    let img = qcow2(64 * MIB, 300_000);
    let url = fx.server.route("/deb.qcow2", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );

    let b = fx.ensure(&e, "deb").await.unwrap();
    assert!(b.imported);
    assert_eq!(b.digest, sha(&img));
    assert_eq!(
        b.name,
        names::base(
            "home",
            names::ImageSource::Catalogue("deb"),
            &sha(&img),
            ImageFormat::Qcow2
        )
    );
    assert_eq!(b.capacity, 64 * MIB, "virtual size from the qcow2 header");
    assert_eq!(b.format, ImageFormat::Qcow2);
    assert_eq!(b.path, format!("/pool/{}", b.name));
    assert_eq!(fx.base_bytes(&b.name), img);
    let marker = cache::marker_name(&b.name);
    let text = String::from_utf8(fx.fake.volume_content(POOL, &marker).unwrap()).unwrap();
    assert!(
        text.contains(&format!("digest=sha256:{}", sha(&img))),
        "{text}"
    );
    assert!(text.contains(&format!("size={}", img.len())), "{text}");
    assert!(text.contains("source=http://127.0.0.1:"), "{text}");
    assert!(
        fx.parts().is_empty(),
        "the part is gone: {:?}",
        fx.volumes()
    );

    let again = fx.ensure(&e, "deb").await.unwrap();
    assert!(!again.imported);
    assert_eq!(again.vol, b.vol);
    assert_eq!(fx.server.gets("/deb.qcow2"), 1, "no second download");
    assert_eq!(
        fx.bulk.opens.load(Ordering::SeqCst),
        1,
        "a cache hit opens no bulk link"
    );
}

#[tokio::test]
async fn two_entries_with_the_same_key_and_different_urls_never_share_a_base() {
    // finding: H4, L8
    // Seed scenario 1: two entries, one key, URLs drifted; whoever fetched first owned the file.
    let fx = Fx::new().await;
    let (a, b) = (qcow2(8 * MIB, 1000), qcow2(16 * MIB, 2000));
    let ua = fx.server.route("/a.qcow2", Route::new(a.clone()));
    let ub = fx.server.route("/b.qcow2", Route::new(b.clone()));
    let mut ea = entry("kvm-home");
    ea.images.insert(
        "debian-13".into(),
        spec(&ua, Some(&sha(&a)), ImageFormat::Qcow2),
    );
    let mut eb = entry("kvm2-home");
    eb.images.insert(
        "debian-13".into(),
        spec(&ub, Some(&sha(&b)), ImageFormat::Qcow2),
    );
    let ba = fx.ensure(&ea, "debian-13").await.unwrap();
    let bb = fx.ensure(&eb, "debian-13").await.unwrap();
    assert_ne!(ba.name, bb.name);
    assert_eq!(fx.base_bytes(&ba.name), a);
    assert_eq!(fx.base_bytes(&bb.name), b);
    // Editing an unpinned URL is not a silent no-op: unpinned sources are named by URL.
    let mut e = entry("home");
    e.images.insert(
        "k".into(),
        spec("https://m1.example/d.qcow2", None, ImageFormat::Qcow2),
    );
    let s1 = source::resolve(&e, "k").unwrap();
    e.images.insert(
        "k".into(),
        spec("https://m2.example/d.qcow2", None, ImageFormat::Qcow2),
    );
    let s2 = source::resolve(&e, "k").unwrap();
    assert_ne!(
        names::source_key(s1.name_source()),
        names::source_key(s2.name_source())
    );
}

#[tokio::test]
async fn a_digest_change_makes_a_new_base_and_never_deletes_the_old_one() {
    // finding: H4, M13, E7
    // Seed scenario 2: one entry pins D2 while the cached base is D1; the seed deleted D1
    // under live overlays.
    let fx = Fx::new().await;
    let (d1, d2) = (qcow2(8 * MIB, 100), qcow2(8 * MIB, 200));
    let url = fx.server.route("/img", Route::new(d1.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&d1)), ImageFormat::Qcow2),
    );
    let b1 = fx.ensure(&e, "deb").await.unwrap();

    // The server now serves D2 and the operator pins it: a new volume, the old one untouched.
    fx.server.route("/img", Route::new(d2.clone()));
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&d2)), ImageFormat::Qcow2),
    );
    let b2 = fx.ensure(&e, "deb").await.unwrap();
    assert_ne!(b1.name, b2.name);
    assert_eq!(fx.base_bytes(&b1.name), d1, "old base intact");
    assert!(
        fx.fake
            .volume(POOL, &cache::marker_name(&b1.name))
            .is_some()
    );

    // A mistyped digest: Permanent, naming the setting; nothing but the part is removed.
    let before = fx.volumes();
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&"0".repeat(64)), ImageFormat::Qcow2),
    );
    let r = fx.ensure(&e, "deb").await;
    assert_eq!(class(&r), ErrorClass::Permanent);
    assert!(r.unwrap_err().message.contains("images.deb.sha256"));
    assert_eq!(fx.volumes(), before, "no base deleted, no part left");
}

#[tokio::test]
async fn concurrent_imports_of_one_base_in_one_process_download_once() {
    // finding: H4
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 500_000);
    let url = fx.server.route("/c", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let (a, b) = tokio::join!(fx.ensure(&e, "deb"), fx.ensure(&e, "deb"));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.vol, b.vol);
    assert!(a.imported ^ b.imported);
    assert_eq!(fx.server.gets("/c"), 1);
    assert_eq!(fx.base_bytes(&a.name), img);
}

#[tokio::test]
async fn concurrent_imports_from_two_processes_publish_one_base_and_delete_nothing_of_each_other() {
    // finding: H4
    // Seed scenario 3: B found A's unmarked base, deleted it and re-uploaded; A's guest booted
    // from B's partial file. Two "processes" here: different lock keys (host names) on one pool.
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 3_000_000);
    let url = fx.server.route("/p", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let (ta, tb) = (fx.target(&e, "proc-a"), fx.target(&e, "proc-b"));
    let (a, b) = tokio::join!(
        image::ensure_base(&ta, "deb"),
        image::ensure_base(&tb, "deb")
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.name, b.name);
    assert_eq!(fx.base_bytes(&a.name), img, "complete, not partial");
    assert!(fx.parts().is_empty(), "{:?}", fx.volumes());
    let bases: Vec<_> = fx
        .volumes()
        .into_iter()
        .filter(|v| v.ends_with(".qcow2"))
        .collect();
    assert_eq!(bases, vec![a.name.clone()]);
}

#[tokio::test]
async fn a_final_name_without_its_marker_is_never_adopted_nor_deleted() {
    // finding: H4, E7
    // A crashed (or still running) publisher left the final name without a marker.
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 1000);
    let url = fx.server.route("/x", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    e.timeouts.image_import = Duration::from_secs(5);
    let name = names::base(
        "home",
        names::ImageSource::Catalogue("deb"),
        &sha(&img),
        ImageFormat::Qcow2,
    );
    fx.fake
        .add_volume(
            POOL,
            libvirt_fake::VolumeSpec::new(&name, 8 * MIB)
                .format("qcow2")
                .content(b"QFI\xfbpartial".to_vec()),
        )
        .unwrap();
    let r = fx.ensure(&e, "deb").await;
    assert_eq!(class(&r), ErrorClass::Transient, "{r:?}");
    let msg = r.unwrap_err().message;
    assert!(msg.contains(&name), "names the volume to delete: {msg}");
    assert_eq!(
        fx.fake.volume_content(POOL, &name).unwrap(),
        b"QFI\xfbpartial",
        "not touched"
    );
    assert!(
        fx.fake.volume(POOL, &cache::marker_name(&name)).is_none(),
        "never marked"
    );
    assert!(fx.parts().is_empty(), "{:?}", fx.volumes());
}

#[tokio::test]
async fn publishing_copies_nothing_and_the_sweep_keeps_a_published_bases_data() {
    // finding: H4, M13
    // The publish is an instant qcow2 overlay on the verified part: no clone; a sweep of old
    // parts removes a dead import's leftover but never the data a published base reads.
    use libvirt_remote::proto::procs;
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 4_000);
    let url = fx.server.route("/s", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let b = fx.ensure(&e, "deb").await.unwrap();
    assert_eq!(fx.fake.calls(procs::STORAGE_VOL_CREATE_XML_FROM), 0);
    assert_eq!(b.disk_format, ImageFormat::Qcow2);
    assert_eq!(fx.base_bytes(&b.name), img);
    let marker = String::from_utf8(
        fx.fake
            .volume_content(POOL, &cache::marker_name(&b.name))
            .unwrap(),
    )
    .unwrap();
    assert!(
        marker.contains("layout=qcow2 overlay on data volume"),
        "{marker}"
    );

    let stray = format!(
        "ep-home-base-img-deb-unverified{}1000-00000000000000aa",
        cache::PART_INFIX
    );
    fx.fake
        .add_volume(POOL, libvirt_fake::VolumeSpec::new(&stray, MIB))
        .unwrap();
    let swept = image::sweep_parts(&fx.client, &fx.pool, "home", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(swept, vec![stray.clone()]);
    let again = image::sweep_parts(&fx.client, &fx.pool, "home", Duration::ZERO)
        .await
        .unwrap();
    assert!(again.is_empty(), "the data volume stays: {again:?}");
    assert_eq!(fx.base_bytes(&b.name), img);
    let hit = fx.ensure(&e, "deb").await.unwrap();
    assert!(!hit.imported);
    assert_eq!(hit.path, b.path);
    assert_eq!(hit.disk_format, ImageFormat::Qcow2);
}

#[tokio::test]
async fn a_publish_that_fails_before_its_marker_removes_its_base_and_its_data() {
    // finding: H4, M13
    use libvirt_remote::proto::procs;
    let fx = Fx::new().await;
    // A marker left behind by hand, recording another size: the publish creates its base,
    // then finds the marker disagrees, and must remove the base and its data, nothing else.
    let (e, _img, name) = deb_entry(&fx, "/f", 5_000);
    let marker = cache::marker_name(&name);
    fx.fake
        .add_volume(POOL, libvirt_fake::VolumeSpec::new(&marker, 1))
        .unwrap();
    let r = fx.ensure(&e, "deb").await;
    assert_eq!(class(&r), ErrorClass::Permanent, "{r:?}");
    assert!(r.unwrap_err().message.contains(&marker));
    assert_eq!(
        fx.volumes(),
        vec![marker],
        "base and data removed, marker untouched"
    );
    assert!(
        fx.fake.calls(procs::STORAGE_VOL_CREATE_XML) >= 2,
        "a base was created"
    );
}

/// The `home` entry with image `deb` served from `path`, its bytes and its base's name.
fn deb_entry(fx: &Fx, path: &str, pad: usize) -> (LibvirtEntry, Vec<u8>, String) {
    let img = qcow2(8 * MIB, pad);
    let url = fx.server.route(path, Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let name = names::base(
        "home",
        names::ImageSource::Catalogue("deb"),
        &sha(&img),
        ImageFormat::Qcow2,
    );
    (e, img, name)
}

#[tokio::test]
async fn a_base_whose_publish_and_removal_both_failed_is_removed_once_the_host_answers() {
    // finding: H4
    // The publish fails after creating its base (a marker of another size is in the way) and
    // the base's removal fails too (the host failing at that moment): the unmarked base would
    // make every later import of the image on this host wait for a marker nobody writes.
    // The next clear (run by each host check once the host answers) removes base, then part.
    const HOST: &str = "h-debris-unremoved";
    let fx = Fx::new().await;
    let (e, img, name) = deb_entry(&fx, "/u", 6_000);
    let marker = cache::marker_name(&name);
    fx.fake
        .add_volume(POOL, libvirt_fake::VolumeSpec::new(&marker, 1))
        .unwrap();
    fx.fake.faults().fail_calls(
        procs::STORAGE_VOL_DELETE,
        1,
        18,
        "internal error: the host is failing",
        Some(1),
    );
    let r = image::ensure_base(&fx.target(&e, HOST), "deb").await;
    assert_eq!(class(&r), ErrorClass::Permanent, "{r:?}");
    let part = fx
        .volumes()
        .into_iter()
        .find(|v| v.contains(cache::PART_INFIX))
        .expect("the part stays while its base does");
    assert_eq!(
        fx.fake.volume(POOL, &name).and_then(|b| b.backing),
        Some(format!("/pool/{part}")),
        "the unmarked base is still there, on the part: {:?}",
        fx.volumes()
    );
    assert_eq!(
        image::debris::noted(HOST, POOL),
        vec![name.clone(), part.clone()]
    );

    let gone = image::debris::clear(&fx.client, &fx.pool, HOST, "home")
        .await
        .unwrap();
    assert_eq!(gone, vec![name.clone(), part]);
    assert_eq!(fx.volumes(), vec![marker.clone()], "the marker is not ours");
    assert!(image::debris::noted(HOST, POOL).is_empty());

    // Once the stray marker is removed (as the error says), the image publishes.
    fx.client
        .vol_delete(&cache::handle(&fx.pool, &marker, ""), 0)
        .await
        .unwrap();
    let b = image::ensure_base(&fx.target(&e, HOST), "deb")
        .await
        .unwrap();
    assert!(b.imported);
    assert_eq!(fx.base_bytes(&b.name), img);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_dropped_between_its_base_and_its_marker_leaves_nothing_once_the_host_answers() {
    // finding: H4
    // The import's future is dropped (a cancelled reconcile, the import deadline) while the
    // host is frozen right after the base was created: the base is noted, then removed.
    const HOST: &str = "h-debris-dropped";
    let fx = std::sync::Arc::new(Fx::new().await);
    let (e, _img, name) = deb_entry(&fx, "/d", 7_000);
    // NB: every call waits 250 ms, so the base's creation is seen and the fake frozen well
    // before the publish's next two calls (the base's info, the marker) run.
    fx.fake
        .faults()
        .delay_replies(Some(Duration::from_millis(250)));
    let task = {
        let fx = fx.clone();
        let e = e.clone();
        tokio::spawn(async move { image::ensure_base(&fx.target(&e, HOST), "deb").await })
    };
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while fx.fake.volume(POOL, &name).is_none() {
        assert!(
            !task.is_finished(),
            "the import ended before its base appeared"
        );
        assert!(std::time::Instant::now() < until, "no base after 60 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    fx.fake.faults().freeze();
    assert!(
        fx.fake.volume(POOL, &cache::marker_name(&name)).is_none(),
        "the publish marked its base before the fake froze (the test missed its window)"
    );
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let noted = image::debris::noted(HOST, POOL);
    assert_eq!(noted.first(), Some(&name), "{noted:?}");

    fx.fake.faults().clear();
    let gone = image::debris::clear(&fx.client, &fx.pool, HOST, "home")
        .await
        .unwrap();
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(fx.volumes().is_empty(), "{:?}", fx.volumes());
    assert!(image::debris::noted(HOST, POOL).is_empty());
}

#[tokio::test]
async fn a_noted_base_is_kept_when_published_or_no_longer_on_its_part() {
    // finding: H4
    // Only an unpublished base still backed by the noted part is removed: a base of the same
    // name published since (by another import, on its own part), or one whose marker was
    // written after all, stays with its data.
    let fx = Fx::new().await;
    let (e, img, name) = deb_entry(&fx, "/k", 8_000);
    let b = fx.ensure(&e, "deb").await.unwrap();
    let data = b.data_path.clone().unwrap();
    let data_name = data.strip_prefix("/pool/").unwrap().to_owned();
    let before = fx.volumes();

    // Published (marker agrees), on the noted part.
    image::debris::note_base("h-debris-kept-1", POOL, &name, &data_name, &data);
    let gone = image::debris::clear(&fx.client, &fx.pool, "h-debris-kept-1", "home")
        .await
        .unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    assert!(image::debris::noted("h-debris-kept-1", POOL).is_empty());

    // Unmarked, but on another part than the one noted.
    let marker = cache::marker_name(&name);
    fx.client
        .vol_delete(&cache::handle(&fx.pool, &marker, ""), 0)
        .await
        .unwrap();
    let other = format!("{name}{}1-00000000000000bb", cache::PART_INFIX);
    image::debris::note_base(
        "h-debris-kept-2",
        POOL,
        &name,
        &other,
        &format!("/pool/{other}"),
    );
    let gone = image::debris::clear(&fx.client, &fx.pool, "h-debris-kept-2", "home")
        .await
        .unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    assert!(image::debris::noted("h-debris-kept-2", POOL).is_empty());
    let mut now = fx.volumes();
    now.push(marker);
    now.sort();
    assert_eq!(now, before, "nothing removed");
    assert_eq!(fx.base_bytes(&name), img);
}

// ---------------------------------------------------------------- M10

#[tokio::test]
async fn an_import_completes_when_the_unrelated_pooled_link_dies_meanwhile() {
    // finding: M10
    // Seed: another reconcile's cancel killed the pooled link during the download; the
    // verified base was discarded. Here the pooled client dies as the bulk link opens.
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 200_000);
    let url = fx.server.route("/m10", Route::new(img.clone()));
    let mut e = entry("home");
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    *fx.bulk.kill_on_open.lock().unwrap() = Some(fx.client.clone());
    let b = fx.ensure(&e, "deb").await.unwrap();
    assert!(
        !fx.client.connection().is_alive(),
        "the pooled link really died"
    );
    assert!(b.imported);
    assert!(fx.fake.volume(POOL, &cache::marker_name(&b.name)).is_some());
    assert_eq!(fx.base_bytes(&b.name), img);
}

// ---------------------------------------------------------------- M9, M11

#[tokio::test]
async fn a_head_without_a_usable_length_falls_back_to_get() {
    // finding: M9
    for head in [Head::NoLength, Head::Says(0), Head::Status(405)] {
        let fx = Fx::new().await;
        let img = qcow2(8 * MIB, 10_000);
        let mut r = Route::new(img.clone());
        r.head = head.clone();
        let url = fx.server.route("/h", r);
        let mut e = entry("home");
        e.images.insert(
            "deb".into(),
            spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
        );
        let b = fx
            .ensure(&e, "deb")
            .await
            .unwrap_or_else(|e| panic!("{head:?}: {e}"));
        assert_eq!(fx.base_bytes(&b.name), img);
    }
}

#[tokio::test]
async fn the_space_check_uses_the_length_get_streams_not_heads() {
    // finding: M11
    // Seed: HEAD says 1 MB, GET says 4 TiB; the precheck passed and the stream filled the pool.
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 1000);
    let mut r = Route::new(img.clone());
    r.head = Head::Says(1000);
    r.get_len = GetLength::Says(300 * MIB);
    let url = fx.server.route("/big", r);
    let mut e = entry("home");
    e.max_image_bytes = 1 << 40;
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let t = Target {
        reserve_bytes: 200 * MIB,
        ..fx.target(&e, "h1")
    };
    let r = image::ensure_base(&t, "deb").await;
    assert_eq!(class(&r), ErrorClass::QuotaExceeded, "{r:?}");
    assert!(r.unwrap_err().message.contains("poolReserveGiB"));
    assert!(
        fx.volumes().is_empty(),
        "nothing created: {:?}",
        fx.volumes()
    );
}

#[tokio::test]
async fn max_image_bytes_is_enforced_as_bytes_arrive() {
    // finding: M11
    // No length anywhere: the cap is the only bound, and it stops the upload mid-stream.
    let fx = Fx::new().await;
    let img = qcow2(64 * MIB, 6 * MIB as usize);
    let mut r = Route::new(img.clone());
    r.head = Head::NoLength;
    r.get_len = GetLength::None;
    let url = fx.server.route("/cap", r);
    let mut e = entry("home");
    e.max_image_bytes = 2 * MIB;
    e.images.insert(
        "deb".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let r = fx.ensure(&e, "deb").await;
    assert_eq!(class(&r), ErrorClass::Permanent, "{r:?}");
    assert!(r.unwrap_err().message.contains("maxImageBytes"));
    assert!(fx.volumes().is_empty(), "part removed: {:?}", fx.volumes());
    // A declared length over the cap is refused before any volume exists.
    let mut r = Route::new(img.clone());
    r.head = Head::NoLength;
    let url = fx.server.route("/cap2", r);
    e.images.insert(
        "deb2".into(),
        spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    let r = fx.ensure(&e, "deb2").await;
    assert_eq!(class(&r), ErrorClass::Permanent);
    assert!(fx.volumes().is_empty());
}

#[tokio::test]
async fn truncated_lying_and_stalled_bodies_fail_transient_and_leave_nothing() {
    // finding: H4
    // A truncated base must never be published (seed: a truncated base stayed under a valid
    // marker forever).
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 2 * MIB as usize);
    let mut e = entry("home");
    let mut trunc = Route::new(img.clone());
    trunc.truncate_at = Some(MIB as usize);
    let mut short_len = Route::new(img.clone());
    short_len.get_len = GetLength::Says(MIB);
    let mut stall = Route::new(img.clone());
    stall.stall_at = Some(MIB as usize);
    for (path, r) in [("/trunc", trunc), ("/short", short_len), ("/stall", stall)] {
        let url = fx.server.route(path, r);
        e.images.insert(
            path[1..].into(),
            spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
        );
        let r = fx.ensure(&e, &path[1..]).await;
        // A length shorter than the body cannot be told from a different image: the digest
        // catches it (Permanent); truncation and stalls are Transient.
        if path != "/short" {
            assert_eq!(class(&r), ErrorClass::Transient, "{path}: {r:?}");
        } else {
            assert!(r.is_err());
        }
        assert!(fx.volumes().is_empty(), "{path}: {:?}", fx.volumes());
    }
}

/// Asserts, from the fake's journal, that the part of the (only) failed upload was deleted on
/// a connection other than the upload's, and after the upload's connection was closed.
fn assert_upload_link_closed_before_the_part_was_deleted(fake: &FakeLibvirt, what: &str) {
    let j = fake.journal();
    let (at, up) = j
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, e)| match e {
            JournalEntry::Call { conn, proc_ } if *proc_ == procs::STORAGE_VOL_UPLOAD => {
                Some((i, *conn))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{what}: no upload in {j:?}"));
    let rest = &j[at..];
    let del = rest
        .iter()
        .position(|e| matches!(e, JournalEntry::Call { proc_, .. } if *proc_ == procs::STORAGE_VOL_DELETE))
        .unwrap_or_else(|| panic!("{what}: the part was never deleted: {rest:?}"));
    let killed = rest
        .iter()
        .position(|e| *e == JournalEntry::ClientKilled { conn: up })
        .unwrap_or(usize::MAX);
    assert!(
        killed < del,
        "{what}: the upload's connection #{up} must be closed before the part is deleted: \
         {rest:?}"
    );
    assert!(
        !matches!(rest[del], JournalEntry::Call { conn, .. } if conn == up),
        "{what}: the part was deleted over the upload's own connection: {rest:?}"
    );
}

#[tokio::test]
async fn after_a_failed_upload_its_link_is_closed_before_the_part_is_deleted() {
    // finding: H2 — the second half: the connection is closed before the partial volume is
    // deleted, for a server error (disk full) and for a source error (truncated body).
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 4 * MIB as usize);
    let mut e = entry("home");
    let full = fx.server.route("/full", Route::new(img.clone()));
    let mut trunc = Route::new(img.clone());
    trunc.truncate_at = Some(3 * MIB as usize);
    let trunc = fx.server.route("/trunc", trunc);
    e.images.insert(
        "full".into(),
        spec(&full, Some(&sha(&img)), ImageFormat::Qcow2),
    );
    e.images.insert(
        "trunc".into(),
        spec(&trunc, Some(&sha(&img)), ImageFormat::Qcow2),
    );

    fx.fake.faults().fail_uploads_after(Some(MIB));
    let r = fx.ensure(&e, "full").await;
    assert_eq!(class(&r), ErrorClass::Transient, "{r:?}");
    assert!(fx.volumes().is_empty(), "{:?}", fx.volumes());
    assert_upload_link_closed_before_the_part_was_deleted(&fx.fake, "disk full");

    fx.fake.faults().fail_uploads_after(None);
    let r = fx.ensure(&e, "trunc").await;
    assert_eq!(class(&r), ErrorClass::Transient, "{r:?}");
    assert!(fx.volumes().is_empty(), "{:?}", fx.volumes());
    assert_upload_link_closed_before_the_part_was_deleted(&fx.fake, "truncated source");
}

// ---------------------------------------------------------------- L7

#[tokio::test]
async fn the_format_comes_from_the_bytes_and_must_match_the_declaration() {
    // finding: L7
    let fx = Fx::new().await;
    let raw = vec![7u8; 1 << 20];
    let url = fx.server.route("/raw", Route::new(raw.clone()));
    let mut e = entry("home");
    e.images.insert(
        "decl-qcow2".into(),
        spec(&url, Some(&sha(&raw)), ImageFormat::Qcow2),
    );
    let r = fx.ensure(&e, "decl-qcow2").await;
    assert_eq!(class(&r), ErrorClass::Permanent);
    assert!(
        r.unwrap_err()
            .message
            .contains("declared qcow2 but its bytes are raw")
    );
    assert!(fx.volumes().is_empty());
    e.images.insert(
        "decl-raw".into(),
        spec(&url, Some(&sha(&raw)), ImageFormat::Raw),
    );
    let b = fx.ensure(&e, "decl-raw").await.unwrap();
    assert_eq!(b.format, ImageFormat::Raw);
    assert_eq!(b.capacity, raw.len() as u64);
    assert!(b.name.ends_with(".raw"));
    // A URL image has no declaration: a raw image is detected as raw (seed assumed qcow2).
    e.url_images = UrlImagePolicy {
        enabled: true,
        allowed_hosts: vec![format!("127.0.0.1:{}", fx.server.addr.port())],
    };
    let t = Fx::url_target(&fx, &e);
    let b = image::ensure_base(&t, &format!("{url}#sha256={}", sha(&raw)))
        .await
        .unwrap();
    assert_eq!(b.format, ImageFormat::Raw);
    assert!(b.name.contains("-base-url-"), "{}", b.name);
}

impl Fx {
    fn url_target<'a>(fx: &'a Fx, e: &'a LibvirtEntry) -> Target<'a> {
        Target {
            fetch: &URL_FETCH,
            ..fx.target(e, "h1")
        }
    }
}

static URL_FETCH: std::sync::LazyLock<FetchOptions> = std::sync::LazyLock::new(|| FetchOptions {
    allow_loopback_for_tests: true,
    stall_timeout: Duration::from_secs(2),
    ..FetchOptions::default()
});

// ---------------------------------------------------------------- M12, L24

#[tokio::test]
async fn url_images_are_refused_unless_enabled_allowlisted_public_and_https_or_pinned() {
    // finding: M12
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 100);
    let url = fx.server.route("/u", Route::new(img.clone()));
    let pinned = format!("{url}#sha256={}", sha(&img));
    let mut e = entry("home");
    let r = fx.ensure(&e, &pinned).await;
    assert_eq!(class(&r), ErrorClass::Permanent);
    assert!(r.unwrap_err().message.contains("urlImages.enabled"));

    e.url_images = UrlImagePolicy {
        enabled: true,
        allowed_hosts: vec!["images.example".into()],
    };
    let r = fx.ensure(&e, &pinned).await;
    assert!(r.unwrap_err().message.contains("urlImages.allowedHosts"));

    e.url_images.allowed_hosts = vec![
        "127.0.0.1".into(),
        "169.254.169.254".into(),
        "10.0.0.1".into(),
        "[fd00:ec2::254]".into(),
        "100.64.0.1".into(),
        "images.example".into(),
        format!("localhost:{}", fx.server.addr.port()),
        format!("127.0.0.1:{}", fx.server.addr.port()),
    ];
    for bad in [
        url.clone(), // http, no pin
        "http://169.254.169.254/latest/meta-data#sha256=".to_owned() + &sha(&img),
        "https://10.0.0.1/x.qcow2".into(),
        "https://[fd00:ec2::254]/x".into(),
        "https://100.64.0.1/x".into(),
        format!("https://127.0.0.1:{}/u", fx.server.addr.port()), // loopback literal
        "https://images.example/x#md5=abc".into(),
    ] {
        let r = fx.ensure(&e, &bad).await;
        assert_eq!(class(&r), ErrorClass::Permanent, "{bad}: {r:?}");
    }
    // A name that resolves to loopback is refused at connect time (the resolver checks the
    // resolved address), so the server never sees a request.
    let by_name = format!(
        "http://localhost:{}/u#sha256={}",
        fx.server.addr.port(),
        sha(&img)
    );
    let r = fx.ensure(&e, &by_name).await;
    assert_eq!(class(&r), ErrorClass::Permanent, "{r:?}");
    assert!(r.unwrap_err().message.contains("loopback"));
    assert_eq!(fx.server.requests("/u"), 0, "no traffic reached the server");
    assert!(fx.volumes().is_empty());
}

#[tokio::test]
async fn redirects_are_bounded_and_every_hop_is_checked() {
    // finding: M12
    let src = source::resolve(
        &{
            let mut e = entry("home");
            e.url_images = UrlImagePolicy {
                enabled: true,
                allowed_hosts: vec!["images.example".into()],
            };
            e
        },
        "https://images.example/a.qcow2",
    )
    .unwrap();
    let hosts = vec!["images.example".to_owned()];
    let ok =
        |u: &str, hops| fetch::redirect_verdict(&src, &hosts, false, &u.parse().unwrap(), hops);
    assert!(ok("https://images.example/b", 1).is_ok());
    assert!(
        ok("https://images.example/b", fetch::MAX_REDIRECTS + 1).is_err(),
        "bounded"
    );
    assert!(ok("https://evil.example/b", 1).is_err(), "not allowlisted");
    assert!(
        ok("https://images.example:443/b", 1).is_ok(),
        "the default port"
    );
    assert!(
        ok("https://images.example:8443/b", 1).is_err(),
        "another port than the entry's (none: the default)"
    );
    let with_port = vec!["images.example:8443".to_owned()];
    let at = |u: &str| fetch::redirect_verdict(&src, &with_port, false, &u.parse().unwrap(), 1);
    assert!(at("https://images.example:8443/b").is_ok());
    assert!(
        at("https://images.example/b").is_err(),
        "only the port named"
    );
    assert!(at("https://images.example:9443/b").is_err());
    assert!(
        ok("http://images.example/b", 1).is_err(),
        "downgrade without a pin"
    );
    assert!(
        ok("https://u:p@images.example/b", 1).is_err(),
        "credentials"
    );
    let hosts2 = vec!["images.example".to_owned(), "169.254.169.254".to_owned()];
    assert!(
        fetch::redirect_verdict(
            &src,
            &hosts2,
            false,
            &"https://169.254.169.254/".parse().unwrap(),
            1
        )
        .is_err(),
        "metadata literal"
    );
}

#[tokio::test]
async fn a_live_redirect_to_a_forbidden_host_is_refused_and_an_allowed_url_image_imports() {
    // finding: M12
    let fx = Fx::new().await;
    let img = qcow2(8 * MIB, 100);
    let good = fx.server.route("/good", Route::new(img.clone()));
    let mut r = Route::new(Vec::new());
    r.redirect = Some(format!("http://127.0.0.2:{}/good", fx.server.addr.port()));
    let redir = fx.server.route("/redir", r);
    let mut e = entry("home");
    e.url_images = UrlImagePolicy {
        enabled: true,
        allowed_hosts: vec![format!("127.0.0.1:{}", fx.server.addr.port())],
    };
    let t = Fx::url_target(&fx, &e);
    let r = image::ensure_base(&t, &format!("{redir}#sha256={}", sha(&img))).await;
    assert_eq!(class(&r), ErrorClass::Permanent, "{r:?}");
    let m = r.unwrap_err().message;
    assert!(m.contains("allowedHosts"), "{m}");
    assert_eq!(fx.server.gets("/good"), 0);
    let b = image::ensure_base(&t, &format!("{good}#sha256={}", sha(&img)))
        .await
        .unwrap();
    assert_eq!(fx.base_bytes(&b.name), img);
}

#[tokio::test]
async fn credentials_never_appear_in_errors() {
    // finding: L24
    let fx = Fx::new().await;
    let mut e = entry("home");
    e.images.insert(
        "creds".into(),
        spec(
            "https://bob:s3cret@images.example/x.qcow2",
            None,
            ImageFormat::Qcow2,
        ),
    );
    let r = fx.ensure(&e, "creds").await;
    let m = r.unwrap_err().message;
    assert!(!m.contains("s3cret") && !m.contains("bob"), "{m}");
    assert!(m.contains("credentials"), "{m}");
    let mut r404 = Route::new(Vec::new());
    r404.status = 404;
    let url = fx.server.route("/gone", r404);
    let img = qcow2(MIB, 0);
    e.images.insert(
        "tok".into(),
        spec(
            &format!("{url}?token=SECRETTOKEN"),
            Some(&sha(&img)),
            ImageFormat::Qcow2,
        ),
    );
    let r = fx.ensure(&e, "tok").await;
    let err = r.unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent);
    assert!(!err.message.contains("SECRETTOKEN"), "{}", err.message);
    assert!(err.message.contains("images.tok.url"), "{}", err.message);
    let e2 = entry("home");
    let r = fx.ensure(&e2, "https://u:pw@x.example/i").await;
    assert!(!r.unwrap_err().message.contains("pw@"));
}

// ---------------------------------------------------------------- the real libvirtd, via sshd

mod real {
    use super::*;
    use crate::image_fixtures::{SshBulk, unique, virsh};
    use ep_test_support::sshd::Sshd;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Bound for each real test body.
    // NB: the imports here are a few hundred KiB; two minutes covers sshd start-up and a
    // loaded 2-core box.
    const BUDGET: Duration = Duration::from_secs(120);

    /// A transient dir pool in a temp dir; destroyed (and its files removed) on drop.
    struct PoolGuard {
        name: String,
        dir: PathBuf,
    }

    impl PoolGuard {
        fn new(tag: &str) -> Self {
            let name = unique(tag);
            let dir = std::env::temp_dir().join(&name);
            eprintln!("creating pool {name} in {}", dir.display());
            std::fs::create_dir_all(&dir).unwrap();
            let out = virsh(&[
                "pool-create-as",
                &name,
                "dir",
                "--target",
                dir.to_str().unwrap(),
            ]);
            assert!(
                out.status.success(),
                "pool-create-as: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Self { name, dir }
        }
        fn files(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for PoolGuard {
        fn drop(&mut self) {
            let _ = virsh(&["pool-destroy", &self.name]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn qemu_img(dir: &Path, name: &str, size: &str, extra: &[&str]) -> Vec<u8> {
        let p = dir.join(name);
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .args(extra)
            .arg(&p)
            .arg(size)
            .output()
            .expect("qemu-img");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let b = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        b
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_upload_through_ssh_leaves_no_part_on_the_real_daemon() {
        // finding: H2 — the upload's link is closed first; the real daemon then lets the part
        // be deleted over the fresh link (no "still in use").
        tokio::time::timeout(BUDGET, async {
            let sshd = Sshd::start();
            let pg = PoolGuard::new("imgfail");
            let bulk = SshBulk {
                target: sshd.target(),
            };
            let client = bulk.open().await.unwrap();
            let pool = client.pool_lookup_by_name(&pg.name).await.unwrap();
            let server = ImageServer::start().await;
            let img = qcow2(8 * MIB, 6 * MIB as usize);
            let mut trunc = Route::new(img.clone());
            trunc.truncate_at = Some(3 * MIB as usize);
            let url = server.route("/trunc.qcow2", trunc);
            let mut e = entry("eptest");
            e.images.insert(
                "trunc".into(),
                spec(&url, Some(&sha(&img)), ImageFormat::Qcow2),
            );
            let fetch = FetchOptions::default();
            let t = Target {
                entry: &e,
                host: "local",
                client: &client,
                pool: &pool,
                reserve_bytes: 0,
                bulk: &bulk,
                progress: &NoProgress,
                fetch: &fetch,
            };
            let r = image::ensure_base(&t, "trunc").await;
            assert_eq!(class(&r), ErrorClass::Transient, "{r:?}");
            let _ = virsh(&["pool-refresh", &pg.name]);
            assert!(pg.files().is_empty(), "left behind: {:?}", pg.files());
        })
        .await
        .expect("the real failed-upload test exceeded its budget");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_qcow2_is_imported_through_ssh_reused_renewed_by_digest_and_published_once_under_contention()
     {
        // finding: H4, M13, E7
        tokio::time::timeout(BUDGET, async {
            let sshd = Sshd::start();
            let pg = PoolGuard::new("img");
            let bulk = SshBulk {
                target: sshd.target(),
            };
            let client = bulk.open().await.unwrap();
            let pool = client.pool_lookup_by_name(&pg.name).await.unwrap();
            let server = ImageServer::start().await;
            let scratch = tempdir(&pg.name);
            let img1 = qemu_img(&scratch, "a.qcow2", "64M", &[]);
            let img2 = qemu_img(&scratch, "b.qcow2", "64M", &["-o", "cluster_size=131072"]);
            let img3 = qemu_img(&scratch, "c.qcow2", "32M", &[]);
            assert_ne!(sha(&img1), sha(&img2));
            let url = server.route("/deb.qcow2", Route::new(img1.clone()));
            let mut e = entry("eptest");
            e.images.insert(
                "deb".into(),
                spec(&url, Some(&sha(&img1)), ImageFormat::Qcow2),
            );
            let fetch = FetchOptions::default();

            let t = Target {
                entry: &e,
                host: "local",
                client: &client,
                pool: &pool,
                reserve_bytes: 0,
                bulk: &bulk,
                progress: &NoProgress,
                fetch: &fetch,
            };
            let b1 = image::ensure_base(&t, "deb").await.unwrap();
            assert!(b1.imported);
            assert_eq!(
                b1.capacity,
                64 * MIB,
                "virtual size as libvirt reads the header"
            );
            assert_eq!(b1.format, ImageFormat::Qcow2);
            assert!(Path::new(&b1.path).exists(), "{}", b1.path);
            let info = Command::new("qemu-img")
                .args(["info", &b1.path])
                .output()
                .unwrap();
            let info = String::from_utf8_lossy(&info.stdout);
            assert!(
                info.contains("file format: qcow2") && info.contains("67108864 bytes"),
                "{info}"
            );
            let files = pg.files();
            assert!(files.contains(&cache::marker_name(&b1.name)), "{files:?}");
            // finding: H4, M13 — published without a copy: the base is a qcow2 overlay whose
            // backing store is the verified data volume (the part), format given.
            let parts: Vec<&String> = files.iter().filter(|f| f.contains(".part-")).collect();
            assert_eq!(parts.len(), 1, "only the base's data volume: {files:?}");
            let data = pg.dir.join(parts[0]);
            let chain = Command::new("qemu-img")
                .args(["info", "-U", "--backing-chain", &b1.path])
                .output()
                .unwrap();
            let chain = String::from_utf8_lossy(&chain.stdout);
            assert!(
                chain.contains(&format!("backing file: {}", data.display()))
                    && chain.contains("backing file format: qcow2")
                    && chain.matches("file format: qcow2").count() >= 2,
                "{chain}"
            );
            assert_eq!(b1.disk_format, ImageFormat::Qcow2);
            // The sweep never removes a published base's data volume, however old.
            let swept = image::sweep_parts(&client, &pool, "eptest", Duration::ZERO)
                .await
                .unwrap();
            assert!(swept.is_empty(), "{swept:?}");
            assert!(data.exists());

            // Reused: no second download.
            let again = image::ensure_base(&t, "deb").await.unwrap();
            assert!(!again.imported);
            assert_eq!(again.path, b1.path);
            assert_eq!(server.gets("/deb.qcow2"), 1);

            // A digest change: a new base; the old one stays, unchanged.
            let old_bytes = std::fs::read(&b1.path).unwrap();
            server.route("/deb.qcow2", Route::new(img2.clone()));
            let mut e2 = e.clone();
            e2.images.insert(
                "deb".into(),
                spec(&url, Some(&sha(&img2)), ImageFormat::Qcow2),
            );
            let t2 = Target { entry: &e2, ..t };
            let b2 = image::ensure_base(&t2, "deb").await.unwrap();
            assert_ne!(b2.name, b1.name);
            assert_eq!(
                std::fs::read(&b1.path).unwrap(),
                old_bytes,
                "old base untouched"
            );
            assert!(pg.files().contains(&cache::marker_name(&b1.name)));

            // Two imports of one base that do not share a lock (as two processes would).
            let url3 = server.route("/c.qcow2", Route::new(img3.clone()));
            let mut e3 = e.clone();
            e3.images.insert(
                "c".into(),
                spec(&url3, Some(&sha(&img3)), ImageFormat::Qcow2),
            );
            let ta = Target {
                entry: &e3,
                host: "proc-a",
                ..t
            };
            let tb = Target {
                entry: &e3,
                host: "proc-b",
                ..t
            };
            let (ra, rb) = tokio::join!(image::ensure_base(&ta, "c"), image::ensure_base(&tb, "c"));
            let (ra, rb) = (ra.unwrap(), rb.unwrap());
            assert_eq!(ra.name, rb.name);
            assert_eq!(ra.capacity, 32 * MIB);
            let files = pg.files();
            assert_eq!(
                files.iter().filter(|f| f.contains(&sha(&img3))).count(),
                3,
                "base + marker + its data volume, the loser's part deleted: {files:?}"
            );
            assert_eq!(
                files.iter().filter(|f| f.contains(".part-")).count(),
                3,
                "one data volume per base (three bases): {files:?}"
            );
            client.close();
        })
        .await
        .expect("real image test exceeded its budget");
    }

    /// A scratch directory removed on drop (panics included).
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("{tag}-src"));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}
