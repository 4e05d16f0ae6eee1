//! The client against a scripted in-process peer: multiplexing, cancellation, malformed
//! frames, keepalive, uploads and teardown, asserted on the wire.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use libvirt_remote::frame::{Header, MessageType, Packet, PacketCodec, Status};
use libvirt_remote::proto::{self, Domain, RemoteErrorWire, StorageVol, procs};
use libvirt_remote::transport::{KillSwitch, Transport};
use libvirt_remote::{Client, Connection, ConnectionConfig, DeathReason, UploadOptions, xdr};
use tokio::io::{AsyncRead, AsyncReadExt, DuplexStream, ReadBuf};
use tokio_util::codec::Framed;

/// The daemon side of a duplex connection, driven by the test.
struct Peer {
    io: Framed<DuplexStream, PacketCodec>,
}

impl Peer {
    async fn recv(&mut self) -> Packet {
        tokio::time::timeout(Duration::from_secs(30), self.io.next())
            .await
            .expect("peer waited too long for a packet")
            .expect("client closed")
            .expect("bad frame from client")
    }

    /// Next packet that is not keepalive.
    async fn recv_remote(&mut self) -> Packet {
        loop {
            let p = self.recv().await;
            if p.header.prog == proto::REMOTE_PROGRAM {
                return p;
            }
        }
    }

    async fn reply(&mut self, call: &Packet, payload: Bytes) {
        self.send(reply_to(call, Status::Ok, payload)).await;
    }

    async fn send(&mut self, p: Packet) {
        self.io.send(p).await.unwrap();
    }

    async fn raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.io.get_mut().write_all(bytes).await.unwrap();
    }
}

fn reply_to(call: &Packet, status: Status, payload: Bytes) -> Packet {
    Packet {
        header: Header {
            mtype: if call.header.mtype == MessageType::Stream {
                MessageType::Stream
            } else {
                MessageType::Reply
            },
            status,
            ..call.header
        },
        payload,
    }
}

fn error_payload(code: i32, msg: &str) -> Bytes {
    xdr::to_bytes(&RemoteErrorWire {
        code,
        domain: 18,
        message: Some(msg.into()),
        level: 2,
        ..Default::default()
    })
}

fn hostname_payload(name: &str) -> Bytes {
    xdr::to_bytes(&proto::StringRet { value: name.into() })
}

fn pair(config: ConnectionConfig) -> (Client, Peer) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let t = Transport::from_stream(a, KillSwitch::noop(), "duplex");
    let conn = Connection::start(t, config).unwrap();
    (
        Client::from_connection(conn),
        Peer {
            io: Framed::new(b, PacketCodec),
        },
    )
}

fn quiet() -> ConnectionConfig {
    ConnectionConfig {
        call_timeout: Duration::from_secs(3600),
        keepalive_interval: Duration::from_secs(3600),
        keepalive_count: 5,
    }
}

#[tokio::test]
async fn concurrent_calls_each_get_their_own_reply_in_any_order() {
    let (client, mut peer) = pair(quiet());
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.hostname().await })
        })
        .collect();
    let mut received = Vec::new();
    for _ in 0..16 {
        received.push(peer.recv_remote().await);
    }
    // Answer in reverse order, each with its own serial in the payload.
    for call in received.iter().rev() {
        peer.reply(call, hostname_payload(&format!("h{}", call.header.serial)))
            .await;
    }
    let mut got: Vec<String> = Vec::new();
    for c in calls {
        got.push(c.await.unwrap().unwrap());
    }
    let mut want: Vec<String> = received
        .iter()
        .map(|p| format!("h{}", p.header.serial))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(client.connection().stats().calls, 16);
}

#[tokio::test]
async fn calls_are_encoded_as_libvirt_expects() {
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let task = tokio::spawn(async move { c.domain_lookup_by_name("vm1").await });
    let call = peer.recv_remote().await;
    assert_eq!(call.header.prog, 0x2000_8086);
    assert_eq!(call.header.vers, 1);
    assert_eq!(call.header.proc_, 23);
    assert_eq!(call.header.mtype, MessageType::Call);
    assert_eq!(call.header.status, Status::Ok);
    assert_eq!(&call.payload[..], &[0, 0, 0, 3, b'v', b'm', b'1', 0]);
    peer.send(reply_to(
        &call,
        Status::Error,
        error_payload(42, "no domain 'vm1'"),
    ))
    .await;
    let err = task.await.unwrap().unwrap_err();
    assert_eq!(err.libvirt_code(), Some(42));
    assert_eq!(err.remote().unwrap().message, "no domain 'vm1'");
    assert!(!err.is_connection());
    assert!(client.connection().is_alive());
}

