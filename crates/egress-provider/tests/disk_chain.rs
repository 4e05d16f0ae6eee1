//! The root disk's backing chain ends where the domain XML declares it: base, then the base's
//! data volume, then an empty `<backingStore/>`, so libvirt never follows a backing file
//! named inside an image's own header (checked in the XML, and on the real libvirtd by
//! starting a domain whose data layer names a decoy of the test's own: the running domain's
//! chain does not contain it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::Command;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::caps;
use egress_provider::libvirt::config::{Firmware, ImageFormat, VirtType};
use egress_provider::libvirt::domain_xml::{self, Backing, DiskSource, DomainSpec};
use ep_test_support::cleanup;
use libvirt_remote::client::undefine;
use libvirt_remote::transport;
use libvirt_remote::{Client, OpenOptions};

/// Bound on the real-daemon test body (defines, starts and stops one tiny TCG domain).
// NB: a TCG start answers in ~1 s here; 120 s is generous for a loaded 2-core box.
const REAL_BUDGET: Duration = Duration::from_secs(120);
/// Per-call deadline given to `caps::probe`.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn random_uid() -> ProxyUid {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mixed = n ^ (u128::from(std::process::id()) << 64) ^ 0x7e57_c4a1_u128;
    let mut b = uuid::Builder::from_u128(mixed);
    b.set_variant(uuid::Variant::RFC4122);
    b.set_version(uuid::Version::Random);
    ProxyUid(b.into_uuid())
}

fn spec<'a>(
    name: &'a str,
    uid: &'a ProxyUid,
    root: DiskSource<'a>,
    seed: DiskSource<'a>,
    backing: &'a Backing<'a>,
) -> DomainSpec<'a> {
    DomainSpec {
        name,
        uuid: Some(uid.0),
        vcpus: 1,
        memory_mib: 128,
        firmware: Firmware::Bios,
        root,
        backing: Some(*backing),
        seed,
        nic: None,
        uid,
        entry: "eptest",
        created_at: SystemTime::now(),
        installation: None,
        addresses: &[],
    }
}

/// The text between the first `<disk` and its `</disk>` (the root disk).
fn root_disk(xml: &str) -> &str {
    let start = xml.find("<disk").expect("a disk");
    let end = xml[start..].find("</disk>").expect("closed") + start;
    &xml[start..end]
}

#[test]
fn the_declared_chain_lists_the_base_then_its_data_and_ends_with_an_empty_backing_store() {
    let caps_xml = include_str!("../../testing/libvirt-fake/fixtures/capabilities.xml");
    let dom_xml =
        include_str!("../../testing/libvirt-fake/fixtures/domcapabilities-qemu-x86_64.xml");
    let hc = caps::choose(
        "h1",
        VirtType::Qemu,
        &caps::parse_capabilities(caps_xml).unwrap(),
        None,
        Some(&caps::parse_domain_capabilities(dom_xml).unwrap()),
    )
    .unwrap();
    let u = random_uid();
    let data = Backing {
        path: "/pool/base.part-1",
        format: ImageFormat::Raw,
        below: None,
    };
    let base = Backing {
        path: "/pool/base.qcow2",
        format: ImageFormat::Qcow2,
        below: Some(&data),
    };
    let xml = domain_xml::build(
        &spec(
            "ep-eptest-chain",
            &u,
            DiskSource::File("/pool/root.qcow2"),
            DiskSource::File("/pool/seed.iso"),
            &base,
        ),
        &hc,
    )
    .unwrap();
    let disk: String = root_disk(&xml).split_whitespace().collect();
    let want: String = "<backingStore type=\"file\"><format type=\"qcow2\"/>\
        <source file=\"/pool/base.qcow2\"/><backingStore type=\"file\"><format type=\"raw\"/>\
        <source file=\"/pool/base.part-1\"/><backingStore/></backingStore></backingStore>"
        .split_whitespace()
        .collect();
    assert!(disk.contains(&want), "{xml}");

    // A base without a data layer ends right after itself.
    let alone = Backing {
        below: None,
        ..base
    };
    let xml = domain_xml::build(
        &spec(
            "ep-eptest-chain",
            &u,
            DiskSource::File("/pool/root.qcow2"),
            DiskSource::File("/pool/seed.iso"),
            &alone,
        ),
        &hc,
    )
    .unwrap();
    let disk: String = root_disk(&xml).split_whitespace().collect();
    assert!(
        disk.contains("<sourcefile=\"/pool/base.qcow2\"/><backingStore/></backingStore>"),
        "{xml}"
    );
}

fn qemu_img(args: &[&str]) {
    let out = Command::new("timeout")
        .args(["60", "qemu-img"])
        .args(args)
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_real_libvirtd_runs_the_declared_chain_and_never_opens_a_backing_file_an_image_names() {
    tokio::time::timeout(REAL_BUDGET, async {
        cleanup::sweep_once();
        let t = transport::unix::connect(
            std::env::var_os("EPTEST_LIBVIRT_SOCKET")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| transport::DEFAULT_SOCKET.into()),
            transport::DEFAULT_DIAL_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("libvirtd unreachable ({e}): run `bash .ci/setup-host`"));
        let c = Client::open(t, OpenOptions::default()).await.unwrap();
        let hc = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
            .await
            .unwrap();
        let pool = cleanup::PoolFixture::create("diskchain");
        let path = |f: &str| pool.file(f).to_str().unwrap().to_owned();
        // The decoy is the test's own file; the data layer's header names it.
        let decoy = path("decoy.raw");
        std::fs::write(&decoy, vec![0x5a; 1 << 16]).unwrap();
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", &decoy, "-F", "raw", &path("data.qcow2"), "16M"]);
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", &path("data.qcow2"), "-F", "qcow2", &path("base.qcow2"), "16M"]);
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", &path("base.qcow2"), "-F", "qcow2", &path("root.qcow2"), "16M"]);
        qemu_img(&["create", "-q", "-f", "raw", &path("seed.raw"), "1M"]);
        let (data_p, base_p, root_p, seed_p) =
            (path("data.qcow2"), path("base.qcow2"), path("root.qcow2"), path("seed.raw"));
        let data = Backing {
            path: &data_p,
            format: ImageFormat::Qcow2,
            below: None,
        };
        let base = Backing {
            path: &base_p,
            format: ImageFormat::Qcow2,
            below: Some(&data),
        };
        let u = random_uid();
        let guard = cleanup::DomainGuard::new("diskchain");
        let xml = domain_xml::build(
            &spec(
                &guard.name,
                &u,
                DiskSource::File(&root_p),
                DiskSource::File(&seed_p),
                &base,
            ),
            &hc,
        )
        .unwrap();
        let dom = c.domain_define_xml(&xml, 0).await.unwrap();
        c.domain_create(&dom).await.unwrap();
        let live = c.domain_xml(&dom, 0).await.unwrap();
        c.domain_destroy(&dom, 0).await.unwrap();
        c.domain_undefine(&dom, undefine::ALL_METADATA).await.unwrap();
        c.close();
        let disk = root_disk(&live);
        assert!(disk.contains(&base_p) && disk.contains(&data_p), "{disk}");
        assert!(
            !disk.contains(&decoy),
            "the running chain must end at the data layer, not follow its header to the decoy: {disk}"
        );
    })
    .await
    .expect("the real disk-chain test exceeded its budget");
}
