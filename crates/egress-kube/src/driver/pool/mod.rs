//! The ProxyPool controller: a kube-runtime `Controller` on ProxyPools, woken by its own
//! watch and by every change of a member Proxy (through the [`index::MemberIndex`] the Proxy
//! watch feeds), running the core's pool round ([`egress_core::pool::round`]: removal,
//! validation, credentials, the decision, status, metrics) and doing its Kubernetes I/O:
//! member Proxies created (owned by the pool, labelled) and deleted, the generated-credentials
//! Secret made once, Events, the pool's status and its finalizer.
//!
//! Pipeline of one reconcile (`reconcile.rs`): the pool from the watch cache → the finalizer
//! ensured (network) → credentials Secret read or created, for a pool that will act
//! (network) → members read from the Proxy cache by the index, plus the creates not seen yet
//! (pure, `members.rs`) → the core's round planned (pure) → carried out through this driver's
//! `PoolDriver`: creates, deletes, Events, status (network) → the finalizer dropped once a
//! deleted pool has no member left (network).
//!
//! Guarantees:
//! - Per-event cost independent of the number of pools and members: an event wakes only the
//!   pools it touched, and a reconcile reads only its pool's members, by name.
//! - Members carry `ownerReferences` to the pool (controller, blockOwnerDeletion) and the
//!   labels `egress-proxies.dev/pool` and `egress-proxies.dev/template-hash`; they are
//!   reconciled by the Proxy controller like any Proxy.
//! - Deleting a pool deletes its members explicitly and waits for them to be gone (the
//!   finalizer [`POOL_FINALIZER`]): the members' VMs are removed even where no garbage
//!   collector runs, and the pool disappears last. The garbage collector may delete members
//!   first (a foreground deletion, or the finalizer removed by hand): a member already gone or
//!   being deleted is not an error. A pool deleted with `propagationPolicy: Orphan` leaves its
//!   members: only members that still name the pool as their owner are deleted with it, and
//!   a deleted pool's delete of a member holds only for the member as read (resourceVersion
//!   precondition), so a cache that has not shown the collector (or a user) removing the
//!   reference yet never deletes a member that no longer belongs to the pool.
//! - A member the pool created is counted until the watch shows it (expectations), so a
//!   reconcile that runs before the watch caught up never creates it twice.
//! - Metrics as in standalone mode: members by state on every reconcile; a replacement counted
//!   by cause once per member delete the API server took (a delete sent again before the watch
//!   shows it, or one the cache already shows, is not counted again); create-to-available
//!   observed once per member, remembered only while the member exists; a pool's series go
//!   with the pool.
//! - Runs only on the leader (it is part of a leadership term); every call is bounded by
//!   [`super::API_SLACK`].

pub(in crate::driver) mod index;
mod members;
mod reconcile;
pub(crate) mod secret;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_core::controller::Controller as Core;
use futures_util::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::events::Recorder;
use crate::api::{Proxy, ProxyPool};
use crate::observe::Observer;
use index::{MemberIndex, PoolKey};

/// The finalizer on every ProxyPool: its members are deleted before it goes.
pub const POOL_FINALIZER: &str = "egress-proxies.dev/members";

/// How long a member the pool created counts before the watch shows it.
// NB: the watch delivers a create within milliseconds; a minute covers a slow API server
// and a relist, after which a create the API server lost is made again.
pub(in crate::driver) const EXPECTATION_TTL: Duration = Duration::from_secs(60);

/// Reconciles of pools at once.
// NB: a pool reconcile makes a handful of calls per member it changes; 4 keeps many pools
// moving without crowding the Proxy controller's own API calls.
pub(in crate::driver) const POOL_CONCURRENCY: u16 = 4;

/// Re-decide a pool at least this often, even without events (the clock moves ages and
/// health periods on; the credentials Secret is polled, never watched).
pub(in crate::driver) const POOL_RESYNC: Duration = Duration::from_secs(60);

