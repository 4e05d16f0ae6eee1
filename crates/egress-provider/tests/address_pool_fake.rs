//! Declared egress addresses through `LibvirtProvider` against libvirt-fake: each create on a
//! host with an address pool gets its own address, recorded in the mark and configured in the
//! seed's network-config; concurrent creates never share one; a restarted provider rebuilds
//! the allocations from the marks (other entries' and installations' included) before
//! allocating; an address comes back only after the instance holding it is deleted; a pinned
//! address taken or outside the pool is Permanent naming the address (never its holder) or the ranges; an
//! exhausted pool is QuotaExceeded naming host and family, and nothing is defined for it. A
//! delete that fails, or a failed create whose cleanup could not remove its domain, leaves
//! the address held: another Proxy asking for it is refused until the domain is gone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_support;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use egress_provider::libvirt::address_pool::{AddressPool, FamilyPool};
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::fetch::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::libvirt::{mark, names};
use egress_provider::{
    CreateRequest, ErrorClass, InstanceState, NoProgress, Provider, ProviderError, ProxyUid,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{DomainSpec, FakeLibvirt, NetworkSpec, PoolSpec};
use libvirt_remote::Transport;
use libvirt_remote::proto::procs;

const GIB: u64 = 1 << 30;
const POOL: &str = "images";
const ENTRY: &str = "home";
/// Deadline for any one provider call here (the fake answers in microseconds).
const CALL_BUDGET: std::time::Duration = std::time::Duration::from_secs(30);

struct FakeConnector(FakeLibvirt);

#[async_trait]
impl Connector for FakeConnector {
    async fn connect(&self, _host: &HostConfig) -> Result<Transport, ProviderError> {
        Ok(self.0.connect_duplex())
    }
}

struct Setup {
    fake: FakeLibvirt,
    url: String,
    sha: String,
    ranges: Vec<String>,
}

fn host(ranges: &[String]) -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "h1.invalid".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: None,
        network: Some("default".into()),
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 1,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 16,
        guest_cidr: Vec::new(),
        address_pool: Some(AddressPool {
            ipv4: Some(FamilyPool {
                prefix: "203.0.113.0/24".into(),
                gateway: "203.0.113.1".into(),
                ranges: ranges.to_vec(),
            }),
            ipv6: None,
            dns: vec!["203.0.113.53".into()],
            access: None,
            hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        }),
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
    }
}

/// A fake host with a network and a pool, and an image server; `ranges` is the IPv4 pool.
async fn setup(ranges: &[&str]) -> (Setup, ImageServer) {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 * GIB))
        .unwrap();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    (
        Setup {
            fake,
            url,
            sha: sha(&image),
            ranges: ranges.iter().map(|s| s.to_string()).collect(),
        },
        server,
    )
}

impl Setup {
    /// A provider over the fake (a new one is a restarted operator).
    fn provider(&self) -> LibvirtProvider {
        let mut images = BTreeMap::new();
        images.insert(
            "tiny".to_string(),
            ImageSpec {
                url: self.url.clone(),
                sha256: Some(self.sha.clone()),
                format: ImageFormat::Qcow2,
                firmware: Default::default(),
                ca_file: None,
            },
        );
        let entry = LibvirtEntry {
            name: ENTRY.into(),
            hosts: vec![host(&self.ranges)],
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
            Arc::new(FakeConnector(self.fake.clone())),
            PoolOptions::default(),
        )
        .unwrap();
        LibvirtProvider::new(pool, FetchOptions::default(), CheckOptions::default())
    }