#[tokio::test]
async fn duplicate_and_unknown_replies_are_dropped_and_counted() {
    // finding: L28 — a duplicate reply must not block the reader or reach another caller.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let first = tokio::spawn(async move { c.hostname().await });
    let call = peer.recv_remote().await;
    peer.reply(&call, hostname_payload("one")).await;
    peer.reply(&call, hostname_payload("dup")).await;
    peer.reply(&call, hostname_payload("dup2")).await;
    let mut bogus = call.clone();
    bogus.header.serial = 999_999;
    peer.reply(&bogus, hostname_payload("unknown")).await;
    assert_eq!(first.await.unwrap().unwrap(), "one");
    // The next call is answered normally: the reader did not stall on the duplicates.
    let c = client.clone();
    let second = tokio::spawn(async move { c.hostname().await });
    let call2 = peer.recv_remote().await;
    peer.reply(&call2, hostname_payload("two")).await;
    assert_eq!(second.await.unwrap().unwrap(), "two");
    assert_eq!(client.connection().stats().unknown_replies, 3);
}

#[tokio::test]
async fn a_dropped_call_is_abandoned_alone_and_its_late_reply_is_counted() {
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let abandoned = tokio::spawn(async move { c.hostname().await });
    let call = peer.recv_remote().await;
    abandoned.abort();
    let _ = abandoned.await;
    peer.reply(&call, hostname_payload("late")).await;
    let c = client.clone();
    let next = tokio::spawn(async move { c.hostname().await });
    let call2 = peer.recv_remote().await;
    peer.reply(&call2, hostname_payload("fresh")).await;
    assert_eq!(next.await.unwrap().unwrap(), "fresh");
    let s = client.connection().stats();
    assert_eq!(s.late_replies, 1);
    assert_eq!(s.unknown_replies, 0);
    assert!(client.connection().is_alive());
}

#[tokio::test(start_paused = true)]
async fn a_call_times_out_without_killing_the_connection() {
    let cfg = ConnectionConfig {
        call_timeout: Duration::from_secs(5),
        ..quiet()
    };
    let (client, mut peer) = pair(cfg);
    let c = client.clone();
    let slow = tokio::spawn(async move { c.hostname().await });
    let call = peer.recv_remote().await;
    let err = slow.await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(client.connection().is_alive());
    peer.reply(&call, hostname_payload("late")).await;
    let c = client.clone();
    let next = tokio::spawn(async move { c.hostname().await });
    let call2 = peer.recv_remote().await;
    peer.reply(&call2, hostname_payload("ok")).await;
    assert_eq!(next.await.unwrap().unwrap(), "ok");
    assert_eq!(client.connection().stats().late_replies, 1);
}

#[tokio::test]
async fn short_and_huge_frame_lengths_kill_the_connection_without_panicking() {
    // finding: L27
    for bad in [
        27u32.to_be_bytes().to_vec(),
        0u32.to_be_bytes().to_vec(),
        u32::MAX.to_be_bytes().to_vec(),
        ((libvirt_remote::frame::MAX_PACKET + 1) as u32)
            .to_be_bytes()
            .to_vec(),
    ] {
        let (client, mut peer) = pair(quiet());
        let c = client.clone();
        let pending = tokio::spawn(async move { c.hostname().await });
        let _call = peer.recv_remote().await;
        peer.raw(&bad).await;
        let err = pending.await.unwrap().unwrap_err();
        assert!(err.is_connection(), "{err}");
        assert!(matches!(
            client.connection().death_reason(),
            Some(DeathReason::Malformed(_))
        ));
        // Later calls fail at once.
        let later = client.hostname().await.unwrap_err();
        assert!(later.is_connection());
    }
}

#[tokio::test]
async fn an_undecodable_reply_kills_the_connection_and_fails_the_call() {
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let pending = tokio::spawn(async move { c.lib_version().await });
    let call = peer.recv_remote().await;
    peer.reply(&call, Bytes::from_static(&[0, 0, 1])).await;
    let err = pending.await.unwrap().unwrap_err();
    assert!(err.is_protocol(), "{err}");
    assert!(!client.connection().is_alive());
}

