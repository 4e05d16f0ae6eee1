//! `egress-proxies kubernetes`: the Kubernetes driver ([`egress_kube::run`]) with its
//! `/metrics`, `/healthz`, `/readyz` and status views served by the shared HTTP server
//! ([`egress_core::web::serve`]).
//!
//! Guarantees: the flags are exactly those the Helm chart (deploy/helm/egress-proxies) passes;
//! a bad health flag is a usage error (exit 2); an address it cannot bind, or a driver error,
//! is exit 1; SIGTERM/SIGINT stop it gracefully (exit 0).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

use super::{ConfigArg, EXIT_OK, HealthArgs};

/// Arguments of `kubernetes`. The Helm chart (deploy/helm/egress-proxies) passes exactly
/// these flags; keep the two in step.
#[derive(Debug, clap::Args)]
pub struct KubernetesArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Directory of SSH private keys and known_hosts (the mounted Secret), watched for changes.
    #[arg(long, value_name = "DIR", env = "EGRESS_PROXIES_SSH_DIR")]
    ssh_dir: Option<PathBuf>,
    /// Watch Proxies of this namespace only (default: every namespace).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// Name of the leader-election Lease.
    #[arg(long, value_name = "NAME", default_value = "egress-proxies-leader")]
    lease_name: String,
    /// Namespace of the Lease: the operator's own (the chart sets it from the pod's).
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    lease_namespace: String,
    /// This replica's identity in the Lease (the chart sets the pod's name).
    #[arg(long, value_name = "ID", env = "POD_NAME")]
    identity: String,
    #[command(flatten)]
    health: HealthArgs,
}

/// Runs the Kubernetes driver until a signal.
pub async fn run(a: KubernetesArgs) -> anyhow::Result<u8> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), identity = %a.identity, "egress-proxies kubernetes starting");
    let health = a.health.settings()?;
    let lease =
        egress_kube::leader::LeaseSettings::new(&a.lease_name, &a.lease_namespace, &a.identity);
    let mut opts = egress_kube::KubeOptions::new(a.config.config, lease);
    opts.ssh_dir = a.ssh_dir;
    opts.namespace = a.namespace;
    let observer = Arc::new(egress_kube::Observer::new(health));
    let shutdown = egress_standalone::shutdown_on_signals();
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    tracing::info!(listen = %a.listen, "serving /metrics, /healthz, /readyz");
    let server = tokio::spawn(egress_core::web::serve(
        listener,
        observer.clone(),
        shutdown.clone(),
    ));
    let r = egress_kube::run(opts, observer, shutdown.clone()).await;
    shutdown.cancel();
    let _ = server.await;
    r?;
    Ok(EXIT_OK)
}
