//! The standalone driver's side of the shared config watch
//! ([`egress_core::background::config_watch`]): the provider config file is watched by size
//! and modification time, reloaded as the same installation, and a good reload is put in
//! effect everywhere.
//!
//! Guarantees: a bad reload keeps the running config (the core's watch logs every field
//! error); a good one replaces the providers for the controller and every job at once,
//! refreshes the host rows (hosts no longer configured go) and re-queues every Proxy (which
//! releases latched failures of changed entries) and every pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use egress_core::background::config_watch::{Compare, Reload, WatchedFiles};
use egress_core::config;
use egress_core::config::installation::Installation;
use egress_core::providers::{self, Providers};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::host_checks::seed_rows;
use crate::store::Store;

/// The config file as the standalone driver watches it: a change of size or modification
/// time (no SSH directory: key files are named in the config).
pub(crate) fn watched_config(path: &Path) -> WatchedFiles {
    WatchedFiles {
        config: path.to_path_buf(),
        dirs: Vec::new(),
        compare: Compare::SizeAndModified,
    }
}

/// Loads the config at `path` and opens its providers as `installation` (blocking: file I/O).
pub(crate) fn reload_from(path: PathBuf, installation: Installation) -> Reload {
    Arc::new(move || {
        let cfg = config::load(&path).map_err(|e| e.to_string())?;
        providers::open(&cfg, &installation).map_err(|e| e.to_string())
    })
}

/// Puts reloaded providers in effect: the controller, the host rows, and every Proxy
/// re-queued (which releases latches of changed entries).
pub(crate) fn providers_reloaded(store: &Store, ctx: &Context, p: Providers, path: &Path) {
    ctx.set_providers(Arc::new(p));
    seed_rows(store, ctx);
    tracing::info!(path = %path.display(), "provider config reloaded");
    let uids: Vec<ProxyUid> = lock(&store.objects).keys().copied().collect();
    for u in uids {
        ctx.queue.add(u);
    }
    // A host's `maintenance:` may have changed: every pool decides again now.
    crate::pool::reconcile::all_pools_dirty(store, ctx);
}
