//! Regression tests for the findings the fake exists to reproduce, run with
//! `libvirt_remote::Client` against the fake over the real wire protocol.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::{SinkExt, StreamExt};
use libvirt_fake::*;
use libvirt_remote::frame::{Header, MessageType, Packet, PacketCodec, Status};
use libvirt_remote::proto::{self, procs};
use libvirt_remote::{
    Client, ConnectionConfig, DeathReason, OpenOptions, UploadOptions, upload, xdr,
};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, timeout};
use tokio_util::codec::Framed;

const OURS: &str = "https://egress-proxies.example/ns/1";
const FOREIGN: &str = "https://someone-else.example/ns";
/// Generous bound for anything that should take microseconds on an in-memory stream.
const PROMPT: Duration = Duration::from_secs(10);

async fn open(fake: &FakeLibvirt) -> Client {
    Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap()
}

fn domain_xml(name: &str) -> String {
    format!("<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory></domain>")
}

// ---- M18: metadata scoped by namespace ----

#[tokio::test]
async fn a_domain_marked_only_under_a_foreign_namespace_is_never_returned_under_ours() {
    // finding: M18
    let fake = FakeLibvirt::new();
    fake.add_domain(DomainSpec::new("eptest-ours").metadata(OURS, "<mark uid='1'/>"))
        .unwrap();
    fake.add_domain(DomainSpec::new("eptest-foreign").metadata(FOREIGN, "<mark uid='2'/>"))
        .unwrap();
    fake.add_domain(
        DomainSpec::new("eptest-both")
            .metadata(FOREIGN, "<mark uid='3'/>")
            .metadata(OURS, "<mark uid='4'/>"),
    )
    .unwrap();
    fake.define_domain_xml(&format!(
        "<domain type='qemu'><name>eptest-xml-foreign</name>\
         <metadata><f:mark xmlns:f='{FOREIGN}' uid='5'/></metadata></domain>"
    ))
    .unwrap();
    fake.add_domain(DomainSpec::new("eptest-bare")).unwrap();
    let c = open(&fake).await;

    let mut ours = Vec::new();
    for d in c.list_all_domains(0).await.unwrap() {
        match c.domain_metadata(&d, OURS, 0).await {
            Ok(xml) => ours.push((d.name, xml)),
            Err(e) => assert_eq!(e.libvirt_code(), Some(codes::NO_DOMAIN_METADATA), "{e}"),
        }
    }
    assert_eq!(
        ours,
        vec![
            ("eptest-both".to_string(), "<mark uid='4'/>".to_string()),
            ("eptest-ours".to_string(), "<mark uid='1'/>".to_string()),
        ]
    );
    // The foreign marks are there, under their own namespace only.
    let f = c.domain_lookup_by_name("eptest-xml-foreign").await.unwrap();
    assert_eq!(
        c.domain_metadata(&f, FOREIGN, 0).await.unwrap(),
        r#"<mark uid="5"/>"#
    );

    // Marking a foreign domain under ours and unmarking it again leaves it foreign only.
    let d = c.domain_lookup_by_name("eptest-foreign").await.unwrap();
    c.domain_set_metadata(&d, Some("<mark/>"), "ep", OURS, 0)
        .await
        .unwrap();
    assert!(c.domain_metadata(&d, OURS, 0).await.is_ok());
    c.domain_set_metadata(&d, None, "ep", OURS, 0)
        .await
        .unwrap();
    let e = c.domain_metadata(&d, OURS, 0).await.unwrap_err();
    assert_eq!(e.libvirt_code(), Some(codes::NO_DOMAIN_METADATA));
    assert_eq!(
        c.domain_metadata(&d, FOREIGN, 0).await.unwrap(),
        "<mark uid='2'/>"
    );
}

// ---- L21: cancellation ----

