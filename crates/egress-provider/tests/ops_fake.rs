//! get, delete and list_owned of the libvirt provider against libvirt-fake: the fault paths
//! and every finding these operations own (M1, L6, M2, M3, L5, M14, H3, M15, E2, L9, M18).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{HostConfig, VirtType};
use egress_provider::libvirt::ops::{delete, get, list};
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, InstanceState, ProviderId, ProxyUid};
use libvirt_fake::{
    ConnHandle, DomainSpec, FakeLibvirt, Interface, Lease, NetworkSpec, PoolSpec, VolumeSpec,
    codes, domain_state, domains,
};
use libvirt_remote::client::undefine;
use libvirt_remote::proto::{DomainFlagsArgs, procs};
use libvirt_remote::{Client, ConnectionConfig, KillSwitch, OpenOptions, Transport, xdr};
use tokio::io::AsyncWrite;

const ENTRY: &str = "home";
const POOL: &str = "default";
/// Delay the fake adds to every call in the tests that cut the connection mid-operation, so
/// the cut lands while a chosen call is in flight (ordering only; nothing asserts timing).
const CUT_DELAY: Duration = Duration::from_millis(20);
/// Call deadline for the tests that freeze the fake (the call must end by its deadline).
const SHORT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

fn host() -> HostConfig {
    HostConfig {
        name: "h1".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: POOL.into(),
        bridge: Some("br0".into()),
        network: None,
        virt_type: VirtType::Auto,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        // The bridge's subnet: where the guests' agents below report their addresses.
        guest_cidr: vec!["192.168.122.0/24".into()],
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

fn id_of(u: &ProxyUid) -> ProviderId {
    ProviderId {
        entry: ENTRY.into(),
        host: "h1".into(),
        name: names::domain(ENTRY, u),
    }
}

fn created() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000)
}

/// The mark as libvirt hands it back (default namespace, re-indented), with any UID text.
fn mark_xml(uid_text: &str, entry: &str, created_at: &str) -> String {
    format!(
        "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{uid_text}</uid>\n  \
         <entry>{entry}</entry>\n  <createdAt>{created_at}</createdAt>\n</instance>",
        mark::NAMESPACE
    )
}

/// A domain named for `u` in ENTRY and carrying our mark for `u`.
fn ours(u: &ProxyUid) -> DomainSpec {
    DomainSpec::new(names::domain(ENTRY, u))
        .metadata(mark::NAMESPACE, mark::render(u, ENTRY, created()))
}

fn fake_with_pool() -> FakeLibvirt {
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL)).unwrap();
    fake
}

fn add_volumes(fake: &FakeLibvirt, u: &ProxyUid) {
    fake.add_volume(
        POOL,
        VolumeSpec::new(names::overlay(ENTRY, u), 1 << 30).format("qcow2"),
    )
    .unwrap();
    fake.add_volume(POOL, VolumeSpec::new(names::seed(ENTRY, u), 1 << 20))
        .unwrap();
}

async fn open(fake: &FakeLibvirt) -> Client {
    Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap()
}

async fn open_with_handle(
    fake: &FakeLibvirt,
    call_timeout: Option<Duration>,
) -> (Client, ConnHandle) {
    let (t, h) = fake.duplex();
    let mut opts = OpenOptions::default();
    if let Some(ct) = call_timeout {
        opts.connection = ConnectionConfig {
            call_timeout: ct,
            ..ConnectionConfig::default()
        };
    }
    (Client::open(t, opts).await.unwrap(), h)
}

fn vols(fake: &FakeLibvirt) -> Vec<String> {
    let mut v = fake.volumes(POOL).unwrap();
    v.sort();
    v
}

// ---------------------------------------------------------------- get: state

