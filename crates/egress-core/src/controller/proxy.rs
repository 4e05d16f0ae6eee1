//! What a driver hands the controller about one Proxy: [`ProxyObject`] and the
//! [`ProxyCredentials`] its spec references.
//!
//! Guarantees: the credentials' `Debug` never prints the password; no I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use egress_provider::model::ProxyUid;

use crate::model::ProxySpec;

/// What a driver knows about one Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyObject {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Proxy's UID (names and marks derive from it).
    pub uid: ProxyUid,
    /// The spec generation (a change releases a latched Permanent failure).
    pub generation: i64,
    /// What the user wants (shared: a driver that keeps the spec hands out the same copy).
    pub spec: Arc<ProxySpec>,
    /// The user removed it; finalize (delete the instance, then report `finalized`).
    pub deleting: bool,
    /// The credentials `spec.proxy.credentialsRef` resolves to, when it names any.
    pub credentials: Option<ProxyCredentials>,
    /// The labels of its namespace, when the driver knows them (Kubernetes); the config's
    /// `namespaceSelector`s match only known labels.
    pub namespace_labels: Option<Arc<BTreeMap<String, String>>>,
    /// The Proxy this one replaces, as its driver resolved it: a member of the same pool in
    /// the same namespace, lost with its host, whose egress addresses this one pins
    /// (`rotation.egressAddress: Keep`). Its instance holding them on another host of the
    /// segment counts as this Proxy's own copy: the provider may fence that host. Drivers
    /// set it only from their own pool records, never from what a tenant wrote alone.
    pub replaces: Option<ProxyUid>,
}

/// Proxy credentials (basic auth for HTTP, username/password for SOCKS5). `Debug` redacts
/// the password so it never reaches a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
}

impl fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyCredentials")
            .field("username", &self.username)
            .field("password", &"REDACTED")
            .finish()
    }
}
