//! Fuzzes a live `libvirt_remote::Connection`: the input is what a "daemon" writes on a
//! `tokio::io::duplex` while three calls and one upload are in flight.
//!
//! Input layout: byte 0 is control (bit 0: the daemon keeps the stream open after writing
//! instead of closing it; bits 4..8: the write chunk size, 1..=16 × 16 bytes); the rest is
//! the daemon's bytes. Each input runs on its own current-thread runtime with a paused
//! clock, so call timeouts and keepalive deadlines cost no wall time.
//!
//! Checks (findings L27, L28, M6):
//! - nothing panics, and every call and the upload finish (the whole exchange has a virtual
//!   deadline);
//! - a call that succeeded got exactly the payload of the first reply to its serial in the
//!   daemon's bytes; a remote error is exactly that reply's `remote_error`;
//! - a connection-class or protocol error leaves the connection dead;
//! - once the daemon has finished writing, the connection dies (on EOF, a malformed frame or
//!   the keepalive deadline) within a bounded virtual time and reports why.

#![no_main]

use std::time::Duration;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use libvirt_remote::frame::{MessageType, Packet, PacketCodec, Status};
use libvirt_remote::proto::{
    self, Domain, DomainRet, ListAllDomainsArgs, ListAllDomainsRet, NameArgs, RemoteErrorWire,
    StorageVol, StorageVolUploadArgs, procs,
};
use libvirt_remote::xdr::{self, Xdr};
use libvirt_remote::{Connection, ConnectionConfig, Error, KillSwitch, Transport, UploadOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::Decoder;

/// Virtual-time bound for the calls: well above every budget configured below.
const EXCHANGE_BOUND: Duration = Duration::from_secs(600);
/// Virtual-time bound for the connection to die once the daemon is done.
const DEATH_BOUND: Duration = Duration::from_secs(60);

fn config() -> ConnectionConfig {
    ConnectionConfig {
        call_timeout: Duration::from_secs(20),
        keepalive_interval: Duration::from_secs(2),
        keepalive_count: 2,
    }
}

/// The packets a reader would dispatch: the stream's valid prefix.
fn packets(stream: &[u8]) -> Vec<Packet> {
    let mut buf = BytesMut::from(stream);
    let mut out = Vec::new();
    while let Ok(Some(p)) = PacketCodec.decode(&mut buf) {
        out.push(p);
    }
    out
}

/// The first packet the connection would route to the call with `serial` as its reply.
fn first_reply(pkts: &[Packet], serial: u32) -> Option<&Packet> {
    pkts.iter().find(|p| {
        p.header.prog == proto::REMOTE_PROGRAM
            && p.header.serial == serial
            && matches!(
                p.header.mtype,
                MessageType::Reply | MessageType::ReplyWithFds
            )
    })
}

/// Checks one call's outcome against the daemon's bytes.
/// A call's result and whether the connection was alive the instant it returned.
type Outcome<R> = (Result<R, Error>, bool);

/// Runs a call and samples the connection's liveness as soon as it returns.
async fn observe<R>(conn: &Connection, call: impl Future<Output = Result<R, Error>>) -> Outcome<R> {
    let res = call.await;
    (res, conn.is_alive())
}

/// Checks one call's outcome against the daemon's bytes.
fn check_call<R: Xdr + PartialEq + std::fmt::Debug>(
    pkts: &[Packet],
    serial: u32,
    (res, alive): &Outcome<R>,
) {
    let reply = first_reply(pkts, serial);
    match res {
        Ok(v) => {
            let p = reply.expect("a call succeeded without a reply to its serial");
            assert_eq!(p.header.status, Status::Ok);
            assert_eq!(xdr::from_bytes::<R>(&p.payload).as_ref(), Ok(v));
        }
        Err(e) => check_error(*alive, reply, e),
    }
}

fn check_error(alive: bool, reply: Option<&Packet>, e: &Error) {
    if let Some(remote) = e.remote() {
        let p = reply.expect("a remote error without a reply to its serial");
        assert_eq!(p.header.status, Status::Error);
        let w = xdr::from_bytes::<RemoteErrorWire>(&p.payload).expect("error payload decodes");
        assert_eq!(remote.code, w.code);
        assert_eq!(remote.message, w.message.unwrap_or_default());
    }
    // A connection error or an undecodable reply means the link is dead by the time the
    // caller sees the error: no connection looks alive after the peers disagreed.
    if e.is_connection() || e.is_protocol() {
        assert!(!alive, "{e} but the connection is alive");
    }
}

async fn exchange(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let keep_open = ctl & 1 == 1;
    let chunk = usize::from(ctl >> 4).saturating_add(1) * 16;

    let (client_io, daemon_io) = tokio::io::duplex(64 * 1024);
    let transport = Transport::from_stream(client_io, KillSwitch::noop(), "fuzz-duplex");
    let conn = Connection::start(transport, config()).expect("valid config");
    let (mut daemon_rx, mut daemon_tx) = tokio::io::split(daemon_io);

    // The daemon drains whatever the client sends, so the client never blocks on writing.
    let drain = tokio::spawn(async move {
        let mut sink = vec![0u8; 4096];
        while let Ok(n) = daemon_rx.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });

    let dom = Domain {
        name: "eptest-fuzz".into(),
        uuid: [1; 16],
        id: -1,
    };
    let lookup_args = NameArgs {
        name: dom.name.clone(),
    };
    let list_args = ListAllDomainsArgs {
        need_results: 1,
        flags: 0,
    };
    let create_args = proto::DomainArgs { dom };
    // Serials are handed out on first poll, in the order join! polls: 1, 2, 3, 4.
    let lookup = observe(
        &conn,
        conn.call::<_, DomainRet>(procs::DOMAIN_LOOKUP_BY_NAME, &lookup_args),
    );
    let list = observe(
        &conn,
        conn.call::<_, ListAllDomainsRet>(procs::CONNECT_LIST_ALL_DOMAINS, &list_args),
    );
    let create = observe(
        &conn,
        conn.call::<_, ()>(procs::DOMAIN_CREATE, &create_args),
    );
    let upload_args = xdr::to_bytes(&StorageVolUploadArgs {
        vol: StorageVol {
            pool: "p".into(),
            name: "v".into(),
            key: "/k".into(),
        },
        offset: 0,
        length: 0,
        flags: 0,
    });
    let opts = UploadOptions {
        chunk_size: 64,
        deadline: Some(Duration::from_secs(30)),
        abort_budget: Duration::from_secs(1),
        finish_timeout: Duration::from_secs(10),
    };
    let source: &[u8] = &[0x55; 200];
    let upload = observe(
        &conn,
        conn.upload(procs::STORAGE_VOL_UPLOAD, upload_args, source, &opts),
    );

    let daemon = async {
        for part in stream.chunks(chunk) {
            if daemon_tx.write_all(part).await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
        if keep_open {
            Some(daemon_tx)
        } else {
            let _ = daemon_tx.shutdown().await;
            drop(daemon_tx);
            None
        }
    };

    let all = async { tokio::join!(lookup, list, create, upload, daemon) };
    let (r1, r2, r3, r4, held) = tokio::time::timeout(EXCHANGE_BOUND, all)
        .await
        .expect("calls did not finish in bounded (virtual) time");

    let pkts = packets(stream);
    check_call(&pkts, 1, &r1);
    check_call(&pkts, 2, &r2);
    check_call(&pkts, 3, &r3);
    if let (Err(e), alive) = &r4 {
        // An upload's error may come from a STREAM packet as well as the reply.
        if e.is_connection() || e.is_protocol() {
            assert!(!alive, "upload: {e} but the connection is alive");
        }
    } else {
        // The upload's first packet (reply or stream) on its serial opened it.
        let p = pkts
            .iter()
            .find(|p| {
                p.header.prog == proto::REMOTE_PROGRAM
                    && p.header.serial == 4
                    && matches!(
                        p.header.mtype,
                        MessageType::Reply | MessageType::ReplyWithFds | MessageType::Stream
                    )
            })
            .expect("an upload succeeded without a reply");
        assert_eq!(p.header.status, Status::Ok);
    }

    // The daemon is done: the connection must end by itself (EOF, malformed input, or the
    // keepalive deadline when the daemon keeps the stream open but silent).
    tokio::time::timeout(DEATH_BOUND, conn.closed())
        .await
        .expect("the connection outlived a finished daemon");
    assert!(!conn.is_alive());
    assert!(conn.death_reason().is_some());
    drop(held);
    drop(conn);
    let _ = tokio::time::timeout(DEATH_BOUND, drain).await;
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(exchange(data));
});
