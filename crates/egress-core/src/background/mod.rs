//! Background work both drivers run, written once: the orphan GC loop ([`gc`]), the host
//! check loop ([`host_checks`]), the proxy health loop ([`proxy_health`]), the reputation
//! check loop ([`reputation`]), the provider config
//! and SSH material watch ([`config_watch`]), and the process's stop signal ([`signals`]).
//!
//! Each background task is a plain `async fn` that runs until its stop token is cancelled,
//! generic over a small trait the driver implements: where the providers and the live set
//! come from, where the results go, and the clock. Whether this replica may act is the stop
//! token the driver hands in: the standalone driver passes its process token; the Kubernetes
//! driver passes the token of one leadership term, so a lost Lease stops every leader-only
//! task. [`Tasks`] holds the running tasks of one scope (a process or a term) by name.
//! (A *worker*, in this project, is only a reconcile worker: the standalone `--workers`.)
//!
//! Guarantees:
//! - Every wait is bounded and every task leaves its loop at the next wait once its stop
//!   token is cancelled ([`sleep_or_stop`]); [`Tasks::shutdown`] cancels, aborts and joins
//!   every task it holds, so nothing of a scope outlives it.
//! - The tasks hold no lock across an `.await`; what they call on the driver's traits must
//!   not either.

pub mod config_watch;
pub mod gc;
pub mod host_checks;
pub mod proxy_health;
pub mod reputation;
pub mod signals;

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Waits `d`, or until `stop` is cancelled; `true` when the full time passed, `false` when
/// stopped (the caller leaves its loop).
pub async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// The running background tasks of one scope (a process or a leadership term), each under a
/// name (logged at debug level when its work returns; an aborted task logs nothing), with
/// the scope's stop token.
#[derive(Debug)]
pub struct Tasks {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Tasks {
    /// An empty set whose tasks stop on `stop`.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            stop,
            tasks: JoinSet::new(),
        }
    }

    /// The scope's stop token (hand a clone to every task spawned here).
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Starts `work` under `name` on the current runtime.
    pub fn spawn(&mut self, name: &'static str, work: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(async move {
            work.await;
            tracing::debug!(task = name, "background task ended");
        });
    }

    /// Aborts every task without waiting for them (see [`Tasks::join`]).
    pub fn abort(&mut self) {
        self.tasks.abort_all();
    }

    /// Waits until every task ended (after [`Tasks::abort`] or their stop token).
    pub async fn join(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }

    /// Cancels the stop token, aborts every task and waits until all ended.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        self.abort();
        self.join().await;
    }
}
