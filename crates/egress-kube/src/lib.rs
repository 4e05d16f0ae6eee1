//! The Kubernetes driver of egress-proxies: the custom resources ([`api`]) and, over the
//! operator core (`egress_core`), the kube-runtime controller. The core never depends on
//! kube; everything Kubernetes-specific lives here.

pub mod api;
pub mod driver;
pub mod fence;
pub mod gateway_source;
pub mod leader;
pub mod observe;
pub mod rbac;

pub use driver::{KubeOptions, RunError, run};
pub use observe::Observer;
