//! Every procedure `libvirt_remote::Client` exposes, round-tripped against the fake over the
//! real wire protocol, with the values and error codes libvirtd 11.3 returns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use bytes::Bytes;
use libvirt_fake::*;
use libvirt_remote::client::{addr_source, domain_state as ds, list_domains};
use libvirt_remote::proto::{self, procs};
use libvirt_remote::{Client, Connection, ConnectionConfig, LifecycleEvent, OpenOptions, xdr};

const OURS: &str = "https://egress-proxies.example/ns/1";
const MAC: &str = "52:54:00:aa:bb:cc";
/// Generous bound for anything that should take microseconds on an in-memory stream.
const PROMPT: Duration = Duration::from_secs(10);

async fn open(fake: &FakeLibvirt) -> Client {
    Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap()
}

fn code<T: std::fmt::Debug>(r: libvirt_remote::Result<T>) -> i32 {
    r.unwrap_err().libvirt_code().expect("a remote error")
}

fn domain_xml(name: &str, uuid: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid>\
         <memory unit='MiB'>128</memory><vcpu>2</vcpu>\
         <metadata><ep:proxy xmlns:ep='{OURS}' uid='u-1'><entry>e1</entry></ep:proxy></metadata>\
         <devices><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices>\
         </domain>"
    )
}

#[tokio::test]
async fn connection_level_procedures_return_the_configured_values() {
    let fake = FakeLibvirt::new();
    fake.set_hostname("hv-1.example");
    fake.set_lib_version(11_006_000);
    fake.set_hypervisor_version(10_001_000);
    fake.set_domain_capabilities("<domainCapabilities><domain>qemu</domain></domainCapabilities>");
    let c = open(&fake).await;
    assert_eq!(c.hostname().await.unwrap(), "hv-1.example");
    assert_eq!(c.lib_version().await.unwrap(), 11_006_000);
    assert_eq!(c.hypervisor_version().await.unwrap(), 10_001_000);
    assert_eq!(c.capabilities().await.unwrap(), DEFAULT_CAPABILITIES);
    assert!(DEFAULT_CAPABILITIES.contains("<capabilities>"));
    let dc = c
        .domain_capabilities(None, Some("x86_64"), None, Some("qemu"))
        .await
        .unwrap();
    assert!(dc.contains("<domain>qemu</domain>"));
    assert!(
        c.supports_feature(proto::FEATURE_PROGRAM_KEEPALIVE)
            .await
            .unwrap()
    );
    assert!(c.supports_feature(8).await.unwrap());
    assert!(!c.supports_feature(1).await.unwrap());
    assert_eq!(fake.calls(procs::AUTH_LIST), 1);
    assert_eq!(fake.calls(procs::CONNECT_OPEN), 1);
    // Client::open asked for the keepalive feature once, and we asked three more times.
    assert_eq!(fake.calls(procs::CONNECT_SUPPORTS_FEATURE), 4);
    assert_eq!(fake.open_connections(), 1);
}

#[tokio::test]
async fn calls_before_authentication_and_open_are_rejected_like_libvirtd() {
    let fake = FakeLibvirt::new();
    let conn = Connection::start(fake.connect_duplex(), ConnectionConfig::default()).unwrap();
    let raw = |p: i32, a: Bytes| {
        let conn = conn.clone();
        async move { conn.call_raw(p, a).await }
    };
    let e = raw(procs::CONNECT_GET_HOSTNAME, Bytes::new())
        .await
        .unwrap_err();
    let r = e.remote().unwrap();
    assert_eq!((r.code, r.domain), (codes::RPC, domains::RPC));
    assert_eq!(r.message, "authentication required");

    let auth: proto::AuthListRet = conn.call(procs::AUTH_LIST, &()).await.unwrap();
    assert_eq!(
        auth.types,
        vec![0],
        "a root client is offered REMOTE_AUTH_NONE"
    );

    let e = raw(procs::CONNECT_GET_HOSTNAME, Bytes::new())
        .await
        .unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::INTERNAL_ERROR));
    assert_eq!(
        e.remote().unwrap().message,
        "internal error: hypervisor connection not open"
    );
    // The keepalive feature may be asked before open.
    let f: proto::SupportsFeatureRet = conn
        .call(
            procs::CONNECT_SUPPORTS_FEATURE,
            &proto::SupportsFeatureArgs { feature: 10 },
        )
        .await
        .unwrap();
    assert_eq!(f.supported, 1);

    let open = xdr::to_bytes(&proto::ConnectOpenArgs {
        name: Some("qemu:///system".into()),
        flags: 0,
    });
    raw(procs::CONNECT_OPEN, open.clone()).await.unwrap();
    raw(procs::CONNECT_GET_HOSTNAME, Bytes::new())
        .await
        .unwrap();
    let e = raw(procs::CONNECT_OPEN, open).await.unwrap_err();
    assert_eq!(
        e.remote().unwrap().message,
        "internal error: connection already open"
    );

    let e = raw(9999, Bytes::new()).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::RPC));
    assert_eq!(e.remote().unwrap().message, "unknown procedure: 9999");
    // DOMAIN_SUSPEND exists in libvirt but not in the fake.
    let e = raw(12, Bytes::new()).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_SUPPORT));
    assert!(conn.is_alive(), "errors never kill the connection");
}

