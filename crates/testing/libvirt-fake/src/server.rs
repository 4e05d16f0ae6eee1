//! The daemon: [`FakeLibvirt`] owns the shared state; each served byte stream gets one task
//! that reads packets, answers them, writes replies and keeps the keepalive program.
//!
//! Guarantees:
//! - one task per connection; its reader, writer and keepalive run inside it, so when any of
//!   them ends (EOF, I/O error, malformed frame, `CONNECT_CLOSE`, close-after-open fault,
//!   keepalive timeout, [`ConnHandle::close`], [`FakeLibvirt::shutdown`]) the stream is dropped
//!   and nothing of the connection stays live (finding L22);
//! - a delayed call runs only if its connection is still open when the delay ends, so a call
//!   whose client went away has no effect (finding L21);
//! - no lock is held across an `.await`; locks are taken in the order session → config →
//!   state, or connection table → session;
//! - a frozen connection neither reads nor writes (not even PONGs) until thawed;
//! - dropping the last [`FakeLibvirt`] handle shuts everything down.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use libvirt_remote::frame::{Header, MessageType, Packet, PacketCodec, Status};
use libvirt_remote::proto::{self, RemoteErrorWire, procs};
use libvirt_remote::transport::{KillSwitch, Transport};
use libvirt_remote::{RemoteError, xdr};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::dispatch::{self, After, Config, Session};
use crate::errors;
use crate::faults::{BadLength, FaultScope, FaultSpec, Faults};
use crate::spec::{
    AuthMode, DomainInfo, DomainSpec, Interface, Lease, NetworkSpec, PoolInfo, PoolSpec,
    VolumeInfo, VolumeSpec,
};
use crate::state::{DomainEvent, SeedError, State, UploadTarget};

/// Packets queued for one connection's writer. A client that stops reading stalls the fake's
/// reader after this many (backpressure, as libvirtd limits per-client work); events beyond it
/// are dropped. 64 covers a burst of pipelined replies plus their duplicates.
const OUTBOUND_QUEUE: usize = 64;
/// Buffer of each in-memory (duplex) connection: four 256 KiB upload chunks, so uploads
/// stream without a context switch per packet.
pub const DUPLEX_BUFFER: usize = 1 << 20;
/// How long closing a connection may spend flushing its last reply before the stream is
/// dropped anyway (in-memory and loopback peers take microseconds).
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a connection re-reads the keepalive settings while the fake's PINGs are off.
const KEEPALIVE_POLL: Duration = Duration::from_secs(1);
/// libvirtd's default `keepalive_interval`.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// libvirtd's default `keepalive_count`.
pub const DEFAULT_KEEPALIVE_COUNT: u32 = 5;
/// libvirt 11.3.0 as `CONNECT_GET_LIB_VERSION` encodes it.
pub const DEFAULT_LIB_VERSION: u64 = 11_003_000;
/// QEMU 10.0.2 as `CONNECT_GET_VERSION` encodes it.
pub const DEFAULT_HV_VERSION: u64 = 10_000_002;
/// Default hostname.
pub const DEFAULT_HOSTNAME: &str = "fake-host";
/// Host capabilities of the machine the fake was modelled on (libvirt 11.3, QEMU 10, x86_64).
pub const DEFAULT_CAPABILITIES: &str = include_str!("../fixtures/capabilities.xml");
/// Domain capabilities for `qemu` (TCG) on x86_64 from the same machine.
pub const DEFAULT_DOMAIN_CAPABILITIES: &str =
    include_str!("../fixtures/domcapabilities-qemu-x86_64.xml");

/// The fake's own keepalive: after a client asks about the keepalive feature, send a PING
/// after `interval` without traffic, and close the connection after `count` more silent
/// intervals (libvirtd's behaviour). A zero `interval` turns the fake's PINGs off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveConfig {
    /// Idle time before a PING.
    pub interval: Duration,
    /// Unanswered intervals tolerated before the connection is closed.
    pub count: u32,
}

