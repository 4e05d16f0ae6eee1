//! The Proxy watch cache the kube-runtime controller reconciles from: what each Proxy keeps
//! there.
//!
//! Guarantees: every Proxy enters the cache without its `metadata.managedFields` and without
//! the `kubectl.kubernetes.io/last-applied-configuration` annotation (nothing in the driver
//! reads either for a Proxy, and together they were the larger part of each cached object);
//! everything else (spec, status, labels, finalizers, versions) is kept as the API server
//! sent it. The watch, its stream and its triggers are otherwise those of
//! `Controller::new` with the default watcher configuration.

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::api::Proxy;

/// The annotation `kubectl apply` writes: a full copy of the applied object.
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The controller over `api`'s Proxies, its cache fed by a watch whose objects are
/// [`strip`]ped before they are stored; `observe` sees every watch event once the cache holds
/// it (the pool controller's member index).
// rbac: PROXIES list, watch (the controller's watch cache)
pub(super) fn proxy_controller(
    api: Api<Proxy>,
    observe: impl Fn(&watcher::Event<Proxy>) + Send + 'static,
) -> Controller<Proxy> {
    let (reader, writer) = reflector::store();
    let events = watcher(api, watcher::Config::default()).modify(strip);
    let events = reflector(writer, events).inspect(move |r| {
        if let Ok(ev) = r {
            observe(ev);
        }
    });
    Controller::for_stream(events.applied_objects(), reader)
}

/// Drops from `p` what the cache does not need: its `managedFields` (each field manager's
/// set of owned fields, as a JSON tree) and the last-applied annotation.
pub(crate) fn strip(p: &mut Proxy) {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            p.metadata.annotations = None;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    #[test]
    fn a_cached_proxy_keeps_everything_but_managed_fields_and_the_last_applied_copy() {
        let mut p: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "egress-proxies.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {
                "name": "p1", "namespace": "default", "uid": "u1", "generation": 2,
                "labels": {"team": "a"},
                "annotations": {LAST_APPLIED: "{...}", "note": "kept"},
                "finalizers": ["egress-proxies.dev/instance"],
            },
            "spec": {"provider": "home", "image": "debian-12"},
            "status": {"phase": "Running", "ip": "10.0.0.5"},
        }))
        .unwrap();
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("egress-proxies".into()),
            ..Default::default()
        }]);
        let before = p.clone();
        strip(&mut p);
        assert_eq!(p.metadata.managed_fields, None);
        let annotations = p.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["note"], "kept");
        let mut want = before;
        want.metadata.managed_fields = None;
        want.metadata.annotations = Some(annotations);
        assert_eq!(p, want, "nothing else changes");

        // No annotation left: none at all, as the API server would send it.
        let mut q = p.clone();
        q.metadata.annotations = Some([(LAST_APPLIED.to_owned(), "{}".to_owned())].into());
        strip(&mut q);
        assert_eq!(q.metadata.annotations, None);
    }
}