/// Creates and deletes pools made whose results the watch has not shown yet.
#[derive(Debug, Default)]
pub(in crate::driver) struct Expectations {
    /// By pool.
    pub(in crate::driver) pools: HashMap<PoolKey, members::PoolExpectations>,
}

/// Everything a pool reconcile needs.
pub(in crate::driver) struct PoolCtx {
    pub(in crate::driver) client: Client,
    pub(in crate::driver) core: Arc<Core>,
    pub(in crate::driver) recorder: Recorder,
    pub(in crate::driver) proxies: Store<Proxy>,
    pub(in crate::driver) index: Arc<MemberIndex>,
    pub(in crate::driver) observer: Arc<Observer>,
    pub(in crate::driver) expectations: Mutex<Expectations>,
    pub(in crate::driver) failures: Mutex<HashMap<PoolKey, u32>>,
    /// Interval between re-reads of a generated-credentials Secret.
    pub(in crate::driver) secret_poll: Duration,
    /// The DNS blocklist checks (`reputation.retireFor`).
    pub(in crate::driver) reputation: Arc<egress_core::reputation::ReputationService>,
    /// The process's retired addresses: each pool's `status.retiredAddresses` in effect.
    pub(in crate::driver) retired: Arc<egress_provider::libvirt::retired::RetiredAddresses>,
}

/// Runs the pool controller until `stop`: its own watch of `pools`, woken also by `triggers`
/// (pools whose members changed).
pub(in crate::driver) async fn run(
    pools: Api<ProxyPool>,
    ctx: Arc<PoolCtx>,
    triggers: mpsc::UnboundedReceiver<PoolKey>,
    stop: CancellationToken,
) {
    if !restore_retired(&pools, &ctx, &stop).await {
        return;
    }
    let triggers = futures_util::stream::unfold(triggers, |mut rx| async move {
        rx.recv()
            .await
            .map(|(ns, name)| (ObjectRef::<ProxyPool>::new(&name).within(&ns), rx))
    });
    // rbac: PROXYPOOLS list, watch (the pool controller's watch cache)
    Controller::new(pools, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(POOL_CONCURRENCY))
        .reconcile_on(triggers)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "pool controller");
            }
        })
        .await;
}

/// Reads every pool's `status.retiredAddresses` into the process's registry and primes it
/// (until then no address is handed out: a restart never gives a retired address away before
/// its retirement was read back). Retries every [`RESTORE_RETRY`] until a listing succeeds;
/// `false` when stopped first.
async fn restore_retired(pools: &Api<ProxyPool>, ctx: &PoolCtx, stop: &CancellationToken) -> bool {
    use kube::ResourceExt;
    let params = kube::api::ListParams::default();
    loop {
        // rbac: PROXYPOOLS list
        let listed = tokio::select! {
            () = stop.cancelled() => return false,
            r = tokio::time::timeout(
                super::API_SLACK,
                pools.list(&params),
            ) => r,
        };
        match listed {
            Ok(Ok(list)) => {
                let now = std::time::SystemTime::now();
                for p in &list.items {
                    if let Some(st) = &p.status {
                        let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                        st.sync_retired(&ctx.retired, &key, &p.spec.template.spec.provider, now);
                    }
                }
                ctx.retired.prime();
                return true;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the pools' retired addresses; retrying");
            }
            Err(_) => tracing::warn!("listing the pools' retired addresses timed out; retrying"),
        }
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(RESTORE_RETRY) => {}
        }
    }
}

/// Pause between attempts to read the pools' retired addresses at the start of a term.
// NB: allocation waits on it; a couple of seconds keeps a brief API outage short.
const RESTORE_RETRY: Duration = Duration::from_secs(2);

/// Why one pool reconcile failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub(in crate::driver) enum PoolError {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A call did not answer in time.
    #[error("a Kubernetes API call took longer than {0:?}")]
    Timeout(Duration),
    /// The credentials Secret could not be read or made.
    #[error("credentials Secret: {0}")]
    Secret(#[from] secret::SecretError),
}
