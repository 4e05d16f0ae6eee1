//! Regression inputs for the fuzz targets in `fuzz/` (see `docs/fuzzing.md`), and hand-made
//! hostile inputs that go through the public decoders and through a live [`Connection`] whose
//! peer (a `tokio::io::duplex`) sends them. Each must end in a clean error or a dead
//! connection, never a panic or a large allocation (finding L27).
//!
//! `fuzz_seed_files_are_the_valid_packets_they_claim_to_be` also guards the seed corpus in
//! `fuzz/seeds/`; run it with `FUZZ_WRITE_SEEDS=1` to (re)write the seed files.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use libvirt_remote::frame::{
    FrameError, HEADER_SIZE, Header, MAX_PACKET, MAX_PAYLOAD, MIN_PACKET, MessageType, Packet,
    PacketCodec, Status,
};
use libvirt_remote::proto::{
    self, Domain, DomainRet, ListAllDomainsRet, RemoteErrorWire, StringRet, procs,
};
use libvirt_remote::xdr::{self, STRING_MAX, XdrError};
use libvirt_remote::{
    Connection, ConnectionConfig, DeathReason, Error, KillSwitch, Transport, UploadOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Decoder;

// ---------------------------------------------------------------------------------------
// Building wire bytes.

fn header(prog: u32, proc_: i32, mtype: MessageType, serial: u32, status: Status) -> Header {
    Header {
        prog,
        vers: 1,
        proc_,
        mtype,
        serial,
        status,
    }
}

fn reply(proc_: i32, serial: u32, status: Status, payload: &[u8]) -> Vec<u8> {
    let p = Packet {
        header: header(
            proto::REMOTE_PROGRAM,
            proc_,
            MessageType::Reply,
            serial,
            status,
        ),
        payload: Bytes::copy_from_slice(payload),
    };
    p.to_bytes().unwrap().to_vec()
}

/// A length word followed by a valid reply header for serial 1 (no payload bytes).
fn length_word_then_header(len: u32) -> Vec<u8> {
    let mut b = len.to_be_bytes().to_vec();
    b.extend_from_slice(&reply(procs::CONNECT_GET_HOSTNAME, 1, Status::Ok, &[])[4..]);
    b
}

fn domain() -> Domain {
    Domain {
        name: "eptest-fuzz".into(),
        uuid: *b"0123456789abcdef",
        id: 7,
    }
}

fn remote_error() -> RemoteErrorWire {
    RemoteErrorWire {
        code: 42,
        domain: 10,
        message: Some("Domain not found: no domain with matching name 'x'".into()),
        level: 2,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// A duplex "daemon".

/// How the fake daemon ends after writing its bytes.
#[derive(Clone, Copy)]
enum After {
    /// Keep the stream open and silent (so only the bytes themselves can kill the link).
    StayOpen,
    /// Close its side.
    Close,
}

/// Starts a connection whose peer writes `wire` and then behaves as `after` says, while
/// the peer drains everything the client sends.
fn connection_with_peer(wire: Vec<u8>, after: After) -> Connection {
    let (client_io, daemon_io) = tokio::io::duplex(1 << 20);
    let transport = Transport::from_stream(client_io, KillSwitch::noop(), "fuzz-regression");
    let conn = Connection::start(transport, ConnectionConfig::default()).unwrap();
    let (mut rx, mut tx) = tokio::io::split(daemon_io);
    tokio::spawn(async move {
        let mut sink = vec![0u8; 4096];
        while let Ok(n) = rx.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let _ = tx.write_all(&wire).await;
        match after {
            // NB: shut the write direction down: dropping one half of a split duplex
            // does not close it while the drain task holds the other half.
            After::Close => {
                let _ = tx.shutdown().await;
            }
            After::StayOpen => std::future::pending::<()>().await,
        }
    });
    conn
}

/// Asserts the call failed as a dead connection would fail it, and the link is dead for
/// the reason `expected` accepts.
fn assert_dead(conn: &Connection, err: &Error, expected: fn(&DeathReason) -> bool) {
    assert!(
        err.is_connection() || err.is_protocol(),
        "unexpected error kind: {err}"
    );
    assert!(!conn.is_alive(), "the connection survived: {err}");
    let reason = conn.death_reason().unwrap();
    assert!(expected(&reason), "unexpected death reason: {reason:?}");
}

fn malformed(r: &DeathReason) -> bool {
    matches!(r, DeathReason::Malformed(_))
}

// ---------------------------------------------------------------------------------------
// Frame lengths through the public decoder.

// finding: L27
#[test]
fn every_length_below_the_header_minimum_is_refused_by_the_decoder() {
    for len in 0..MIN_PACKET as u32 {
        let mut b = BytesMut::from(&length_word_then_header(len)[..]);
        match PacketCodec.decode(&mut b) {
            Err(FrameError::TooShort(l)) => assert_eq!(l, len as usize),
            other => panic!("length {len}: {other:?}"),
        }
    }
}

// finding: L27
#[test]
fn length_of_0xffffffff_is_refused_without_reserving_anything() {
    let mut b = BytesMut::from(&length_word_then_header(u32::MAX)[..]);
    let cap = b.capacity();
    assert!(matches!(
        PacketCodec.decode(&mut b),
        Err(FrameError::TooLarge(l)) if l == u32::MAX as usize
    ));
    assert_eq!(b.capacity(), cap);
}

// finding: L27
#[test]
fn length_of_exactly_min_packet_decodes_to_an_empty_payload() {
    let mut b = BytesMut::from(&length_word_then_header(MIN_PACKET as u32)[..]);
    let p = PacketCodec.decode(&mut b).unwrap().unwrap();
    assert!(p.payload.is_empty());
    assert_eq!(p.header.serial, 1);
    assert!(b.is_empty());
}

// finding: L27
#[test]
fn length_of_exactly_max_packet_is_accepted_and_one_more_is_refused() {
    let mut b = BytesMut::from(&length_word_then_header(MAX_PACKET as u32)[..]);
    assert!(PacketCodec.decode(&mut b).unwrap().is_none());
    assert!(
        b.capacity() <= MAX_PACKET,
        "reserved {} for one packet",
        b.capacity()
    );
    b.resize(MAX_PACKET, 0xab);
    let p = PacketCodec.decode(&mut b).unwrap().unwrap();
    assert_eq!(p.payload.len(), MAX_PAYLOAD);

    let mut b = BytesMut::from(&length_word_then_header(MAX_PACKET as u32 + 1)[..]);
    assert!(matches!(
        PacketCodec.decode(&mut b),
        Err(FrameError::TooLarge(l)) if l == MAX_PACKET + 1
    ));
}

// finding: L27
#[test]
fn truncated_header_is_incomplete_until_eof_and_an_error_at_eof() {
    let full = length_word_then_header(MIN_PACKET as u32);
    for cut in 1..full.len() {
        let mut b = BytesMut::from(&full[..cut]);
        assert!(PacketCodec.decode(&mut b).unwrap().is_none(), "cut {cut}");
        assert!(PacketCodec.decode_eof(&mut b).is_err(), "cut {cut}");
    }
}

// ---------------------------------------------------------------------------------------
// XDR payloads through the public decoder.

// finding: L27
#[test]
fn array_count_larger_than_the_payload_is_refused_before_allocating() {
    for count in [2u32, 0x7fff_ffff, u32::MAX] {
        let mut b = count.to_be_bytes().to_vec();
        b.extend_from_slice(&xdr::to_bytes(&domain()));
        b.extend_from_slice(&0u32.to_be_bytes());
        let err = xdr::from_bytes::<ListAllDomainsRet>(&b).unwrap_err();
        assert!(matches!(err, XdrError::TooLong { .. }), "{count}: {err:?}");
    }
}

// finding: L27
#[test]
fn string_of_four_mib_plus_one_is_refused_and_four_mib_is_accepted() {
    let mut over = ((STRING_MAX + 1) as u32).to_be_bytes().to_vec();
    over.resize(4 + STRING_MAX + 4, b'a');
    assert!(matches!(
        xdr::from_bytes::<StringRet>(&over),
        Err(XdrError::TooLong { len, .. }) if len == STRING_MAX + 1
    ));

    let mut max = (STRING_MAX as u32).to_be_bytes().to_vec();
    max.resize(4 + STRING_MAX, b'a');
    assert_eq!(
        xdr::from_bytes::<StringRet>(&max).unwrap().value.len(),
        STRING_MAX
    );
}

// finding: L27
#[test]
fn string_length_of_0xffffffff_is_refused_in_every_optional_field() {
    // remote_error with message = Some(<length 0xffffffff>) and nothing after it.
    let b = [
        0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, b'x',
    ];
    assert!(matches!(
        xdr::from_bytes::<RemoteErrorWire>(&b),
        Err(XdrError::TooLong { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// The same inputs from a peer of a live connection.

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_peer_sending_a_length_below_the_minimum_kills_the_connection() {
    for len in [0u32, 4, 27] {
        let conn = connection_with_peer(length_word_then_header(len), After::StayOpen);
        let err = conn
            .call::<_, StringRet>(procs::CONNECT_GET_HOSTNAME, &())
            .await
            .unwrap_err();
        assert_dead(&conn, &err, malformed);
    }
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_peer_sending_a_0xffffffff_length_kills_the_connection() {
    let conn = connection_with_peer(length_word_then_header(u32::MAX), After::StayOpen);
    let err = conn
        .call::<_, StringRet>(procs::CONNECT_GET_HOSTNAME, &())
        .await
        .unwrap_err();
    assert_dead(&conn, &err, malformed);
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_peer_sending_max_packet_plus_one_kills_the_connection_before_the_body() {
    // Only the length word and header are sent: the body never has to arrive.
    let conn = connection_with_peer(
        length_word_then_header(MAX_PACKET as u32 + 1),
        After::StayOpen,
    );
    let err = conn
        .call_raw(procs::CONNECT_GET_HOSTNAME, Bytes::new())
        .await;
    assert_dead(&conn, &err.unwrap_err(), malformed);
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_reply_of_exactly_min_and_max_packet_length_is_delivered_whole() {
    let mut wire = reply(procs::DOMAIN_CREATE, 1, Status::Ok, &[]);
    assert_eq!(wire.len(), MIN_PACKET);
    let body = vec![0x5a; MAX_PAYLOAD];
    wire.extend_from_slice(&reply(procs::CONNECT_GET_HOSTNAME, 2, Status::Ok, &body));
    let conn = connection_with_peer(wire, After::StayOpen);
    // Both calls are registered (serials 1 and 2) before the peer's bytes are read.
    let (min, got) = tokio::join!(
        conn.call::<_, ()>(procs::DOMAIN_CREATE, &()),
        conn.call_raw(procs::CONNECT_GET_HOSTNAME, Bytes::new()),
    );
    min.unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), MAX_PAYLOAD);
    assert!(got.iter().all(|&b| b == 0x5a));
    assert!(conn.is_alive());
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_peer_closing_inside_a_header_fails_the_call_with_a_connection_error() {
    let full = reply(procs::CONNECT_GET_HOSTNAME, 1, Status::Ok, &[]);
    for cut in [2, 4, 4 + HEADER_SIZE / 2, MIN_PACKET - 1] {
        let conn = connection_with_peer(full[..cut].to_vec(), After::Close);
        let err = conn
            .call::<_, ()>(procs::CONNECT_GET_HOSTNAME, &())
            .await
            .unwrap_err();
        assert!(err.is_connection(), "cut {cut}: {err}");
        assert_dead(&conn, &err, |r| {
            matches!(r, DeathReason::Io(_) | DeathReason::Eof)
        });
    }
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_reply_whose_array_count_exceeds_its_payload_kills_the_connection() {
    let mut payload = 0x7fff_ffffu32.to_be_bytes().to_vec();
    payload.extend_from_slice(&xdr::to_bytes(&domain()));
    payload.extend_from_slice(&0u32.to_be_bytes());
    let wire = reply(procs::CONNECT_LIST_ALL_DOMAINS, 1, Status::Ok, &payload);
    let conn = connection_with_peer(wire, After::StayOpen);
    let err = conn
        .call::<_, ListAllDomainsRet>(procs::CONNECT_LIST_ALL_DOMAINS, &())
        .await
        .unwrap_err();
    assert!(err.is_protocol(), "{err}");
    assert_dead(&conn, &err, malformed);
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn a_reply_with_a_string_of_four_mib_plus_one_kills_the_connection() {
    let mut payload = ((STRING_MAX + 1) as u32).to_be_bytes().to_vec();
    payload.resize(4 + STRING_MAX + 4, b'a');
    let wire = reply(procs::CONNECT_GET_HOSTNAME, 1, Status::Ok, &payload);
    let conn = connection_with_peer(wire, After::StayOpen);
    let err = conn
        .call::<_, StringRet>(procs::CONNECT_GET_HOSTNAME, &())
        .await
        .unwrap_err();
    assert!(err.is_protocol(), "{err}");
    assert_dead(&conn, &err, malformed);
}

// finding: L27
#[tokio::test(start_paused = true)]
async fn an_error_reply_with_an_empty_payload_kills_the_connection() {
    let wire = reply(procs::DOMAIN_CREATE, 1, Status::Error, &[]);
    let conn = connection_with_peer(wire, After::StayOpen);
    let err = conn
        .call::<_, ()>(procs::DOMAIN_CREATE, &())
        .await
        .unwrap_err();
    assert_dead(&conn, &err, malformed);
}

// ---------------------------------------------------------------------------------------
// Inputs the fuzz targets found.

// finding: M6 — found by the `connection` target (input minimised by `cargo fuzz tmin`): a
// reply whose status is neither OK nor ERROR returned a protocol error but left the
// connection alive, a link that looks usable after the peers disagreed on the protocol.
#[tokio::test(start_paused = true)]
async fn a_reply_with_an_unknown_status_kills_the_connection() {
    let wire: Vec<u8> = vec![
        0x00, 0x00, 0x00, 0x40, 0x20, 0x00, 0x80, 0x86, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x17, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0xfd, 0x07, 0x00, 0x00, 0x00, 0x6c,
        0x20, 0x00, 0x00, 0x01, 0x11, 0x00, 0x00, 0x01, 0x00, 0x00, 0x86, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x01, 0x11, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00,
    ];
    let conn = connection_with_peer(wire, After::StayOpen);
    let err = conn
        .call::<_, DomainRet>(procs::DOMAIN_LOOKUP_BY_NAME, &())
        .await
        .unwrap_err();
    assert!(err.is_protocol(), "{err}");
    // Dead the instant the caller sees the error, not later by keepalive.
    assert_dead(&conn, &err, malformed);
}

/// Runs an upload (serial 1) against a peer that writes `wire` and stays open.
async fn upload_against(wire: Vec<u8>) -> (Error, Connection) {
    let conn = connection_with_peer(wire, After::StayOpen);
    let opts = UploadOptions {
        chunk_size: 64,
        ..UploadOptions::default()
    };
    let src = tokio::io::repeat(0x55).take(1 << 20);
    let err = conn
        .upload(procs::STORAGE_VOL_UPLOAD, Bytes::new(), src, &opts)
        .await
        .unwrap_err();
    (err, conn)
}

fn stream_packet(serial: u32, status: Status, payload: &[u8]) -> Vec<u8> {
    Packet {
        header: header(
            proto::REMOTE_PROGRAM,
            procs::STORAGE_VOL_UPLOAD,
            MessageType::Stream,
            serial,
            status,
        ),
        payload: Bytes::copy_from_slice(payload),
    }
    .to_bytes()
    .unwrap()
    .to_vec()
}

// finding: M6
#[tokio::test(start_paused = true)]
async fn a_daemon_sending_data_into_an_upload_kills_the_connection() {
    let mut wire = reply(procs::STORAGE_VOL_UPLOAD, 1, Status::Ok, &[]);
    wire.extend_from_slice(&stream_packet(1, Status::Continue, b"data"));
    let (err, conn) = upload_against(wire).await;
    assert!(err.is_protocol(), "{err}");
    assert_dead(&conn, &err, malformed);
}

// finding: M6
#[tokio::test(start_paused = true)]
async fn a_stream_error_without_a_remote_error_kills_the_connection() {
    let mut wire = reply(procs::STORAGE_VOL_UPLOAD, 1, Status::Ok, &[]);
    wire.extend_from_slice(&stream_packet(1, Status::Error, &[]));
    let (err, conn) = upload_against(wire).await;
    assert!(err.is_protocol(), "{err}");
    assert_dead(&conn, &err, malformed);
}

// ---------------------------------------------------------------------------------------
// Seed corpus for the fuzz targets.

fn seeds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

/// The seed inputs, by target, in each target's input layout (see `fuzz/fuzz_targets/`).
fn seed_inputs() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let dom_reply = reply(
        procs::DOMAIN_LOOKUP_BY_NAME,
        1,
        Status::Ok,
        &xdr::to_bytes(&DomainRet { dom: domain() }),
    );
    let list_reply = reply(
        procs::CONNECT_LIST_ALL_DOMAINS,
        2,
        Status::Ok,
        &xdr::to_bytes(&ListAllDomainsRet {
            domains: vec![domain(), domain()],
            ret: 2,
        }),
    );
    let err_reply = reply(
        procs::DOMAIN_CREATE,
        3,
        Status::Error,
        &xdr::to_bytes(&remote_error()),
    );
    let ping = Packet {
        header: header(
            proto::KEEPALIVE_PROGRAM,
            proto::KEEPALIVE_PING,
            MessageType::Message,
            0,
            Status::Ok,
        ),
        payload: Bytes::new(),
    }
    .to_bytes()
    .unwrap()
    .to_vec();
    let upload_reply = reply(procs::STORAGE_VOL_UPLOAD, 4, Status::Ok, &[]);
    let stream = Packet {
        header: header(
            proto::REMOTE_PROGRAM,
            procs::STORAGE_VOL_UPLOAD,
            MessageType::Stream,
            4,
            Status::Ok,
        ),
        payload: Bytes::new(),
    }
    .to_bytes()
    .unwrap()
    .to_vec();
    let cat = |parts: &[&[u8]]| parts.concat();
    vec![
        ("frame_decoder", "reply_domain", cat(&[&[0], &dom_reply])),
        ("frame_decoder", "error_reply", cat(&[&[0], &err_reply])),
        ("frame_decoder", "keepalive_ping", cat(&[&[0], &ping])),
        ("frame_decoder", "stream", cat(&[&[0], &stream])),
        (
            "frame_decoder",
            "three_packets_split",
            cat(&[&[3, 1, 5, 30], &dom_reply, &ping, &stream]),
        ),
        (
            "reply_decoding",
            "domain_ret",
            xdr::to_bytes(&DomainRet { dom: domain() }).to_vec(),
        ),
        (
            "reply_decoding",
            "remote_error",
            xdr::to_bytes(&remote_error()).to_vec(),
        ),
        (
            "reply_decoding",
            "list_all_domains",
            list_reply[28..].to_vec(),
        ),
        (
            "connection",
            "all_replies_then_close",
            cat(&[
                &[0x30],
                &ping,
                &dom_reply,
                &list_reply,
                &err_reply,
                &upload_reply,
            ]),
        ),
        (
            "connection",
            "ping_and_reply_stay_open",
            cat(&[&[0x01], &ping, &dom_reply, &ping]),
        ),
    ]
}

#[test]
fn fuzz_seed_files_are_the_valid_packets_they_claim_to_be() {
    let write = std::env::var("FUZZ_WRITE_SEEDS").is_ok_and(|v| v == "1");
    for (target, name, bytes) in seed_inputs() {
        // Every packet seed decodes and re-encodes to itself.
        if target != "reply_decoding" {
            let skip = if target == "frame_decoder" {
                1 + usize::from(bytes[0] % 16)
            } else {
                1
            };
            let mut b = BytesMut::from(&bytes[skip..]);
            let mut n = 0;
            while let Some(p) = PacketCodec.decode(&mut b).unwrap() {
                assert!(p.to_bytes().unwrap().len() >= MIN_PACKET);
                n += 1;
            }
            assert!(n > 0 && b.is_empty(), "{target}/{name}");
        }
        let path = seeds_dir().join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with FUZZ_WRITE_SEEDS=1)", path.display()));
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale (run with FUZZ_WRITE_SEEDS=1)",
            path.display()
        );
    }
}
