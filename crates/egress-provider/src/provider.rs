//! The provider trait: what the controller needs from any place that runs proxies.
//!
//! Guarantees every implementation must keep: every destructive path verifies the ownership
//! mark before acting; `get` fails (Transient) rather than reporting a guess when the host
//! cannot be read; `list_owned` fails as a whole rather than returning a partial list;
//! `delete` removes what the UID names even when no domain or providerID exists.

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{
    CreateRequest, HostReport, Instance, OwnedInstance, Progress, ProviderId, ProxyUid,
};

/// A place that runs proxies as instances.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider entry's name (it is part of every name this provider derives).
    fn entry(&self) -> &str;

    /// Creates (or converges) the instance for `req.uid` on `req.host` and starts it.
    /// Idempotent; on failure removes what this call created.
    async fn create(&self, req: &CreateRequest, progress: &dyn Progress) -> Result<Instance>;

    /// Observes the instance `id`, which must carry a valid mark for `uid` (else NotFound).
    async fn get(&self, id: &ProviderId, uid: &ProxyUid) -> Result<Instance>;

    /// Removes the instance of `uid` on `host` and its volumes (never the base). Succeeds when
    /// nothing is left; a domain whose mark is not ours for `uid` is never touched.
    async fn delete(&self, host: &str, uid: &ProxyUid) -> Result<()>;

    /// Every instance on every host carrying a valid mark of this entry. Fails as a whole on
    /// any connection-class error.
    async fn list_owned(&self) -> Result<Vec<OwnedInstance>>;

    /// Checks every host of the entry.
    async fn check(&self) -> Vec<HostReport>;
}
