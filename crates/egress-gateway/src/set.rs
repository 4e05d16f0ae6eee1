//! Every pool a process serves: [`GatewaySet::apply`] takes the drivers' views (one per pool
//! declaring a gateway) and makes the listeners and members match; [`GatewaySet::shutdown`]
//! stops accepting and lets open connections finish within a grace.
//!
//! Guarantees:
//! - A pool whose view is the same `Arc` as last time costs nothing; a changed one costs
//!   O(its members) (a driver re-sends only what changed).
//! - Listeners follow the view: a listener added is bound, one removed stops accepting (its
//!   open connections continue); a bind failure (a port in use, another pool's port) is
//!   logged once per cause and tried again at the next apply; the pool's `listeners` gauge
//!   says how many are bound.
//! - A pool that leaves the views stops accepting and drains its members with its grace.
//! - At most [`MAX_CONNECTIONS`] client connections at once; beyond that a new connection is
//!   closed at once (the kernel's backlog absorbs bursts), so memory stays bounded.
//! - With [`Workers`], each listener is one `SO_REUSEPORT` socket per worker, each accepted
//!   on by its own worker, whose connections stay on it; two pools of one set never share an
//!   address (the second is refused like a port in use, since `SO_REUSEPORT` would let the
//!   kernel split one port between them).
//! - Nothing here reads or writes pool state anywhere else: the gateway only follows views.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLog;
use crate::conn::{self, ConnCtx};
use crate::metrics::GatewayMetrics;
use crate::model::{Listener, PoolView};
use crate::pool::PoolRt;
use crate::workers::Workers;

/// Client connections one process holds at most.
// NB: an idle tunnel costs ~2 KiB of task state plus two sockets (measured in
// docs/benchmarks.md: 10,000 idle tunnels); 65,536 keeps the worst case near 256 MiB and
// below the descriptor limit a container usually gets (two descriptors per connection).
pub const MAX_CONNECTIONS: usize = 65_536;
/// The listen backlog.
// NB: the kernel queues this many completed handshakes while the accept loop catches up
// (net.core.somaxconn caps it); 4096 absorbs a burst of 256 concurrent clients many times.
const BACKLOG: u32 = 4096;
/// Pause after a failed accept (e.g. out of descriptors) before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Extra time given to connections cut at the end of the shutdown grace to log and close.
const CUT_GRACE: Duration = Duration::from_secs(5);

/// The views of every pool to serve, by `namespace/name`.
pub type Views = BTreeMap<String, Arc<PoolView>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Bound {
    local: SocketAddr,
    stop: CancellationToken,
}

#[derive(Debug)]
struct Entry {
    rt: Arc<PoolRt>,
    view: Option<Arc<PoolView>>,
    listeners: HashMap<Listener, Bound>,
    failed: HashMap<Listener, String>,
}

#[derive(Debug)]
struct Inner {
    pools: Mutex<BTreeMap<String, Entry>>,
    tracker: TaskTracker,
    stop_accepting: CancellationToken,
    cut: CancellationToken,
    metrics: GatewayMetrics,
    log: AccessLog,
    conns: Arc<AtomicUsize>,
    workers: Option<Workers>,
}

/// The pools a process serves.
#[derive(Debug, Clone)]
pub struct GatewaySet {
    inner: Arc<Inner>,
}

/// One bound listener, for callers that need the port (tests, logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    /// The pool.
    pub pool: String,
    /// The listener as declared.
    pub listener: Listener,
    /// The address actually bound.
    pub local: SocketAddr,
}

impl GatewaySet {
    /// A set serving nothing yet, counting into `metrics` and logging to `log`; its
    /// listeners accept on the caller's runtime.
    pub fn new(metrics: GatewayMetrics, log: AccessLog) -> Self {
        Self::build(metrics, log, None)
    }