#[tokio::test]
async fn a_domain_paused_after_an_io_error_is_paused_with_its_reason_never_stopped() {
    // finding: M1
    let fake = fake_with_pool();
    let u = uid(1);
    // VIR_DOMAIN_PAUSED_IOERROR = 5: QEMU paused the guest because the host's storage is full.
    fake.add_domain(ours(&u).state(domain_state::PAUSED, 5))
        .unwrap();
    let c = open(&fake).await;
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    let InstanceState::Paused { reason } = &inst.state else {
        panic!("an I/O-error pause must be Paused, got {:?}", inst.state);
    };
    assert!(reason.contains("I/O error"), "{reason}");
    assert_eq!(inst.uid, u);

    fake.set_domain_state(&names::domain(ENTRY, &u), domain_state::PMSUSPENDED, 0)
        .unwrap();
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert!(
        matches!(inst.state, InstanceState::Paused { .. }),
        "pmsuspended must be Paused, got {:?}",
        inst.state
    );

    fake.set_domain_state(&names::domain(ENTRY, &u), domain_state::SHUTOFF, 1)
        .unwrap();
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert!(
        matches!(inst.state, InstanceState::Stopped { .. }),
        "{:?}",
        inst.state
    );
}

#[tokio::test]
async fn a_vanished_domain_is_not_found_whenever_it_vanishes() {
    // finding: L6
    let fake = fake_with_pool();
    let u = uid(2);
    let c = open(&fake).await;
    let e = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");

    // It vanishes between the lookup and the state read...
    fake.add_domain(ours(&u).running()).unwrap();
    let msg = "Domain not found: no domain with matching uuid";
    fake.faults().fail_calls(
        procs::DOMAIN_GET_STATE,
        codes::NO_DOMAIN,
        domains::QEMU,
        msg,
        Some(1),
    );
    let e = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");

    // ...and while its address is read: never Provisioning.
    fake.faults().fail_calls(
        procs::DOMAIN_INTERFACE_ADDRESSES,
        codes::NO_DOMAIN,
        domains::QEMU,
        msg,
        Some(1),
    );
    let e = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");
}

// ---------------------------------------------------------------- get: address

#[tokio::test]
async fn the_address_is_that_of_our_nic_even_when_docker0_comes_first() {
    // finding: M14
    let fake = fake_with_pool();
    let u = uid(3);
    let mac = names::mac(ENTRY, &u);
    fake.add_domain(
        ours(&u)
            .running()
            .interface(Interface::new("lo", "00:00:00:00:00:00").addr("127.0.0.1", 8))
            .interface(Interface::new("docker0", "02:42:ac:11:00:01").addr("172.17.0.1", 16))
            .interface(Interface::new("tailscale0", "").addr("100.64.0.7", 32))
            .interface(
                Interface::new("eth0", mac.to_uppercase())
                    .addr("fe80::5054:ff:fe00:1", 64)
                    .addr("192.168.122.50", 24),
            ),
    )
    .unwrap();
    let c = open(&fake).await;
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.ip, Some("192.168.122.50".parse().unwrap()));
    assert_eq!(inst.mac, mac);

    // Only docker0 has an address yet: no address of ours, so Provisioning.
    fake.set_interfaces(
        &names::domain(ENTRY, &u),
        vec![
            Interface::new("docker0", "02:42:ac:11:00:01").addr("172.17.0.1", 16),
            Interface::new("eth0", mac.clone()),
        ],
    )
    .unwrap();
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(inst.ip, None);
}