#[tokio::test]
async fn polkit_is_offered_and_completed_only_when_configured() {
    let fake = FakeLibvirt::new();
    fake.set_auth(AuthMode::Polkit);
    let c = open(&fake).await;
    assert_eq!(fake.calls(procs::AUTH_POLKIT), 1);
    c.hostname().await.unwrap();

    fake.set_auth(AuthMode::PolkitDenied);
    let e = Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::AUTH_FAILED));
    assert_eq!(
        fake.calls(procs::CONNECT_OPEN),
        1,
        "a denied client never opened"
    );
}

async fn next_event(
    rx: &mut tokio::sync::broadcast::Receiver<libvirt_remote::Event>,
) -> (i32, i32) {
    let ev = tokio::time::timeout(PROMPT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let l = LifecycleEvent::from_event(&ev).unwrap();
    (l.event, l.detail)
}

#[tokio::test]
async fn domain_lifecycle_round_trips_with_libvirt_states_and_events() {
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let mut rx = c.connection().subscribe();
    let cb = c.register_lifecycle_events().await.unwrap();
    assert_eq!(cb, 0, "libvirtd numbers a connection's callbacks from 0");
    assert_eq!(
        code(c.register_lifecycle_events().await),
        codes::INVALID_ARG
    );

    let uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    let xml = domain_xml("eptest-vm", uuid);
    let dom = c.domain_define_xml(&xml, 0).await.unwrap();
    assert_eq!(dom.name, "eptest-vm");
    assert_eq!(proto::format_uuid(&dom.uuid), uuid);
    assert_eq!(dom.id, -1);
    assert_eq!(
        next_event(&mut rx).await,
        (events::DEFINED, events::DEFINED_ADDED)
    );
    assert_eq!(c.domain_lookup_by_name("eptest-vm").await.unwrap(), dom);
    assert_eq!(c.domain_state(&dom).await.unwrap(), (ds::SHUTOFF, 0));
    let info = c.domain_info(&dom).await.unwrap();
    assert_eq!(
        (info.max_mem, info.nr_virt_cpu.0, info.state.0),
        (131_072, 2, 5)
    );
    assert_eq!(
        c.domain_xml(&dom, 0).await.unwrap(),
        xml,
        "the XML is kept as given"
    );

    // Redefining the same name updates it; a different UUID is refused.
    c.domain_define_xml(&xml, 0).await.unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        (events::DEFINED, events::DEFINED_UPDATED)
    );
    let other = domain_xml("eptest-vm", "11111111-2222-3333-4444-555555555555");
    assert_eq!(
        code(c.domain_define_xml(&other, 0).await),
        codes::OPERATION_FAILED
    );

    let running = c.domain_create_with_flags(&dom, 0).await.unwrap();
    assert!(running.id > 0);
    assert_eq!(
        next_event(&mut rx).await,
        (events::RESUMED, events::RESUMED_UNPAUSED)
    );
    assert_eq!(
        next_event(&mut rx).await,
        (events::STARTED, events::STARTED_BOOTED)
    );
    assert_eq!(c.domain_state(&dom).await.unwrap(), (ds::RUNNING, 1));
    let e = c.domain_create(&dom).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::OPERATION_INVALID));
    assert_eq!(e.remote().unwrap().domain, domains::QEMU);

    let active = c.list_all_domains(list_domains::ACTIVE).await.unwrap();
    assert_eq!(active, vec![running.clone()]);
    assert!(
        c.list_all_domains(list_domains::INACTIVE)
            .await
            .unwrap()
            .is_empty()
    );

    c.domain_destroy(&dom, 0).await.unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        (events::SHUTDOWN, events::SHUTDOWN_HOST)
    );
    assert_eq!(
        next_event(&mut rx).await,
        (events::STOPPED, events::STOPPED_DESTROYED)
    );
    assert_eq!(c.domain_state(&dom).await.unwrap(), (ds::SHUTOFF, 2));
    let e = c.domain_destroy(&dom, 0).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::OPERATION_INVALID));
    assert_eq!(
        e.remote().unwrap().message,
        "Requested operation is not valid: domain is not running"
    );

    c.domain_undefine(&dom, libvirt_remote::client::undefine::ALL_METADATA)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        (events::UNDEFINED, events::UNDEFINED_REMOVED)
    );
    let e = c.domain_lookup_by_name("eptest-vm").await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_DOMAIN));
    assert_eq!(e.remote().unwrap().domain, domains::QEMU);
    let e = c.domain_state(&dom).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_DOMAIN));
    assert!(e.remote().unwrap().message.contains(uuid));
    assert!(fake.domains().is_empty());

    c.deregister_events(cb).await.unwrap();
    assert_eq!(code(c.deregister_events(cb).await), codes::INTERNAL_ERROR);
    assert_eq!(fake.events_dropped(), 0);
}