impl Default for KeepaliveConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_KEEPALIVE_INTERVAL,
            count: DEFAULT_KEEPALIVE_COUNT,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

enum Out {
    Bytes(Bytes),
    Close,
}

struct ConnCtx {
    id: u64,
    out: mpsc::Sender<Out>,
    cancel: CancellationToken,
    faults: FaultScope,
    session: Mutex<Session>,
    uploads: Mutex<HashMap<u32, UploadTarget>>,
    last_rx: Mutex<Instant>,
    keepalive_on: AtomicBool,
}

impl ConnCtx {
    fn touch(&self) {
        *lock(&self.last_rx) = Instant::now();
    }

    fn idle(&self) -> Duration {
        lock(&self.last_rx).elapsed()
    }

    async fn send(&self, b: Bytes) {
        // NB: fails only when the connection has ended; nothing to do then.
        let _ = self.out.send(Out::Bytes(b)).await;
    }
}

struct Inner {
    state: Mutex<State>,
    config: Mutex<Config>,
    keepalive: Mutex<Option<KeepaliveConfig>>,
    faults: Faults,
    next_conn_faults: Mutex<Option<FaultSpec>>,
    conns: Mutex<HashMap<u64, Arc<ConnCtx>>>,
    open: watch::Sender<usize>,
    calls: Mutex<HashMap<i32, u64>>,
    total_calls: watch::Sender<u64>,
    events_dropped: AtomicU64,
    next_conn_id: AtomicU64,
    shutdown: CancellationToken,
    journal: Mutex<std::collections::VecDeque<JournalEntry>>,
}

/// Entries [`FakeLibvirt::journal`] keeps (the oldest are dropped beyond it).
// NB: the fake also serves benchmarks and soak runs of millions of calls in the process it
// measures; 65536 entries (1 MiB) cover any single test's calls.
pub const JOURNAL_CAP: usize = 1 << 16;

fn journal_push(j: &Mutex<std::collections::VecDeque<JournalEntry>>, e: JournalEntry) {
    let mut j = lock(j);
    if j.len() >= JOURNAL_CAP {
        j.pop_front();
    }
    j.push_back(e);
}

/// One entry of [`FakeLibvirt::journal`], in the order the fake saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalEntry {
    /// A call of procedure `proc_` arrived on connection `conn` (before any delay).
    Call {
        /// [`ConnHandle::id`] of the connection.
        conn: u64,
        /// The procedure number.
        proc_: i32,
    },
    /// The client side of an in-memory connection ([`FakeLibvirt::duplex`]) was killed (its
    /// transport's kill switch fired), recorded at that instant, before the fake notices EOF.
    ClientKilled {
        /// [`ConnHandle::id`] of the connection.
        conn: u64,
    },
}