#[tokio::test]
async fn a_guest_created_with_the_legacy_mac_keeps_its_address_after_an_upgrade() {
    // A guest created before the 40-bit MAC derivation has QEMU's 52:54:00 prefix and 24 hash
    // bits; its domain is never redefined, so the lookup must still find our NIC by that MAC
    // (its DHCP lease and the agent's report), and report the MAC it has.
    let fake = fake_with_pool();
    let u = uid(0x31);
    let legacy = names::legacy_mac(ENTRY, &u);
    assert_ne!(legacy, names::mac(ENTRY, &u));
    fake.add_network(
        NetworkSpec::new("egress")
            .xml(
                "<network><name>egress</name><bridge name='virbr0'/>\
                 <ip address='192.168.100.1' prefix='24'/></network>",
            )
            .lease(Lease::new(legacy.clone(), "192.168.100.31", 24)),
    )
    .unwrap();
    fake.add_domain(
        ours(&u)
            .running()
            .guest_agent(false)
            .interface(Interface::new("eth0", legacy.clone()).network("egress")),
    )
    .unwrap();
    let mut h = host();
    h.bridge = None;
    h.network = Some("egress".into());
    h.guest_cidr = Vec::new();
    let c = open(&fake).await;
    let inst = get::get(&c, ENTRY, None, &h, &id_of(&u), &u).await.unwrap();
    assert_eq!(inst.ip, Some("192.168.100.31".parse().unwrap()));
    assert_eq!(inst.state, InstanceState::Running);
    assert_eq!(inst.mac, legacy);

    // The agent path (a bridge host): the same.
    let u2 = uid(0x32);
    let legacy2 = names::legacy_mac(ENTRY, &u2);
    fake.add_domain(
        ours(&u2)
            .running()
            .interface(Interface::new("eth0", legacy2.clone()).addr("192.168.122.32", 24)),
    )
    .unwrap();
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u2), &u2)
        .await
        .unwrap();
    assert_eq!(inst.ip, Some("192.168.122.32".parse().unwrap()));
    assert_eq!(inst.mac, legacy2);
}

#[tokio::test]
async fn without_an_agent_the_dhcp_lease_of_our_mac_gives_the_address() {
    let fake = fake_with_pool();
    let u = uid(4);
    let mac = names::mac(ENTRY, &u);
    fake.add_network(
        NetworkSpec::new("egress")
            .xml(
                "<network><name>egress</name><bridge name='virbr0'/>\
                 <ip address='192.168.100.1' prefix='24'/></network>",
            )
            .lease(Lease::new("52:54:00:99:99:99", "192.168.100.9", 24))
            .lease(Lease::new(mac.clone(), "192.168.100.20", 24)),
    )
    .unwrap();
    fake.add_domain(
        ours(&u)
            .running()
            .guest_agent(false)
            .interface(Interface::new("eth0", mac.clone()).network("egress")),
    )
    .unwrap();
    let mut h = host();
    h.bridge = None;
    h.network = Some("egress".into());
    h.guest_cidr = Vec::new();
    let c = open(&fake).await;
    let inst = get::get(&c, ENTRY, None, &h, &id_of(&u), &u).await.unwrap();
    assert_eq!(inst.ip, Some("192.168.100.20".parse().unwrap()));
    assert_eq!(inst.state, InstanceState::Running);
}

#[tokio::test]
async fn an_unresponsive_or_missing_agent_means_no_address_yet() {
    // finding: H3
    let fake = fake_with_pool();
    let u = uid(5);
    let mac = names::mac(ENTRY, &u);
    fake.add_domain(
        ours(&u)
            .running()
            .interface(Interface::new("eth0", mac).addr("192.168.122.51", 24)),
    )
    .unwrap();
    fake.faults().agent_unresponsive(true); // code 86
    let c = open(&fake).await;
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert_eq!((inst.state, inst.ip), (InstanceState::Provisioning, None));

    fake.faults().agent_unresponsive(false);
    fake.set_guest_agent(&names::domain(ENTRY, &u), false)
        .unwrap(); // code 74
    let inst = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
        .await
        .unwrap();
    assert_eq!((inst.state, inst.ip), (InstanceState::Provisioning, None));
}

#[tokio::test]
async fn a_connection_that_dies_during_the_address_read_fails_get_transient() {
    // finding: H3
    let fake = fake_with_pool();
    let u = uid(6);
    let mac = names::mac(ENTRY, &u);
    fake.add_domain(
        ours(&u)
            .running()
            .interface(Interface::new("eth0", mac).addr("192.168.122.52", 24)),
    )
    .unwrap();
    let (c, handle) = open_with_handle(&fake, None).await;
    fake.faults().delay_replies(Some(CUT_DELAY));
    let (h, id) = (host(), id_of(&u));
    let (r, ()) = tokio::join!(get::get(&c, ENTRY, None, &h, &id, &u), async {
        fake.wait_for_calls(procs::DOMAIN_INTERFACE_ADDRESSES, 1)
            .await;
        handle.close();
    });
    let e = r.expect_err("a dead connection must never read as 'no address yet'");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    assert!(e.message.contains("address"), "{e}");
}