    fn mark_addresses(&self, u: &ProxyUid) -> Vec<IpAddr> {
        let xml = self
            .fake
            .domain_metadata(&names::domain(ENTRY, u), mark::NAMESPACE)
            .unwrap();
        mark::parse(&xml, ENTRY, SystemTime::now())
            .unwrap()
            .addresses
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn request(u: ProxyUid, pinned: &[&str]) -> CreateRequest {
    CreateRequest {
        uid: u,
        display_name: "default/p".into(),
        host: "h1".into(),
        image: "tiny".into(),
        disk_gib: 4,
        memory_mib: 256,
        vcpus: 1,
        user_data: "#cloud-config\n{}\n".into(),
        pinned_egress: pinned.iter().map(|s| s.parse().unwrap()).collect(),
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal: true,
        replaces: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn create(
    p: &LibvirtProvider,
    u: ProxyUid,
    pinned: &[&str],
) -> Result<egress_provider::Instance, ProviderError> {
    tokio::time::timeout(CALL_BUDGET, p.create(&request(u, pinned), &NoProgress))
        .await
        .expect("create within its budget")
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn each_create_gets_its_own_address_in_the_mark_the_seed_and_the_instance() {
    let (s, _srv) = setup(&["203.0.113.10-203.0.113.20"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &[]).await.unwrap();
    let b = create(&p, uid(2), &[]).await.unwrap();
    assert_eq!(a.egress, vec![ip("203.0.113.10")]);
    assert_eq!(b.egress, vec![ip("203.0.113.11")]);
    // The configured address is the instance's address: no DHCP to ask.
    assert_eq!(a.ip, Some(ip("203.0.113.10")));
    assert_eq!(a.state, InstanceState::Running);
    assert_eq!(s.mark_addresses(&uid(1)), a.egress);
    assert_eq!(s.mark_addresses(&uid(2)), b.egress);
    // The seed's network-config: our NIC by MAC, static address and prefix, gateway, DNS.
    let seed = s
        .fake
        .volume_content(POOL, &names::seed(ENTRY, &uid(1)))
        .unwrap();
    for want in [
        format!("macaddress: \"{}\"", names::mac(ENTRY, &uid(1))),
        "\"203.0.113.10/24\"".to_owned(),
        "via: \"203.0.113.1\"".to_owned(),
        "dhcp4: false".to_owned(),
        "- \"203.0.113.53\"".to_owned(),
    ] {
        assert!(contains(&seed, &want), "the seed lacks {want}");
    }
    assert!(!contains(&seed, "203.0.113.11"), "only its own address");
    // get() reads them back from the mark; a retried create gets the same address.
    let got = p.get(&a.id, &uid(1)).await.unwrap();
    assert_eq!(
        (got.egress, got.ip, got.state),
        (a.egress.clone(), a.ip, InstanceState::Running)
    );
    let again = create(&p, uid(1), &[]).await.unwrap();
    assert_eq!(again.egress, a.egress);
    // check() reports the pool's usage.
    let r = p.check().await;
    let usage = &r[0].addresses;
    assert_eq!(usage.len(), 1, "{r:?}");
    assert_eq!(
        (usage[0].family, usage[0].size, usage[0].held),
        ("IPv4", 11, 2)
    );
}

#[tokio::test]
async fn concurrent_creates_never_share_an_address_and_the_one_too_many_is_quota() {
    let (s, _srv) = setup(&["203.0.113.10-203.0.113.17"]).await;
    let p = s.provider();
    let creates = (1..=9u8).map(|n| create(&p, uid(n), &[]));
    let results = futures_util::future::join_all(creates).await;
    let mut got = HashSet::new();
    let mut refused = Vec::new();
    for (n, r) in (1..=9u8).zip(results) {
        match r {
            Ok(i) => {
                assert_eq!(i.egress.len(), 1);
                assert!(got.insert(i.egress[0]), "{} given twice", i.egress[0]);
            }
            Err(e) => refused.push((n, e)),
        }
    }
    assert_eq!(got.len(), 8);
    let [(n, e)] = refused.as_slice() else {
        panic!("exactly one create must be refused: {refused:?}")
    };
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
    assert!(
        e.message.contains("host h1") && e.message.contains("IPv4"),
        "{}",
        e.message
    );
    assert!(
        s.fake.domain(&names::domain(ENTRY, &uid(*n))).is_none(),
        "nothing defined for the refused create"
    );
    assert!(
        !s.fake
            .volumes(POOL)
            .unwrap()
            .contains(&names::seed(ENTRY, &uid(*n))),
        "no seed for the refused create"
    );
}

#[tokio::test]
async fn a_restarted_provider_rebuilds_from_every_mark_before_allocating() {
    let (s, _srv) = setup(&["203.0.113.10-203.0.113.13"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &[]).await.unwrap();
    let b = create(&p, uid(2), &[]).await.unwrap();
    drop(p);
    // Another installation's instance on the same host holds .12 (its mark says so).
    let other = uid(0xee);
    s.fake
        .add_domain(DomainSpec::new("someone-else").metadata(
            mark::NAMESPACE,
            mark::render_with(
                &other,
                "lab",
                Some("site-b"),
                &[ip("203.0.113.12")],
                SystemTime::now(),
            ),
        ))
        .unwrap();
    let p2 = s.provider();
    // A retried create of A gets what A holds; a new one gets the only free address.
    assert_eq!(create(&p2, uid(1), &[]).await.unwrap().egress, a.egress);
    let c = create(&p2, uid(3), &[]).await.unwrap();
    assert_eq!(
        c.egress,
        vec![ip("203.0.113.13")],
        "not .10/.11 (ours) nor .12 (theirs)"
    );
    assert_ne!(c.egress, b.egress);
    let e = create(&p2, uid(4), &[]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
}

#[tokio::test]
async fn an_address_comes_back_only_after_its_instance_is_deleted() {
    let (s, _srv) = setup(&["203.0.113.10"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &[]).await.unwrap();
    assert_eq!(a.egress, vec![ip("203.0.113.10")]);
    let e = create(&p, uid(2), &[]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
    assert!(s.fake.domain(&names::domain(ENTRY, &uid(2))).is_none());
    // A complete listing that still shows A keeps it held.
    let listed = p.list_owned().await.unwrap();
    assert_eq!(listed.len(), 1);
    let e = create(&p, uid(2), &[]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
    // Deleted: the address goes to the next create.
    p.delete("h1", &uid(1)).await.unwrap();
    let b = create(&p, uid(2), &[]).await.unwrap();
    assert_eq!(b.egress, vec![ip("203.0.113.10")]);
    // A restarted provider sees B's mark, not A's.
    let p2 = s.provider();
    let e = create(&p2, uid(1), &[]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
}

#[tokio::test]
async fn a_pinned_address_is_given_exactly_or_refused_naming_the_address_or_the_ranges() {
    let (s, _srv) = setup(&["203.0.113.10-203.0.113.20"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &["203.0.113.15"]).await.unwrap();
    assert_eq!(a.egress, vec![ip("203.0.113.15")]);
    assert_eq!(s.mark_addresses(&uid(1)), a.egress);
    let e = create(&p, uid(2), &["203.0.113.15"]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    // The holder may be another tenant's instance: it is not named.
    assert!(
        e.message.contains("203.0.113.15")
            && e.message.contains("another instance")
            && !e.message.contains(&uid(1).simple().to_string()),
        "names the address, not the holder: {}",
        e.message
    );
    assert!(s.fake.domain(&names::domain(ENTRY, &uid(2))).is_none());
    let e = create(&p, uid(2), &["203.0.113.30"]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("203.0.113.10-203.0.113.20"),
        "names the ranges: {}",
        e.message
    );
    let e = create(&p, uid(2), &["2001:db8::5"]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(s.fake.domain(&names::domain(ENTRY, &uid(2))).is_none());
    // The refusals held nothing: B then gets a fresh address.
    let b = create(&p, uid(2), &[]).await.unwrap();
    assert_eq!(b.egress, vec![ip("203.0.113.10")]);
}

#[tokio::test]
async fn a_failed_create_that_left_no_domain_holds_nothing() {
    let (s, _srv) = setup(&["203.0.113.10"]).await;
    let p = s.provider();
    // Start fails once: the domain was defined, and the cleanup undefines it.
    s.fake.faults().fail_calls(
        procs::DOMAIN_CREATE,
        1,
        libvirt_fake::domains::QEMU,
        "internal error: start failed",
        Some(1),
    );
    let e = create(&p, uid(1), &[]).await.unwrap_err();
    assert!(e.message.contains("start failed"), "{e}");
    assert!(s.fake.domain(&names::domain(ENTRY, &uid(1))).is_none());
    // Its address is free again: the host does not look full, and another Proxy gets it.
    assert_eq!(p.check().await[0].addresses[0].held, 0);
    let b = create(&p, uid(2), &[]).await.unwrap();
    assert_eq!(b.egress, vec![ip("203.0.113.10")]);
}

/// Another Proxy (B) asking for the pool's only address, .10, is refused: pinned, saying it
/// is held without naming the holder `holder`'s domain (another tenant's); unpinned, QuotaExceeded. Nothing is defined for B, and the host
/// reports the address held.
async fn refused_while_held(s: &Setup, p: &LibvirtProvider, holder: ProxyUid, b: ProxyUid) {
    let e = create(p, b, &["203.0.113.10"]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("already held"),
        "says why: {}",
        e.message
    );
    assert!(
        !e.message.contains(&names::domain(ENTRY, &holder)),
        "names no other tenant's domain: {}",
        e.message
    );
    let e = create(p, b, &[]).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::QuotaExceeded, "{e}");
    assert!(s.fake.domain(&names::domain(ENTRY, &b)).is_none());
    assert_eq!(p.check().await[0].addresses[0].held, 1, "still held");
}

#[tokio::test]
async fn a_failed_delete_keeps_the_address_held_until_a_delete_succeeds() {
    let (s, _srv) = setup(&["203.0.113.10"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &[]).await.unwrap();
    assert_eq!(a.egress, vec![ip("203.0.113.10")]);
    // The delete fails at the undefine: the domain, and its mark holding .10, stay.
    s.fake.faults().fail_calls(
        procs::DOMAIN_UNDEFINE_FLAGS,
        1,
        libvirt_fake::domains::QEMU,
        "internal error: undefine failed",
        Some(1),
    );
    let e = tokio::time::timeout(CALL_BUDGET, p.delete("h1", &uid(1)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.message.contains("undefine failed"), "{e}");
    assert!(s.fake.domain(&names::domain(ENTRY, &uid(1))).is_some());
    assert_eq!(s.mark_addresses(&uid(1)), a.egress);
    refused_while_held(&s, &p, uid(1), uid(2)).await;
    // A complete listing still shows A: still held.
    assert_eq!(p.list_owned().await.unwrap().len(), 1);
    refused_while_held(&s, &p, uid(1), uid(2)).await;
    // The delete succeeds: the address goes to B.
    p.delete("h1", &uid(1)).await.unwrap();
    let b = create(&p, uid(2), &["203.0.113.10"]).await.unwrap();
    assert_eq!(b.egress, vec![ip("203.0.113.10")]);
}

#[tokio::test]
async fn a_failed_create_whose_cleanup_left_its_domain_keeps_its_address() {
    let (s, _srv) = setup(&["203.0.113.10"]).await;
    let p = s.provider();
    // Start fails, and so does the cleanup's undefine: the domain (with its mark naming .10)
    // is left on the host.
    s.fake.faults().fail_calls(
        procs::DOMAIN_CREATE,
        1,
        libvirt_fake::domains::QEMU,
        "internal error: start failed",
        Some(1),
    );
    s.fake.faults().fail_calls(
        procs::DOMAIN_UNDEFINE_FLAGS,
        1,
        libvirt_fake::domains::QEMU,
        "internal error: undefine failed",
        Some(1),
    );
    let e = create(&p, uid(1), &[]).await.unwrap_err();
    assert!(e.message.contains("start failed"), "{e}");
    assert!(
        s.fake.domain(&names::domain(ENTRY, &uid(1))).is_some(),
        "the cleanup could not remove the domain"
    );
    assert_eq!(s.mark_addresses(&uid(1)), vec![ip("203.0.113.10")]);
    refused_while_held(&s, &p, uid(1), uid(2)).await;
    // The retry of A removes the leftover and recreates it, with the same address.
    let a = create(&p, uid(1), &[]).await.unwrap();
    assert_eq!(a.egress, vec![ip("203.0.113.10")]);
    assert_eq!(s.mark_addresses(&uid(1)), a.egress);
    refused_while_held(&s, &p, uid(1), uid(2)).await;
}

/// A create of `u` asking for `prefer` again (re-created in place), pinning nothing.
async fn create_preferring(
    p: &LibvirtProvider,
    u: ProxyUid,
    prefer: &[&str],
) -> Result<egress_provider::Instance, ProviderError> {
    let mut req = request(u, &[]);
    req.prefer_egress = prefer.iter().map(|s| s.parse().unwrap()).collect();
    tokio::time::timeout(CALL_BUDGET, p.create(&req, &NoProgress))
        .await
        .expect("create within its budget")
}

#[tokio::test]
async fn a_proxy_re_created_in_place_gets_its_previous_address_when_it_is_still_free() {
    let (s, _srv) = setup(&["203.0.113.10-203.0.113.20"]).await;
    let p = s.provider();
    let a = create(&p, uid(1), &[]).await.unwrap();
    let b = create(&p, uid(2), &[]).await.unwrap();
    assert_eq!(
        (a.egress.clone(), b.egress.clone()),
        (vec![ip("203.0.113.10")], vec![ip("203.0.113.11")])
    );
    // A's instance is replaced in place (deleted, created again): it gets .10 back, not the
    // next fresh address (.12).
    p.delete("h1", &uid(1)).await.unwrap();
    let again = create_preferring(&p, uid(1), &["203.0.113.10"])
        .await
        .unwrap();
    assert_eq!(again.egress, a.egress);
    assert_eq!(s.mark_addresses(&uid(1)), a.egress);
    // An address another Proxy holds, one reserved for another, one outside the pool, or a
    // family the pool lacks is no reason to fail: the create allocates as usual.
    p.delete("h1", &uid(1)).await.unwrap();
    let c = create_preferring(&p, uid(1), &["203.0.113.11"])
        .await
        .unwrap();
    assert_eq!(c.egress, vec![ip("203.0.113.12")], "B keeps .11");
    p.delete("h1", &uid(1)).await.unwrap();
    let mut req = request(uid(1), &[]);
    req.prefer_egress = vec![ip("203.0.113.12")];
    req.reserved = vec![ip("203.0.113.12")];
    let d = tokio::time::timeout(CALL_BUDGET, p.create(&req, &NoProgress))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(d.egress, vec![ip("203.0.113.12")], "reserved for another");
    for prefer in ["203.0.113.30", "2001:db8::5"] {
        p.delete("h1", &uid(1)).await.unwrap();
        let e = create_preferring(&p, uid(1), &[prefer]).await.unwrap();
        assert_eq!(e.egress.len(), 1, "{prefer}: {:?}", e.egress);
        assert!(
            e.egress[0].is_ipv4() && e.egress[0] != ip(prefer),
            "{prefer}: {:?}",
            e.egress
        );
    }
    // A pinned address wins over a preference.
    p.delete("h1", &uid(1)).await.unwrap();
    let mut req = request(uid(1), &["203.0.113.19"]);
    req.prefer_egress = vec![ip("203.0.113.10")];
    let pinned = tokio::time::timeout(CALL_BUDGET, p.create(&req, &NoProgress))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pinned.egress, vec![ip("203.0.113.19")]);
}
