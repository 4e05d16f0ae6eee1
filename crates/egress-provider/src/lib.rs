//! Proxies as instances: the [`Provider`] trait, its model and error classes, and the libvirt
//! implementation. Nothing here depends on Kubernetes.

pub mod bases;
pub mod denylist;
pub mod error;
pub mod libvirt;
pub mod model;
pub mod provider;
pub mod sync;

pub use error::{ErrorClass, ProviderError, Result};
pub use model::{
    CreateRequest, HostReport, HostState, Instance, InstanceState, NoProgress, OwnedInstance,
    Progress, ProviderId, ProxyUid,
};
pub use provider::Provider;