#[tokio::test]
async fn peer_closing_right_after_open_fails_the_next_call_and_a_redial_works() {
    // finding: M6 — over 1000 iterations, a link whose peer closed after the open reply is
    // dead (connection error), never "alive but returning EINVAL"; a fresh dial works.
    tokio::time::timeout(Duration::from_secs(120), async {
        for i in 0..1000 {
            let (client, mut peer) = pair(quiet());
            let c = client.clone();
            let open = tokio::spawn(async move {
                c.connection()
                    .call::<_, ()>(
                        procs::CONNECT_OPEN,
                        &proto::ConnectOpenArgs {
                            name: Some("qemu:///system".into()),
                            flags: 0,
                        },
                    )
                    .await
            });
            let call = peer.recv_remote().await;
            peer.reply(&call, Bytes::new()).await;
            open.await.unwrap().unwrap();
            drop(peer); // the daemon goes away right after answering
            client.connection().closed().await;
            let err = client.hostname().await.unwrap_err();
            assert!(err.is_connection(), "iteration {i}: {err}");
            assert_eq!(client.connection().death_reason(), Some(DeathReason::Eof));
            // Redial.
            let (client2, mut peer2) = pair(quiet());
            let c2 = client2.clone();
            let h = tokio::spawn(async move { c2.hostname().await });
            let call = peer2.recv_remote().await;
            peer2.reply(&call, hostname_payload("back")).await;
            assert_eq!(h.await.unwrap().unwrap(), "back");
        }
    })
    .await
    .expect("M6 loop wedged");
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_is_declared_dead_within_the_keepalive_budget() {
    let cfg = ConnectionConfig {
        call_timeout: Duration::from_secs(3600),
        keepalive_interval: Duration::from_secs(2),
        keepalive_count: 3,
    };
    let budget = cfg.keepalive_budget();
    let (client, mut peer) = pair(cfg);
    let c = client.clone();
    let pending = tokio::spawn(async move { c.hostname().await });
    let _call = peer.recv_remote().await;
    let start = tokio::time::Instant::now();
    client.connection().closed().await;
    let took = start.elapsed();
    assert!(took <= budget + Duration::from_secs(2), "took {took:?}");
    assert!(
        took >= Duration::from_secs(6),
        "declared dead too early: {took:?}"
    );
    assert!(matches!(
        client.connection().death_reason(),
        Some(DeathReason::KeepaliveTimeout { .. })
    ));
    assert!(pending.await.unwrap().unwrap_err().is_connection());
    // The silent peer was pinged before being given up on.
    let mut pings = 0;
    while let Ok(Some(Ok(p))) =
        tokio::time::timeout(Duration::from_millis(10), peer.io.next()).await
    {
        if p.header.prog == proto::KEEPALIVE_PROGRAM && p.header.proc_ == proto::KEEPALIVE_PING {
            pings += 1;
        }
    }
    assert_eq!(pings, 3);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_answers_pings_keeps_the_connection_alive() {
    let cfg = ConnectionConfig {
        call_timeout: Duration::from_secs(3600),
        keepalive_interval: Duration::from_secs(1),
        keepalive_count: 2,
    };
    let (client, mut peer) = pair(cfg);
    let responder = tokio::spawn(async move {
        loop {
            let p = peer.recv().await;
            if p.header.prog == proto::KEEPALIVE_PROGRAM && p.header.proc_ == proto::KEEPALIVE_PING
            {
                let mut pong = p.clone();
                pong.header.proc_ = proto::KEEPALIVE_PONG;
                peer.send(pong).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(client.connection().is_alive());
    let s = client.connection().stats();
    assert!(s.pongs_received >= 10, "{s:?}");
    responder.abort();
}

#[tokio::test]
async fn the_client_answers_a_daemon_ping_with_a_pong() {
    let (client, mut peer) = pair(quiet());
    let ping = Packet {
        header: Header {
            prog: proto::KEEPALIVE_PROGRAM,
            vers: 1,
            proc_: proto::KEEPALIVE_PING,
            mtype: MessageType::Message,
            serial: 0,
            status: Status::Ok,
        },
        payload: Bytes::new(),
    };
    peer.send(ping).await;
    let pong = peer.recv().await;
    assert_eq!(pong.header.prog, 0x6b65_6570);
    assert_eq!(pong.header.proc_, 2);
    assert_eq!(pong.header.mtype, MessageType::Message);
    assert!(pong.payload.is_empty());
    assert_eq!(client.connection().stats().pings_answered, 1);
}

#[tokio::test]
async fn a_flood_of_events_nobody_reads_never_blocks_replies() {
    let (client, mut peer) = pair(quiet());
    let _unread = client.connection().subscribe();
    let c = client.clone();
    let pending = tokio::spawn(async move { c.hostname().await });
    let call = peer.recv_remote().await;
    let ev = Packet {
        header: Header {
            prog: proto::REMOTE_PROGRAM,
            vers: 1,
            proc_: procs::DOMAIN_EVENT_CALLBACK_LIFECYCLE,
            mtype: MessageType::Message,
            serial: 0,
            status: Status::Ok,
        },
        payload: Bytes::from_static(&[0; 40]),
    };
    for _ in 0..5000 {
        peer.send(ev.clone()).await;
    }
    peer.reply(&call, hostname_payload("still here")).await;
    let got = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("reply blocked behind unread events")
        .unwrap()
        .unwrap();
    assert_eq!(got, "still here");
    assert_eq!(client.connection().stats().events, 5000);
}

/// Longest a `close_by` may take in the L14 tests before they fail (instead of hanging).
// NB: a correct close returns at its deadline (at most 300 ms here); 5 s is far above that
// on a loaded box, and far below the peer's silence (the quiet config waits an hour).
const CLOSE_BOUND: Duration = Duration::from_secs(5);

#[tokio::test]
async fn closing_after_the_deadline_sends_nothing() {
    // finding: L14
    let (client, mut peer) = pair(quiet());
    let past = tokio::time::Instant::now() - Duration::from_millis(1);
    let start = std::time::Instant::now();
    // A regression that waits on the (silent) peer must fail here, not hang the suite.
    tokio::time::timeout(CLOSE_BOUND, client.close_by(past))
        .await
        .expect("close_by waited on the network after its deadline");
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(!client.connection().is_alive());
    // The peer sees the stream end with no CONNECT_CLOSE (or anything else) sent.
    let next = tokio::time::timeout(Duration::from_secs(5), peer.io.next())
        .await
        .expect("stream did not end");
    assert!(next.is_none(), "client sent {next:?} after its deadline");
}

#[tokio::test]
async fn closing_with_time_left_says_goodbye_and_never_waits_past_the_deadline() {
    // finding: L14 — the goodbye is bounded by the deadline even if the peer never answers.
    let (client, mut peer) = pair(quiet());
    let start = std::time::Instant::now();
    let closer = {
        let c = client.clone();
        tokio::spawn(async move {
            c.close_by(tokio::time::Instant::now() + Duration::from_millis(300))
                .await
        })
    };
    let call = peer.recv_remote().await;
    assert_eq!(call.header.proc_, procs::CONNECT_CLOSE);
    tokio::time::timeout(CLOSE_BOUND, closer)
        .await
        .expect("close_by waited on the silent peer past its deadline")
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(!client.connection().is_alive());
}

#[test]
fn zero_durations_in_the_connection_config_are_rejected_without_panicking() {
    // finding: L1
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for cfg in [
            ConnectionConfig {
                keepalive_interval: Duration::ZERO,
                ..Default::default()
            },
            ConnectionConfig {
                keepalive_count: 0,
                ..Default::default()
            },
            ConnectionConfig {
                call_timeout: Duration::ZERO,
                ..Default::default()
            },
        ] {
            let (a, _b) = tokio::io::duplex(64);
            let t = Transport::from_stream(a, KillSwitch::noop(), "duplex");
            let err = Connection::start(t, cfg).unwrap_err();
            assert!(err.is_permanent(), "{err}");
            assert!(
                err.to_string().contains("must be greater than zero"),
                "{err}"
            );
        }
    });
}

// ---- uploads ----

fn vol() -> StorageVol {
    StorageVol {
        pool: "p".into(),
        name: "v".into(),
        key: "/p/v".into(),
    }
}

/// A source that yields `ok_bytes` zero bytes, then fails.
struct FailingSource {
    left: usize,
}

impl AsyncRead for FailingSource {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.left == 0 {
            return std::task::Poll::Ready(Err(std::io::Error::other("disk read error")));
        }
        let n = self.left.min(buf.remaining()).min(8192);
        buf.put_slice(&vec![7u8; n]);
        self.left -= n;
        std::task::Poll::Ready(Ok(()))
    }
}

/// Answers the upload call, then reads stream packets until `until` says stop;
/// returns the data bytes seen and the last packet.
async fn accept_upload(peer: &mut Peer) -> Packet {
    let call = peer.recv_remote().await;
    assert_eq!(call.header.proc_, procs::STORAGE_VOL_UPLOAD);
    peer.reply(&call, Bytes::new()).await;
    call
}

#[tokio::test]
async fn upload_sends_data_then_finish_and_waits_for_the_confirm() {
    let (client, mut peer) = pair(quiet());
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let src = std::io::Cursor::new(data.clone());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload(&vol(), 0, 0, src, &UploadOptions::default())
            .await
    });
    let call = accept_upload(&mut peer).await;
    let mut got = Vec::new();
    loop {
        let p = peer.recv_remote().await;
        assert_eq!(p.header.serial, call.header.serial);
        assert_eq!(p.header.mtype, MessageType::Stream);
        match p.header.status {
            Status::Continue => {
                assert!(p.payload.len() <= libvirt_remote::frame::LEGACY_STREAM_PAYLOAD);
                got.extend_from_slice(&p.payload);
            }
            Status::Ok => {
                assert!(p.payload.is_empty());
                peer.send(reply_to(&p, Status::Ok, Bytes::new())).await;
                break;
            }
            s => panic!("unexpected status {s:?}"),
        }
    }
    assert_eq!(up.await.unwrap().unwrap(), data.len() as u64);
    assert_eq!(got, data);
}

#[tokio::test]
async fn upload_ends_when_the_source_fails_midway() {
    // finding: H2 — the stream is aborted (STREAM/ERROR on the wire) and the source's error
    // returned, in bounded time.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload(
            &vol(),
            0,
            0,
            FailingSource { left: 1_000_000 },
            &UploadOptions::default(),
        )
        .await
    });
    let call = accept_upload(&mut peer).await;
    let abort = loop {
        let p = peer.recv_remote().await;
        if p.header.status != Status::Continue {
            break p;
        }
    };
    assert_eq!(abort.header.serial, call.header.serial);
    assert_eq!(abort.header.mtype, MessageType::Stream);
    assert_eq!(abort.header.status, Status::Error);
    assert!(abort.payload.is_empty());
    // libvirtd confirms an abort with an error reply on the stream's serial.
    peer.send(Packet {
        header: Header {
            mtype: MessageType::Reply,
            status: Status::Error,
            ..call.header
        },
        payload: error_payload(39, "stream aborted at client request"),
    })
    .await;
    let err = tokio::time::timeout(Duration::from_secs(10), up)
        .await
        .expect("upload wedged")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.source_error().unwrap().to_string(), "disk read error");
    assert!(client.connection().is_alive());
}