#[tokio::test]
async fn a_connection_that_freezes_during_the_address_read_fails_get_transient() {
    // finding: H3
    let fake = fake_with_pool();
    let u = uid(7);
    let mac = names::mac(ENTRY, &u);
    fake.add_domain(
        ours(&u)
            .running()
            .interface(Interface::new("eth0", mac).addr("192.168.122.53", 24)),
    )
    .unwrap();
    let (c, handle) = open_with_handle(&fake, Some(SHORT_CALL_TIMEOUT)).await;
    fake.faults().delay_replies(Some(CUT_DELAY));
    let (h, id) = (host(), id_of(&u));
    let (r, ()) = tokio::join!(get::get(&c, ENTRY, None, &h, &id, &u), async {
        fake.wait_for_calls(procs::DOMAIN_INTERFACE_ADDRESSES, 1)
            .await;
        handle.faults().freeze();
    });
    let e = r.expect_err("a frozen connection must never read as 'no address yet'");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
}

// ---------------------------------------------------------------- ownership

/// Same-named domains that are not ours for `u`, each with our-named volumes beside it.
fn not_ours(u: &ProxyUid) -> Vec<(&'static str, DomainSpec)> {
    let name = names::domain(ENTRY, u);
    let t = "2026-11-29T10:00:00Z";
    vec![
        ("unmarked", DomainSpec::new(&name).running()),
        (
            "foreign namespace",
            DomainSpec::new(&name)
                .running()
                .metadata("https://kvm.example/v1", mark_xml(&u.canonical(), ENTRY, t)),
        ),
        (
            "another UID",
            DomainSpec::new(&name)
                .running()
                .metadata(mark::NAMESPACE, mark::render(&uid(0xee), ENTRY, created())),
        ),
        (
            "another entry",
            DomainSpec::new(&name)
                .running()
                .metadata(mark::NAMESPACE, mark_xml(&u.canonical(), "lab", t)),
        ),
        (
            "padded UID",
            DomainSpec::new(&name)
                .running()
                .metadata(mark::NAMESPACE, mark_xml(&format!(" {u}\n"), ENTRY, t)),
        ),
    ]
}

#[tokio::test]
async fn a_domain_without_our_mark_for_the_uid_is_not_found_and_never_deleted() {
    // finding: M2
    let u = uid(8);
    for (what, spec) in not_ours(&u) {
        let fake = fake_with_pool();
        fake.add_domain(spec).unwrap();
        add_volumes(&fake, &u);
        let before = vols(&fake);
        let c = open(&fake).await;

        let e = get::get(&c, ENTRY, None, &host(), &id_of(&u), &u)
            .await
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::NotFound, "{what}: {e}");

        let e = delete::delete(&c, ENTRY, None, &host(), &u)
            .await
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{what}: {e}");
        assert!(
            e.message.contains("refusing to delete domain"),
            "{what}: {e}"
        );
        assert!(e.message.contains(&names::domain(ENTRY, &u)), "{what}: {e}");
        let d = fake
            .domain(&names::domain(ENTRY, &u))
            .unwrap_or_else(|| panic!("{what}: the foreign domain was removed"));
        assert_eq!(d.state, domain_state::RUNNING, "{what}: it was stopped");
        assert!(d.persistent, "{what}: it was undefined");
        assert_eq!(vols(&fake), before, "{what}: its volumes were touched");
        for p in [
            procs::DOMAIN_DESTROY_FLAGS,
            procs::DOMAIN_UNDEFINE_FLAGS,
            procs::STORAGE_VOL_DELETE,
        ] {
            assert_eq!(fake.calls(p), 0, "{what}: procedure {p} was called");
        }
    }
}

