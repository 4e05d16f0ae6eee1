//! `LibvirtProvider` against the REAL libvirtd through a real sshd: create → get → delete of a
//! TCG domain from a small qcow2 base served by a local HTTP server with its sha256 pinned.
//! Resources are uniquely named (`ep-eptest…` domains, `eptest-…` pools), printed first, and
//! removed on every path by Drop guards.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::SystemTime;

use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names, volumes};
use egress_provider::{CreateRequest, ErrorClass, NoProgress, Provider, ProxyUid};
use ep_test_support::cleanup::{self, PoolFixture};
use ep_test_support::sshd::Sshd;
use image_support::{ImageServer, Route, sha};
use libvirt_remote::{Client, OpenOptions, transport};

const GIB: u64 = 1 << 30;

fn unique(tag: &str) -> String {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{tag}{:x}",
        (n as u64) ^ u64::from(std::process::id()) << 20
    )
}

/// Removes domains by name on Drop (destroy, then undefine with every metadata flag).
struct DomainGuard(Vec<String>);

impl Drop for DomainGuard {
    fn drop(&mut self) {
        for d in &self.0 {
            cleanup::remove_domain(d);
        }
    }
}

/// A real qcow2 image of `size` virtual bytes (sparse: a few hundred KiB on disk).
fn qcow2_image(size: &str, dir: &std::path::Path, name: &str) -> Vec<u8> {
    let path = dir.join(name);
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    b
}

fn host(sshd: &Sshd, pool: &str, virt_type: VirtType) -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: format!("127.0.0.1:{}", sshd.port),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: pool.into(),
        // NB: no bridge or network: the test guest has no NIC, so it sends no traffic.
        bridge: None,
        network: None,
        virt_type,
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
    }
}

fn provider(entry: &str, sshd: &Sshd, pool: &str, url: &str, image: &[u8]) -> LibvirtProvider {
    provider_with(entry, sshd, pool, url, image, VirtType::Qemu)
}