#[tokio::test]
async fn upload_stops_sending_at_once_when_the_daemon_fails_midway() {
    // finding: H2 — a REPLY/ERROR on the stream's serial (disk full) ends the upload even
    // though the source never ends.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload(
            &vol(),
            0,
            0,
            tokio::io::repeat(1),
            &UploadOptions::default(),
        )
        .await
    });
    let call = accept_upload(&mut peer).await;
    for _ in 0..3 {
        let p = peer.recv_remote().await;
        assert_eq!(p.header.status, Status::Continue);
    }
    peer.send(Packet {
        header: Header {
            mtype: MessageType::Reply,
            status: Status::Error,
            ..call.header
        },
        payload: error_payload(38, "No space left on device"),
    })
    .await;
    let err = tokio::time::timeout(Duration::from_secs(10), up)
        .await
        .expect("upload kept sending after the daemon failed")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.libvirt_code(), Some(38));
    assert!(client.connection().is_alive());
    // Drain what was queued; the client then goes quiet (no more data for that stream).
    let quiet_after = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            let p = peer.recv_remote().await;
            if p.header.status != Status::Continue {
                return p;
            }
        }
    })
    .await;
    assert!(quiet_after.is_err(), "client sent {quiet_after:?}");
}

#[tokio::test]
async fn upload_past_its_deadline_aborts_and_kills_the_connection_if_unconfirmed() {
    // finding: H2 — deadline → abort; no confirm within the abort budget → connection killed.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let opts = UploadOptions {
        deadline: Some(Duration::from_millis(300)),
        abort_budget: Duration::from_millis(300),
        ..Default::default()
    };
    let (_never_tx, never_rx) = tokio::io::duplex(8); // a source that never yields
    let start = std::time::Instant::now();
    let up = tokio::spawn(async move { c.vol_upload(&vol(), 0, 0, never_rx, &opts).await });
    let _call = accept_upload(&mut peer).await;
    let abort = peer.recv_remote().await;
    assert_eq!(abort.header.status, Status::Error);
    let err = up.await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        client.connection().death_reason(),
        Some(DeathReason::StreamAbortTimeout)
    );
}

