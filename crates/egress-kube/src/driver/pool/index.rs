//! The member index: which Proxies belong to which pool (by their `egress-proxies.dev/pool`
//! label), fed by the Proxy watch after each event reached the watch cache, so a pool's
//! reconcile reads its own members (by name from the cache) without scanning every Proxy.
//!
//! Guarantees: O(1) work per watch event (a relist costs one pass over its objects); every
//! event that adds, changes or removes a member triggers exactly the pools it belonged to
//! before and after (a Proxy relabelled from one pool to another triggers both); a relist
//! replaces the index as a whole and triggers every pool seen before or after it. Pure (no
//! I/O); the triggers go to an unbounded channel the pool controller reads.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use egress_core::pool::member::LABEL_POOL;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::Proxy;

/// A pool: (namespace, name).
pub(crate) type PoolKey = (String, String);

#[derive(Debug, Default)]
struct Inner {
    /// Members' names per pool.
    members: HashMap<PoolKey, BTreeSet<String>>,
    /// The pool each member Proxy (namespace, name) is in.
    pool_of: HashMap<(String, String), String>,
    /// A relist in progress: the members it has listed so far.
    relist: Option<Vec<(String, String, String)>>,
}

/// Members by pool.
#[derive(Debug, Default)]
pub(crate) struct MemberIndex {
    inner: Mutex<Inner>,
}

fn pool_label(p: &Proxy) -> Option<String> {
    p.labels().get(LABEL_POOL).cloned()
}

impl Inner {
    fn remove(&mut self, ns: &str, name: &str, touched: &mut BTreeSet<PoolKey>) {
        if let Some(pool) = self.pool_of.remove(&(ns.to_owned(), name.to_owned())) {
            let key = (ns.to_owned(), pool);
            if let Some(set) = self.members.get_mut(&key) {
                set.remove(name);
                if set.is_empty() {
                    self.members.remove(&key);
                }
            }
            touched.insert(key);
        }
    }

    fn insert(&mut self, ns: &str, name: &str, pool: String, touched: &mut BTreeSet<PoolKey>) {
        self.remove(ns, name, touched);
        let key = (ns.to_owned(), pool.clone());
        self.members
            .entry(key.clone())
            .or_default()
            .insert(name.to_owned());
        self.pool_of.insert((ns.to_owned(), name.to_owned()), pool);
        touched.insert(key);
    }
}

impl MemberIndex {
    /// Applies one watch event; returns the pools it touched.
    pub(crate) fn observe(&self, ev: &Event<Proxy>) -> BTreeSet<PoolKey> {
        let mut touched = BTreeSet::new();
        let mut g = super::super::lock(&self.inner);
        match ev {
            Event::Apply(p) => {
                let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
                match pool_label(p) {
                    Some(pool) => g.insert(&ns, &name, pool, &mut touched),
                    None => g.remove(&ns, &name, &mut touched),
                }
            }
            Event::Delete(p) => {
                g.remove(
                    &p.namespace().unwrap_or_default(),
                    &p.name_any(),
                    &mut touched,
                );
            }
            Event::Init => g.relist = Some(Vec::new()),
            Event::InitApply(p) => {
                if let (Some(pool), Some(list)) = (pool_label(p), g.relist.as_mut()) {
                    list.push((p.namespace().unwrap_or_default(), p.name_any(), pool));
                }
            }
            Event::InitDone => {
                let listed = g.relist.take().unwrap_or_default();
                touched.extend(g.members.keys().cloned());
                g.members.clear();
                g.pool_of.clear();
                for (ns, name, pool) in listed {
                    g.insert(&ns, &name, pool, &mut touched);
                }
            }
        }
        touched
    }

    /// The names of `pool`'s members.
    pub(crate) fn members(&self, pool: &PoolKey) -> Vec<String> {
        super::super::lock(&self.inner)
            .members
            .get(pool)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn proxy(name: &str, pool: Option<&str>) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns",
                         "labels": pool.map(|p| serde_json::json!({LABEL_POOL: p}))},
            "spec": {"provider": "home", "image": "tiny"},
        }))
        .unwrap()
    }

    fn key(p: &str) -> PoolKey {
        ("ns".into(), p.into())
    }

    #[test]
    fn events_move_members_between_pools_and_trigger_each_pool_touched() {
        let i = MemberIndex::default();
        assert_eq!(
            i.observe(&Event::Apply(proxy("a", Some("web")))),
            [key("web")].into()
        );
        i.observe(&Event::Apply(proxy("b", Some("web"))));
        assert_eq!(i.observe(&Event::Apply(proxy("x", None))), BTreeSet::new());
        assert_eq!(i.members(&key("web")), ["a", "b"]);
        // Relabelled: both pools hear of it.
        assert_eq!(
            i.observe(&Event::Apply(proxy("b", Some("api")))),
            [key("api"), key("web")].into()
        );
        assert_eq!(i.members(&key("web")), ["a"]);
        // Its label removed: it leaves the pool, which hears of it.
        i.observe(&Event::Apply(proxy("z", Some("web"))));
        assert_eq!(
            i.observe(&Event::Apply(proxy("z", None))),
            [key("web")].into()
        );
        assert_eq!(i.members(&key("web")), ["a"]);
        assert_eq!(
            i.observe(&Event::Delete(proxy("a", Some("web")))),
            [key("web")].into()
        );
        assert!(i.members(&key("web")).is_empty());
        // A relist replaces everything and triggers every pool before and after it.
        i.observe(&Event::Init);
        i.observe(&Event::InitApply(proxy("c", Some("db"))));
        assert_eq!(
            i.members(&key("api")),
            ["b"],
            "unchanged until the relist is done"
        );
        assert_eq!(i.observe(&Event::InitDone), [key("api"), key("db")].into());
        assert!(i.members(&key("api")).is_empty());
        assert_eq!(i.members(&key("db")), ["c"]);
    }
}
