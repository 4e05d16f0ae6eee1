//! What the standalone driver serves over HTTP ([`egress_web::serve`]), read from the
//! [`Store`]: the status document, `/metrics` (through the context's exposition), readiness,
//! the host rows and each pool's healthy members.
//!
//! `/status` and `/proxies` do not build the whole document: they take its outline (hosts,
//! pools, manifest errors and the Proxies' UIDs sorted by namespace/name) and then build the
//! rows a chunk at a time as the body is sent ([`egress_web::stream`]), so a request at
//! 10,000 Proxies holds ~160 KB of UIDs and one chunk rather than every row and its JSON.
//!
//! Guarantees: every view is a snapshot taken under short locks, never across an `.await`,
//! and `pools` and `objects` are never held together; serving a request never waits on a
//! host. A streamed row is the Proxy's state when its chunk is built; a Proxy gone by then is
//! left out. A pool's views read only its own members (O(members)). Readiness turns on once
//! every entry was adopted from a complete listing and stays on through a bad config reload
//! (see the crate doc).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_core::host_health::HostHealth;
use egress_core::metrics::MetricsFormat;
use egress_core::pool::spec::OnListed;
use egress_core::pool::{Member, ProxyPoolStatus};
use egress_provider::model::ProxyUid;
use egress_provider::sync::lock;
use egress_web::Endpoints;
use egress_web::status::{
    HostStatusRow, PoolMemberRow, PoolStatusRow, ProxyStatusRow, StatusDocument,
};

use crate::context::Context;
use crate::pool::members::member_uid;
use crate::store::{MemberRec, Obj, Objects, Store};

/// The driver's views, as the HTTP server reads them.
pub(crate) struct Observe {
    store: Arc<Store>,
    ctx: Arc<Context>,
}

/// A pool's row as `/status` needs it, read under the pools lock.
struct PoolSnapshot {
    namespace: String,
    name: String,
    desired: u32,
    status: ProxyPoolStatus,
    members: Vec<MemberRec>,
    quarantine: BTreeMap<String, String>,
    error: Option<String>,
    on_listed: OnListed,
}

impl Observe {
    /// Views of `store`, with the metrics and controller of `ctx`.
    pub(crate) fn new(store: Arc<Store>, ctx: Arc<Context>) -> Self {
        Self { store, ctx }
    }

    /// The document without its rows, and the rows' UIDs sorted by namespace, name (and UID,
    /// the order the objects map lists two objects of one name in). O(n log n) under the
    /// objects lock, O(n) UIDs kept.
    fn outline(&self) -> (StatusDocument, Vec<ProxyUid>) {
        let uids: Vec<ProxyUid> = {
            let objects = lock(&self.store.objects);
            let mut keys: Vec<(&str, &str, ProxyUid)> = objects
                .iter()
                .map(|(uid, o)| (o.object.namespace.as_str(), o.object.name.as_str(), *uid))
                .collect();
            keys.sort_unstable();
            keys.into_iter().map(|(_, _, uid)| uid).collect()
        };
        let doc = StatusDocument {
            generated_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            proxies: Vec::new(),
            hosts: self.hosts().iter().map(HostStatusRow::from).collect(),
            manifest_errors: lock(&self.store.manifest_errors).clone(),
            pools: self.pool_rows(),
        };
        (doc, uids)
    }

    /// The rows of `uids` still known, in that order. O(|uids| log n) under the objects lock.
    fn rows(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        let objects = lock(&self.store.objects);
        uids.iter()
            .filter_map(|uid| objects.get(uid))
            .map(|o| self.row(o))
            .collect()
    }

    fn row(&self, o: &Obj) -> ProxyStatusRow {
        ProxyStatusRow {
            namespace: o.object.namespace.clone(),
            name: o.object.name.clone(),
            uid: o.object.uid.canonical(),
            phase: o.status.phase,
            host: o.status.host.clone(),
            ip: o.status.ip.clone(),
            provider_id: o.status.provider_id.clone(),
            // The instance's creation (its mark's time) when known, else when this
            // process first saw the manifest.
            created_at: humantime::format_rfc3339_seconds(
                self.ctx
                    .controller
                    .created_at(&o.object.uid)
                    .unwrap_or(o.first_seen),
            )
            .to_string(),
            last_error: o.status.last_error(),
            conditions: o.status.conditions.clone(),
            port: Some(o.object.spec.proxy.port),
            health: o.status.health.clone(),
            reputation: o.status.reputation.clone(),
            egress_address: o.status.egress_address.clone(),
        }
    }