#[tokio::test]
async fn undefining_a_running_domain_makes_it_transient_as_libvirt_does() {
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let dom = c
        .domain_define_xml(
            &domain_xml("eptest-t", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1"),
            0,
        )
        .await
        .unwrap();
    c.domain_create(&dom).await.unwrap();
    c.domain_undefine(&dom, 0).await.unwrap();
    assert!(!fake.domain("eptest-t").unwrap().persistent);
    assert_eq!(
        code(c.domain_undefine(&dom, 0).await),
        codes::OPERATION_INVALID
    );
    c.domain_destroy(&dom, 0).await.unwrap();
    assert_eq!(
        code(c.domain_lookup_by_name("eptest-t").await),
        codes::NO_DOMAIN
    );
}

#[tokio::test]
async fn metadata_is_stored_and_removed_per_namespace() {
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let dom = c
        .domain_define_xml(
            &domain_xml("eptest-m", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f2"),
            0,
        )
        .await
        .unwrap();
    // From the XML: returned without the root's prefix and namespace declaration.
    assert_eq!(
        c.domain_metadata(&dom, OURS, 0).await.unwrap(),
        r#"<proxy uid="u-1"><entry>e1</entry></proxy>"#
    );
    let foreign = "https://someone-else.example/ns";
    let e = c.domain_metadata(&dom, foreign, 0).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_DOMAIN_METADATA));
    assert_eq!(e.remote().unwrap().domain, domains::DOMAIN);

    c.domain_set_metadata(&dom, Some("<mark a='1'/>"), "x", foreign, 0)
        .await
        .unwrap();
    assert_eq!(
        c.domain_metadata(&dom, foreign, 0).await.unwrap(),
        "<mark a='1'/>"
    );
    c.domain_set_metadata(&dom, None, "x", OURS, 0)
        .await
        .unwrap();
    assert_eq!(
        code(c.domain_metadata(&dom, OURS, 0).await),
        codes::NO_DOMAIN_METADATA
    );
    assert!(
        c.domain_metadata(&dom, foreign, 0).await.is_ok(),
        "other namespaces untouched"
    );
    // Removing what is not there succeeds, as in libvirt.
    c.domain_set_metadata(&dom, None, "x", OURS, 0)
        .await
        .unwrap();
    assert_eq!(
        fake.domain_metadata("eptest-m", foreign).as_deref(),
        Some("<mark a='1'/>")
    );

    // Setting without a key is refused (code 8).
    let args = proto::DomainSetMetadataArgs {
        dom: dom.clone(),
        kind: 2,
        metadata: Some("<a/>".into()),
        key: None,
        uri: Some(OURS.into()),
        flags: 0,
    };
    let e = c
        .connection()
        .call::<_, ()>(procs::DOMAIN_SET_METADATA, &args)
        .await
        .unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::INVALID_ARG));
}

