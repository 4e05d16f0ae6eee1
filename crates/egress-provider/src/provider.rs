//! The provider trait: what the controller needs from any place that runs proxies.
//!
//! Guarantees every implementation must keep: every destructive path verifies the ownership
//! mark before acting; `get` fails (Transient) rather than reporting a guess when the host
//! cannot be read; `list_owned` fails as a whole rather than returning a partial list;
//! `delete` removes what the UID names even when no domain or providerID exists.

use async_trait::async_trait;

use crate::bases::{BaseGcSettings, BaseVerdict};
use crate::error::Result;
use crate::model::{
    CreateRequest, HostReport, Instance, OwnedInstance, OwnedVolume, Progress, ProviderId, ProxyUid,
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

    /// Every volume on every host of the entry whose name is of this entry's scheme and
    /// collectable: Proxy overlays and seeds (with the UID their name encodes, canonical only)
    /// and temporary image uploads (with their age). Never a base, a marker or a foreign
    /// name. Fails as a whole on any connection-class error (finding M15).
    ///
    /// The default (for providers that keep no volumes of their own) lists nothing.
    async fn list_owned_volumes(&self) -> Result<Vec<OwnedVolume>> {
        Ok(Vec::new())
    }

    /// Deletes `v`, a volume [`list_owned_volumes`](Self::list_owned_volumes) returned, after
    /// re-checking right before the delete that its name is still of this entry's scheme and,
    /// for an overlay or seed, that no domain named for its UID exists on the host (else it
    /// refuses, Permanent, and touches nothing). A volume already gone is success.
    ///
    /// The default refuses (Permanent): a provider that lists no volumes deletes none.
    async fn delete_orphan_volume(&self, v: &OwnedVolume) -> Result<()> {
        Err(crate::error::ProviderError::permanent(format!(
            "provider entry {} does not collect volumes (asked to delete {})",
            v.entry, v.name
        )))
    }

    /// Consults `retired` (the process's retired addresses, see
    /// [`crate::libvirt::retired`]) before handing out any declared egress address from now
    /// on. The default (a provider without address pools) ignores it.
    fn use_retired(&self, retired: std::sync::Arc<crate::libvirt::retired::RetiredAddresses>) {
        let _ = retired;
    }

    /// Records that an administrator declared `host` dead (its guests are off): what its
    /// instances held (declared egress addresses) may be given to instances on other hosts of
    /// its segment, until the host answers again. Refused (Transient) while the host's last
    /// check did not find it dead. Returns what was freed. The default (a provider that
    /// holds nothing per host) frees nothing.
    fn fence_host(&self, host: &str) -> Result<Vec<std::net::IpAddr>> {
        let _ = host;
        Ok(Vec::new())
    }

    /// Makes sure the base for catalogue key (or allowed URL) `image` is cached, verified and
    /// published on `host`, importing it if needed and reporting bytes through `progress`.
    /// Idempotent: a cached base is reused without a download. Never creates an instance.
    /// The default fails Permanent: the provider does not cache images.
    async fn prefetch(&self, host: &str, image: &str, progress: &dyn Progress) -> Result<()> {
        let _ = (host, progress);
        Err(crate::error::ProviderError::permanent(format!(
            "provider entry {} does not support prefetching images (asked for {image})",
            self.entry()
        )))
    }

    /// Removes the entry's cached base images that nothing on their host uses and that have
    /// been unused for the grace period (`settings.grace`, else the entry's own), host by
    /// host; one verdict per base, and one per host that could not be read (name `*`,
    /// [`BaseAction::Failed`](crate::bases::BaseAction::Failed)). A base any domain or
    /// volume on its host uses is never removed. Never fails as a whole.
    ///
    /// The default (for providers that cache no images) collects nothing.
    async fn collect_bases(&self, settings: &BaseGcSettings) -> Vec<BaseVerdict> {
        let _ = settings;
        Vec::new()
    }
}
