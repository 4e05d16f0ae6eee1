//! Every Kubernetes API the operator calls, as one table: the RBAC of the Helm chart and of
//! `deploy/manifests/` is checked against it (a test in crates/egress-proxies/tests/deploy.rs
//! fails when the RBAC grants more or less than this table), and the driver's code names the
//! entry it uses next to each call.
//!
//! Secrets are the exception to "watched namespaces": they are granted only in the
//! namespaces listed for them ([`Scope::SecretNamespaces`]), never cluster-wide.
//!
//! Guarantees: least privilege by construction. A call the driver makes that is not listed
//! here would be refused by the API server in a real cluster; a verb listed here that the
//! driver does not use is a grant to remove. Keep the table and the calls together. Each
//! grant has the narrowest [`Scope`] the driver can work with: what it touches only in the
//! namespaces it watches (Proxies, ProxyPools, their Secrets, Services, EndpointSlices and
//! Events) is a
//! Role in the watched namespace when one namespace is watched, and cluster-wide only when
//! every namespace is; only the cluster-scoped ProviderHealth is always cluster-wide.

/// Where a grant applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Cluster-wide always (a ClusterRole bound by a ClusterRoleBinding): cluster-scoped
    /// resources.
    Cluster,
    /// In the namespaces whose Proxies the operator watches: a Role and RoleBinding in the
    /// watched namespace when one is (`--namespace`, the chart's `watchNamespace`), a
    /// ClusterRole when every namespace is watched.
    WatchedNamespaces,
    /// Only in the operator's own namespace (a Role bound by a RoleBinding).
    OperatorNamespace,
    /// Only in the namespaces granted Secret access (a Role per namespace: the chart's
    /// `secretNamespaces`, by default the watched namespace when one is, else none). Never
    /// cluster-wide, whatever is watched: cluster-wide `create` and `get` on Secrets would
    /// let whoever holds the operator's token mint and read a token Secret for any
    /// ServiceAccount.
    SecretNamespaces,
}

/// One resource the operator calls and the verbs it uses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    /// Where the grant applies.
    pub scope: Scope,
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resource (plural), with `/subresource` when it is one.
    pub resource: &'static str,
    /// Verbs used, sorted.
    pub verbs: &'static [&'static str],
}

/// Proxies: watched by the controller (list, watch), finalizer added and removed with a
/// patch; a ProxyPool's members created and deleted by the pool controller.
pub const PROXIES: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxies",
    verbs: &["create", "delete", "list", "patch", "watch"],
};
/// Proxies of every namespace, listed (metadata only) for GC's live set: an instance on a
/// shared host may belong to a Proxy another installation watches, so GC must see every
/// namespace's Proxies even when this one watches a single namespace. Read-only.
pub const PROXIES_LIVE_SET: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "proxies",
    verbs: &["list"],
};
/// Proxy status: written with server-side apply (a patch).
pub const PROXIES_STATUS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxies/status",
    verbs: &["patch"],
};
/// Proxy finalizers: setting a finalizer needs `update` on this subresource where the
/// OwnerReferencesPermissionEnforcement admission plugin is on.
pub const PROXIES_FINALIZERS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxies/finalizers",
    verbs: &["update"],
};
/// ProxyPools: watched by the pool controller (list, watch), its finalizer added and removed
/// with a patch. (`proxypools/scale` is for `kubectl scale` and autoscalers, with their own
/// grants: the operator reads `spec.replicas` from the pool itself.)
pub const PROXY_POOLS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxypools",
    verbs: &["list", "patch", "watch"],
};
/// ProxyPool status: written with server-side apply.
pub const PROXY_POOLS_STATUS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxypools/status",
    verbs: &["patch"],
};
/// ProxyPool finalizers: setting the pool's finalizer, and owner references with
/// `blockOwnerDeletion` on its members and Secret, need `update` on this subresource where
/// the OwnerReferencesPermissionEnforcement admission plugin is on.
pub const PROXY_POOLS_FINALIZERS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxypools/finalizers",
    verbs: &["update"],
};
/// ProviderHealth: one per provider entry, created and updated with server-side apply
/// (`create` because an apply that creates the object is authorized as a create too), listed
/// to find stale ones (entry removed from the config), which are deleted.
pub const PROVIDER_HEALTHS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "providerhealths",
    verbs: &["create", "delete", "list", "patch"],
};
/// ProviderHealth status: written with server-side apply.
pub const PROVIDER_HEALTHS_STATUS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "providerhealths/status",
    verbs: &["patch"],
};
/// Events (events.k8s.io/v1, as kube-runtime's recorder writes them), only about Proxies (so
/// in the Proxy's namespace): created, and patched when a repeated event becomes a series.
pub const EVENTS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: "events.k8s.io",
    resource: "events",
    verbs: &["create", "patch"],
};
/// The credentials Secret a Proxy names in `spec.proxy.credentialsRef`: read by name on
/// every reconcile and re-read on an interval (never listed or watched, so the operator
/// cannot read every Secret of the cluster in bulk); a ProxyPool's generated-credentials
/// Secret created when missing (never updated: an existing Secret is never written), of type
/// [`SECRET_TYPE`] only (the chart's ValidatingAdmissionPolicy refuses any other type from
/// the operator's ServiceAccount).
pub const SECRETS: ApiAccess = ApiAccess {
    scope: Scope::SecretNamespaces,
    group: "",
    resource: "secrets",
    verbs: &["create", "get"],
};
/// The selector-less Service of each Proxy group (`egress-proxies.dev/group`): read before
/// every write (an existing Service that is not ours is never written), applied (patch;
/// create when new), listed by label at the start of a term to find stale ones, deleted
/// (with a UID precondition) when the group empties.
pub const SERVICES: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: "",
    resource: "services",
    verbs: &["create", "delete", "get", "list", "patch"],
};
/// EndpointSlices the operator publishes healthy proxies' addresses in: the same life cycle
/// and checks as their Service.
pub const ENDPOINT_SLICES: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: "discovery.k8s.io",
    resource: "endpointslices",
    verbs: &["create", "delete", "get", "list", "patch"],
};
/// The leader-election Lease, in the operator's namespace only: read, created once, renewed
/// and released by replacing it.
pub const LEASES: ApiAccess = ApiAccess {
    scope: Scope::OperatorNamespace,
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["create", "get", "update"],
};