#[tokio::test]
async fn a_provider_id_naming_a_foreign_domain_is_not_found() {
    // finding: M2
    let fake = fake_with_pool();
    let u = uid(9);
    fake.add_domain(DomainSpec::new("docker-29").running())
        .unwrap();
    fake.add_domain(ours(&u).running()).unwrap();
    let c = open(&fake).await;
    let tampered = ProviderId {
        name: "docker-29".into(),
        ..id_of(&u)
    };
    let e = get::get(&c, ENTRY, None, &host(), &tampered, &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");
    // Another entry's providerID (a re-typed entry) is not ours either.
    let other_entry = ProviderId {
        entry: "lab".into(),
        ..id_of(&u)
    };
    let e = get::get(&c, ENTRY, None, &host(), &other_entry, &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");
    // Our domain, asked for with another UID, is not that UID's.
    let e = get::get(&c, ENTRY, None, &host(), &id_of(&u), &uid(10))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound, "{e}");
}

// ---------------------------------------------------------------- delete

#[tokio::test]
async fn delete_without_a_domain_removes_overlay_and_seed_and_keeps_the_base() {
    // finding: M3
    let fake = fake_with_pool();
    let u = uid(11);
    let other = uid(12);
    add_volumes(&fake, &u);
    add_volumes(&fake, &other);
    let base = names::base(
        ENTRY,
        names::ImageSource::Catalogue("debian-12"),
        &"a".repeat(64),
        egress_provider::libvirt::config::ImageFormat::Qcow2,
    );
    fake.add_volume(POOL, VolumeSpec::new(&base, 3 << 30).format("qcow2"))
        .unwrap();
    fake.add_volume(POOL, VolumeSpec::new("unrelated.img", 1 << 20))
        .unwrap();
    let c = open(&fake).await;

    delete::delete(&c, ENTRY, None, &host(), &u).await.unwrap();
    let left = vols(&fake);
    assert!(!left.contains(&names::overlay(ENTRY, &u)), "{left:?}");
    assert!(!left.contains(&names::seed(ENTRY, &u)), "{left:?}");
    for keep in [
        base.clone(),
        "unrelated.img".into(),
        names::overlay(ENTRY, &other),
        names::seed(ENTRY, &other),
    ] {
        assert!(left.contains(&keep), "{keep} was deleted: {left:?}");
    }
    // Idempotent: nothing left to remove is success.
    delete::delete(&c, ENTRY, None, &host(), &u).await.unwrap();
    assert_eq!(vols(&fake), left);
}

/// A writer that keeps a copy of everything the client sends.
struct Tee<W> {
    inner: W,
    log: Arc<Mutex<Vec<u8>>>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Tee<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.log.lock().unwrap().extend_from_slice(&buf[..*n]);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The `flags` of every DOMAIN_UNDEFINE_FLAGS call in the bytes a client sent.
fn undefine_flags_sent(wire: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 28 <= wire.len() {
        let len = u32::from_be_bytes(wire[pos..pos + 4].try_into().unwrap()) as usize;
        let proc_ = i32::from_be_bytes(wire[pos + 12..pos + 16].try_into().unwrap());
        if proc_ == procs::DOMAIN_UNDEFINE_FLAGS {
            let args: DomainFlagsArgs = xdr::from_bytes(&wire[pos + 28..pos + len]).unwrap();
            out.push(args.flags);
        }
        pos += len;
    }
    out
}

#[tokio::test]
async fn delete_destroys_and_undefines_with_every_metadata_flag_then_removes_volumes() {
    // finding: L5, M3
    let fake = fake_with_pool();
    let u = uid(13);
    fake.add_domain(ours(&u).running()).unwrap();
    add_volumes(&fake, &u);
    let (client_end, server_end) = tokio::io::duplex(libvirt_fake::DUPLEX_BUFFER);
    let _handle = fake.serve(server_end);
    let (r, w) = tokio::io::split(client_end);
    let log = Arc::new(Mutex::new(Vec::new()));
    let t = Transport::new(
        r,
        Tee {
            inner: w,
            log: log.clone(),
        },
        KillSwitch::noop(),
        "fake:tee",
    );
    let c = Client::open(t, OpenOptions::default()).await.unwrap();

    delete::delete(&c, ENTRY, None, &host(), &u).await.unwrap();
    assert!(fake.domain(&names::domain(ENTRY, &u)).is_none());
    assert_eq!(fake.calls(procs::DOMAIN_DESTROY_FLAGS), 1);
    let flags = undefine_flags_sent(&log.lock().unwrap());
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert_eq!(flags[0] & undefine::ALL_METADATA, undefine::ALL_METADATA);
    assert_ne!(
        flags[0] & undefine::CHECKPOINTS_METADATA,
        0,
        "{:#x}",
        flags[0]
    );
    assert!(vols(&fake).is_empty(), "{:?}", vols(&fake));
}

#[tokio::test]
async fn delete_of_a_shut_off_domain_ignores_not_running_and_succeeds_twice() {
    let fake = fake_with_pool();
    let u = uid(14);
    fake.add_domain(ours(&u)).unwrap(); // shut off
    add_volumes(&fake, &u);
    let c = open(&fake).await;
    delete::delete(&c, ENTRY, None, &host(), &u).await.unwrap();
    assert!(fake.domain(&names::domain(ENTRY, &u)).is_none());
    assert!(vols(&fake).is_empty());
    delete::delete(&c, ENTRY, None, &host(), &u).await.unwrap();
}

#[tokio::test]
async fn delete_fails_transient_when_the_connection_dies_and_reports_nothing_removed() {
    let fake = fake_with_pool();
    let u = uid(15);
    add_volumes(&fake, &u);
    let (c, handle) = open_with_handle(&fake, None).await;
    handle.close();
    handle.closed().await;
    let e = delete::delete(&c, ENTRY, None, &host(), &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    assert_eq!(vols(&fake).len(), 2);
}

#[tokio::test]
async fn delete_with_a_missing_pool_names_the_setting() {
    let fake = FakeLibvirt::new();
    let u = uid(16);
    let c = open(&fake).await;
    let e = delete::delete(&c, ENTRY, None, &host(), &u)
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent, "{e}");
    assert!(
        e.message.contains("`pool`") && e.message.contains(POOL),
        "{e}"
    );
}

// ---------------------------------------------------------------- list_owned

#[tokio::test]
async fn list_keeps_only_valid_marks_of_the_entry() {
    // finding: E2, M18
    let fake = fake_with_pool();
    let (a, b, c_uid, d) = (uid(20), uid(21), uid(22), uid(23));
    let t = "2026-11-29T10:00:00Z";
    // Ours, properly named.
    fake.add_domain(ours(&a).running()).unwrap();
    // Ours, but dated in the future: clamped to now (L9).
    fake.add_domain(DomainSpec::new(names::domain(ENTRY, &b)).metadata(
        mark::NAMESPACE,
        mark_xml(&b.canonical(), ENTRY, "2099-01-01T00:00:00Z"),
    ))
    .unwrap();
    // A valid mark on a domain whose name is not derived from its UID: listed, flagged.
    fake.add_domain(
        DomainSpec::new("renamed-by-hand")
            .metadata(mark::NAMESPACE, mark::render(&c_uid, ENTRY, created())),
    )
    .unwrap();
    // Padded UID (E2): skipped, never handed to GC.
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &d))
            .metadata(mark::NAMESPACE, mark_xml(&format!("\n  {d}\n  "), ENTRY, t)),
    )
    .unwrap();
    // Our mark's content under a foreign namespace (M18): skipped.
    let e = uid(24);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &e))
            .metadata("https://kvm.example/v1", mark_xml(&e.canonical(), ENTRY, t)),
    )
    .unwrap();
    // Another entry's mark, an unmarked domain: skipped.
    let f = uid(25);
    fake.add_domain(
        DomainSpec::new(names::domain("lab", &f))
            .metadata(mark::NAMESPACE, mark::render(&f, "lab", created())),
    )
    .unwrap();
    fake.add_domain(DomainSpec::new("docker-29").running())
        .unwrap();

    let c = open(&fake).await;
    let before = SystemTime::now();
    let mut got = list::list_owned(&c, ENTRY, None, "h1").await.unwrap();
    let after = SystemTime::now();
    got.sort_by_key(|o| o.uid);
    let uids: Vec<ProxyUid> = got.iter().map(|o| o.uid).collect();
    assert_eq!(uids, vec![a, b, c_uid], "{got:?}");
    assert!(got[0].name_matches_uid && got[1].name_matches_uid);
    assert!(
        !got[2].name_matches_uid,
        "a hand-renamed domain must be flagged"
    );
    assert_eq!(got[0].created_at, created());
    // The future mark reads as now (restamped at whole seconds, hence the second of slack).
    assert!(
        got[1].created_at >= before - Duration::from_secs(1) && got[1].created_at <= after,
        "a future mark must read as now"
    );
    assert_eq!(got[0].id, id_of(&a));
}