    /// Member `r` of pool `namespace/name` as the pool sees it, from its object.
    fn member<'a>(
        &self,
        objects: &'a Objects,
        namespace: &str,
        name: &str,
        r: &MemberRec,
        quarantine: Option<String>,
        on_listed: OnListed,
    ) -> Option<(Member, &'a Obj)> {
        let o = objects.get(&member_uid(namespace, name, &r.name))?;
        let m = Member::observe_with(
            r.meta(quarantine, r.deleting || o.object.deleting),
            &o.status,
            self.ctx.health.is_some(),
            on_listed,
        );
        Some((m, o))
    }

    /// The `/pools/NAME/healthy.txt` body of pool `namespace/name` from its own members
    /// (O(members), not the whole status document): `ip:port` of each available member that
    /// is neither quarantined nor being deleted, sorted; `None` for an unknown pool.
    fn pool_healthy_list(&self, namespace: &str, name: &str) -> Option<String> {
        let (recs, quarantine, on_listed) = {
            let all = lock(&self.store.pools);
            let rt = all.by_key.get(&format!("{namespace}/{name}"))?;
            (
                rt.members.values().cloned().collect::<Vec<_>>(),
                rt.quarantine.clone(),
                rt.loaded.0.spec.reputation.on_listed,
            )
        };
        let mut eps: Vec<String> = {
            let objects = lock(&self.store.objects);
            recs.iter()
                .filter(|r| !quarantine.contains_key(&r.name))
                .filter_map(|r| {
                    let (m, o) = self.member(&objects, namespace, name, r, None, on_listed)?;
                    let ip: std::net::IpAddr = o.status.ip.as_deref()?.parse().ok()?;
                    PoolMemberRow::of(&m).available.then(|| {
                        std::net::SocketAddr::new(ip, o.object.spec.proxy.port).to_string()
                    })
                })
                .collect()
        };
        eps.sort();
        let mut out = String::with_capacity(eps.len() * 22);
        for e in eps {
            out.push_str(&e);
            out.push('\n');
        }
        Some(out)
    }

    /// Every pool's row for `/status`.
    fn pool_rows(&self) -> Vec<PoolStatusRow> {
        let pools: Vec<PoolSnapshot> = lock(&self.store.pools)
            .by_key
            .values()
            .map(|rt| PoolSnapshot {
                namespace: rt.namespace.clone(),
                name: rt.name.clone(),
                desired: if rt.removed {
                    0
                } else {
                    rt.loaded.0.policy.replicas
                },
                status: rt.status.clone(),
                members: rt.members.values().cloned().collect(),
                quarantine: rt.quarantine.clone(),
                error: rt.error.clone(),
                on_listed: rt.loaded.0.spec.reputation.on_listed,
            })
            .collect();
        let objects = lock(&self.store.objects);
        pools
            .into_iter()
            .map(|p| {
                let members = p
                    .members
                    .iter()
                    .map(|r| {
                        let quarantine = p.quarantine.get(&r.name).cloned();
                        match self.member(
                            &objects,
                            &p.namespace,
                            &p.name,
                            r,
                            quarantine.clone(),
                            p.on_listed,
                        ) {
                            Some((m, _)) => PoolMemberRow::of(&m),
                            // Recorded, its object not made yet (or gone): as recorded.
                            None => PoolMemberRow::of(&Member::observe(
                                r.meta(quarantine, r.deleting),
                                &Default::default(),
                                self.ctx.health.is_some(),
                            )),
                        }
                    })
                    .collect();
                PoolStatusRow {
                    namespace: p.namespace,
                    name: p.name,
                    desired: p.desired,
                    status: p.status,
                    members,
                    error: p.error,
                }
            })
            .collect()
    }
}

impl Endpoints for Observe {
    fn status(&self) -> StatusDocument {
        let (mut doc, uids) = self.outline();
        doc.proxies = self.rows(&uids);
        doc
    }

    fn status_outline(&self) -> Option<(StatusDocument, Vec<ProxyUid>)> {
        Some(self.outline())
    }

    fn status_rows(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        self.rows(uids)
    }

    fn metrics(&self, format: MetricsFormat) -> String {
        self.ctx
            .exposition
            .render(&self.ctx.metrics, Some(&self.ctx.controller), format)
    }

    fn ready(&self) -> bool {
        self.store.ready.load(Ordering::SeqCst)
    }

    fn hosts(&self) -> Vec<HostHealth> {
        let mut rows: Vec<HostHealth> = lock(&self.store.hosts).values().cloned().collect();
        egress_core::host_health::annotate_maintenance(&mut rows, &self.ctx.controller);
        rows
    }

    fn pool_healthy(&self, namespace: &str, name: &str) -> Option<String> {
        self.pool_healthy_list(namespace, name)
    }
}