#[tokio::test]
async fn a_dropped_upload_is_aborted_in_the_background_and_the_connection_survives_a_confirm() {
    // finding: H2 — cancellation: the abort goes out, and a confirmed abort keeps the link.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload(
            &vol(),
            0,
            0,
            tokio::io::repeat(3),
            &UploadOptions::default(),
        )
        .await
    });
    let call = accept_upload(&mut peer).await;
    let _ = peer.recv_remote().await;
    up.abort();
    let _ = up.await;
    let abort = loop {
        let p = peer.recv_remote().await;
        if p.header.status != Status::Continue {
            break p;
        }
    };
    assert_eq!(abort.header.status, Status::Error);
    peer.send(Packet {
        header: Header {
            mtype: MessageType::Reply,
            status: Status::Error,
            ..call.header
        },
        payload: error_payload(39, "stream aborted at client request"),
    })
    .await;
    let c = client.clone();
    let h = tokio::spawn(async move { c.hostname().await });
    let call2 = peer.recv_remote().await;
    peer.reply(&call2, hostname_payload("ok")).await;
    assert_eq!(h.await.unwrap().unwrap(), "ok");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// How long the isolated run of an FD-counting test may take, child start-up included.
// NB: the body takes well under a second; the child is this test binary, already built.
const ISOLATED_BUDGET: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_leave_no_task_or_descriptor_behind() {
    // finding: H2 — after every failure path, tasks and FDs return to their baseline. The
    // counts are per process, so the body runs in a process of its own: a test running in
    // parallel could otherwise open or close descriptors between the two counts.
    ep_test_support::isolate::in_own_process(
        "failed_uploads_leave_no_task_or_descriptor_behind",
        ISOLATED_BUDGET,
        failed_uploads_body(),
    )
    .await;
}