#[tokio::test]
async fn a_mark_dated_in_the_future_is_restamped_once_with_the_time_it_was_first_seen() {
    // finding: L9
    let fake = fake_with_pool();
    let (a, b, c_uid) = (uid(26), uid(27), uid(28));
    let far = "2099-01-01T00:00:00Z";
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &a))
            .running()
            .metadata(mark::NAMESPACE, mark_xml(&a.canonical(), ENTRY, far)),
    )
    .unwrap();
    // Dated in the future but under a name not derived from its UID: GC never collects it,
    // so the listing never writes to it.
    fake.add_domain(
        DomainSpec::new("renamed-by-hand")
            .metadata(mark::NAMESPACE, mark_xml(&b.canonical(), ENTRY, far)),
    )
    .unwrap();
    // A few seconds ahead (clock skew between replicas): clamped, not rewritten.
    let soon = SystemTime::now() + Duration::from_secs(20);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &c_uid))
            .metadata(mark::NAMESPACE, mark::render(&c_uid, ENTRY, soon)),
    )
    .unwrap();
    let c = open(&fake).await;
    let before = SystemTime::now() - Duration::from_secs(1);
    let first = list::list_owned(&c, ENTRY, None, "h1").await.unwrap();
    let after = SystemTime::now();
    let of = |l: &[egress_provider::OwnedInstance], u: ProxyUid| {
        l.iter().find(|o| o.uid == u).unwrap().created_at
    };
    let stamped = of(&first, a);
    assert!(stamped >= before && stamped <= after, "{stamped:?}");
    let stored = fake
        .domain_metadata(&names::domain(ENTRY, &a), mark::NAMESPACE)
        .unwrap();
    let m = mark::parse(&stored, ENTRY, SystemTime::now()).expect("still a valid mark");
    assert_eq!((m.uid, m.recorded_at), (a, stamped), "{stored}");
    assert!(
        fake.domain_metadata("renamed-by-hand", mark::NAMESPACE)
            .unwrap()
            .contains(far),
        "a domain GC may not collect is never written to"
    );
    assert!(
        fake.domain_metadata(&names::domain(ENTRY, &c_uid), mark::NAMESPACE)
            .unwrap()
            == mark::render(&c_uid, ENTRY, soon),
        "a mark within the skew tolerance is not rewritten"
    );
    // A later listing, on a new connection (an operator restart), reports the same time:
    // the age grows from the first sighting instead of reading zero forever.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let c2 = open(&fake).await;
    let second = list::list_owned(&c2, ENTRY, None, "h1").await.unwrap();
    assert_eq!(of(&second, a), stamped);
    assert!(SystemTime::now().duration_since(of(&second, a)).unwrap() >= Duration::from_secs(1));
}