    /// A set whose listeners each accept on every one of `workers` (one `SO_REUSEPORT`
    /// socket per worker) and whose connections run on the worker that accepted them.
    pub fn with_workers(metrics: GatewayMetrics, log: AccessLog, workers: Workers) -> Self {
        Self::build(metrics, log, Some(workers))
    }

    fn build(metrics: GatewayMetrics, log: AccessLog, workers: Option<Workers>) -> Self {
        Self {
            inner: Arc::new(Inner {
                pools: Mutex::new(BTreeMap::new()),
                tracker: TaskTracker::new(),
                stop_accepting: CancellationToken::new(),
                cut: CancellationToken::new(),
                metrics,
                log,
                conns: Arc::new(AtomicUsize::new(0)),
                workers,
            }),
        }
    }

    /// Client connections open now.
    pub fn connections(&self) -> usize {
        self.inner.conns.load(Ordering::Relaxed)
    }

    /// Every bound listener.
    pub fn listening(&self) -> Vec<Listening> {
        let pools = lock(&self.inner.pools);
        let mut out: Vec<Listening> = pools
            .iter()
            .flat_map(|(k, e)| {
                e.listeners.iter().map(|(l, b)| Listening {
                    pool: k.clone(),
                    listener: *l,
                    local: b.local,
                })
            })
            .collect();
        out.sort_by_key(|l| (l.pool.clone(), l.local));
        out
    }