/// The only Secret type the operator creates (the chart's ValidatingAdmissionPolicy
/// `…-secret-type` allows its ServiceAccount no other).
pub const SECRET_TYPE: &str = crate::api::CREDENTIALS_SECRET_TYPE;

/// The `kube-system` namespace, read once at start: its UID is the cluster's identity in the
/// installation ID (two clusters installed alike never share one). Namespaces hold no
/// secrets; `get` only, never listed.
pub const NAMESPACES: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: "",
    resource: "namespaces",
    verbs: &["get"],
};

/// The pool gateway (`egress-proxies gateway`, its own Deployment and ServiceAccount):
/// ProxyPools listed and watched, read-only.
pub const GATEWAY_PROXY_POOLS: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxypools",
    verbs: &["list", "watch"],
};
/// The pool gateway: member Proxies listed and watched (by the pool label), read-only.
pub const GATEWAY_PROXIES: ApiAccess = ApiAccess {
    scope: Scope::WatchedNamespaces,
    group: crate::api::GROUP,
    resource: "proxies",
    verbs: &["list", "watch"],
};
/// The pool gateway: the credentials Secrets (the pool's, its members', its clients') read
/// by name, never listed or watched, and only in the namespaces granted Secret access (as
/// the operator's own grant: never cluster-wide).
pub const GATEWAY_SECRETS: ApiAccess = ApiAccess {
    scope: Scope::SecretNamespaces,
    group: "",
    resource: "secrets",
    verbs: &["get"],
};

/// Every grant the pool gateway needs: read-only, and nothing else.
pub const GATEWAY_API_ACCESS: &[ApiAccess] =
    &[GATEWAY_PROXY_POOLS, GATEWAY_PROXIES, GATEWAY_SECRETS];

/// Every grant the operator needs, and nothing else.
pub const API_ACCESS: &[ApiAccess] = &[
    PROXIES,
    PROXIES_LIVE_SET,
    PROXIES_STATUS,
    PROXIES_FINALIZERS,
    PROXY_POOLS,
    PROXY_POOLS_STATUS,
    PROXY_POOLS_FINALIZERS,
    PROVIDER_HEALTHS,
    PROVIDER_HEALTHS_STATUS,
    EVENTS,
    SECRETS,
    SERVICES,
    ENDPOINT_SLICES,
    LEASES,
    NAMESPACES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cluster_scoped_resources_and_the_gc_live_set_are_granted_cluster_wide() {
        let cluster: Vec<&str> = API_ACCESS
            .iter()
            .filter(|a| a.scope == Scope::Cluster)
            .map(|a| a.resource)
            .collect();
        assert_eq!(
            cluster,
            [
                "proxies",
                "providerhealths",
                "providerhealths/status",
                "namespaces"
            ]
        );
        assert_eq!(
            NAMESPACES.verbs,
            ["get"],
            "the cluster's identity, read once"
        );
        assert_eq!(
            PROXIES_LIVE_SET.verbs,
            ["list"],
            "read-only across namespaces"
        );
        assert_eq!(SECRETS.scope, Scope::SecretNamespaces, "never cluster-wide");
        for a in [SERVICES, ENDPOINT_SLICES, EVENTS, PROXIES, PROXY_POOLS] {
            assert_eq!(a.scope, Scope::WatchedNamespaces, "{a:?}");
        }
        assert_eq!(LEASES.scope, Scope::OperatorNamespace);
    }

    #[test]
    fn the_gateway_only_reads() {
        for a in GATEWAY_API_ACCESS {
            assert!(
                a.verbs.iter().all(|v| ["get", "list", "watch"].contains(v)),
                "{a:?}"
            );
        }
        assert_eq!(GATEWAY_PROXY_POOLS.scope, Scope::WatchedNamespaces);
        assert_eq!(GATEWAY_PROXIES.scope, Scope::WatchedNamespaces);
        assert_eq!(
            GATEWAY_SECRETS.scope,
            Scope::SecretNamespaces,
            "never cluster-wide"
        );
    }

    #[test]
    fn every_grant_lists_sorted_unique_verbs_and_each_resource_once() {
        for table in [API_ACCESS, GATEWAY_API_ACCESS] {
            let mut seen = std::collections::BTreeSet::new();
            for a in table {
                assert!(seen.insert((a.scope, a.group, a.resource)), "{a:?} twice");
                assert!(a.verbs.windows(2).all(|w| w.first() < w.last()), "{a:?}");
                assert!(!a.verbs.is_empty());
            }
        }
    }
}