#[tokio::test]
async fn a_future_mark_the_listing_does_not_restamp_still_reads_as_no_later_than_now() {
    // finding: L9 — the cases the restamp leaves alone, where only the clamp keeps a creation
    // time in the future out of the listing (and so out of a Proxy's status and the GC's age).
    let fake = fake_with_pool();
    let (a, b, c_uid) = (uid(32), uid(33), uid(34));
    let far = "2099-01-01T00:00:00Z";
    // A few seconds ahead (clock skew): within the tolerance, never rewritten.
    let soon = SystemTime::now() + Duration::from_secs(20);
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &a))
            .metadata(mark::NAMESPACE, mark::render(&a, ENTRY, soon)),
    )
    .unwrap();
    // Far ahead, but the restamp's write fails (it is retried by a later listing).
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &b))
            .metadata(mark::NAMESPACE, mark_xml(&b.canonical(), ENTRY, far)),
    )
    .unwrap();
    // Far ahead under a name not derived from its UID: never written to.
    fake.add_domain(
        DomainSpec::new("renamed-by-hand")
            .metadata(mark::NAMESPACE, mark_xml(&c_uid.canonical(), ENTRY, far)),
    )
    .unwrap();
    fake.faults().fail_calls(
        procs::DOMAIN_SET_METADATA,
        codes::OPERATION_FAILED,
        domains::QEMU,
        "operation failed: metadata not writable",
        None,
    );
    let c = open(&fake).await;
    let before = SystemTime::now();
    let got = list::list_owned(&c, ENTRY, None, "h1").await.unwrap();
    let after = SystemTime::now();
    assert_eq!(got.len(), 3, "{got:?}");
    for o in &got {
        assert!(
            o.created_at >= before && o.created_at <= after,
            "{}: created {:?}, listed between {before:?} and {after:?}: a mark dated later \
             reads as the time of the listing",
            o.id.name,
            o.created_at
        );
    }
    assert!(
        fake.domain_metadata(&names::domain(ENTRY, &b), mark::NAMESPACE)
            .unwrap()
            .contains(far),
        "the restamp did fail: the clamp alone kept the time"
    );
}