#[tokio::test]
async fn interface_addresses_come_from_the_agent_or_the_network_leases() {
    let fake = FakeLibvirt::new();
    fake.add_network(
        NetworkSpec::new("default")
            .bridge("virbr7")
            .lease(Lease::new(MAC, "192.168.122.50", 24).hostname("guest"))
            .lease(Lease::new("52:54:00:00:00:01", "192.168.122.51", 24)),
    )
    .unwrap();
    fake.add_domain(
        DomainSpec::new("eptest-a")
            .running()
            .interface(Interface::new("lo", "00:00:00:00:00:00").addr("127.0.0.1", 8))
            .interface(
                Interface::new("eth0", MAC)
                    .network("default")
                    .addr("192.168.122.50", 24)
                    .addr("fe80::1", 64),
            ),
    )
    .unwrap();
    fake.add_domain(DomainSpec::new("eptest-off")).unwrap();
    let c = open(&fake).await;
    let dom = c.domain_lookup_by_name("eptest-a").await.unwrap();

    let agent = c
        .domain_interface_addresses(&dom, addr_source::AGENT)
        .await
        .unwrap();
    assert_eq!(agent.len(), 2);
    let eth0 = &agent[1];
    assert_eq!(
        (eth0.name.as_str(), eth0.hwaddr.as_deref()),
        ("eth0", Some(MAC))
    );
    assert_eq!(eth0.addrs[0].addr, "192.168.122.50");
    assert_eq!(
        (eth0.addrs[1].kind, eth0.addrs[1].prefix),
        (1, 64),
        "IPv6 typed as such"
    );

    let lease = c
        .domain_interface_addresses(&dom, addr_source::LEASE)
        .await
        .unwrap();
    assert_eq!(lease.len(), 1);
    assert_eq!(lease[0].hwaddr.as_deref(), Some(MAC));
    assert_eq!(lease[0].addrs[0].addr, "192.168.122.50");

    fake.faults().agent_unresponsive(true);
    let e = c
        .domain_interface_addresses(&dom, addr_source::AGENT)
        .await
        .unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::AGENT_UNRESPONSIVE));
    assert!(
        c.domain_interface_addresses(&dom, addr_source::LEASE)
            .await
            .is_ok()
    );
    fake.faults().agent_unresponsive(false);
    fake.set_guest_agent("eptest-a", false).unwrap();
    assert_eq!(
        code(c.domain_interface_addresses(&dom, addr_source::AGENT).await),
        codes::ARGUMENT_UNSUPPORTED
    );
    let off = c.domain_lookup_by_name("eptest-off").await.unwrap();
    assert_eq!(
        code(c.domain_interface_addresses(&off, addr_source::LEASE).await),
        codes::OPERATION_INVALID
    );

    let net = c.network_lookup_by_name("default").await.unwrap();
    assert!(
        c.network_xml(&net)
            .await
            .unwrap()
            .contains("<bridge name='virbr7'/>")
    );
    let all = c.network_dhcp_leases(&net, None).await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].iface, "virbr7");
    assert_eq!(all[0].hostname.as_deref(), Some("guest"));
    let one = c
        .network_dhcp_leases(&net, Some(&MAC.to_uppercase()))
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let e = c.network_lookup_by_name("nope").await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_NETWORK));
    assert_eq!(e.remote().unwrap().domain, domains::NETWORK);
}

