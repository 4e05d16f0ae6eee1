//! `LibvirtProvider` end to end against libvirt-fake, with a local HTTP image server: create
//! converges, is idempotent, cleans up after itself, and refuses what it must.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::mark;
use egress_provider::libvirt::names;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{
    CreateRequest, ErrorClass, InstanceState, NoProgress, Provider, ProviderError, ProxyUid,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, NetworkSpec, PoolSpec, codes};
use libvirt_remote::Transport;
use libvirt_remote::proto::procs;

const GIB: u64 = 1 << 30;
const POOL: &str = "images";

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

struct Setup {
    fake: FakeLibvirt,
    provider: LibvirtProvider,
    server: ImageServer,
    image_path: String,
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
        pool_reserve_gib: 1,
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

async fn setup() -> Setup {
    setup_serving(qcow2(2 * GIB, 4096), |r| r).await
}

/// A fake host and an entry whose image `tiny` is `image`, served by the route `route` makes.
async fn setup_serving(image: Vec<u8>, route: impl FnOnce(Route) -> Route) -> Setup {
    setup_on(host(), image, route).await
}

/// [`setup_serving`] with the host `h`.
async fn setup_on(h: HostConfig, image: Vec<u8>, route: impl FnOnce(Route) -> Route) -> Setup {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    let server = ImageServer::start().await;
    let image_path = "/tiny.qcow2".to_string();
    let url = server.route(&image_path, route(Route::new(image.clone())));
    let mut images = BTreeMap::new();
    images.insert(
        "tiny".to_string(),
        ImageSpec {
            url,
            sha256: Some(sha(&image)),
            format: ImageFormat::Qcow2,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    let entry = LibvirtEntry {
        name: "home".into(),
        hosts: vec![h],
        images,
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let pool = HostPool::new(
        entry,
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    let provider = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    Setup {
        fake,
        provider,
        server,
        image_path,
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn request(u: ProxyUid, disk_gib: u64) -> CreateRequest {
    CreateRequest {
        uid: u,
        display_name: "default/p".into(),
        host: "h1".into(),
        image: "tiny".into(),
        disk_gib,
        memory_mib: 256,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: Vec::new(),
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces: None,
    }
}

fn vols(fake: &FakeLibvirt) -> Vec<String> {
    let mut v = fake.volumes(POOL).unwrap();
    v.sort();
    v
}

fn instance_vols(fake: &FakeLibvirt, u: &ProxyUid) -> Vec<String> {
    let (o, s) = (names::overlay("home", u), names::seed("home", u));
    vols(fake)
        .into_iter()
        .filter(|v| *v == o || *v == s)
        .collect()
}

#[tokio::test]
async fn create_builds_a_marked_running_domain_and_delete_leaves_only_the_base() {
    let s = setup().await;
    let u = uid(1);
    let inst = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
    assert_eq!(inst.uid, u);
    assert_eq!(inst.id.name, names::domain("home", &u));
    assert_eq!(
        inst.state,
        InstanceState::Provisioning,
        "running, no address yet"
    );
    assert_eq!(inst.mac, names::mac("home", &u));
    let d = s.fake.domain(&inst.id.name).unwrap();
    assert_eq!(d.state, 1, "started");
    let m = s
        .fake
        .domain_metadata(&inst.id.name, mark::NAMESPACE)
        .unwrap();
    assert_eq!(
        mark::parse(&m, "home", std::time::SystemTime::now())
            .unwrap()
            .uid,
        u
    );
    assert_eq!(instance_vols(&s.fake, &u).len(), 2, "{:?}", vols(&s.fake));
    let bases: Vec<_> = vols(&s.fake)
        .into_iter()
        .filter(|v| v.starts_with(&names::base_prefix("home")) && v.ends_with(".qcow2"))
        .collect();
    assert_eq!(bases.len(), 1, "{:?}", vols(&s.fake));

    // Get through the trait sees the same instance.
    let got = s.provider.get(&inst.id, &u).await.unwrap();
    assert_eq!(got.id, inst.id);

    // Idempotent: a second create converges on the same domain, no second download.
    let again = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
    assert_eq!(again.id, inst.id);
    assert_eq!(s.server.gets(&s.image_path), 1);

    s.provider.delete("h1", &u).await.unwrap();
    assert!(s.fake.domain(&inst.id.name).is_none());
    assert!(instance_vols(&s.fake, &u).is_empty());
    assert!(vols(&s.fake).contains(&bases[0]), "the base stays");
    let e = s.provider.get(&inst.id, &u).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
    // A second delete is a no-op success.
    s.provider.delete("h1", &u).await.unwrap();
}

#[tokio::test]
async fn a_second_proxy_reuses_the_cached_base() {
    let s = setup().await;
    s.provider
        .create(&request(uid(1), 4), &NoProgress)
        .await
        .unwrap();
    s.provider
        .create(&request(uid(2), 4), &NoProgress)
        .await
        .unwrap();
    assert_eq!(
        s.server.gets(&s.image_path),
        1,
        "one download for two proxies"
    );
    let owned = s.provider.list_owned().await.unwrap();
    assert_eq!(owned.len(), 2);
    assert!(owned.iter().all(|o| o.name_matches_uid));
}

#[tokio::test]
async fn a_disk_smaller_than_the_image_is_refused_before_any_instance_volume_exists() {
    // finding: M5 — the image's virtual size is 2 GiB; a 1 GiB disk would never boot.
    let s = setup().await;
    let u = uid(3);
    let e = s
        .provider
        .create(&request(u, 1), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("resources.diskGiB 1"), "{}", e.message);
    assert!(e.message.contains(&(2 * GIB).to_string()), "{}", e.message);
    assert!(e.message.contains("tiny"), "{}", e.message);
    assert!(instance_vols(&s.fake, &u).is_empty(), "{:?}", vols(&s.fake));
    assert!(s.fake.domain(&names::domain("home", &u)).is_none());
}

#[tokio::test]
async fn user_data_cloud_init_would_not_read_is_refused_before_any_instance_volume_exists() {
    // finding: M8 — the seed's input is checked before the overlay, though the seed image is
    // built only just before its upload.
    let s = setup().await;
    // A first Proxy caches the base, so the refused create below has no import to make.
    s.provider
        .create(&request(uid(5), 2), &NoProgress)
        .await
        .unwrap();
    let u = uid(4);
    let mut req = request(u, 2);
    req.user_data = "no cloud-init header\n".into();
    let created = s.fake.calls(procs::STORAGE_VOL_CREATE_XML);
    let e = s.provider.create(&req, &NoProgress).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("user-data"), "{}", e.message);
    assert_eq!(
        s.fake.calls(procs::STORAGE_VOL_CREATE_XML),
        created,
        "no volume was created (and removed again)"
    );
    assert!(instance_vols(&s.fake, &u).is_empty(), "{:?}", vols(&s.fake));
    assert!(s.fake.domain(&names::domain("home", &u)).is_none());
}

/// A real qcow2 image made by `qemu-img create` with a virtual size of `size`.
fn qemu_img_qcow2(size: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img.qcow2");
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .expect("qemu-img must be installed (.ci/setup-host installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&path).unwrap()
}

/// Longest the refusal below may take: the body stalls after its first bytes, so only a
/// refusal from the header can end the create before the stall timeout (60 s).
const HEADER_REFUSAL_BUDGET: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_disk_smaller_than_the_image_is_refused_from_the_qcow2_header_before_the_download_goes_on()
 {
    // finding: M5 — qemu-img's image says 3 GiB in its header; a 2 GiB disk is refused as
    // soon as the header arrives: the server sends the first 4 KiB and then nothing, so a
    // check after the download would only end in the stall timeout.
    let img = qemu_img_qcow2("3G");
    assert!(img.len() > 8192, "{}", img.len());
    let s = setup_serving(img, |mut r| {
        r.stall_at = Some(4096);
        r
    })
    .await;
    let u = uid(9);
    let e = tokio::time::timeout(
        HEADER_REFUSAL_BUDGET,
        s.provider.create(&request(u, 2), &NoProgress),
    )
    .await
    .expect("the size was not checked from the header")
    .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("resources.diskGiB 2"), "{}", e.message);
    assert!(e.message.contains(&(3 * GIB).to_string()), "{}", e.message);
    assert!(!e.message.contains("diskSizeGb"), "{}", e.message);
    assert!(
        vols(&s.fake).is_empty(),
        "nothing kept: {:?}",
        vols(&s.fake)
    );
    assert!(s.fake.domain(&names::domain("home", &u)).is_none());
}

#[tokio::test]
async fn pool_space_is_checked_on_fresh_figures_not_libvirts_cached_ones() {
    // finding: M4 — the pool's cached `available` still says 100 GiB while the disk is full;
    // only a refresh shows it. Create must refresh and refuse with QuotaExceeded.
    let s = setup().await;
    s.provider
        .create(&request(uid(1), 4), &NoProgress)
        .await
        .unwrap();
    let p = s.fake.pool(POOL).unwrap();
    s.fake
        .set_pool_usage(POOL, 100 * GIB - GIB - (10 << 20), GIB + (10 << 20))
        .unwrap();
    assert_eq!(
        s.fake.pool(POOL).unwrap().cached_available,
        p.cached_available,
        "libvirt still reports the old figure until a refresh"
    );
    assert!(p.cached_available > 90 * GIB);
    let u = uid(2);
    let e = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
    assert!(
        e.message.contains(POOL) && e.message.contains("poolReserveGiB"),
        "{}",
        e.message
    );
    assert!(instance_vols(&s.fake, &u).is_empty());
}

#[tokio::test]
async fn a_failed_define_removes_what_the_create_made_and_is_permanent() {
    // finding: M3, M7 — code 67 (config unsupported) on define is Permanent, and the overlay
    // and seed this call created are removed, not leaked.
    let s = setup().await;
    s.fake.faults().fail_calls(
        procs::DOMAIN_DEFINE_XML_FLAGS,
        codes::CONFIG_UNSUPPORTED,
        10,
        "unsupported configuration: machine type 'q35' not supported",
        Some(1),
    );
    let u = uid(4);
    let e = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert_eq!(e.libvirt_code, Some(67));
    assert!(instance_vols(&s.fake, &u).is_empty(), "{:?}", vols(&s.fake));
    assert!(s.fake.domain(&names::domain("home", &u)).is_none());
    // The cached base is not something this create made for the instance: it stays.
    assert!(
        vols(&s.fake)
            .iter()
            .any(|v| v.starts_with(&names::base_prefix("home")))
    );
    // And the next attempt succeeds.
    s.provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_domain_of_ours_without_its_disks_is_recreated_not_started() {
    // finding: L4 — adopting a defined domain verifies its overlay and seed first.
    let s = setup().await;
    let u = uid(5);
    let inst = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
    // Someone removed the overlay behind our back and the domain stopped.
    s.fake.set_domain_state(&inst.id.name, 5, 1).unwrap();
    let c = libvirt_remote::Client::open(s.fake.connect_duplex(), Default::default())
        .await
        .unwrap();
    let pool = c.pool_lookup_by_name(POOL).await.unwrap();
    let ov = c
        .vol_lookup_by_name(&pool, &names::overlay("home", &u))
        .await
        .unwrap();
    c.vol_delete(&ov, 0).await.unwrap();
    let again = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
    assert_eq!(again.id, inst.id);
    assert_eq!(instance_vols(&s.fake, &u).len(), 2, "overlay recreated");
    assert_eq!(s.fake.domain(&inst.id.name).unwrap().state, 1);
}

/// Replaces the overlay of `u` with a qcow2 volume of `capacity` bytes backed by `backing`.
async fn replace_overlay(fake: &FakeLibvirt, u: &ProxyUid, capacity: u64, backing: &str) {
    let c = libvirt_remote::Client::open(fake.connect_duplex(), Default::default())
        .await
        .unwrap();
    let pool = c.pool_lookup_by_name(POOL).await.unwrap();
    let name = names::overlay("home", u);
    let ov = c.vol_lookup_by_name(&pool, &name).await.unwrap();
    c.vol_delete(&ov, 0).await.unwrap();
    let xml = format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity>\
         <target><format type='qcow2'/></target>\
         <backingStore><path>{backing}</path><format type='qcow2'/></backingStore></volume>"
    );
    c.vol_create_xml(&pool, &xml, 0).await.unwrap();
}

#[tokio::test]
async fn a_domain_of_ours_whose_overlay_has_another_base_or_size_is_recreated_not_started() {
    // finding: L4 — adoption checks the overlay's backing base and size, not only that it
    // exists.
    let s = setup().await;
    let u = uid(6);
    let inst = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap();
    let ov_name = names::overlay("home", &u);
    let good = s.fake.volume(POOL, &ov_name).unwrap();
    let base_path = good
        .backing
        .clone()
        .expect("the overlay is backed by the base");
    s.fake
        .add_volume(
            POOL,
            libvirt_fake::VolumeSpec::new("other-base.qcow2", 2 * GIB).format("qcow2"),
        )
        .unwrap();
    let other = s.fake.volume(POOL, "other-base.qcow2").unwrap().path;
    for (capacity, backing, what) in [
        (4 * GIB, other.as_str(), "another base"),
        (8 * GIB, base_path.as_str(), "another size"),
    ] {
        replace_overlay(&s.fake, &u, capacity, backing).await;
        s.fake.set_domain_state(&inst.id.name, 5, 1).unwrap();
        let again = s
            .provider
            .create(&request(u, 4), &NoProgress)
            .await
            .unwrap();
        assert_eq!(again.id, inst.id, "{what}");
        let ov = s.fake.volume(POOL, &ov_name).unwrap();
        assert_eq!(
            (ov.backing.as_deref(), ov.capacity),
            (Some(base_path.as_str()), 4 * GIB),
            "{what}: the overlay was recreated on the right base at the requested size"
        );
        assert_eq!(s.fake.domain(&inst.id.name).unwrap().state, 1, "{what}");
    }
}

#[tokio::test]
async fn create_refuses_a_same_named_domain_that_is_not_this_proxys() {
    // finding: M2 — a domain carrying another UID's mark under our name is never adopted,
    // started or removed by create.
    let s = setup().await;
    let u = uid(6);
    let other = uid(7);
    let name = names::domain("home", &u);
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><metadata>{}</metadata></domain>",
        mark::render(&other, "home", std::time::SystemTime::now())
    );
    s.fake.define_domain_xml(&xml).unwrap();
    let e = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("not this Proxy's"), "{}", e.message);
    let d = s.fake.domain(&name).unwrap();
    assert_eq!(d.state, 5, "left shut off, untouched");
    assert!(instance_vols(&s.fake, &u).is_empty());
}

#[tokio::test]
async fn invalid_sizes_are_permanent_and_leave_nothing_behind() {
    // finding: L11, L20 — zero vCPUs or absurd memory never reach libvirt.
    let s = setup().await;
    for (i, (vcpus, mem)) in [(0u32, 256u64), (1, u64::MAX / 2)].into_iter().enumerate() {
        let u = uid(10 + i as u8);
        let mut r = request(u, 4);
        r.vcpus = vcpus;
        r.memory_mib = mem;
        let e = s.provider.create(&r, &NoProgress).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{e}");
        assert!(instance_vols(&s.fake, &u).is_empty(), "{:?}", vols(&s.fake));
        assert!(s.fake.domain(&names::domain("home", &u)).is_none());
    }
}

#[tokio::test]
async fn a_create_whose_mac_another_domain_on_the_host_uses_is_refused_before_define() {
    // Two NICs with one MAC break each other's networking: the derived MAC (24 hash bits) is
    // checked against every domain on the host, foreign ones included, before define.
    let s = setup_on(
        HostConfig {
            network: Some("default".into()),
            ..host()
        },
        qcow2(2 * GIB, 4096),
        |r| r,
    )
    .await;
    s.fake.add_network(NetworkSpec::new("default")).unwrap();
    let u = uid(8);
    let mac = names::mac("home", &u);
    // A foreign, shut-off domain whose NIC has that MAC (upper case, as a human may write).
    let xml = format!(
        "<domain type='qemu'><name>someone-elses-vm</name><memory unit='MiB'>64</memory>\
         <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>\
         <interface type='network'><source network='default'/><mac address='{}'/>\
         </interface></devices></domain>",
        mac.to_ascii_uppercase()
    );
    s.fake.define_domain_xml(&xml).unwrap();
    let e = s
        .provider
        .create(&request(u, 4), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains(&mac) && e.message.contains("someone-elses-vm"),
        "{}",
        e.message
    );
    assert!(s.fake.domain(&names::domain("home", &u)).is_none());
    assert!(instance_vols(&s.fake, &u).is_empty(), "{:?}", vols(&s.fake));
    assert!(s.fake.domain("someone-elses-vm").is_some(), "left alone");
    // Another Proxy, whose MAC nobody uses, is created on the same host; its own domain
    // (recreated or adopted later) never counts as a collision with itself.
    let v = uid(9);
    s.provider
        .create(&request(v, 4), &NoProgress)
        .await
        .unwrap();
    s.provider
        .create(&request(v, 4), &NoProgress)
        .await
        .unwrap();
    // The check does not read every domain again on each create: the domain XML reads a
    // create makes stay the same as the host fills up (they grew by one per domain before).
    let mut per_create = Vec::new();
    for n in 10..14 {
        let before = s.fake.calls(procs::DOMAIN_GET_XML_DESC);
        s.provider
            .create(&request(uid(n), 4), &NoProgress)
            .await
            .unwrap();
        per_create.push(s.fake.calls(procs::DOMAIN_GET_XML_DESC) - before);
    }
    assert!(
        per_create.windows(2).all(|w| w[0] == w[1]),
        "domain XML reads per create grew with the host's domains: {per_create:?}"
    );
}