fn provider_with(
    entry: &str,
    sshd: &Sshd,
    pool: &str,
    url: &str,
    image: &[u8],
    virt: VirtType,
) -> LibvirtProvider {
    let mut images = BTreeMap::new();
    images.insert(
        "tiny".to_string(),
        ImageSpec {
            url: url.into(),
            sha256: Some(sha(image)),
            format: ImageFormat::Qcow2,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    let e = LibvirtEntry {
        name: entry.into(),
        hosts: vec![host(sshd, pool, virt)],
        images,
        url_images: Default::default(),
        max_image_bytes: GIB,
        guest: Default::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    };
    let t = Timeouts::default();
    let pool = HostPool::new(e, Arc::new(SshConnector::new(&t)), PoolOptions::default()).unwrap();
    LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default())
}

fn request(uid: ProxyUid, disk_gib: u64) -> CreateRequest {
    CreateRequest {
        uid,
        display_name: "default/p".into(),
        host: "h1".into(),
        image: "tiny".into(),
        disk_gib,
        memory_mib: 128,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: Vec::new(),
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces: None,
    }
}

async fn local() -> Client {
    let t = transport::unix::connect(transport::DEFAULT_SOCKET, transport::DEFAULT_DIAL_TIMEOUT)
        .await
        .expect("libvirtd must be running (.ci/setup-host starts it)");
    Client::open(t, OpenOptions::default()).await.unwrap()
}

fn vol_names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_are_created_reused_and_deleted_on_the_real_libvirtd_through_sshd() {
    // finding: H4, M13, M5, M3
    let sshd = Sshd::start();
    let pool = PoolFixture::create("provider");
    let server = ImageServer::start().await;
    let scratch_dir = tempfile::Builder::new()
        .prefix("eptest-scratch-")
        .tempdir()
        .unwrap();
    let scratch = scratch_dir.path().to_path_buf();
    let img1 = qcow2_image("1G", &scratch, "a.qcow2");
    let url1 = server.route("/tiny.qcow2", Route::new(img1.clone()));
    let entry = unique("eptest");
    let (ua, ub, uc) = (uid(), uid(), uid());
    let mut doms: Vec<String> = [ua, ub, uc]
        .iter()
        .map(|u| names::domain(&entry, u))
        .collect();
    let entry2 = unique("eptestb");
    let ud = uid();
    doms.push(names::domain(&entry2, &ud));
    for d in &doms {
        println!("eptest: may create domain {d}");
    }
    let _domains = DomainGuard(doms);

    let p1 = provider(&entry, &sshd, &pool.name, &url1, &img1);
    let a = p1.create(&request(ua, 2), &NoProgress).await.unwrap();
    assert_eq!(a.uid, ua);
    let lv = local().await;
    let dom = lv.domain_lookup_by_name(&a.id.name).await.unwrap();
    assert_eq!(lv.domain_state(&dom).await.unwrap().0, 1, "running (TCG)");
    // The mark is readable and ours.
    let m = lv.domain_metadata(&dom, mark::NAMESPACE, 0).await.unwrap();
    assert_eq!(mark::parse(&m, &entry, SystemTime::now()).unwrap().uid, ua);
    // The overlay backs onto the base; the seed is attached.
    let xml = lv.domain_xml(&dom, 0).await.unwrap();
    let overlay = names::overlay(&entry, &ua);
    let seed = names::seed(&entry, &ua);
    assert!(xml.contains(&overlay) && xml.contains(&seed), "{xml}");
    let sp = lv.pool_lookup_by_name(&pool.name).await.unwrap();
    let ov = lv.vol_lookup_by_name(&sp, &overlay).await.unwrap();
    let facts = volumes::parse_volume_xml(&lv.vol_xml(&ov).await.unwrap()).unwrap();
    let base_path = facts.backing.clone().expect("overlay has a backing store");
    assert!(
        base_path.contains(&names::base_prefix(&entry)),
        "{base_path}"
    );
    assert_eq!(facts.capacity, 2 * GIB);
    // finding: H4, M13 — the base was published without a copy: the running TCG guest's
    // chain is overlay → base (a qcow2 overlay) → the verified data volume.
    let ov_path = facts.path.clone().expect("overlay path");
    let chain = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--backing-chain", &ov_path])
        .output()
        .unwrap();
    let chain = String::from_utf8_lossy(&chain.stdout);
    assert!(
        chain.contains(&format!("backing file: {base_path}")) && chain.contains(".part-"),
        "{chain}"
    );
    assert_eq!(chain.matches("image: ").count(), 3, "{chain}");
    assert_eq!(p1.get(&a.id, &ua).await.unwrap().id, a.id);

    // A second proxy reuses the cached base: one download.
    p1.create(&request(ub, 2), &NoProgress).await.unwrap();
    assert_eq!(server.gets("/tiny.qcow2"), 1);

    // finding: M5 — a disk smaller than the image's 1 GiB virtual size is refused before any
    // instance volume or domain exists.
    let small = uid();
    let e = p1
        .create(&request(small, 0), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(e.message.contains("resources.diskGiB 0"), "{}", e.message);
    let files = vol_names(&pool.dir);
    assert!(
        !files.iter().any(|f| f.contains(&small.simple())),
        "{files:?}"
    );

    // A second entry with the same image key gets its own base.
    let p2 = provider(&entry2, &sshd, &pool.name, &url1, &img1);
    p2.create(&request(ud, 2), &NoProgress).await.unwrap();
    assert_eq!(server.gets("/tiny.qcow2"), 2, "entries never share a base");

    // finding: M13 — a digest change creates a new base and leaves the old one, still under A.
    let img2 = qcow2_image("1536M", &scratch, "b.qcow2");
    assert_ne!(sha(&img1), sha(&img2));
    let url2 = server.route("/tiny-v2.qcow2", Route::new(img2.clone()));
    let p1b = provider(&entry, &sshd, &pool.name, &url2, &img2);
    p1b.create(&request(uc, 2), &NoProgress).await.unwrap();
    let bases: Vec<String> = vol_names(&pool.dir)
        .into_iter()
        .filter(|f| f.starts_with(&names::base_prefix(&entry)) && f.ends_with(".qcow2"))
        .collect();
    assert_eq!(bases.len(), 2, "{bases:?}");
    assert!(
        std::path::Path::new(&base_path).exists(),
        "old base kept under A"
    );
    assert_eq!(lv.domain_state(&dom).await.unwrap().0, 1, "A still running");

    // Delete removes domains, overlays and seeds; the bases stay.
    for (p, u) in [(&p1, ua), (&p1, ub), (&p1b, uc), (&p2, ud)] {
        p.delete("h1", &u).await.unwrap();
    }
    let left = vol_names(&pool.dir);
    for u in [ua, ub, uc, ud] {
        assert!(!left.iter().any(|f| f.contains(&u.simple())), "{left:?}");
    }
    assert!(
        left.iter().filter(|f| f.ends_with(".qcow2")).count() >= 3,
        "bases kept: {left:?}"
    );
    let e = lv.domain_lookup_by_name(&a.id.name).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(42));
}

fn uid() -> ProxyUid {
    ProxyUid(uuid::Uuid::new_v4())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_domain_with_a_replaced_overlay_is_recreated_and_a_foreign_one_is_never_touched() {
    // finding: L4, M2
    let sshd = Sshd::start();
    let pool = PoolFixture::create("provider");
    let server = ImageServer::start().await;
    let scratch = tempfile::Builder::new()
        .prefix("eptest-scratch-")
        .tempdir()
        .unwrap();
    let img = qcow2_image("1G", scratch.path(), "a.qcow2");
    let url = server.route("/tiny.qcow2", Route::new(img.clone()));
    let entry = unique("eptest");
    let (u, foreign) = (uid(), uid());
    let (name, foreign_name) = (names::domain(&entry, &u), names::domain(&entry, &foreign));
    println!("eptest: may create domains {name} {foreign_name}");
    let _domains = DomainGuard(vec![name.clone(), foreign_name.clone()]);
    let p = provider(&entry, &sshd, &pool.name, &url, &img);
    p.create(&request(u, 2), &NoProgress).await.unwrap();
    let lv = local().await;
    let sp = lv.pool_lookup_by_name(&pool.name).await.unwrap();
    let overlay = names::overlay(&entry, &u);
    let facts = |xml: String| volumes::parse_volume_xml(&xml).unwrap();
    let ov = lv.vol_lookup_by_name(&sp, &overlay).await.unwrap();
    let good = facts(lv.vol_xml(&ov).await.unwrap());
    let base_path = good.backing.clone().unwrap();

    // L4: the domain stopped, and its overlay was replaced by one of another size on the
    // same base (as a hand edit could leave it): adopting it recreates the overlay.
    let dom = lv.domain_lookup_by_name(&name).await.unwrap();
    lv.domain_destroy(&dom, 0).await.unwrap();
    lv.vol_delete(&ov, 0).await.unwrap();
    let wrong = volumes::BackingBase {
        path: base_path.clone(),
        capacity: GIB,
        format: ImageFormat::Qcow2,
        image: "tiny".into(),
    };
    lv.vol_create_xml(&sp, &volumes::overlay_xml(&overlay, 3 * GIB, &wrong), 0)
        .await
        .unwrap();
    p.create(&request(u, 2), &NoProgress).await.unwrap();
    let ov = lv.vol_lookup_by_name(&sp, &overlay).await.unwrap();
    let now = facts(lv.vol_xml(&ov).await.unwrap());
    assert_eq!(
        (now.capacity, now.backing.as_deref()),
        (2 * GIB, Some(base_path.as_str())),
        "the overlay was recreated at the requested size on the base"
    );
    let dom = lv.domain_lookup_by_name(&name).await.unwrap();
    assert_eq!(lv.domain_state(&dom).await.unwrap().0, 1, "running again");

    // M2: a domain under the name of another Proxy's UID, carrying this Proxy's mark, is
    // neither adopted nor deleted by that other Proxy's create and delete.
    let xml = lv.domain_xml(&dom, 0).await.unwrap();
    let fxml = xml
        .replace(&name, &foreign_name)
        .replace(&overlay, "no-such-overlay")
        .lines()
        .filter(|l| !l.trim_start().starts_with("<uuid>"))
        .collect::<Vec<_>>()
        .join("\n");
    let fdom = lv.domain_define_xml(&fxml, 0).await.unwrap();
    let e = p
        .create(&request(foreign, 2), &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    let e = p.delete("h1", &foreign).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    lv.domain_lookup_by_name(&foreign_name)
        .await
        .expect("a domain without this Proxy's mark is never deleted");
    let m = lv.domain_metadata(&fdom, mark::NAMESPACE, 0).await.unwrap();
    assert_eq!(mark::parse(&m, &entry, SystemTime::now()).unwrap().uid, u);
    p.delete("h1", &u).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virt_type_auto_starts_a_guest_even_where_kvm_is_listed_but_unusable() {
    // finding: M7 — on these machines KVM is listed (and QEMU enables it) but guests fail to
    // start; `auto` must still produce a running guest, falling back to TCG.
    let sshd = Sshd::start();
    let pool = PoolFixture::create("provider");
    let server = ImageServer::start().await;
    let scratch = tempfile::Builder::new()
        .prefix("eptest-scratch-")
        .tempdir()
        .unwrap();
    let img = qcow2_image("1G", scratch.path(), "a.qcow2");
    let url = server.route("/tiny.qcow2", Route::new(img.clone()));
    let entry = unique("eptest");
    let u = uid();
    let name = names::domain(&entry, &u);
    println!("eptest: may create domain {name}");
    let _domains = DomainGuard(vec![name.clone()]);
    let p = provider_with(&entry, &sshd, &pool.name, &url, &img, VirtType::Auto);
    p.create(&request(u, 2), &NoProgress).await.unwrap();
    let lv = local().await;
    let dom = lv.domain_lookup_by_name(&name).await.unwrap();
    assert_eq!(lv.domain_state(&dom).await.unwrap().0, 1, "running");
    let xml = lv.domain_xml(&dom, 0).await.unwrap();
    let kind = if xml.contains("<domain type='kvm'") {
        "kvm"
    } else {
        "qemu"
    };
    println!("virtType auto ran the guest with {kind}");
    // A second guest on the same host goes straight to what worked.
    let u2 = uid();
    let name2 = names::domain(&entry, &u2);
    let _d2 = DomainGuard(vec![name2.clone()]);
    p.create(&request(u2, 2), &NoProgress).await.unwrap();
    let xml2 = lv
        .domain_xml(&lv.domain_lookup_by_name(&name2).await.unwrap(), 0)
        .await
        .unwrap();
    assert!(xml2.contains(&format!("<domain type='{kind}'")), "{xml2}");
    p.delete("h1", &u).await.unwrap();
    p.delete("h1", &u2).await.unwrap();
}