/// Removes a connection from the table when its task ends (or is dropped unpolled).
struct ConnGuard {
    inner: Arc<Inner>,
    ctx: Arc<ConnCtx>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.ctx.cancel.cancel();
        lock(&self.ctx.uploads).clear();
        lock(&self.inner.conns).remove(&self.ctx.id);
        self.inner.open.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn encode(header: Header, payload: Bytes) -> Bytes {
    let pkt = Packet { header, payload };
    match pkt.to_bytes() {
        Ok(b) => b,
        Err(e) => {
            // A reply over the 32 MiB limit: libvirtd answers with an RPC error instead.
            let err = errors::remote_error(
                errors::codes::RPC,
                errors::domains::RPC,
                format!("message payload is too large: {e}"),
            );
            let header = Header {
                mtype: MessageType::Reply,
                status: Status::Error,
                ..pkt.header
            };
            Packet {
                header,
                payload: xdr::to_bytes(&*err),
            }
            .to_bytes()
            .unwrap_or_default()
        }
    }
}

fn remote_header(proc_: i32, mtype: MessageType, serial: u32, status: Status) -> Header {
    Header {
        prog: proto::REMOTE_PROGRAM,
        vers: proto::REMOTE_VERSION,
        proc_,
        mtype,
        serial,
        status,
    }
}

fn reply_bytes(call: &Header, reply: &Result<Bytes, Box<RemoteErrorWire>>) -> Bytes {
    let (status, payload) = match reply {
        Ok(p) => (Status::Ok, p.clone()),
        Err(e) => (Status::Error, xdr::to_bytes(&**e)),
    };
    let header = Header {
        mtype: MessageType::Reply,
        status,
        ..*call
    };
    encode(header, payload)
}

fn keepalive_bytes(proc_: i32) -> Bytes {
    encode(
        Header {
            prog: proto::KEEPALIVE_PROGRAM,
            vers: proto::KEEPALIVE_VERSION,
            proc_,
            mtype: MessageType::Message,
            serial: 0,
            status: Status::Ok,
        },
        Bytes::new(),
    )
}

fn bad_frame(kind: BadLength) -> Bytes {
    let len: u32 = match kind {
        BadLength::Short => 12,
        BadLength::Huge => 0xFFFF_FFF0,
    };
    let mut b = len.to_be_bytes().to_vec();
    b.extend_from_slice(&[0u8; 8]);
    Bytes::from(b)
}

impl Inner {
    fn count_call(&self, conn: u64, proc_: i32) {
        journal_push(&self.journal, JournalEntry::Call { conn, proc_ });
        *lock(&self.calls).entry(proc_).or_insert(0) += 1;
        self.total_calls.send_modify(|n| *n = n.saturating_add(1));
    }

    fn calls(&self, proc_: i32) -> u64 {
        lock(&self.calls).get(&proc_).copied().unwrap_or(0)
    }