#[tokio::test]
async fn list_skips_a_domain_that_vanished_between_listing_and_mark_read() {
    let fake = fake_with_pool();
    let (a, b) = (uid(30), uid(31));
    fake.add_domain(ours(&a)).unwrap();
    fake.add_domain(ours(&b)).unwrap();
    fake.faults().fail_calls(
        procs::DOMAIN_GET_METADATA,
        codes::NO_DOMAIN,
        domains::QEMU,
        "Domain not found: no domain with matching uuid",
        Some(1),
    );
    let c = open(&fake).await;
    let got = list::list_owned(&c, ENTRY, None, "h1").await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
}

/// Twelve domains of ours (more than the read concurrency) for the mid-list cuts.
fn many(fake: &FakeLibvirt) {
    for n in 0..12 {
        fake.add_domain(ours(&uid(0x40 + n))).unwrap();
    }
}

#[tokio::test]
async fn a_connection_that_closes_mid_list_fails_the_whole_list() {
    // finding: M15
    let fake = fake_with_pool();
    many(&fake);
    let (c, handle) = open_with_handle(&fake, None).await;
    fake.faults().delay_replies(Some(CUT_DELAY));
    let (r, ()) = tokio::join!(list::list_owned(&c, ENTRY, None, "h1"), async {
        fake.wait_for_calls(procs::DOMAIN_GET_METADATA, 3).await;
        handle.close();
    });
    let e = r.expect_err("a list cut short must fail, never come back partial");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
}

#[tokio::test]
async fn a_connection_that_freezes_mid_list_fails_the_whole_list() {
    // finding: M15
    let fake = fake_with_pool();
    many(&fake);
    let (c, handle) = open_with_handle(&fake, Some(SHORT_CALL_TIMEOUT)).await;
    fake.faults().delay_replies(Some(CUT_DELAY));
    let (r, ()) = tokio::join!(list::list_owned(&c, ENTRY, None, "h1"), async {
        fake.wait_for_calls(procs::DOMAIN_GET_METADATA, 5).await;
        handle.faults().freeze();
    });
    let e = r.expect_err("a frozen list must fail, never come back partial");
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
}

#[tokio::test]
async fn an_unexpected_daemon_error_on_one_mark_fails_the_list_transient() {
    // finding: M15
    let fake = fake_with_pool();
    many(&fake);
    fake.faults().fail_calls(
        procs::DOMAIN_GET_METADATA,
        codes::INVALID_ARG,
        domains::DOMAIN,
        "invalid argument",
        Some(1),
    );
    let c = open(&fake).await;
    let e = list::list_owned(&c, ENTRY, None, "h1").await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Transient, "{e}");
    assert_eq!(e.libvirt_code, Some(codes::INVALID_ARG));
}
