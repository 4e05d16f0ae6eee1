//! Watching the provider config file and the SSH directory, and rebuilding the providers
//! when either changes.
//!
//! Guarantees: a config that fails to load keeps the running one; files are fingerprinted
//! off the async runtime, and a file over [`super::MAX_FINGERPRINT_FILE`] by size and mtime.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use egress_core::providers::Providers;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{DriverStats, KubeOptions, MAX_FINGERPRINT_FILE, Reload, sleep_or_stop};

/// A fingerprint of the config file and every file under the SSH directory (two levels, as a
/// mounted Secret's `..data` symlink layout has).
pub(super) fn fingerprint(opts: &KubeOptions) -> String {
    let mut h = Sha256::new();
    let mut add = |p: &std::path::Path| {
        h.update(p.to_string_lossy().as_bytes());
        match std::fs::metadata(p) {
            Ok(m) if m.len() <= MAX_FINGERPRINT_FILE => {
                h.update(std::fs::read(p).unwrap_or_default());
            }
            Ok(m) => h.update(format!("{:?}{}", m.modified().ok(), m.len()).as_bytes()),
            Err(_) => h.update(b"-"),
        }
    };
    add(&opts.config_path);
    if let Some(dir) = &opts.ssh_dir {
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

/// Rebuilds the providers when the config file or the SSH material changes.
pub(super) async fn watch_files(
    opts: KubeOptions,
    reload: Reload,
    tx: watch::Sender<Arc<Providers>>,
    stats: Arc<DriverStats>,
    stop: CancellationToken,
) {
    let o = opts.clone();
    let mut last = tokio::task::spawn_blocking(move || fingerprint(&o))
        .await
        .unwrap_or_default();
    while sleep_or_stop(opts.watch_interval, &stop).await {
        let o = opts.clone();
        let now = tokio::task::spawn_blocking(move || fingerprint(&o))
            .await
            .unwrap_or_default();
        if now == last {
            continue;
        }
        last = now;
        let r = reload.clone();
        match tokio::task::spawn_blocking(move || r()).await {
            Ok(Ok(p)) => {
                tracing::info!("provider config or SSH material changed: providers rebuilt");
                stats.reloads.fetch_add(1, Ordering::Relaxed);
                tx.send_replace(Arc::new(p));
            }
            Ok(Err(e)) => tracing::error!(error = %e, "reload refused; the running config stays"),
            Err(e) => tracing::error!(error = %e, "reload failed; the running config stays"),
        }
    }
}
