//! `egress-proxies kubernetes`: the Kubernetes driver ([`egress_kube::run`]) with `/metrics`,
//! `/healthz` and `/readyz` on `--listen`, and the status views (`/status`, `/proxies`,
//! `/hosts`, `/healthy.txt`) only on `--status-listen` when it is given, both served by the
//! shared HTTP server ([`egress_web::serve_routes`]).
//!
//! Guarantees: the flags are exactly those the Helm chart (deploy/helm/egress-proxies) passes;
//! GC, deadline, shutdown and health flags are the same definition as `standalone`'s
//! ([`super::DriverArgs`]); the status views (Proxy names, addresses, host errors) are never on
//! the main listener, which a whole cluster may reach; a bad flag is a usage error (exit 2);
//! an address it cannot bind, or a driver error, is exit 1; SIGTERM/SIGINT stop it gracefully
//! (exit 0). Without `POD_NAME`/`--identity` the Lease identity is the machine's hostname.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use egress_web::Routes;

use super::{ConfigArg, DriverArgs, EXIT_OK, UsageError};

/// Arguments of `kubernetes`. The Helm chart (deploy/helm/egress-proxies) passes exactly
/// these flags; keep the two in step.
#[derive(Debug, clap::Args)]
pub struct KubernetesArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Kubeconfig file to connect with (default: $KUBECONFIG, ~/.kube/config, then the pod's
    /// service account).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Directory of SSH private keys and known_hosts (the mounted Secret), watched for changes.
    #[arg(long, value_name = "DIR", env = "EGRESS_PROXIES_SSH_DIR")]
    ssh_dir: Option<PathBuf>,
    /// Watch Proxies of this namespace only (default: every namespace).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Address for /metrics, /healthz and /readyz (nothing else is served there).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// Address for the status views /status, /proxies, /hosts and /healthy.txt (Proxy names,
    /// addresses and host errors, without authentication); off unless given. Keep it on
    /// loopback or behind a NetworkPolicy.
    #[arg(long, value_name = "ADDR")]
    status_listen: Option<std::net::SocketAddr>,
    /// A DNS name the HTTP listeners also answer to (repeatable), besides IP addresses and
    /// `localhost`: a request whose Host header names any other is refused (421), so a web
    /// page cannot reach them by DNS rebinding. E.g. the name of a Service in front of them.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Name of the leader-election Lease.
    #[arg(long, value_name = "NAME", default_value = "egress-proxies-leader")]
    lease_name: String,
    /// Namespace of the Lease: the operator's own (the chart sets it from the pod's).
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    lease_namespace: String,
    /// This replica's identity in the Lease (the chart sets the pod's name); default: the
    /// machine's hostname (a pod's hostname is its name).
    #[arg(long, value_name = "ID", env = "POD_NAME")]
    identity: Option<String>,
    /// GC, host checks, deadlines, shutdown and proxy health (shared with `standalone`).
    #[command(flatten)]
    driver: DriverArgs,
}

/// The machine's hostname (`/proc/sys/kernel/hostname`, else `$HOSTNAME`), trimmed.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Runs the Kubernetes driver until a signal.
pub async fn run(a: KubernetesArgs) -> anyhow::Result<u8> {
    let identity = match a.identity.filter(|i| !i.is_empty()).or_else(hostname) {
        Some(i) => i,
        None => {
            return Err(UsageError::new(
                "no Lease identity: set POD_NAME or --identity (the hostname is unknown)",
            )
            .into());
        }
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), identity = %identity, "egress-proxies kubernetes starting");
    let d = a.driver;
    let health = d.health.settings()?;
    let lease =
        egress_kube::leader::LeaseSettings::new(&a.lease_name, &a.lease_namespace, &identity);
    let mut opts = egress_kube::KubeOptions::new(a.config.config, lease);
    opts.ssh_dir = a.ssh_dir;
    opts.kubeconfig = a.kubeconfig;
    opts.namespace = a.namespace;
    opts.gc_interval = d.gc_interval;
    opts.gc.min_age = d.gc_min_age;
    opts.gc.dry_run = d.gc_dry_run;
    opts.check_interval = d.check_interval;
    opts.controller.provisioning_deadline = d.provisioning_deadline;
    if let Some(g) = d.shutdown_grace {
        opts.shutdown_grace = g;
    }
    let observer = Arc::new(egress_kube::Observer::new(health));
    let shutdown = egress_core::background::signals::shutdown_on_signals();
    let mut servers = Vec::new();
    for (addr, routes, what) in
        std::iter::once((a.listen, Routes::Probes, "/metrics, /healthz, /readyz")).chain(
            a.status_listen
                .map(|s| (s, Routes::Status, "/status, /proxies, /hosts, /healthy.txt")),
        )
    {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(listen = %addr, "serving {what}");
        servers.push(tokio::spawn(egress_web::serve_checked(
            listener,
            observer.clone(),
            routes,
            egress_web::HostCheck::new(&a.allowed_hosts),
            shutdown.clone(),
        )));
    }
    let r = egress_kube::run(opts, observer, shutdown.clone()).await;
    shutdown.cancel();
    for s in servers {
        let _ = s.await;
    }
    match r {
        Ok(()) => Ok(EXIT_OK),
        // The config's own problem: exit 2 like every other command's, said once (the
        // error's source is its own text).
        Err(e @ (egress_kube::RunError::Config(_) | egress_kube::RunError::Providers(_))) => {
            Err(UsageError::new(e.to_string()).into())
        }
        Err(e) => Err(e.into()),
    }
}
