//! The standalone driver's side of the shared proxy health task
//! ([`egress_core::background::proxy_health`]): the targets are the [`Store`]'s Proxies that
//! are Running with an address, and after each round every Proxy's health is merged into its
//! status (`Healthy`, `Ready` = Running ∧ Healthy).
//!
//! Guarantees: a Proxy a round turned Unhealthy is queued for a reconcile at once (the work
//! queue's de-duplication keeps it to one); a pool whose member a round turned healthy or
//! unhealthy is queued for a decision at once (its row and gateway follow within the pool
//! loop's fold, not the next tick); a Proxy being deleted is not probed; the engine
//! keeps the state of every Proxy the store knows (deleting ones included) and drops the rest.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use egress_core::background::proxy_health::ProxyHealthDriver;
use egress_core::health::{self, HealthEngine, ProbeTarget, RoundReport};
use egress_provider::ProxyUid;
use egress_provider::sync::lock;

use crate::context::Context;
use crate::pool::members::pool_view;
use crate::store::{Objects, Store};

/// The targets and the status merge of the proxy health task, over the [`Store`].
pub(crate) struct ProxyHealth {
    store: Arc<Store>,
    ctx: Arc<Context>,
}

impl ProxyHealth {
    /// Health checks of `store`'s Proxies; Proxies turned Unhealthy go to `ctx`'s work queue.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>) -> Self {
        Self { store, ctx }
    }
}

impl ProxyHealthDriver for ProxyHealth {
    fn targets(&self) -> Vec<ProbeTarget> {
        lock(&self.store.objects)
            .iter()
            .filter(|(_, o)| !o.object.deleting)
            .filter_map(|(uid, o)| {
                ProbeTarget::of(
                    *uid,
                    format!("{}/{}", o.object.namespace, o.object.name),
                    &o.object.spec.provider,
                    &o.object.spec.proxy,
                    o.object.credentials.as_ref(),
                    &o.status,
                )
            })
            .collect()
    }

    fn known(&self) -> HashSet<ProxyUid> {
        lock(&self.store.objects).keys().copied().collect()
    }

    fn round_done(&self, engine: &HealthEngine, _report: &RoundReport) {
        let pools = merge_round(
            &mut lock(&self.store.objects),
            |uid| engine.get(uid),
            SystemTime::now(),
        );
        // The pools whose members' health changed are decided at once, not at the next tick.
        for k in pools {
            self.ctx.pool_queue.add(&k);
        }
    }

    fn reconcile_now(&self, proxies: &[(ProxyUid, String)]) {
        for (uid, _) in proxies {
            self.ctx.queue.add(*uid);
        }
    }
}

/// Merges every Proxy's health (`health(uid)`) into its status; returns the pools
/// (`namespace/name`) of the members whose pool-visible state (phase, readiness, health,
/// listing) changed. One pass over the objects, as the merge itself.
fn merge_round(
    objects: &mut Objects,
    health: impl Fn(&ProxyUid) -> Option<egress_core::health::ProxyHealth>,
    now: SystemTime,
) -> BTreeSet<String> {
    let mut pools = BTreeSet::new();
    objects.for_each_mut(|uid, o| {
        let previous = o.status.clone();
        health::apply_to_status(
            &mut o.status,
            health(uid).as_ref(),
            Some(&previous),
            now,
            o.object.generation,
        );
        if let Some(k) = &o.pool
            && pool_view(&previous) != pool_view(&o.status)
        {
            pools.insert(k.clone());
        }
    });
    pools
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use std::path::Path;

    use egress_core::health::{HealthState, ProxyHealth};
    use egress_core::model::{Phase, ProxyStatus};

    use super::*;
    use crate::manifests::parse_file;
    use crate::store::{Obj, object_of};

    fn obj(pool: Option<&str>) -> Obj {
        let text = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p\n\
                    spec:\n  provider: local\n  image: tiny\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let (loaded, errs) = parse_file(Path::new("/m/p.yaml"), text, Path::new("/m"));
        assert!(errs.is_empty(), "{errs:?}");
        Obj {
            object: object_of(&loaded[0], 1),
            status: ProxyStatus {
                phase: Phase::Running,
                ..ProxyStatus::default()
            },
            first_seen: SystemTime::UNIX_EPOCH,
            pool: pool.map(str::to_owned),
        }
    }

    fn uid(n: u128) -> ProxyUid {
        ProxyUid(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn a_round_queues_exactly_the_pools_whose_members_health_changed() {
        let mut objects = Objects::default();
        objects.insert(uid(1), obj(Some("default/a")));
        objects.insert(uid(2), obj(Some("default/b")));
        objects.insert(uid(3), obj(None));
        let state = |s| ProxyHealth {
            state: s,
            ..ProxyHealth::default()
        };
        let now = SystemTime::UNIX_EPOCH;
        // 1 and 3 turn healthy; 2 has no result yet (as before): only a's pool is queued.
        let first = |u: &ProxyUid| (u.0.as_u128() != 2).then(|| state(HealthState::Healthy));
        let pools = merge_round(&mut objects, first, now);
        assert_eq!(pools, BTreeSet::from(["default/a".to_owned()]));
        // The same results again: nothing changed, no pool queued.
        assert!(merge_round(&mut objects, first, now).is_empty());
        // 1 turns unhealthy, 2 healthy: both pools.
        let second = |u: &ProxyUid| {
            Some(state(if u.0.as_u128() == 1 {
                HealthState::Unhealthy
            } else {
                HealthState::Healthy
            }))
        };
        let pools = merge_round(&mut objects, second, now);
        assert_eq!(
            pools,
            BTreeSet::from(["default/a".to_owned(), "default/b".to_owned()])
        );
    }
}