    /// Delivers lifecycle events to every connection that registered for them; never waits
    /// (a connection whose queue is full loses the event, and it is counted).
    fn broadcast(&self, events: &[DomainEvent]) {
        if events.is_empty() {
            return;
        }
        let conns: Vec<Arc<ConnCtx>> = lock(&self.conns).values().cloned().collect();
        for c in conns {
            for ev in events {
                let ids = lock(&c.session).wants(ev);
                for callback_id in ids {
                    let msg = proto::DomainEventCallbackLifecycleMsg {
                        callback_id,
                        msg: proto::DomainEventLifecycleMsg {
                            dom: ev.dom.clone(),
                            event: ev.event,
                            detail: ev.detail,
                        },
                    };
                    let b = encode(
                        remote_header(
                            procs::DOMAIN_EVENT_CALLBACK_LIFECYCLE,
                            MessageType::Message,
                            0,
                            Status::Ok,
                        ),
                        xdr::to_bytes(&msg),
                    );
                    if c.out.try_send(Out::Bytes(b)).is_err() {
                        self.events_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    fn serve<S>(self: &Arc<Self>, stream: S) -> ConnHandle
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let id = self.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let spec = lock(&self.next_conn_faults).take().unwrap_or_default();
        let conn_faults = Faults::from_spec(spec);
        let cancel = self.shutdown.child_token();
        let handle = ConnHandle {
            id,
            faults: conn_faults.clone(),
            cancel: cancel.clone(),
        };
        if self.shutdown.is_cancelled() {
            // NB: dropping the stream closes it: the client sees EOF at once.
            drop(stream);
            return handle;
        }
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let ctx = Arc::new(ConnCtx {
            id,
            out: tx,
            cancel,
            faults: FaultScope {
                conn: conn_faults,
                global: self.faults.clone(),
            },
            session: Mutex::new(Session::default()),
            uploads: Mutex::new(HashMap::new()),
            last_rx: Mutex::new(Instant::now()),
            keepalive_on: AtomicBool::new(false),
        });
        lock(&self.conns).insert(id, ctx.clone());
        self.open.send_modify(|n| *n = n.saturating_add(1));
        let guard = ConnGuard {
            inner: self.clone(),
            ctx,
        };
        tokio::spawn(run_connection(guard, stream, rx));
        handle
    }
}

async fn run_connection<S>(guard: ConnGuard, stream: S, rx: mpsc::Receiver<Out>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let inner = &guard.inner;
    let ctx = &guard.ctx;
    tokio::select! {
        () = ctx.cancel.cancelled() => {}
        () = read_loop(inner, ctx, r) => {}
        () = write_loop(ctx, w, rx) => {}
        () = keepalive_loop(inner, ctx) => {}
    }
    tracing::debug!(conn = ctx.id, "fake libvirt connection closed");
    // `guard` drops here: the stream halves are already gone.
}

async fn read_loop<R: AsyncRead + Unpin>(inner: &Arc<Inner>, ctx: &Arc<ConnCtx>, r: R) {
    let mut framed = FramedRead::new(r, PacketCodec);
    let mut watch = ctx.faults.watch();
    loop {
        watch.wait_thawed().await;
        let next = tokio::select! {
            biased;
            () = watch.until_frozen() => continue,
            n = framed.next() => n,
        };
        // EOF, an I/O error or a malformed frame ends the connection, as in libvirtd.
        let Some(Ok(pkt)) = next else { return };
        ctx.touch();
        handle_packet(inner, ctx, pkt).await;
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(ctx: &ConnCtx, mut w: W, mut rx: mpsc::Receiver<Out>) {
    let mut watch = ctx.faults.watch();
    while let Some(item) = rx.recv().await {
        watch.wait_thawed().await;
        match item {
            Out::Bytes(b) => {
                if w.write_all(&b).await.is_err() {
                    return;
                }
                if rx.is_empty() && w.flush().await.is_err() {
                    return;
                }
            }
            Out::Close => {
                let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, async {
                    w.flush().await?;
                    w.shutdown().await
                })
                .await;
                return;
            }
        }
    }
}

async fn keepalive_loop(inner: &Inner, ctx: &ConnCtx) {
    loop {
        // NB: a zero interval would spin; it means "off", like `None`.
        let cfg = lock(&inner.keepalive).filter(|k| !k.interval.is_zero());
        tokio::time::sleep(cfg.map_or(KEEPALIVE_POLL, |k| k.interval)).await;
        let Some(k) = cfg else { continue };
        if !ctx.keepalive_on.load(Ordering::Relaxed) {
            continue;
        }
        if ctx.faults.frozen() {
            // A frozen daemon counts nothing; silence is measured from the thaw.
            ctx.touch();
            continue;
        }
        let idle = ctx.idle();
        if idle >= k.interval.saturating_mul(k.count.saturating_add(1)) {
            tracing::debug!(conn = ctx.id, "fake libvirt: client missed keepalives");
            return;
        }
        if idle >= k.interval {
            let _ = ctx
                .out
                .try_send(Out::Bytes(keepalive_bytes(proto::KEEPALIVE_PING)));
        }
    }
}

async fn handle_packet(inner: &Arc<Inner>, ctx: &Arc<ConnCtx>, pkt: Packet) {
    let h = pkt.header;
    if h.prog == proto::KEEPALIVE_PROGRAM {
        if h.proc_ == proto::KEEPALIVE_PING {
            ctx.send(keepalive_bytes(proto::KEEPALIVE_PONG)).await;
        }
        return;
    }
    match h.mtype {
        MessageType::Call => {
            if h.prog != proto::REMOTE_PROGRAM || h.vers != proto::REMOTE_VERSION {
                let err = errors::unknown_program(h.prog, h.vers);
                ctx.send(reply_bytes(&h, &Err(err))).await;
                return;
            }
            inner.count_call(ctx.id, h.proc_);
            match ctx.faults.delay() {
                None => process_call(inner, ctx, h, pkt.payload).await,
                Some(delay) => {
                    let (inner, ctx) = (inner.clone(), ctx.clone());
                    tokio::spawn(async move {
                        tokio::select! {
                            () = ctx.cancel.cancelled() => return,
                            () = tokio::time::sleep(delay) => {}
                        }
                        process_call(&inner, &ctx, h, pkt.payload).await;
                    });
                }
            }
        }
        MessageType::Stream if h.prog == proto::REMOTE_PROGRAM => {
            handle_stream(inner, ctx, h, &pkt.payload).await;
        }
        // Anything else (replies, events, holes from a client) is ignored, as libvirtd does.
        _ => {}
    }
}

async fn process_call(inner: &Inner, ctx: &ConnCtx, h: Header, payload: Bytes) {
    if ctx.cancel.is_cancelled() {
        // The client went away before the call ran: it has no effect (finding L21).
        return;
    }
    let outcome = {
        let mut session = lock(&ctx.session);
        let config = lock(&inner.config);
        let mut state = lock(&inner.state);
        dispatch::dispatch(
            &mut state,
            &config,
            &mut session,
            &ctx.faults,
            h.proc_,
            &payload,
        )
    };
    let mut close = false;
    match outcome.after {
        After::Nothing => {}
        After::Opened => close = ctx.faults.close_after_open(),
        After::Close => close = true,
        After::StartKeepalive => ctx.keepalive_on.store(true, Ordering::Relaxed),
        After::Upload(t) => {
            lock(&ctx.uploads).insert(h.serial, t);
        }
    }
    let reply = reply_bytes(&h, &outcome.reply);
    if let Some(kind) = ctx.faults.take_bad_length() {
        ctx.send(bad_frame(kind)).await;
    } else {
        ctx.send(reply.clone()).await;
        // Stream replies are never duplicated: the stream's own packets follow them.
        if h.proc_ != procs::STORAGE_VOL_UPLOAD && ctx.faults.take_duplicate() {
            ctx.send(reply).await;
        }
    }
    if close {
        let _ = ctx.out.send(Out::Close).await;
    }
    inner.broadcast(&outcome.events);
}

/// One packet of an upload stream, handled as libvirtd's stream code does: data is stored
/// (an error is a REPLY/ERROR on the stream's serial and ends the stream), a finish or an
/// abort is confirmed with an empty STREAM/OK, and packets for a stream that has ended are
/// dropped.
async fn handle_stream(inner: &Inner, ctx: &ConnCtx, h: Header, payload: &[u8]) {
    let Some(mut target) = lock(&ctx.uploads).remove(&h.serial) else {
        return;
    };
    match h.status {
        Status::Continue => {
            let limit = ctx.faults.upload_fail_after();
            let res = lock(&inner.state).upload_chunk(&mut target, payload, limit);
            match res {
                Ok(()) => {
                    lock(&ctx.uploads).insert(h.serial, target);
                }
                Err(e) => {
                    let header =
                        remote_header(h.proc_, MessageType::Reply, h.serial, Status::Error);
                    ctx.send(encode(header, xdr::to_bytes(&*e))).await;
                }
            }
        }
        // NB: libvirtd 11.3 confirms both a finish and a client abort with an empty
        // STREAM/OK (`daemonStreamHandleFinish` / `daemonStreamHandleAbort`).
        _ => {
            let header = remote_header(h.proc_, MessageType::Stream, h.serial, Status::Ok);
            ctx.send(encode(header, Bytes::new())).await;
        }
    }
}

/// Tears the fake down when the last [`FakeLibvirt`] handle goes away.
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shutdown.cancel();
    }
}

/// An in-process libvirtd. Cheap to clone; every clone shares the same daemon. Dropping the
/// last clone shuts it down (as [`shutdown`](Self::shutdown) does).
#[derive(Clone)]
pub struct FakeLibvirt {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for FakeLibvirt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeLibvirt")
            .field("open_connections", &self.open_connections())
            .field("shut_down", &self.is_shut_down())
            .finish()
    }
}

impl Default for FakeLibvirt {
    fn default() -> Self {
        Self::new()
    }
}

/// A handle to one served connection.
#[derive(Debug, Clone)]
pub struct ConnHandle {
    id: u64,
    faults: Faults,
    cancel: CancellationToken,
}

impl ConnHandle {
    /// The connection's number (unique within its fake).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// This connection's own faults (added to the fake-wide ones).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Closes the connection from the daemon's side, at once.
    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// Whether the connection is still being served.
    pub fn is_open(&self) -> bool {
        !self.cancel.is_cancelled()
    }

    /// Waits until the connection has ended.
    pub async fn closed(&self) {
        self.cancel.cancelled().await;
    }
}

impl FakeLibvirt {
    /// An empty daemon: no domains, pools or networks; healthy; authentication as for a root
    /// client; keepalive PINGs every 5 s once asked for. Needs no runtime until it serves.
    pub fn new() -> Self {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new()),
            config: Mutex::new(Config {
                hostname: DEFAULT_HOSTNAME.into(),
                lib_version: DEFAULT_LIB_VERSION,
                hv_version: DEFAULT_HV_VERSION,
                capabilities: DEFAULT_CAPABILITIES.into(),
                domain_capabilities: DEFAULT_DOMAIN_CAPABILITIES.into(),
                auth: AuthMode::default(),
            }),
            keepalive: Mutex::new(Some(KeepaliveConfig::default())),
            faults: Faults::new(),
            next_conn_faults: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            open: watch::channel(0).0,
            calls: Mutex::new(HashMap::new()),
            total_calls: watch::channel(0).0,
            events_dropped: AtomicU64::new(0),
            next_conn_id: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
            journal: Mutex::new(std::collections::VecDeque::new()),
        });
        Self {
            _owner: Arc::new(Owner(inner.clone())),
            inner,
        }
    }