    /// Makes the served pools, their listeners and members match `views`.
    pub async fn apply(&self, views: &Views) {
        if self.inner.stop_accepting.is_cancelled() {
            return;
        }
        // Pools gone: stop accepting, drain.
        {
            let mut pools = lock(&self.inner.pools);
            let gone: Vec<String> = pools
                .keys()
                .filter(|k| !views.contains_key(*k))
                .cloned()
                .collect();
            for k in gone {
                if let Some(e) = pools.remove(&k) {
                    for b in e.listeners.values() {
                        b.stop.cancel();
                    }
                    let grace = e.view.map_or(Duration::ZERO, |v| v.settings.drain_grace);
                    e.rt.drain_all(grace);
                    self.inner.metrics.forget_pool(&k);
                    tracing::info!(pool = %k, "gateway: pool no longer served; its connections drain");
                }
            }
        }
        for (key, view) in views {
            let binds = {
                let mut pools = lock(&self.inner.pools);
                let e = pools.entry(key.clone()).or_insert_with(|| Entry {
                    rt: Arc::new(PoolRt::new(key, &self.inner.metrics)),
                    view: None,
                    listeners: HashMap::new(),
                    failed: HashMap::new(),
                });
                if e.view.as_ref().is_some_and(|v| Arc::ptr_eq(v, view)) {
                    continue;
                }
                e.rt.update(view);
                e.view = Some(Arc::clone(view));
                let wanted = &view.settings.listeners;
                e.listeners.retain(|l, b| {
                    let keep = wanted.contains(l);
                    if !keep {
                        b.stop.cancel();
                    }
                    keep
                });
                e.failed.retain(|l, _| wanted.contains(l));
                wanted
                    .iter()
                    .filter(|l| !e.listeners.contains_key(l))
                    .copied()
                    .collect::<Vec<_>>()
            };
            for l in binds {
                let taken = taken_by_another(&lock(&self.inner.pools), key, l.addr);
                let bound = match taken {
                    Some(other) => Err(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!("address in use by pool {other}'s listener"),
                    )),
                    None => self.bind_all(l.addr),
                };
                let mut pools = lock(&self.inner.pools);
                let Some(e) = pools.get_mut(key) else {
                    continue;
                };
                match bound {
                    Ok(sockets) => {
                        let local = sockets
                            .first()
                            .and_then(|s| s.local_addr().ok())
                            .unwrap_or(l.addr);
                        let stop = self.inner.stop_accepting.child_token();
                        let ctx = Arc::new(ConnCtx {
                            pool: Arc::clone(&e.rt),
                            protocol: l.protocol,
                            log: self.inner.log.clone(),
                            shutdown: self.inner.cut.clone(),
                        });
                        for (i, socket) in sockets.into_iter().enumerate() {
                            let run = accept_loop(
                                socket,
                                Arc::clone(&ctx),
                                stop.clone(),
                                self.inner.tracker.clone(),
                                Arc::clone(&self.inner.conns),
                            );
                            match &self.inner.workers {
                                Some(w) => w.spawn(i, run),
                                None => drop(tokio::spawn(run)),
                            }
                        }
                        tracing::info!(pool = %key, listen = %local, protocol = l.protocol.as_str(), "gateway listening");
                        e.failed.remove(&l);
                        e.listeners.insert(l, Bound { local, stop });
                    }
                    Err(err) => {
                        let msg = err.to_string();
                        if e.failed.get(&l) != Some(&msg) {
                            tracing::error!(pool = %key, listen = %l.addr, error = %msg, "gateway: cannot listen (retried at the next change of the pool)");
                            e.failed.insert(l, msg);
                        }
                    }
                }
            }
            if let Some(e) = lock(&self.inner.pools).get(key) {
                e.rt.metrics
                    .listeners
                    .set(i64::try_from(e.listeners.len()).unwrap_or(i64::MAX));
            }
        }
    }

    /// Binds `addr` once, or once per worker with `SO_REUSEPORT` (the later ones on the
    /// port the first got when `addr`'s port is 0); all or none.
    fn bind_all(&self, addr: SocketAddr) -> std::io::Result<Vec<std::net::TcpListener>> {
        let n = self.inner.workers.as_ref().map_or(1, Workers::count);
        let reuse = self.inner.workers.is_some();
        let first = bind(addr, reuse)?;
        let at = first.local_addr()?;
        let mut out = vec![first];
        for _ in 1..n {
            out.push(bind(at, reuse)?);
        }
        Ok(out)
    }

    /// Applies each value of `views` until `stop`, then returns (call [`Self::shutdown`]).
    pub async fn follow(&self, mut views: watch::Receiver<Arc<Views>>, stop: CancellationToken) {
        loop {
            let current = Arc::clone(&views.borrow_and_update());
            self.apply(&current).await;
            tokio::select! {
                () = stop.cancelled() => return,
                r = views.changed() => if r.is_err() { stop.cancelled().await; return },
            }
        }
    }

    /// Stops accepting, waits up to `grace` for open connections to end, then cuts the rest.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.stop_accepting.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::info!(
                open = self.connections(),
                "gateway: shutdown grace over; cutting open connections"
            );
            self.inner.cut.cancel();
            for e in lock(&self.inner.pools).values() {
                e.rt.cut_all();
            }
            let _ = tokio::time::timeout(CUT_GRACE, self.inner.tracker.wait()).await;
        }
    }
}

/// The pool other than `key` whose listener's address overlaps `addr` (same port, and the
/// same or an unspecified address on either side); `None` for port 0.
fn taken_by_another(
    pools: &BTreeMap<String, Entry>,
    key: &str,
    addr: SocketAddr,
) -> Option<String> {
    if addr.port() == 0 {
        return None;
    }
    let overlaps = |b: SocketAddr| {
        b.port() == addr.port()
            && (b.ip() == addr.ip() || b.ip().is_unspecified() || addr.ip().is_unspecified())
    };
    pools
        .iter()
        .filter(|(k, _)| k.as_str() != key)
        .find(|(_, e)| e.listeners.values().any(|b| overlaps(b.local)))
        .map(|(k, _)| k.clone())
}

/// A listening socket on `addr`, not yet registered with a runtime (the worker that accepts
/// on it registers it), with `SO_REUSEPORT` when `reuse_port`.
fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.nonblocking(),
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    // NB: Linux copies TCP_NODELAY from the listening socket to each accepted one, which
    // saves a setsockopt per connection (the handshake and tunnelled interactive protocols
    // must not wait on Nagle); `conn::serve` no longer sets it.
    s.set_tcp_nodelay(true)?;
    s.bind(&addr.into())?;
    s.listen(i32::try_from(BACKLOG).unwrap_or(i32::MAX))?;
    Ok(s.into())
}