async fn failed_uploads_body() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A sparse file far larger than the socket buffers and the queues: its uploads block.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let base_tasks = metrics.num_alive_tasks();
    let base_fds = open_fds();
    // Rounds: 0 the source fails, 1 the deadline passes, 2 the daemon fails midway; 3 and 4
    // as 1 and 2 from a file (FileSource: a batch read may be running on the blocking pool
    // and holds the file), 5 a file upload dropped mid-stream.
    for round in 0..6 {
        let (srv, client_transport) = tokio::join!(listener.accept(), async {
            libvirt_remote::transport::tcp::connect(addr, Duration::from_secs(5)).await
        });
        let (srv, _) = srv.unwrap();
        let conn = Connection::start(client_transport.unwrap(), quiet()).unwrap();
        let client = Client::from_connection(conn);
        let mut peer_io = Framed::new(srv, PacketCodec);
        let opts = UploadOptions {
            deadline: Some(Duration::from_millis(200)),
            abort_budget: Duration::from_millis(200),
            ..Default::default()
        };
        let c = client.clone();
        let file = std::fs::File::open(&image).unwrap();
        let up = tokio::spawn(async move {
            match round {
                0 => {
                    c.vol_upload(&vol(), 0, 0, FailingSource { left: 300_000 }, &opts)
                        .await
                }
                3.. => c.vol_upload_file(&vol(), 0, 0, file, &opts).await,
                _ => {
                    c.vol_upload(&vol(), 0, 0, tokio::io::repeat(0), &opts)
                        .await
                }
            }
        });
        let call = peer_io.next().await.unwrap().unwrap();
        peer_io
            .send(reply_to(&call, Status::Ok, Bytes::new()))
            .await
            .unwrap();
        if round == 5 {
            // Dropped while the file's frames flow: the background abort goes unconfirmed.
            let _ = peer_io.next().await;
            up.abort();
            assert!(up.await.unwrap_err().is_cancelled());
            drop(client);
            drop(peer_io);
            continue;
        }
        if round == 2 || round == 4 {
            // Daemon fails midway.
            let _ = peer_io.next().await;
            peer_io
                .send(Packet {
                    header: Header {
                        mtype: MessageType::Reply,
                        status: Status::Error,
                        ..call.header
                    },
                    payload: error_payload(38, "No space left on device"),
                })
                .await
                .unwrap();
        }
        let res = tokio::time::timeout(Duration::from_secs(10), up)
            .await
            .expect("upload wedged")
            .unwrap();
        assert!(res.is_err());
        drop(client);
        drop(peer_io);
    }
    // Background aborts and connection tasks end within a short wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (t, f) = (metrics.num_alive_tasks(), open_fds());
        if t <= base_tasks && f <= base_fds {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "leak: tasks {t} (baseline {base_tasks}), fds {f} (baseline {base_fds})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_connection_blocked_on_a_frozen_peer_returns_at_once() {
    // finding: H1 — the peer stops reading while an upload fills the send buffers; kill()
    // returns in well under a second and every caller on the link fails promptly.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_send_buffer_size(4096).unwrap();
    let (stream, accepted) = tokio::join!(sock.connect(addr), listener.accept());
    let stream = stream.unwrap();
    let (srv, _) = accepted.unwrap();
    let srv_sock = socket2::SockRef::from(&srv);
    srv_sock.set_recv_buffer_size(4096).unwrap();
    let conn = Connection::start(
        libvirt_remote::transport::tcp::from_stream(stream).unwrap(),
        quiet(),
    )
    .unwrap();
    let client = Client::from_connection(conn);
    let mut peer_io = Framed::new(srv, PacketCodec);

    let c = client.clone();
    let upload = tokio::spawn(async move {
        c.vol_upload(
            &vol(),
            0,
            0,
            tokio::io::repeat(9),
            &UploadOptions::default(),
        )
        .await
    });
    let call = peer_io.next().await.unwrap().unwrap();
    peer_io
        .send(reply_to(&call, Status::Ok, Bytes::new()))
        .await
        .unwrap();
    // From here the peer never reads again: buffers fill, the writer blocks.
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.hostname().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !upload.is_finished(),
        "upload should be blocked on the frozen peer"
    );

    let start = std::time::Instant::now();
    client.connection().kill();
    assert!(start.elapsed() < Duration::from_secs(1), "kill blocked");
    let up_err = tokio::time::timeout(Duration::from_secs(1), upload)
        .await
        .expect("upload did not fail promptly")
        .unwrap()
        .unwrap_err();
    assert!(up_err.is_connection(), "{up_err}");
    for c in callers {
        let e = tokio::time::timeout(Duration::from_secs(1), c)
            .await
            .expect("caller did not fail promptly")
            .unwrap()
            .unwrap_err();
        assert!(e.is_connection(), "{e}");
    }
    // The socket was really shut: the frozen peer now sees EOF after the buffered bytes.
    let mut raw = peer_io.into_inner();
    let mut sink = vec![0u8; 1 << 16];
    let eof = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match raw.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(eof.is_ok(), "socket was not shut down");
    let _ = Domain::default();
}

