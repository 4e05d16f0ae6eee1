//! A TCP relay on 127.0.0.1 that forwards bytes between a client and an upstream server and
//! can be frozen: stop reading and writing in both directions without closing anything, the
//! way a hung host or a black-holed network looks to the client.
//!
//! ```ignore
//! let relay = support::relay::Relay::start(sshd.addr).await;
//! let target = sshd.target().with_port(relay.port());   // known_hosts must name relay.port()
//! relay.freeze();
//! ```
//!
//! With [`RelayOptions::socket_buffer`] the relay's sockets get small kernel buffers, so a
//! client writing into a frozen relay fills its send buffer quickly (finding H1).
//! [`proc_net_tcp`] reads the kernel's view of loopback sockets (queue sizes, states) so tests
//! can observe that buffers are full or that a socket was shut, instead of sleeping.
//! Dropping a [`Relay`] aborts its tasks and closes every socket it holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Bytes moved per read.
const PUMP_BUFFER: usize = 16 * 1024;

/// Relay settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayOptions {
    /// SO_SNDBUF and SO_RCVBUF for the relay's sockets (both sides); `None` keeps the
    /// kernel's defaults. The kernel doubles the value and enforces a small minimum.
    pub socket_buffer: Option<u32>,
}

/// A running relay. See the module docs.
#[derive(Debug)]
pub struct Relay {
    /// The address clients connect to.
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Relay {
    /// A relay to `upstream` with default socket buffers.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_with(upstream, RelayOptions::default()).await
    }

    /// A relay to `upstream`.
    pub async fn start_with(upstream: SocketAddr, opts: RelayOptions) -> Self {
        let sock = TcpSocket::new_v4().unwrap();
        if let Some(b) = opts.socket_buffer {
            // NB: set on the listener so accepted sockets inherit them from the first SYN
            // (the window scale is fixed at the handshake).
            sock.set_recv_buffer_size(b).unwrap();
            sock.set_send_buffer_size(b).unwrap();
        }
        sock.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let listener = sock.listen(128).unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, _) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let frozen = frozen.clone();
            let accepted = accepted.clone();
            async move {
                let mut conns = JoinSet::new();
                loop {
                    tokio::select! {
                        r = listener.accept() => {
                            let Ok((client, _)) = r else { return };
                            accepted.fetch_add(1, Ordering::SeqCst);
                            conns.spawn(relay_one(client, upstream, opts, frozen.subscribe()));
                        }
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    }
                }
            }
        });
        Self {
            addr,
            frozen,
            accepted,
            task,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops moving bytes in both directions (sockets stay open; at most one read per
    /// direction that was already under way completes, and its bytes are held back).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Resumes moving bytes.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// How many client connections the relay accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The kernel's view of client sockets connected to this relay (remote port = ours).
    pub fn client_sockets(&self) -> Vec<ProcTcp> {
        proc_net_tcp()
            .into_iter()
            .filter(|s| s.remote_port == self.port())
            .collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_one(
    client: TcpStream,
    upstream: SocketAddr,
    opts: RelayOptions,
    frozen: watch::Receiver<bool>,
) {
    let Ok(sock) = TcpSocket::new_v4() else {
        return;
    };
    if let Some(b) = opts.socket_buffer {
        let _ = sock.set_recv_buffer_size(b);
        let _ = sock.set_send_buffer_size(b);
    }
    let Ok(server) = sock.connect(upstream).await else {
        return;
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut pumps = JoinSet::new();
    pumps.spawn(pump(cr, sw, frozen.clone()));
    pumps.spawn(pump(sr, cw, frozen));
    while pumps.join_next().await.is_some() {}
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; PUMP_BUFFER];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// One line of `/proc/net/tcp` (IPv4 sockets of this network namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcTcp {
    /// Local port.
    pub local_port: u16,
    /// Remote port.
    pub remote_port: u16,
    /// TCP state (`TCP_ESTABLISHED` = 1, see [`ESTABLISHED`]).
    pub state: u8,
    /// Bytes in the send queue (not yet acknowledged by the peer).
    pub tx_queue: u64,
    /// Bytes in the receive queue (not yet read by the application).
    pub rx_queue: u64,
}

/// `TCP_ESTABLISHED` in `/proc/net/tcp`'s `st` column.
pub const ESTABLISHED: u8 = 1;

/// Reads `/proc/net/tcp`.
pub fn proc_net_tcp() -> Vec<ProcTcp> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = |s: &str| u16::from_str_radix(s.rsplit(':').next()?, 16).ok();
            let (tx, rx) = f.get(4)?.split_once(':')?;
            Some(ProcTcp {
                local_port: port(f.get(1)?)?,
                remote_port: port(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                tx_queue: u64::from_str_radix(tx, 16).ok()?,
                rx_queue: u64::from_str_radix(rx, 16).ok()?,
            })
        })
        .collect()
}