#[tokio::test]
async fn a_call_future_dropped_before_it_is_polled_sends_nothing() {
    // finding: L21
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let xml = domain_xml("eptest-never");
    drop(c.domain_define_xml(&xml, 0));
    c.hostname().await.unwrap();
    assert_eq!(fake.calls(procs::DOMAIN_DEFINE_XML_FLAGS), 0);
    assert!(fake.domain("eptest-never").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_abandoned_after_it_was_sent_gets_a_late_reply_and_the_connection_lives() {
    // finding: L21
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let delay = Duration::from_secs(2);
    fake.faults().delay_replies(Some(delay));
    let xml = domain_xml("eptest-late");
    tokio::select! {
        r = c.domain_define_xml(&xml, 0) => panic!("the slow call answered early: {r:?}"),
        () = fake.wait_for_calls(procs::DOMAIN_DEFINE_XML_FLAGS, 1) => {}
    }
    // The caller is gone. Like libvirtd, the daemon cannot know: it runs the call it received,
    // and its reply arrives late.
    fake.faults().delay_replies(None);
    tokio::time::sleep(delay * 2).await;
    assert_eq!(c.hostname().await.unwrap(), DEFAULT_HOSTNAME);
    let stats = c.connection().stats();
    assert_eq!(stats.late_replies, 1);
    assert_eq!(stats.unknown_replies, 0);
    assert!(c.connection().is_alive());
    assert!(fake.domain("eptest-late").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_delayed_call_whose_client_closed_first_has_no_effect() {
    // finding: L21
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    let delay = Duration::from_secs(2);
    fake.faults().delay_replies(Some(delay));
    let c2 = c.clone();
    let call =
        tokio::spawn(async move { c2.domain_define_xml(&domain_xml("eptest-gone"), 0).await });
    fake.wait_for_calls(procs::DOMAIN_DEFINE_XML_FLAGS, 1).await;
    c.close();
    let e = call.await.unwrap().unwrap_err();
    assert!(e.is_connection(), "{e}");
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
    tokio::time::sleep(delay * 2).await;
    assert!(
        fake.domain("eptest-gone").is_none(),
        "the call ran after its client left"
    );
    assert_eq!(fake.calls(procs::DOMAIN_DEFINE_XML_FLAGS), 1);
}

// ---- L22: use after close ----

#[tokio::test]
async fn after_close_calls_fail_with_a_connection_error_and_the_fake_releases_the_connection() {
    // finding: L22
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    assert_eq!(fake.open_connections(), 1);
    c.close();
    let e = c.hostname().await.unwrap_err();
    assert!(e.is_connection(), "{e}");
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
    let before = fake.total_calls();
    assert!(c.lib_version().await.unwrap_err().is_connection());
    assert_eq!(
        fake.total_calls(),
        before,
        "nothing reaches the daemon after close"
    );
}

#[tokio::test]
async fn connect_close_is_answered_and_then_the_daemon_closes_the_connection() {
    // finding: L22
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    c.close_by(Instant::now() + PROMPT).await;
    assert_eq!(fake.calls(procs::CONNECT_CLOSE), 1);
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
    assert!(c.hostname().await.unwrap_err().is_connection());
}

#[tokio::test]
async fn after_the_fake_shuts_down_every_client_fails_and_new_connections_are_refused() {
    // finding: L22
    let fake = FakeLibvirt::new();
    let addr = fake.listen_tcp().await.unwrap();
    let a = open(&fake).await;
    let t = libvirt_remote::transport::tcp::connect(addr, PROMPT)
        .await
        .unwrap();
    let b = Client::open(t, OpenOptions::default()).await.unwrap();
    assert_eq!(fake.open_connections(), 2);

    fake.shutdown();
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
    for c in [&a, &b] {
        let e = c.hostname().await.unwrap_err();
        assert!(e.is_connection(), "{e}");
    }
    let e = Client::open(fake.connect_duplex(), OpenOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_connection(), "{e}");
    let redial = async {
        let t = libvirt_remote::transport::tcp::connect(addr, PROMPT).await?;
        Client::open(t, OpenOptions::default()).await
    };
    let e = timeout(PROMPT, redial).await.unwrap().unwrap_err();
    assert!(e.is_connection(), "{e}");
    assert_eq!(fake.open_connections(), 0);
}

#[tokio::test]
async fn closing_one_connection_from_the_fake_side_fails_only_that_client() {
    // finding: L22
    let fake = FakeLibvirt::new();
    let (t, h) = fake.duplex();
    let a = Client::open(t, OpenOptions::default()).await.unwrap();
    let b = open(&fake).await;
    h.close();
    timeout(PROMPT, h.closed()).await.unwrap();
    timeout(PROMPT, a.connection().closed()).await.unwrap();
    assert!(a.hostname().await.unwrap_err().is_connection());
    assert_eq!(b.hostname().await.unwrap(), DEFAULT_HOSTNAME);
    assert_eq!(fake.open_connections(), 1);
}

// ---- H2: server failure mid-upload ----

fn storage(fake: &FakeLibvirt, pool: PoolSpec) {
    fake.add_pool(pool).unwrap();
    fake.add_volume("p", VolumeSpec::new("v", 1 << 30).allocation(0))
        .unwrap();
}

#[tokio::test]
async fn upload_fails_with_enospc_midstream_while_the_source_still_has_data() {
    // finding: H2
    let fake = FakeLibvirt::new();
    storage(&fake, PoolSpec::new("p"));
    let budget: u64 = 1 << 20;
    fake.faults().fail_uploads_after(Some(budget));
    let c = open(&fake).await;
    let pool = c.pool_lookup_by_name("p").await.unwrap();
    let vol = c.vol_lookup_by_name(&pool, "v").await.unwrap();

    let never_ends = tokio::io::repeat(0xAB);
    let r = timeout(
        PROMPT,
        c.vol_upload(&vol, 0, 0, never_ends, &UploadOptions::default()),
    )
    .await
    .expect("the upload ends promptly on a server error");
    let e = r.unwrap_err();
    let re = e.remote().expect("the daemon's error");
    assert_eq!(
        (re.code, re.domain),
        (codes::SYSTEM_ERROR, domains::STREAMS)
    );
    assert!(
        re.message.contains("No space left on device"),
        "{}",
        re.message
    );

    let content = fake.volume_content("p", "v").unwrap();
    assert_eq!(content.len() as u64, budget, "nothing kept beyond what fit");
    assert!(content.iter().all(|b| *b == 0xAB));
    assert!(c.connection().is_alive());
    assert_eq!(c.hostname().await.unwrap(), DEFAULT_HOSTNAME);
}

#[tokio::test]
async fn upload_into_a_pool_that_fills_up_fails_with_enospc_and_keeps_what_fit() {
    // finding: H2
    let fake = FakeLibvirt::new();
    storage(
        &fake,
        PoolSpec::new("p").capacity(8 << 20).available(3 << 20),
    );
    let c = open(&fake).await;
    let pool = c.pool_lookup_by_name("p").await.unwrap();
    let vol = c.vol_lookup_by_name(&pool, "v").await.unwrap();
    let r = timeout(
        PROMPT,
        c.vol_upload(&vol, 0, 0, tokio::io::repeat(1), &UploadOptions::default()),
    )
    .await
    .unwrap();
    assert_eq!(r.unwrap_err().libvirt_code(), Some(codes::SYSTEM_ERROR));
    assert_eq!(fake.volume("p", "v").unwrap().content_len, 3 << 20);
    assert_eq!(fake.pool("p").unwrap().available, 0);
    assert!(c.connection().is_alive());
}

/// Yields `left` bytes, then fails.
struct FailingSource {
    left: usize,
}

impl AsyncRead for FailingSource {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.left == 0 {
            return Poll::Ready(Err(io::Error::other("source disk failed")));
        }
        let n = self.left.min(buf.remaining());
        buf.put_slice(&vec![7u8; n]);
        self.left -= n;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn an_upload_aborted_by_the_client_is_confirmed_and_keeps_only_what_was_sent() {
    // finding: H2
    let fake = FakeLibvirt::new();
    storage(&fake, PoolSpec::new("p"));
    let c = open(&fake).await;
    let pool = c.pool_lookup_by_name("p").await.unwrap();
    let vol = c.vol_lookup_by_name(&pool, "v").await.unwrap();
    let chunk = upload::DEFAULT_CHUNK;
    let src = FailingSource {
        left: 3 * chunk + 100,
    };
    let e = timeout(
        PROMPT,
        c.vol_upload(&vol, 0, 0, src, &UploadOptions::default()),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert!(e.source_error().is_some(), "{e}");
    // The client sends whole chunks; the partial one is dropped with the source's error.
    let content = fake.volume_content("p", "v").unwrap();
    assert_eq!(content.len(), 3 * chunk);
    assert!(content.iter().all(|b| *b == 7));
    // The abort was confirmed in time, so the client did not have to kill the connection.
    assert!(c.connection().is_alive());
    assert_eq!(c.hostname().await.unwrap(), DEFAULT_HOSTNAME);
}

// ---- L28: duplicate replies ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_replies_are_dropped_and_counted_and_every_call_gets_its_own_reply() {
    // finding: L28
    let fake = FakeLibvirt::new();
    for i in 0..50 {
        fake.add_domain(DomainSpec::new(format!("eptest-d{i}")))
            .unwrap();
    }
    let c = open(&fake).await;
    fake.faults().duplicate_replies(Duplicate::All);
    let calls = (0..200).map(|i| {
        let c = c.clone();
        let name = format!("eptest-d{}", i % 50);
        async move {
            let r = c.domain_lookup_by_name(&name).await;
            (name, r)
        }
    });
    let results = timeout(PROMPT, join_all(calls))
        .await
        .expect("no call stalls");
    for (name, r) in results {
        let d = r.unwrap();
        assert_eq!(d.name, name);
        assert_eq!(d.uuid, fake.domain(&name).unwrap().uuid);
    }
    fake.faults().duplicate_replies(Duplicate::Off);
    // This reply follows every duplicate on the wire, so all have been counted once it lands.
    c.hostname().await.unwrap();
    let s = c.connection().stats();
    assert_eq!(s.unknown_replies, 200);
    assert_eq!(s.late_replies, 0);
    assert!(c.connection().is_alive());
}

#[tokio::test]
async fn only_the_next_n_replies_are_duplicated() {
    // finding: L28
    let fake = FakeLibvirt::new();
    let c = open(&fake).await;
    fake.faults().duplicate_replies(Duplicate::Next(3));
    for _ in 0..10 {
        c.hostname().await.unwrap();
    }
    assert_eq!(c.connection().stats().unknown_replies, 3);
    assert_eq!(fake.faults().snapshot().duplicate_replies, Duplicate::Off);
}

// ---- L27: malformed frame lengths ----

#[tokio::test]
async fn a_bad_frame_length_kills_the_client_connection_and_fails_every_pending_call() {
    // finding: L27
    for kind in [BadLength::Short, BadLength::Huge] {
        let fake = FakeLibvirt::new();
        let c = open(&fake).await;
        fake.faults().bad_length_next_reply(kind);
        let calls = (0..8).map(|_| c.hostname());
        let results = timeout(PROMPT, join_all(calls))
            .await
            .expect("no call hangs");
        for r in results {
            let e = r.unwrap_err();
            assert!(e.is_connection(), "{kind:?}: {e}");
        }
        assert!(
            matches!(
                c.connection().death_reason(),
                Some(DeathReason::Malformed(_))
            ),
            "{kind:?}: {:?}",
            c.connection().death_reason()
        );
        assert!(c.hostname().await.unwrap_err().is_connection());
        // The client's death closed the stream; the fake lets go of it.
        timeout(PROMPT, fake.wait_for_open_connections(0))
            .await
            .unwrap();
    }
}

// ---- M6: close right after open ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_closing_right_after_open_is_a_connection_error_and_a_redial_works_1000_times() {
    // finding: M6
    let fake = FakeLibvirt::new();
    let run = async {
        for i in 0..1000 {
            fake.faults_for_next_connection(FaultSpec {
                close_after_open: true,
                ..FaultSpec::default()
            });
            match Client::open(fake.connect_duplex(), OpenOptions::default()).await {
                Ok(c) => {
                    let e = c.hostname().await.unwrap_err();
                    assert!(e.is_connection(), "iteration {i}: {e}");
                }
                Err(e) => assert!(e.is_connection(), "iteration {i}: {e}"),
            }
            let c = Client::open(fake.connect_duplex(), OpenOptions::default())
                .await
                .unwrap();
            assert_eq!(
                c.hostname().await.unwrap(),
                DEFAULT_HOSTNAME,
                "iteration {i}"
            );
        }
    };
    timeout(Duration::from_secs(120), run)
        .await
        .expect("nothing wedges in 1000 iterations");
    assert_eq!(fake.calls(procs::CONNECT_OPEN), 2000);
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
}

// ---- keepalive ----

#[tokio::test(start_paused = true)]
async fn a_frozen_fake_is_declared_dead_by_the_client_keepalive_within_its_budget() {
    let fake = FakeLibvirt::new();
    let cfg = ConnectionConfig {
        keepalive_interval: Duration::from_secs(1),
        keepalive_count: 3,
        ..ConnectionConfig::default()
    };
    let opts = OpenOptions {
        connection: cfg.clone(),
        ..OpenOptions::default()
    };
    let c = Client::open(fake.connect_duplex(), opts).await.unwrap();
    let start = Instant::now();
    fake.faults().freeze();
    // The budget counts from the last packet received (the open's replies), which is at or
    // before the freeze: interval × (count + 1), plus 10 ms of timer granularity.
    let bound = cfg.keepalive_budget() + Duration::from_millis(10);
    timeout(bound, c.connection().closed())
        .await
        .expect("declared dead by keepalive");
    assert!(
        start.elapsed() > cfg.keepalive_interval * cfg.keepalive_count,
        "not before the misses"
    );
    assert!(matches!(
        c.connection().death_reason(),
        Some(DeathReason::KeepaliveTimeout { .. })
    ));
    assert_eq!(
        fake.open_connections(),
        1,
        "a frozen daemon keeps its socket open"
    );
    fake.faults().thaw();
    timeout(PROMPT, fake.wait_for_open_connections(0))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_frozen_fake_answers_nothing_until_thawed() {
    let fake = FakeLibvirt::new();
    let opts = OpenOptions {
        connection: ConnectionConfig {
            call_timeout: Duration::from_secs(2),
            ..ConnectionConfig::default()
        },
        ..OpenOptions::default()
    };
    let c = Client::open(fake.connect_duplex(), opts).await.unwrap();
    fake.faults().freeze();
    assert!(c.hostname().await.unwrap_err().is_timeout());
    assert_eq!(
        fake.calls(procs::CONNECT_GET_HOSTNAME),
        0,
        "frozen: nothing was read"
    );
    fake.faults().thaw();
    assert_eq!(c.lib_version().await.unwrap(), DEFAULT_LIB_VERSION);
    assert_eq!(
        c.connection().stats().late_replies,
        1,
        "the first call's reply came late"
    );
}

#[tokio::test(start_paused = true)]
async fn the_fake_pings_an_idle_client_that_asked_for_keepalive() {
    let fake = FakeLibvirt::new();
    fake.set_keepalive(Some(KeepaliveConfig {
        interval: Duration::from_secs(1),
        count: 2,
    }));
    let opts = OpenOptions {
        connection: ConnectionConfig {
            keepalive_interval: Duration::from_secs(60),
            ..ConnectionConfig::default()
        },
        ..OpenOptions::default()
    };
    let c = Client::open(fake.connect_duplex(), opts).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = c.connection().stats();
    assert!(s.pings_answered >= 3, "{s:?}");
    assert!(
        c.connection().is_alive(),
        "answered PINGs keep the connection"
    );
    assert_eq!(fake.open_connections(), 1);
}

fn call(proc_: i32, serial: u32, payload: Bytes) -> Packet {
    Packet {
        header: Header {
            prog: proto::REMOTE_PROGRAM,
            vers: proto::REMOTE_VERSION,
            proc_,
            mtype: MessageType::Call,
            serial,
            status: Status::Ok,
        },
        payload,
    }
}

#[tokio::test(start_paused = true)]
async fn the_fake_closes_a_client_that_stops_answering_its_pings() {
    let fake = FakeLibvirt::new();
    let k = KeepaliveConfig {
        interval: Duration::from_secs(1),
        count: 2,
    };
    fake.set_keepalive(Some(k));
    let (client, server) = tokio::io::duplex(64 << 10);
    let h = fake.serve(server);
    let mut f = Framed::new(client, PacketCodec);
    let open = xdr::to_bytes(&proto::ConnectOpenArgs {
        name: Some("qemu:///system".into()),
        flags: 0,
    });
    let feature = xdr::to_bytes(&proto::SupportsFeatureArgs { feature: 10 });
    for (serial, (p, a)) in [
        (procs::AUTH_LIST, Bytes::new()),
        (procs::CONNECT_OPEN, open),
        (procs::CONNECT_SUPPORTS_FEATURE, feature),
    ]
    .into_iter()
    .enumerate()
    {
        f.send(call(p, serial as u32 + 1, a)).await.unwrap();
        let reply = f.next().await.unwrap().unwrap();
        assert_eq!(reply.header.status, Status::Ok);
    }
    // Now stay silent and stop reading.
    let start = Instant::now();
    timeout(Duration::from_secs(30), h.closed())
        .await
        .expect("the fake closes a silent client");
    let silent = k.interval * (k.count + 1);
    assert!(
        start.elapsed() >= silent,
        "closed after {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() <= silent + k.interval,
        "closed after {:?}",
        start.elapsed()
    );
    assert_eq!(fake.open_connections(), 0);
}

// ---- pool figures cached until refresh (what the provider's M4 test relies on) ----

#[tokio::test]
async fn pool_available_stays_stale_until_refresh() {
    let fake = FakeLibvirt::new();
    fake.add_pool(
        PoolSpec::new("p")
            .capacity(10 << 30)
            .allocation(1 << 30)
            .available(8 << 30),
    )
    .unwrap();
    let c = open(&fake).await;
    let pool = c.pool_lookup_by_name("p").await.unwrap();
    let figures = |i: proto::StoragePoolGetInfoRet| (i.allocation, i.available);
    assert_eq!(
        figures(c.pool_info(&pool).await.unwrap()),
        (1 << 30, 8 << 30)
    );

    let xml = "<volume><name>eptest-big</name><capacity unit='GiB'>2</capacity></volume>";
    c.vol_create_xml(&pool, xml, 0).await.unwrap();
    assert_eq!(
        figures(c.pool_info(&pool).await.unwrap()),
        (1 << 30, 8 << 30),
        "stale until refresh"
    );
    // Something else fills the disk.
    fake.set_pool_usage("p", 9 << 30, 512 << 20).unwrap();
    assert_eq!(
        figures(c.pool_info(&pool).await.unwrap()),
        (1 << 30, 8 << 30)
    );
    let live = fake.pool("p").unwrap();
    assert_eq!((live.allocation, live.available), (9 << 30, 512 << 20));

    c.pool_refresh(&pool).await.unwrap();
    assert_eq!(
        figures(c.pool_info(&pool).await.unwrap()),
        (9 << 30, 512 << 20)
    );
}
