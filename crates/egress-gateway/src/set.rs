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
//! - Nothing here reads or writes pool state anywhere else: the gateway only follows views.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::AccessLog;
use crate::conn::{self, ConnCtx};
use crate::metrics::GatewayMetrics;
use crate::model::{Listener, PoolView};
use crate::pool::PoolRt;

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
    /// A set serving nothing yet, counting into `metrics` and logging to `log`.
    pub fn new(metrics: GatewayMetrics, log: AccessLog) -> Self {
        Self {
            inner: Arc::new(Inner {
                pools: Mutex::new(BTreeMap::new()),
                tracker: TaskTracker::new(),
                stop_accepting: CancellationToken::new(),
                cut: CancellationToken::new(),
                metrics,
                log,
                conns: Arc::new(AtomicUsize::new(0)),
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
                let bound = bind(l.addr).await;
                let mut pools = lock(&self.inner.pools);
                let Some(e) = pools.get_mut(key) else {
                    continue;
                };
                match bound {
                    Ok(listener) => {
                        let local = listener.local_addr().unwrap_or(l.addr);
                        let stop = self.inner.stop_accepting.child_token();
                        let ctx = Arc::new(ConnCtx {
                            pool: Arc::clone(&e.rt),
                            protocol: l.protocol,
                            log: self.inner.log.clone(),
                            shutdown: self.inner.cut.clone(),
                        });
                        tokio::spawn(accept_loop(
                            listener,
                            ctx,
                            stop.clone(),
                            self.inner.tracker.clone(),
                            Arc::clone(&self.inner.conns),
                        ));
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

async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    // NB: Linux copies TCP_NODELAY from the listening socket to each accepted one, which
    // saves a setsockopt per connection (the handshake and tunnelled interactive protocols
    // must not wait on Nagle); `conn::serve` no longer sets it.
    s.set_nodelay(true)?;
    s.bind(addr)?;
    s.listen(BACKLOG)
}

/// Decrements the connection count when a connection task ends.
struct ConnSlot(Arc<AtomicUsize>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ConnCtx>,
    stop: CancellationToken,
    tracker: TaskTracker,
    conns: Arc<AtomicUsize>,
) {
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
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert!(
            s.nodelay().unwrap(),
            "TCP_NODELAY not inherited from the listener"
        );
    }
}