/// Decrements the connection count when a connection task ends.
struct ConnSlot(Arc<AtomicUsize>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    ctx: Arc<ConnCtx>,
    stop: CancellationToken,
    tracker: TaskTracker,
    conns: Arc<AtomicUsize>,
) {
    // Registered here, with the runtime that runs this loop (a worker's, or the caller's).
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(pool = %ctx.pool.key, error = %e, "gateway: cannot register the listener");
            return;
        }
    };
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(pool = %ctx.pool.key, error = %e, "gateway: accept failed");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(ACCEPT_RETRY) => continue,
                    }
                }
            },
        };
        if conns.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            conns.fetch_sub(1, Ordering::AcqRel);
            drop(stream);
            continue;
        }
        let slot = ConnSlot(Arc::clone(&conns));
        let ctx = Arc::clone(&ctx);
        tracker.spawn(async move {
            let _slot = slot;
            conn::serve(ctx, stream, peer).await;
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The client side's TCP_NODELAY comes from the listener, not a call per connection.
    #[tokio::test]
    async fn accepted_connections_have_nodelay_from_the_listener() {
        let l =
            TcpListener::from_std(bind("127.0.0.1:0".parse().unwrap(), false).unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(
            s.nodelay().unwrap(),
            "TCP_NODELAY not inherited from the listener"
        );
    }

    fn entry(metrics: &GatewayMetrics, key: &str, local: &str) -> Entry {
        let l = Listener {
            addr: local.parse().unwrap(),
            protocol: crate::model::ListenerProtocol::Http,
        };
        let mut listeners = HashMap::new();
        listeners.insert(
            l,
            Bound {
                local: l.addr,
                stop: CancellationToken::new(),
            },
        );
        Entry {
            rt: Arc::new(PoolRt::new(key, metrics)),
            view: None,
            listeners,
            failed: HashMap::new(),
        }
    }

    /// `SO_REUSEPORT` would let two pools share a port: the set refuses the second itself.
    #[test]
    fn another_pools_port_is_taken_on_the_same_or_an_unspecified_address() {
        let m = GatewayMetrics::new();
        let mut pools = BTreeMap::new();
        pools.insert("ns/a".to_owned(), entry(&m, "ns/a", "127.0.0.1:4000"));
        let taken = |addr: &str| taken_by_another(&pools, "ns/b", addr.parse().unwrap());
        assert_eq!(taken("127.0.0.1:4000").as_deref(), Some("ns/a"));
        assert_eq!(taken("0.0.0.0:4000").as_deref(), Some("ns/a"));
        assert_eq!(taken("127.0.0.2:4000"), None);
        assert_eq!(taken("127.0.0.1:4001"), None);
        assert_eq!(taken("127.0.0.1:0"), None);
        assert_eq!(
            taken_by_another(&pools, "ns/a", "127.0.0.1:4000".parse().unwrap()),
            None,
            "a pool's own listener is not another's"
        );
    }

    /// One socket per worker on one port; a port a socket without `SO_REUSEPORT` holds (another
    /// program) is refused, not shared.
    #[tokio::test]
    async fn each_worker_gets_its_own_socket_on_the_port_and_a_foreign_port_is_refused() {
        let workers = Workers::new(3).unwrap();
        let log =
            AccessLog::start(crate::access_log::LogTarget::Off, GatewayMetrics::new()).unwrap();
        let set = GatewaySet::with_workers(GatewayMetrics::new(), log, workers);
        let socks = set.bind_all("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(socks.len(), 3);
        let port = socks[0].local_addr().unwrap().port();
        assert!(socks.iter().all(|s| s.local_addr().unwrap().port() == port));
        let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = set.bind_all(foreign.local_addr().unwrap()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    }
}