#[tokio::test]
async fn storage_procedures_round_trip_with_libvirt_errors() {
    let fake = FakeLibvirt::new();
    fake.add_pool(
        PoolSpec::new("images")
            .path("/srv/images")
            .capacity(10 << 30),
    )
    .unwrap();
    fake.add_volume(
        "images",
        VolumeSpec::new("base", 2 << 30)
            .format("qcow2")
            .allocation(1 << 20),
    )
    .unwrap();
    let c = open(&fake).await;
    let pool = c.pool_lookup_by_name("images").await.unwrap();
    let e = c.pool_lookup_by_name("nope").await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_STORAGE_POOL));
    assert_eq!(e.remote().unwrap().domain, domains::STORAGE);

    let xml = "<volume><name>eptest-disk</name><capacity unit='MiB'>4</capacity>\
               <target><format type='raw'/></target></volume>";
    let vol = c.vol_create_xml(&pool, xml, 0).await.unwrap();
    assert_eq!(vol.key, "/srv/images/eptest-disk");
    assert_eq!(
        code(c.vol_create_xml(&pool, xml, 0).await),
        codes::STORAGE_VOL_EXIST
    );
    assert_eq!(
        c.vol_lookup_by_name(&pool, "eptest-disk").await.unwrap(),
        vol
    );
    let info = c.vol_info(&vol).await.unwrap();
    assert_eq!((info.capacity, info.allocation), (4 << 20, 4 << 20));
    assert_eq!(c.vol_path(&vol).await.unwrap(), "/srv/images/eptest-disk");
    let names: Vec<_> = c
        .pool_list_volumes(&pool)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["base", "eptest-disk"]);

    // An overlay without a capacity takes its backing store's.
    let ov = "<volume><name>eptest-ov</name><target><format type='qcow2'/></target>\
              <backingStore><path>/srv/images/base</path><format type='qcow2'/></backingStore></volume>";
    let ov = c.vol_create_xml(&pool, ov, 0).await.unwrap();
    assert_eq!(c.vol_info(&ov).await.unwrap().capacity, 2 << 30);
    assert_eq!(
        fake.volume("images", "eptest-ov")
            .unwrap()
            .backing
            .as_deref(),
        Some("/srv/images/base")
    );
    let bad = "<volume><name>eptest-ov2</name><target><format type='qcow2'/></target>\
               <backingStore><path>/srv/images/missing</path></backingStore></volume>";
    let e = c.vol_create_xml(&pool, bad, 0).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::SYSTEM_ERROR));
    assert!(
        e.remote()
            .unwrap()
            .message
            .contains("No such file or directory")
    );

    // Upload at an offset, then read the bytes back from the fake.
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let opts = libvirt_remote::UploadOptions::default();
    let sent = c.vol_upload(&vol, 3, 0, &data[..], &opts).await.unwrap();
    assert_eq!(sent, data.len() as u64);
    let content = fake.volume_content("images", "eptest-disk").unwrap();
    assert_eq!(&content[..3], &[0, 0, 0]);
    assert_eq!(&content[3..], &data[..]);
    // The client never sends past the declared length (libvirtd 11.3 crashed when it did).
    let sent = c.vol_upload(&vol, 0, 10, &data[..20], &opts).await.unwrap();
    assert_eq!(sent, 10);
    // A raw stream sending more than its declared length gets ENOSPC, as libvirt's fd stream
    // reports it.
    let args = libvirt_remote::xdr::to_bytes(&libvirt_remote::proto::StorageVolUploadArgs {
        vol: vol.clone(),
        offset: 0,
        length: 10,
        flags: 0,
    });
    let e = c
        .connection()
        .upload(
            libvirt_remote::proto::procs::STORAGE_VOL_UPLOAD,
            args,
            &data[..20],
            &opts,
        )
        .await
        .unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::SYSTEM_ERROR));
    assert_eq!(e.remote().unwrap().domain, domains::STREAMS);

    c.vol_delete(&vol, 0).await.unwrap();
    let e = c.vol_delete(&vol, 0).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_STORAGE_VOL));
    assert_eq!(code(c.vol_info(&vol).await), codes::NO_STORAGE_VOL);
    assert_eq!(
        code(c.vol_lookup_by_name(&pool, "eptest-disk").await),
        codes::NO_STORAGE_VOL
    );

    c.pool_refresh(&pool).await.unwrap();
    let pi = c.pool_info(&pool).await.unwrap();
    assert_eq!(pi.state.0, 2);
    assert_eq!(pi.capacity, 10 << 30);
    assert_eq!(
        pi.allocation,
        (1 << 20) + 196_608,
        "base + empty qcow2 overlay"
    );
}

#[tokio::test]
async fn an_injected_failure_replaces_the_call_for_the_given_count() {
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    fake.faults().fail_calls(
        procs::DOMAIN_DEFINE_XML_FLAGS,
        codes::CONFIG_UNSUPPORTED,
        domains::QEMU,
        "unsupported configuration: Emulator does not support virt type 'kvm'",
        Some(1),
    );
    let xml = domain_xml("eptest-f", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f3");
    assert_eq!(
        code(c.domain_define_xml(&xml, 0).await),
        codes::CONFIG_UNSUPPORTED
    );
    assert!(
        fake.domain("eptest-f").is_none(),
        "a failed call changes nothing"
    );
    c.domain_define_xml(&xml, 0).await.unwrap();
    assert!(fake.domain("eptest-f").is_some());
}

#[tokio::test]
async fn tcp_and_unix_listeners_serve_the_protocol() {
    let fake = FakeLibvirt::new();
    let addr = fake.listen_tcp().await.unwrap();
    let t = libvirt_remote::transport::tcp::connect(addr, PROMPT)
        .await
        .unwrap();
    let c = Client::open(t, OpenOptions::default()).await.unwrap();
    assert_eq!(c.hostname().await.unwrap(), DEFAULT_HOSTNAME);

    let path = std::env::temp_dir().join(format!("eptest-fake-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(path.clone());
    fake.listen_unix(&path).await.unwrap();
    let t = libvirt_remote::transport::unix::connect(&path, PROMPT)
        .await
        .unwrap();
    let u = Client::open(t, OpenOptions::default()).await.unwrap();
    assert_eq!(u.lib_version().await.unwrap(), DEFAULT_LIB_VERSION);
    assert_eq!(fake.open_connections(), 2);
}
