//! A pool member's `egress-proxies.dev/replaces` annotation (the member lost with its host
//! whose egress addresses it takes): honoured only when both Proxies are controlled by the
//! same ProxyPool (owner reference UID) in the same namespace, so a tenant cannot name
//! someone else's Proxy to have its host fenced or its address taken.
//!
//! Guarantees: [`vouch`] is pure; [`resolve`] lists at most one Proxy (by name) of the
//! member's own namespace, within [`super::API_SLACK`], and only while the member is not running yet.

use egress_core::model::Phase;
use egress_core::pool::member::ANNOTATION_REPLACES;
use egress_provider::ProxyUid;
use kube::api::Api;
use kube::{Resource, ResourceExt};

use crate::api::Proxy;

/// A new member's annotations: its template's, with [`ANNOTATION_REPLACES`] naming `replaces`
/// (the lost member it replaces) when the pool set one, never the template's own (only the
/// pool names it); `None` when there are none.
pub(super) fn member_annotations(
    template: &std::collections::BTreeMap<String, String>,
    replaces: Option<&str>,
) -> Option<std::collections::BTreeMap<String, String>> {
    let mut a = template.clone();
    a.remove(ANNOTATION_REPLACES);
    if let Some(lost) = replaces {
        a.insert(ANNOTATION_REPLACES.to_owned(), lost.to_owned());
    }
    (!a.is_empty()).then_some(a)
}

/// The UID of the pool controlling `p` (a controller owner reference of kind ProxyPool).
fn pool_uid(p: &Proxy) -> Option<&str> {
    p.owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "ProxyPool")
        .map(|o| o.uid.as_str())
}

/// What `p`'s annotation (naming `replaced`, as read from `p`'s namespace: `None` when it
/// does not exist) allows: `Ok(Some(uid))` when both are members of one pool; `Ok(None)`
/// without the annotation or once the replaced Proxy is gone (nothing left to fence);
/// `Err(why)` when the annotation names a Proxy it may not.
pub(super) fn vouch(p: &Proxy, replaced: Option<&Proxy>) -> Result<Option<ProxyUid>, String> {
    let Some(name) = p.annotations().get(ANNOTATION_REPLACES) else {
        return Ok(None);
    };
    let Some(pool) = pool_uid(p) else {
        return Err(format!(
            "annotation {ANNOTATION_REPLACES} ignored: this Proxy is not a member of a ProxyPool"
        ));
    };
    let Some(r) = replaced else { return Ok(None) };
    let same_ns = r.namespace() == p.namespace();
    if !same_ns || pool_uid(r) != Some(pool) || r.name_any() == p.name_any() {
        return Err(format!(
            "annotation {ANNOTATION_REPLACES} ignored: {name:?} is not another member of this \
             Proxy's ProxyPool; it may not take that Proxy's egress addresses"
        ));
    }
    Ok(r.meta().uid.as_deref().and_then(ProxyUid::parse_strict))
}

/// The Proxy `p` replaces, as [`vouch`] allows it; reads it only while `p` is not running
/// yet (its create may need it). A read that fails or times out vouches for nothing.
pub(super) async fn resolve(
    api: &Api<Proxy>,
    p: &Proxy,
    phase: Phase,
) -> Result<Option<ProxyUid>, String> {
    let Some(name) = p.annotations().get(ANNOTATION_REPLACES) else {
        return Ok(None);
    };
    if phase == Phase::Running || p.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    // NB: a list of at most one (by name), as the operator lists Proxies but does not get them.
    let lp = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
    // rbac: PROXIES list (its own namespace, one name)
    let read = tokio::time::timeout(super::API_SLACK, api.list(&lp)).await;
    match read {
        Ok(Ok(l)) => vouch(p, l.items.iter().find(|r| r.name_any() == *name)),
        Ok(Err(e)) => {
            tracing::warn!(proxy = %p.name_any(), error = %e, "cannot read the Proxy it replaces");
            Ok(None)
        }
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn proxy(ns: &str, name: &str, uid: &str, pool: Option<&str>, replaces: Option<&str>) -> Proxy {
        let spec: egress_core::model::ProxySpec = serde_saphyr::from_str(
            "provider: home\nimage: tiny\nproxy:\n  allowedClientCidrs: [10.0.0.0/8]\n",
        )
        .unwrap();
        let mut p = Proxy::new(name, crate::api::ProxyCrdSpec(spec));
        p.metadata.namespace = Some(ns.into());
        p.metadata.uid = Some(uid.into());
        p.metadata.owner_references = pool.map(|u| {
            vec![OwnerReference {
                api_version: "egress-proxies.dev/v1alpha1".into(),
                kind: "ProxyPool".into(),
                name: "web".into(),
                uid: u.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        });
        p.metadata.annotations = replaces.map(|r| {
            [(ANNOTATION_REPLACES.to_owned(), r.to_owned())]
                .into_iter()
                .collect()
        });
        p
    }

    const OLD: &str = "0f8fad5b-d9cb-469f-a165-708677289501";
    const NEW: &str = "0f8fad5b-d9cb-469f-a165-708677289502";

    #[test]
    fn only_the_pool_names_the_member_a_new_one_replaces() {
        let mut t = std::collections::BTreeMap::new();
        assert_eq!(member_annotations(&t, None), None);
        let a = member_annotations(&t, Some("web-lost")).unwrap();
        assert_eq!(a[ANNOTATION_REPLACES], "web-lost");
        t.insert(ANNOTATION_REPLACES.to_owned(), "someone-else".to_owned());
        t.insert("example.com/owner".to_owned(), "jane".to_owned());
        let a = member_annotations(&t, None).unwrap();
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a["example.com/owner"], "jane");
        let a = member_annotations(&t, Some("web-lost")).unwrap();
        assert_eq!(a[ANNOTATION_REPLACES], "web-lost");
    }

    #[test]
    fn only_a_member_of_the_same_pool_in_the_same_namespace_is_vouched_for() {
        let new = proxy("team-a", "web-new", NEW, Some("pool-1"), Some("web-old"));
        let old = proxy("team-a", "web-old", OLD, Some("pool-1"), None);
        assert_eq!(
            vouch(&new, Some(&old)).unwrap(),
            ProxyUid::parse_strict(OLD)
        );
        // Gone: nothing to fence, nothing refused.
        assert_eq!(vouch(&new, None).unwrap(), None);
        // Another pool, no pool, another namespace: refused.
        for other in [
            proxy("team-a", "web-old", OLD, Some("pool-2"), None),
            proxy("team-a", "web-old", OLD, None, None),
            proxy("team-b", "web-old", OLD, Some("pool-1"), None),
        ] {
            let e = vouch(&new, Some(&other)).unwrap_err();
            assert!(e.contains("not another member"), "{e}");
        }
        // A Proxy outside any pool carrying the annotation: refused.
        let stray = proxy("team-a", "mine", NEW, None, Some("web-old"));
        let e = vouch(&stray, Some(&old)).unwrap_err();
        assert!(e.contains("not a member of a ProxyPool"), "{e}");
        // Without the annotation: nothing.
        let plain = proxy("team-a", "web-new", NEW, Some("pool-1"), None);
        assert_eq!(vouch(&plain, Some(&old)).unwrap(), None);
    }
}
