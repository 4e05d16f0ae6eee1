//! The pool gateway's membership source in standalone mode: for every pool whose manifest
//! declares `spec.gateway`, its resolved settings, client credentials and published members,
//! read from the member state this process already holds, sent on a `watch` channel the
//! gateway follows.
//!
//! Guarantees: a pool's source is rebuilt when the pool loop is told one of its members
//! changed (phase, readiness, health, deletion) and at least every [`REFRESH`]; the cost of a
//! rebuild is O(members of the gateway pools), never the whole fleet; a pool whose source is
//! unchanged keeps the same `Arc`, so the gateway does nothing for it; the gateway only reads
//! this (it never writes pool state).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use egress_core::controller::ProxyCredentials;
use egress_core::pool::gateway_source::{GatewaySource, published_member};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::manifests::pool::LoadedPool;
use crate::pool::credentials;
use crate::pool::member_uid;
use crate::store::Store;
use egress_provider::sync::lock;

/// Every pool gateway's source, by `namespace/name`.
pub type GatewaySources = BTreeMap<String, Arc<GatewaySource>>;

/// Longest a change the pool loop was not told of (an egress address seen anew) waits.
// NB: member changes wake the feed at once; this only bounds what arrives otherwise.
pub const REFRESH: Duration = Duration::from_secs(1);

impl Store {
    /// The gateway source of pool `key`; `None` when it declares no gateway (or its manifest
    /// is gone).
    fn gateway_source(&self, ctx: &Context, key: &str) -> Option<GatewaySource> {
        let (namespace, name, p, recs, quarantine) = {
            let all = lock(&self.pools);
            let rt = all.by_key.get(key).filter(|rt| !rt.removed)?;
            let (p, _) = rt.loaded.clone();
            (
                rt.namespace.clone(),
                rt.name.clone(),
                p,
                rt.members.values().cloned().collect::<Vec<_>>(),
                rt.quarantine.clone(),
            )
        };
        let g = p.spec.gateway.as_ref()?;
        let own =
            p.policy.generate_credentials || p.spec.template.spec.proxy.credentials_ref.is_some();
        let policy = g.validate(own).ok()?;
        let clients: Vec<ProxyCredentials> = if p.gateway_clients.is_empty() {
            own_credentials(ctx, &p).into_iter().collect()
        } else {
            p.gateway_clients
                .iter()
                .map(|c| ProxyCredentials {
                    username: c.username.clone(),
                    password: c.password.clone(),
                })
                .collect()
        };
        let health_checks = ctx.health.is_some();
        let members = {
            let objects = lock(&self.objects);
            recs.iter()
                .filter_map(|r| {
                    let uid = member_uid(&namespace, &name, &r.name);
                    let o = objects.get(&uid)?;
                    published_member(
                        r.meta(
                            quarantine.get(&r.name).cloned(),
                            r.deleting || o.object.deleting,
                        ),
                        &uid.to_string(),
                        &o.status,
                        &o.object.spec,
                        o.object.credentials.as_ref(),
                        health_checks,
                    )
                })
                .collect()
        };
        Some(GatewaySource {
            namespace,
            name,
            policy,
            template: p.spec.template.spec.clone(),
            clients,
            members,
        })
    }

    /// The keys of the pools whose manifest declares a gateway.
    fn gateway_pools(&self) -> Vec<String> {
        lock(&self.pools)
            .by_key
            .iter()
            .filter(|(_, rt)| !rt.removed && rt.loaded.0.spec.gateway.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// The pool's own credentials (generated, or its template's), read without creating any.
fn own_credentials(ctx: &Context, p: &LoadedPool) -> Option<ProxyCredentials> {
    if p.policy.generate_credentials {
        let path = credentials::credentials_path(&ctx.manifest_dir, &p.namespace, &p.name);
        return credentials::read(&path).ok().flatten();
    }
    p.credentials.as_ref().map(|c| ProxyCredentials {
        username: c.username.clone(),
        password: c.password.clone(),
    })
}

/// Keeps `tx` up to date until `stop`.
pub(crate) async fn run(
    store: &Store,
    ctx: &Context,
    tx: watch::Sender<Arc<GatewaySources>>,
    stop: CancellationToken,
) {
    loop {
        let prev = Arc::clone(&tx.borrow());
        let mut next = GatewaySources::new();
        for key in store.gateway_pools() {
            let Some(src) = store.gateway_source(ctx, &key) else {
                continue;
            };
            let kept = prev.get(&key).filter(|p| ***p == src).cloned();
            next.insert(key, kept.unwrap_or_else(|| Arc::new(src)));
        }
        let changed = next.len() != prev.len()
            || next
                .iter()
                .any(|(k, v)| prev.get(k).is_none_or(|p| !Arc::ptr_eq(p, v)));
        if changed {
            tx.send_replace(Arc::new(next));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = ctx.pool_queue.gateway_wake.notified() => {}
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}
