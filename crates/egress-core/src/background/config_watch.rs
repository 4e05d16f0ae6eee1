//! The config watch task: every `interval`, fingerprints the provider config file and the
//! directories of SSH material; on a change, rebuilds the providers off the async threads and
//! hands a good result to the driver.
//!
//! Guarantees:
//! - A config that fails to load or build keeps the running providers (logged at error level
//!   with the reason); the next change is tried again.
//! - File reads and the rebuild run on the blocking pool, never on the async threads; a file
//!   over [`MAX_FINGERPRINT_FILE`] is fingerprinted by size and modification time only.
//! - The first fingerprint is taken when the task starts: only later changes reload.
//! - Every load after a change is counted in `metrics` (`config_reloads_total` by result,
//!   the last load's success and the time of the last successful one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::sleep_or_stop;
use crate::metrics::Metrics;
use crate::providers::Providers;

/// Largest file read when fingerprinting by content.
// NB: keys and known_hosts are a few KiB; a larger file is fingerprinted by size and mtime.
pub const MAX_FINGERPRINT_FILE: u64 = 1 << 20;

/// Rebuilds the providers from the watched files (blocking; run on the blocking pool).
pub type Reload = Arc<dyn Fn() -> Result<Providers, String> + Send + Sync>;

/// What counts as a change of a watched file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Its content (up to [`MAX_FINGERPRINT_FILE`]; above, size and modification time).
    Content,
    /// Its size and modification time only (a rewrite with the same content counts).
    SizeAndModified,
}

/// The files whose change rebuilds the providers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedFiles {
    /// The provider config file.
    pub config: PathBuf,
    /// Directories of SSH keys and known_hosts, read two levels deep (a mounted Secret's
    /// `..data` symlink layout).
    pub dirs: Vec<PathBuf>,
    /// What counts as a change.
    pub compare: Compare,
}

impl WatchedFiles {
    /// A fingerprint of every watched file; equal fingerprints mean no change. Blocking.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        let mut add = |p: &Path| {
            h.update(p.to_string_lossy().as_bytes());
            match (self.compare, std::fs::metadata(p)) {
                (Compare::Content, Ok(m)) if m.len() <= MAX_FINGERPRINT_FILE => {
                    h.update(std::fs::read(p).unwrap_or_default());
                }
                (_, Ok(m)) => h.update(format!("{:?}{}", m.modified().ok(), m.len()).as_bytes()),
                (_, Err(_)) => h.update(b"-"),
            }
        };
        add(&self.config);
        for dir in &self.dirs {
            let mut files = Vec::new();
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    for e2 in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                        if e2.path().is_file() {
                            files.push(e2.path());
                        }
                    }
                } else if p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            for f in &files {
                add(f);
            }
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Watches `files` every `interval` until `stop` is cancelled; after a change, runs `reload`,
/// records its result in `metrics` and hands good providers to `reloaded`.
pub async fn run(
    files: WatchedFiles,
    interval: Duration,
    reload: Reload,
    reloaded: impl Fn(Providers) + Send,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let files = Arc::new(files);
    let fingerprint = |f: &Arc<WatchedFiles>| {
        let f = Arc::clone(f);
        async move {
            tokio::task::spawn_blocking(move || f.fingerprint())
                .await
                .unwrap_or_default()
        }
    };
    let mut last = fingerprint(&files).await;
    while sleep_or_stop(interval, &stop).await {
        let now = fingerprint(&files).await;
        if now == last {
            continue;
        }
        last = now;
        let r = Arc::clone(&reload);
        let result = tokio::task::spawn_blocking(move || r()).await;
        metrics.config_loaded(matches!(result, Ok(Ok(_))));
        match result {
            Ok(Ok(p)) => reloaded(p),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "provider reload refused; the running config stays");
            }
            Err(e) => {
                tracing::error!(error = %e, "provider reload failed; the running config stays")
            }
        }
    }
}