    // ---- serving ----

    /// Serves the libvirt protocol on `stream` in a new task (needs a tokio runtime).
    /// After [`shutdown`](Self::shutdown) the stream is closed at once.
    pub fn serve<S>(&self, stream: S) -> ConnHandle
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.inner.serve(stream)
    }

    /// An in-memory connection to the fake, and the handle of its server side.
    pub fn duplex(&self) -> (Transport, ConnHandle) {
        let (client, server) = tokio::io::duplex(DUPLEX_BUFFER);
        let handle = self.serve(server);
        let peer = format!("fake:duplex#{}", handle.id());
        let kill = KillSwitch::noop();
        let (inner, conn) = (Arc::downgrade(&self.inner), handle.id());
        kill.push(move || {
            if let Some(inner) = inner.upgrade() {
                journal_push(&inner.journal, JournalEntry::ClientKilled { conn });
            }
        });
        (Transport::from_stream(client, kill, peer), handle)
    }

    /// An in-memory connection to the fake, ready for `libvirt_remote::Client::open`.
    pub fn connect_duplex(&self) -> Transport {
        self.duplex().0
    }

    /// Listens on `127.0.0.1:0` until shutdown; returns the bound address.
    pub async fn listen_tcp(&self) -> std::io::Result<SocketAddr> {
        let l = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = l.local_addr()?;
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = inner.shutdown.cancelled() => return,
                    a = l.accept() => a,
                };
                match accepted {
                    Ok((s, _)) => {
                        let _ = s.set_nodelay(true);
                        inner.serve(s);
                    }
                    Err(e) => tracing::debug!("fake libvirt: accept failed: {e}"),
                }
            }
        });
        Ok(addr)
    }

    /// Listens on the unix socket `path` (which must not exist) until shutdown.
    pub async fn listen_unix(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let l = tokio::net::UnixListener::bind(path)?;
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = inner.shutdown.cancelled() => return,
                    a = l.accept() => a,
                };
                match accepted {
                    Ok((s, _)) => {
                        inner.serve(s);
                    }
                    Err(e) => tracing::debug!("fake libvirt: accept failed: {e}"),
                }
            }
        });
        Ok(())
    }

    /// Closes every connection and listener; later connections are closed at once.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    // ---- faults ----

    /// The faults every connection suffers (live: changes apply to open connections).
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Faults for the next connection served (consumed by it; see [`ConnHandle::faults`]).
    pub fn faults_for_next_connection(&self, spec: FaultSpec) {
        *lock(&self.inner.next_conn_faults) = Some(spec);
    }

    // ---- daemon settings ----

    fn config(&self, f: impl FnOnce(&mut Config)) {
        f(&mut lock(&self.inner.config));
    }

    /// `CONNECT_GET_HOSTNAME`'s answer.
    pub fn set_hostname(&self, h: impl Into<String>) {
        let h = h.into();
        self.config(|c| c.hostname = h);
    }

    /// `CONNECT_GET_LIB_VERSION`'s answer (major × 1,000,000 + minor × 1,000 + micro).
    pub fn set_lib_version(&self, v: u64) {
        self.config(|c| c.lib_version = v);
    }

    /// `CONNECT_GET_VERSION`'s answer.
    pub fn set_hypervisor_version(&self, v: u64) {
        self.config(|c| c.hv_version = v);
    }

    /// `CONNECT_GET_CAPABILITIES`'s answer.
    pub fn set_capabilities(&self, xml: impl Into<String>) {
        let xml = xml.into();
        self.config(|c| c.capabilities = xml);
    }

    /// `CONNECT_GET_DOMAIN_CAPABILITIES`'s answer (whatever the arguments).
    pub fn set_domain_capabilities(&self, xml: impl Into<String>) {
        let xml = xml.into();
        self.config(|c| c.domain_capabilities = xml);
    }

    /// How new connections authenticate.
    pub fn set_auth(&self, mode: AuthMode) {
        self.config(|c| c.auth = mode);
    }

    /// The fake's own keepalive (`None`: never PING; PINGs are still answered).
    pub fn set_keepalive(&self, k: Option<KeepaliveConfig>) {
        *lock(&self.inner.keepalive) = k;
    }

    // ---- seeding ----

    fn state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut lock(&self.inner.state))
    }

    /// Adds a domain (no event is emitted).
    pub fn add_domain(&self, spec: DomainSpec) -> Result<proto::Domain, SeedError> {
        self.state(|s| s.add_domain(spec))
    }

    /// Defines a domain from XML exactly as `DOMAIN_DEFINE_XML_FLAGS` does (name, UUID and
    /// namespaced `<metadata>` are read from it), emitting the event.
    pub fn define_domain_xml(&self, xml: &str) -> Result<proto::Domain, RemoteError> {
        let (dom, evs) = self
            .state(|s| s.define_xml(xml))
            .map_err(|e| RemoteError::from(*e))?;
        self.inner.broadcast(&evs);
        Ok(dom)
    }

    /// Adds a storage pool.
    pub fn add_pool(&self, spec: PoolSpec) -> Result<proto::StoragePool, SeedError> {
        self.state(|s| s.add_pool(spec))
    }

    /// Adds a volume to a pool (its allocation moves the pool's live figures only).
    pub fn add_volume(&self, pool: &str, spec: VolumeSpec) -> Result<proto::StorageVol, SeedError> {
        self.state(|s| s.add_volume(pool, spec))
    }

    /// Adds a network.
    pub fn add_network(&self, spec: NetworkSpec) -> Result<proto::Network, SeedError> {
        self.state(|s| s.add_network(spec))
    }

    /// Replaces a network's DHCP leases.
    pub fn set_leases(&self, network: &str, leases: Vec<Lease>) -> Result<(), SeedError> {
        self.state(|s| s.set_leases(network, leases))
    }

    /// Replaces a domain's guest interfaces.
    pub fn set_interfaces(&self, domain: &str, ifaces: Vec<Interface>) -> Result<(), SeedError> {
        self.state(|s| s.set_interfaces(domain, ifaces))
    }

    /// Whether a domain has a guest agent channel.
    pub fn set_guest_agent(&self, domain: &str, on: bool) -> Result<(), SeedError> {
        self.state(|s| s.set_guest_agent(domain, on))
    }

    /// Forces a domain's state and reason (e.g. paused on I/O error); no event.
    pub fn set_domain_state(&self, domain: &str, state: i32, reason: i32) -> Result<(), SeedError> {
        self.state(|s| s.set_domain_state(domain, state, reason))
    }

    /// Sets a pool's live allocation and free space (as if something else wrote to the disk);
    /// `STORAGE_POOL_GET_INFO` shows it after the next refresh.
    pub fn set_pool_usage(
        &self,
        pool: &str,
        allocation: u64,
        available: u64,
    ) -> Result<(), SeedError> {
        self.state(|s| s.set_pool_usage(pool, allocation, available))
    }

    // ---- inspection ----

    /// Every domain.
    pub fn domains(&self) -> Vec<DomainInfo> {
        self.state(|s| s.domain_infos())
    }

    /// One domain by name.
    pub fn domain(&self, name: &str) -> Option<DomainInfo> {
        self.state(|s| s.domain_info_by_name(name))
    }

    /// The XML of network filter `name`, as last defined (`None`: not defined).
    pub fn nwfilter_xml(&self, name: &str) -> Option<String> {
        self.state(|s| s.nwfilters.xml_by_name(name))
    }

    /// A domain's metadata element under namespace `uri`.
    pub fn domain_metadata(&self, name: &str, uri: &str) -> Option<String> {
        self.state(|s| s.metadata_of(name, uri))
    }

    /// One pool by name, with its live and cached figures.
    pub fn pool(&self, name: &str) -> Option<PoolInfo> {
        self.state(|s| s.pool_info_by_name(name))
    }

    /// One volume.
    pub fn volume(&self, pool: &str, name: &str) -> Option<VolumeInfo> {
        self.state(|s| s.volume_info(pool, name))
    }

    /// Names of a pool's volumes (`None` if the pool does not exist).
    pub fn volumes(&self, pool: &str) -> Option<Vec<String>> {
        self.state(|s| s.volume_names(pool))
    }

    /// A copy of a volume's content.
    pub fn volume_content(&self, pool: &str, name: &str) -> Option<Vec<u8>> {
        self.state(|s| s.volume_content(pool, name))
    }

    /// Calls of procedure `proc_` received so far (counted on arrival, before any delay).
    pub fn calls(&self, proc_: i32) -> u64 {
        self.inner.calls(proc_)
    }

    /// The last [`JOURNAL_CAP`] calls and client-side kills, in arrival order (for tests of
    /// which connection a call used and what was closed before it).
    pub fn journal(&self) -> Vec<JournalEntry> {
        lock(&self.inner.journal).iter().copied().collect()
    }

    /// Calls received so far, all procedures.
    pub fn total_calls(&self) -> u64 {
        *self.inner.total_calls.borrow()
    }

    /// Waits until at least `n` calls of `proc_` have arrived.
    pub async fn wait_for_calls(&self, proc_: i32, n: u64) {
        let mut rx = self.inner.total_calls.subscribe();
        let inner = &self.inner;
        // NB: the sender lives in `inner`, which we hold, so this cannot fail.
        let _ = rx.wait_for(|_| inner.calls(proc_) >= n).await;
    }

    /// Connections currently served.
    pub fn open_connections(&self) -> usize {
        *self.inner.open.borrow()
    }

    /// Waits until exactly `n` connections are served.
    pub async fn wait_for_open_connections(&self, n: usize) {
        let mut rx = self.inner.open.subscribe();
        let _ = rx.wait_for(|v| *v == n).await;
    }

    /// Lifecycle events dropped because a connection's queue was full.
    pub fn events_dropped(&self) -> u64 {
        self.inner.events_dropped.load(Ordering::Relaxed)
    }
}
