//! The `egress-proxies` binary: the operator core's commands
//! ([`egress_operator::cli::Command`], flattened in), plus `crds` (the custom resource
//! definitions as YAML) and `kubernetes` (the Kubernetes driver, [`egress_kube`]).
//!
//! Guarantees: the exit codes of [`egress_operator::cli`] (0 ok, 1 failed, 2 usage) for every
//! command; `crds` prints exactly what is committed under `deploy/crds/` (a test checks it)
//! and contacts nothing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use egress_operator::cli::{EXIT_FAILED, EXIT_OK, EXIT_USAGE};

const AFTER_HELP: &str = "\
Exit codes: 0 ok; 1 something is unhealthy or failed; 2 usage or configuration error.
Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug or RUST_LOG=egress_provider=trace) to see more.

Start here: `egress-proxies check --config providers.yaml` validates the file and probes every host.";

/// Runs egress-proxy VMs on libvirt hosts reached over SSH.
#[derive(Debug, Parser)]
#[command(name = "egress-proxies", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Core(egress_operator::cli::Command),
    /// Print the Proxy and ProviderHealth CustomResourceDefinitions as YAML. No network.
    ///
    /// Without --dir, both go to stdout as one multi-document stream (`kubectl apply -f -`).
    /// With --dir, each is written to DIR/<name>.yaml (how deploy/crds/ is generated).
    Crds(CrdsArgs),
    /// Run the operator in a Kubernetes cluster: Proxy resources, ProviderHealth, leader election.
    #[command(after_help = AFTER_HELP)]
    Kubernetes(KubernetesArgs),
}

#[derive(Debug, clap::Args)]
struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Arguments of `kubernetes`. The Helm chart (deploy/helm/egress-proxies) passes exactly
/// these flags; keep the two in step.
#[derive(Debug, clap::Args)]
struct KubernetesArgs {
    #[command(flatten)]
    config: egress_operator::cli::ConfigArg,
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
    health: egress_operator::cli::HealthArgs,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Core(command) => egress_operator::cli::run(egress_operator::cli::Cli { command }),
        Command::Crds(a) => crds(a),
        Command::Kubernetes(a) => kubernetes(a),
    }
}

fn crds(a: CrdsArgs) -> ExitCode {
    let docs = match egress_kube::api::crds_yaml() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match a.dir {
        None => {
            for (_, yaml) in docs {
                print!("---\n{yaml}");
            }
            ExitCode::from(EXIT_OK)
        }
        Some(dir) => {
            for (name, yaml) in docs {
                let path = dir.join(name);
                if let Err(e) = std::fs::write(&path, yaml) {
                    eprintln!("error: cannot write {}: {e}", path.display());
                    return ExitCode::from(EXIT_USAGE);
                }
                println!("wrote {}", path.display());
            }
            ExitCode::from(EXIT_OK)
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`: the operator's log is its output).
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn kubernetes(a: KubernetesArgs) -> ExitCode {
    init_tracing();
    tracing::info!(version = env!("CARGO_PKG_VERSION"), identity = %a.identity, "egress-proxies kubernetes starting");
    let health = match a.health.settings() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let lease =
        egress_kube::leader::LeaseSettings::new(&a.lease_name, &a.lease_namespace, &a.identity);
    let mut opts = egress_kube::KubeOptions::new(a.config.config, lease);
    opts.ssh_dir = a.ssh_dir;
    opts.namespace = a.namespace;
    let observer = Arc::new(egress_kube::Observer::new(health));
    let r = rt.block_on(async {
        let shutdown = egress_operator::standalone::shutdown_on_signals();
        let listener = match tokio::net::TcpListener::bind(a.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: cannot listen on {}: {e}", a.listen);
                return Err(None);
            }
        };
        tracing::info!(listen = %a.listen, "serving /metrics, /healthz, /readyz");
        let server = tokio::spawn(egress_operator::standalone::http::serve(
            listener,
            observer.clone(),
            shutdown.clone(),
        ));
        let r = egress_kube::run(opts, observer, shutdown.clone()).await;
        shutdown.cancel();
        let _ = server.await;
        r.map_err(Some)
    });
    match r {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(Some(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(None) => ExitCode::from(EXIT_FAILED),
    }
}
