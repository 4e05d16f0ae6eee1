//! Every Kubernetes API the operator calls, as one table: the RBAC of the Helm chart and of
//! `deploy/manifests/` is checked against it (a test in crates/egress-proxies/tests/deploy.rs
//! fails when the RBAC grants more or less than this table), and the driver's code names the
//! entry it uses next to each call.
//!
//! Guarantees: least privilege by construction. A call the driver makes that is not listed
//! here would be refused by the API server in a real cluster; a verb listed here that the
//! driver does not use is a grant to remove. Keep the table and the calls together.

/// Where a grant applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// In every namespace (a ClusterRole bound by a ClusterRoleBinding).
    Cluster,
    /// Only in the operator's own namespace (a Role bound by a RoleBinding).
    OperatorNamespace,
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

/// Proxies: watched by the controller and listed for GC's live set (list, watch), finalizer
/// added and removed with a patch.
pub const PROXIES: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "proxies",
    verbs: &["list", "patch", "watch"],
};
/// Proxy status: written with server-side apply (a patch).
pub const PROXIES_STATUS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "proxies/status",
    verbs: &["patch"],
};
/// Proxy finalizers: setting a finalizer needs `update` on this subresource where the
/// OwnerReferencesPermissionEnforcement admission plugin is on.
pub const PROXIES_FINALIZERS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: crate::api::GROUP,
    resource: "proxies/finalizers",
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
/// Events (events.k8s.io/v1, as kube-runtime's recorder writes them): created, and patched
/// when a repeated event becomes a series.
pub const EVENTS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: "events.k8s.io",
    resource: "events",
    verbs: &["create", "patch"],
};
/// The credentials Secret a Proxy names in `spec.proxy.credentialsRef`: read by name on
/// every reconcile and re-read on an interval (never listed or watched, so the operator
/// cannot read every Secret of the cluster in bulk).
pub const SECRETS: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: "",
    resource: "secrets",
    verbs: &["get"],
};
/// The selector-less Service of each Proxy group (`egress-proxies.dev/group`): applied
/// (patch; create when new), listed by label at the start of a term to find stale ones,
/// deleted when the group empties.
pub const SERVICES: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: "",
    resource: "services",
    verbs: &["create", "delete", "list", "patch"],
};
/// EndpointSlices the operator publishes healthy proxies' addresses in: the same life cycle
/// as their Service.
pub const ENDPOINT_SLICES: ApiAccess = ApiAccess {
    scope: Scope::Cluster,
    group: "discovery.k8s.io",
    resource: "endpointslices",
    verbs: &["create", "delete", "list", "patch"],
};
/// The leader-election Lease, in the operator's namespace only: read, created once, renewed
/// and released by replacing it.
pub const LEASES: ApiAccess = ApiAccess {
    scope: Scope::OperatorNamespace,
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["create", "get", "update"],
};

/// Every grant the operator needs, and nothing else.
pub const API_ACCESS: &[ApiAccess] = &[
    PROXIES,
    PROXIES_STATUS,
    PROXIES_FINALIZERS,
    PROVIDER_HEALTHS,
    PROVIDER_HEALTHS_STATUS,
    EVENTS,
    SECRETS,
    SERVICES,
    ENDPOINT_SLICES,
    LEASES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grant_lists_sorted_unique_verbs_and_each_resource_once() {
        let mut seen = std::collections::BTreeSet::new();
        for a in API_ACCESS {
            assert!(seen.insert((a.scope, a.group, a.resource)), "{a:?} twice");
            assert!(a.verbs.windows(2).all(|w| w.first() < w.last()), "{a:?}");
            assert!(!a.verbs.is_empty());
        }
    }
}