/// A client over a duplex whose kill switch records that it fired; the peer side is returned
/// to be driven (or left unread: a frozen peer).
fn pair_with_recorded_kill(config: ConnectionConfig) -> (Client, Peer, Arc<AtomicBool>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let shut = Arc::new(AtomicBool::new(false));
    let kill = KillSwitch::noop();
    let flag = shut.clone();
    kill.push(move || flag.store(true, Ordering::SeqCst));
    let conn = Connection::start(Transport::from_stream(a, kill, "duplex"), config).unwrap();
    (
        Client::from_connection(conn),
        Peer {
            io: Framed::new(b, PacketCodec),
        },
        shut,
    )
}

#[tokio::test(flavor = "current_thread")]
async fn marking_a_link_dead_shuts_its_socket_before_it_returns_and_before_any_caller_fails() {
    // finding: H1 — the order is the guarantee: the socket is shut first (a writer blocked on
    // a frozen peer is released by it), then the tasks stop and the callers fail. On this
    // single-threaded runtime no task runs while `kill()` executes, so only `kill()` itself
    // can have shut the socket when it returns.
    let (client, mut peer, shut) = pair_with_recorded_kill(quiet());
    let c = client.clone();
    let s = shut.clone();
    let call = tokio::spawn(async move {
        let r = c.hostname().await;
        (r, s.load(Ordering::SeqCst))
    });
    let _pending = peer.recv_remote().await; // the call is on the wire, never answered
    client.connection().kill();
    assert!(
        shut.load(Ordering::SeqCst),
        "kill() returned before the socket was shut"
    );
    let (r, shut_when_failed) = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the caller did not fail")
        .unwrap();
    assert!(r.unwrap_err().is_connection());
    assert!(shut_when_failed);

    // The same order when the link dies on its own (the peer hangs up mid-call).
    let (client, mut peer, shut) = pair_with_recorded_kill(quiet());
    let c = client.clone();
    let s = shut.clone();
    let call = tokio::spawn(async move {
        let r = c.hostname().await;
        (r, s.load(Ordering::SeqCst))
    });
    let _pending = peer.recv_remote().await;
    drop(peer);
    let (r, shut_when_failed) = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the caller did not fail")
        .unwrap();
    assert!(r.unwrap_err().is_connection());
    assert!(
        shut_when_failed,
        "a caller failed before the dead link's socket was shut"
    );
    drop(client);
}

