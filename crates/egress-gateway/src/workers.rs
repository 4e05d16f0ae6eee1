//! The gateway's own threads: one single-threaded tokio runtime per worker, each accepting on
//! its own `SO_REUSEPORT` socket of every listener and running the connections it accepted
//! until they end.
//!
//! NB: why not the process's multi-threaded runtime: a short connection there is accepted on
//! one worker and woken on another (work stealing, a futex wake per hand-over), which
//! `scripts/bench gateway` measured at 1.22× HAProxy's CPU per short connection against
//! 1.10× with a single worker thread; HAProxy itself runs one event loop per thread, each
//! with its own `SO_REUSEPORT` socket. Here the kernel spreads new connections over the
//! workers' sockets and a connection never leaves the thread that accepted it.
//!
//! Guarantees:
//! - [`Workers::new`] starts every thread or none (an error names the failed one);
//! - a worker's thread runs until the last [`Workers`] clone is dropped; the tasks still on
//!   it then are dropped (the caller's shutdown waits for its connections first);
//! - [`Workers::spawn`] never blocks and never runs the future on the caller's thread.

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Default number of workers: the CPUs this process may run on.
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Most workers accepted (more than this is a configuration mistake, not a machine).
pub const MAX_WORKERS: usize = 256;

/// Why the workers could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// Zero or more than [`MAX_WORKERS`] asked for.
    #[error("gateway workers: {0} is not between 1 and {MAX_WORKERS}")]
    Count(usize),
    /// A worker's runtime or thread could not be made.
    #[error("gateway worker {index}: cannot start: {source}")]
    Start {
        /// Which worker.
        index: usize,
        /// The system's error.
        source: std::io::Error,
    },
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    // Dropped with the last clone: the thread's `block_on` returns and its runtime is dropped.
    _stop: oneshot::Sender<()>,
}

/// The gateway's worker threads (cheap to clone; the threads stop with the last clone).
#[derive(Debug, Clone)]
pub struct Workers {
    workers: Arc<Vec<Worker>>,
}

impl Workers {
    /// Starts `count` worker threads, each with its own single-threaded runtime.
    pub fn new(count: usize) -> Result<Self, WorkersError> {
        if count == 0 || count > MAX_WORKERS {
            return Err(WorkersError::Count(count));
        }
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| WorkersError::Start { index, source })?;
            let handle = rt.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("gateway-{index}"))
                .spawn(move || {
                    // Runs the spawned tasks until every sender is gone.
                    let _ = rt.block_on(stopped);
                })
                .map_err(|source| WorkersError::Start { index, source })?;
            workers.push(Worker {
                handle,
                _stop: stop,
            });
        }
        Ok(Self {
            workers: Arc::new(workers),
        })
    }

    /// How many workers run.
    pub fn count(&self) -> usize {
        self.workers.len()
    }

    /// Runs `fut` on worker `index` (modulo the count).
    pub fn spawn<F>(&self, index: usize, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        // NB: never empty (`new` refuses 0), so `get` always finds one.
        if let Some(w) = self.workers.get(index % self.workers.len().max(1)) {
            drop(w.handle.spawn(fut));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_count_out_of_range_is_refused() {
        assert!(matches!(Workers::new(0), Err(WorkersError::Count(0))));
        assert!(matches!(
            Workers::new(MAX_WORKERS + 1),
            Err(WorkersError::Count(_))
        ));
    }

    /// Each worker runs what it is given on its own thread, and spawns from there stay there.
    #[tokio::test]
    async fn each_worker_runs_its_tasks_on_its_own_thread() {
        let w = Workers::new(2).unwrap();
        let mut names = Vec::new();
        for i in 0..2 {
            let (tx, rx) = oneshot::channel();
            w.spawn(i, async move {
                let outer = std::thread::current().id();
                let inner = tokio::spawn(async { std::thread::current().id() })
                    .await
                    .unwrap();
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((outer == inner, name));
            });
            let (same, name) = tokio::time::timeout(std::time::Duration::from_secs(10), rx)
                .await
                .unwrap()
                .unwrap();
            assert!(same, "a task spawned on worker {i} moved to another thread");
            names.push(name.unwrap());
        }
        assert_eq!(names, ["gateway-0", "gateway-1"]);
    }
}
