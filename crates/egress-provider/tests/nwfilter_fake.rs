//! The guest NIC's network filter through `LibvirtProvider::create` against libvirt-fake:
//! the entry's filter is defined before the domain that references it, defined once (an
//! unchanged filter is not redefined), named per installation, and left off when the entry
//! turns it off; the fake refuses to start a domain whose filter is missing, as libvirtd
//! does, so a create that forgot the filter would fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::sync::Arc;

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::names;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{CreateRequest, NoProgress, Provider, ProviderError, ProxyUid};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{FakeLibvirt, PoolSpec};
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
    _server: ImageServer,
}

/// A fake host on network `default` at 198.51.100.7, and an entry `home` whose `policy:`
/// is `policy` (JSON), with installation `installation`.
async fn setup(policy: &str, installation: Option<&str>) -> Setup {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    // NB: built from JSON so fields added later with defaults need no change here.
    let entry: LibvirtEntry = serde_json::from_str(&format!(
        r#"{{"name": "home",
            "hosts": [{{"name": "h1", "address": "198.51.100.7:22", "pool": "{POOL}",
                        "network": "default", "virtType": "qemu", "poolReserveGiB": 1}}],
            "images": {{"tiny": {{"url": "{url}", "sha256": "{sha}", "format": "qcow2"}}}},
            "maxImageBytes": {GIB},
            "policy": {policy}}}"#,
        sha = sha(&image),
    ))
    .unwrap();
    let pool = HostPool::new(
        entry,
        Arc::new(FakeConnector(fake.clone())),
        PoolOptions::default(),
    )
    .unwrap();
    let mut provider = LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default());
    if let Some(id) = installation {
        provider = provider.with_installation(id).unwrap();
    }
    Setup {
        fake,
        provider,
        _server: server,
    }
}

fn request(n: u8) -> CreateRequest {
    CreateRequest {
        uid: uid(n),
        display_name: "default/p".into(),
        host: "h1".into(),
        image: "tiny".into(),
        disk_gib: 4,
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

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

#[tokio::test]
async fn every_guest_nic_references_the_entrys_filter_defined_once_per_installation() {
    let s = setup(
        r#"{"allowedInternalCidrs": ["10.5.0.0/16"]}"#,
        Some("inst-a"),
    )
    .await;
    let inst = s.provider.create(&request(1), &NoProgress).await.unwrap();
    let filter = names::nwfilter("home", Some("inst-a"));
    assert_eq!(filter, "ep-home-filter2-inst-a");
    let xml = s
        .fake
        .nwfilter_xml(&filter)
        .unwrap_or_else(|| panic!("{filter} not defined"));
    assert!(
        xml.contains("<all dstipaddr='10.5.0.0' dstipmask='16' state='NEW'/>"),
        "the entry's allowedInternalCidrs are lifted:\n{xml}"
    );
    assert!(
        xml.contains("<all dstipaddr='198.51.100.7' dstipmask='32' state='NEW,INVALID'/>"),
        "the host's own address is rejected:\n{xml}"
    );
    let dom = s.fake.domain(&inst.id.name).unwrap();
    assert_eq!(dom.state, 1, "started: the filter existed before the start");
    // The NIC carries its own parameters: its MAC, and (no declared address) the lease
    // libvirt learns from DHCP.
    assert!(
        dom.xml
            .contains(&format!("<filterref filter=\"{filter}\">"))
            || dom.xml.contains(&format!("<filterref filter='{filter}'>")),
        "{}",
        dom.xml
    );
    assert!(
        dom.xml.contains("name=\"CTRL_IP_LEARNING\" value=\"dhcp\"")
            || dom.xml.contains("name='CTRL_IP_LEARNING' value='dhcp'"),
        "{}",
        dom.xml
    );
    // The set: four children and two roots, each defined once.
    let set = 6;
    assert_eq!(s.fake.calls(procs::NWFILTER_DEFINE_XML), set);
    // A second guest on the host finds the same filters and redefines none (libvirt would
    // re-apply them to every guest's interface).
    s.provider.create(&request(2), &NoProgress).await.unwrap();
    assert_eq!(s.fake.calls(procs::NWFILTER_DEFINE_XML), set);
    assert_eq!(s.fake.calls(procs::NWFILTER_LOOKUP_BY_NAME), 2 * set);
}

#[tokio::test]
async fn an_entry_that_turns_the_filter_off_gets_none() {
    let s = setup(r#"{"networkFilter": false}"#, None).await;
    let inst = s.provider.create(&request(1), &NoProgress).await.unwrap();
    assert!(
        s.fake
            .nwfilter_xml(&names::nwfilter("home", None))
            .is_none()
    );
    let dom = s.fake.domain(&inst.id.name).unwrap();
    assert!(!dom.xml.contains("filterref"), "{}", dom.xml);
    assert_eq!(s.fake.calls(procs::NWFILTER_DEFINE_XML), 0);
}

#[tokio::test]
async fn a_missing_filter_fails_the_start_as_on_libvirtd() {
    use libvirt_remote::{Client, OpenOptions};
    let fake = FakeLibvirt::new();
    let c = Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap();
    let dom = c
        .domain_define_xml(
            "<domain type='qemu'><name>d</name><memory>65536</memory><vcpu>1</vcpu>\
             <devices><interface type='network'><source network='default'/>\
             <filterref filter='absent'/></interface></devices></domain>",
            0,
        )
        .await
        .unwrap();
    let e = c.domain_create(&dom).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(1), "{e}");
    assert!(
        e.to_string()
            .contains("referenced filter 'absent' is missing"),
        "{e}"
    );
    c.nwfilter_define_xml("<filter name='absent' chain='root'/>")
        .await
        .unwrap();
    c.domain_create(&dom).await.unwrap();
    let f = c.nwfilter_lookup_by_name("absent").await.unwrap();
    assert_eq!(
        c.nwfilter_undefine(&f).await.unwrap_err().libvirt_code(),
        Some(55)
    );
    c.close();
}