#[tokio::test]
async fn upload_never_sends_past_the_declared_length() {
    // libvirtd 11.3 was seen to crash when a stream carried more bytes than the call's length.
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload(
            &vol(),
            0,
            300_000,
            tokio::io::repeat(5),
            &UploadOptions::default(),
        )
        .await
    });
    let _call = accept_upload(&mut peer).await;
    let mut data = 0usize;
    loop {
        let p = peer.recv_remote().await;
        match p.header.status {
            Status::Continue => data += p.payload.len(),
            Status::Ok => {
                peer.send(reply_to(&p, Status::Ok, Bytes::new())).await;
                break;
            }
            s => panic!("unexpected {s:?}"),
        }
    }
    assert_eq!(data, 300_000);
    assert_eq!(up.await.unwrap().unwrap(), 300_000);
}

/// Receives an accepted upload's stream packets until the finish packet, confirms it, and
/// returns the data payload sizes and bytes.
async fn receive_upload(peer: &mut Peer, call: &Packet) -> (Vec<usize>, Vec<u8>) {
    let (mut sizes, mut data) = (Vec::new(), Vec::new());
    loop {
        let p = peer.recv_remote().await;
        assert_eq!(p.header.serial, call.header.serial);
        assert_eq!(p.header.mtype, MessageType::Stream);
        match p.header.status {
            Status::Continue => {
                sizes.push(p.payload.len());
                data.extend_from_slice(&p.payload);
            }
            Status::Ok => {
                assert!(p.payload.is_empty());
                peer.send(reply_to(&p, Status::Ok, Bytes::new())).await;
                return (sizes, data);
            }
            s => panic!("unexpected status {s:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_upload_sends_the_file_in_order_in_full_frames_and_stops_at_the_declared_length() {
    // FileSource reads 4 frames per blocking call, one batch ahead: every size around the
    // frame and batch boundaries, with and without a declared length below the file's.
    const CHUNK: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let cases: [(usize, u64); 8] = [
        (1, 0),
        (CHUNK, 0),
        (4 * CHUNK, 0),
        (4 * CHUNK + 1, 0),
        (8 * CHUNK, 0),
        (9 * CHUNK + 77, 0),
        (9 * CHUNK + 77, 5 * CHUNK as u64 + 3),
        (9 * CHUNK + 77, 4 * CHUNK as u64),
    ];
    for (i, (file_len, length)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("img{i}"));
        let content: Vec<u8> = (0..file_len).map(|b| (b * 7 % 253) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let (client, mut peer) = pair(quiet());
        let c = client.clone();
        let file = std::fs::File::open(&path).unwrap();
        let opts = UploadOptions {
            chunk_size: CHUNK,
            ..Default::default()
        };
        let up =
            tokio::spawn(async move { c.vol_upload_file(&vol(), 0, length, file, &opts).await });
        let call = accept_upload(&mut peer).await;
        let (sizes, data) = receive_upload(&mut peer, &call).await;
        let want = if length == 0 {
            file_len
        } else {
            length as usize
        };
        let what = format!("file of {file_len} bytes, length {length}");
        assert_eq!(up.await.unwrap().unwrap(), want as u64, "{what}");
        assert_eq!(data, content[..want], "{what}: the bytes differ");
        let (last, full) = sizes.split_last().unwrap();
        assert!(full.iter().all(|n| *n == CHUNK), "{what}: {sizes:?}");
        assert!(*last > 0 && *last <= CHUNK, "{what}: {sizes:?}");
    }
}

#[tokio::test]
async fn a_file_that_cannot_be_read_aborts_the_upload_with_its_error() {
    // finding: H2 — the source's failure (here: a descriptor opened for writing only) aborts
    // the stream on the wire and comes back as the source's error.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wo");
    std::fs::write(&path, vec![1u8; 10_000]).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (client, mut peer) = pair(quiet());
    let c = client.clone();
    let up = tokio::spawn(async move {
        c.vol_upload_file(&vol(), 0, 0, file, &UploadOptions::default())
            .await
    });
    let call = accept_upload(&mut peer).await;
    let abort = peer.recv_remote().await;
    assert_eq!(abort.header.serial, call.header.serial);
    assert_eq!(abort.header.mtype, MessageType::Stream);
    assert_eq!(abort.header.status, Status::Error);
    peer.send(Packet {
        header: Header {
            mtype: MessageType::Reply,
            status: Status::Error,
            ..call.header
        },
        payload: error_payload(39, "stream aborted at client request"),
    })
    .await;
    let err = tokio::time::timeout(Duration::from_secs(10), up)
        .await
        .expect("upload wedged")
        .unwrap()
        .unwrap_err();
    assert!(err.source_error().is_some(), "{err}");
    assert!(client.connection().is_alive());
}
