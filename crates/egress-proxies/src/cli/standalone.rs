//! `egress-proxies standalone [--config FILE] --proxies DIR [--listen ADDR] ...`: runs the
//! operator without Kubernetes until SIGTERM or SIGINT.
//!
//! Guarantees: the arguments map one-to-one onto [`StandaloneOptions`]; nothing runs until
//! the config and the manifest directory were accepted (a rejected config is exit 2 with every
//! error listed, and nothing is done on any host); SIGTERM/SIGINT stop it gracefully through
//! [`shutdown_on_signals`] (exit 0); a bound listen address that is taken is exit 1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::{EXIT_FAILED, EXIT_OK, UsageError};
use egress_core::background::signals::shutdown_on_signals;
use egress_provider::libvirt::config::ProxyPolicy;
use egress_standalone::{self as standalone, StandaloneError, StandaloneOptions};

/// Arguments of `standalone`.
#[derive(Debug, clap::Args)]
pub struct StandaloneArgs {
    /// Provider configuration file. Without it, the embedded default is used: this machine's
    /// libvirtd through /run/libvirt/libvirt-sock, pool `egress-proxies`, network `default`.
    #[arg(long, short = 'c', value_name = "FILE", env = "EGRESS_PROXIES_CONFIG")]
    config: Option<PathBuf>,
    /// Directory of Proxy manifests (*.yaml), watched for changes; removing a manifest
    /// deletes its Proxy.
    #[arg(long, value_name = "DIR")]
    proxies: PathBuf,
    /// Address for /status, /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value_t = standalone::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// A DNS name the HTTP listeners also answer to (repeatable), besides IP addresses and
    /// `localhost`: a request whose Host header names any other is refused (421), so a web
    /// page cannot reach them by DNS rebinding. E.g. the name of a Service in front of them.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Reconcile workers.
    #[arg(long, value_name = "N", default_value_t = standalone::DEFAULT_WORKERS,
          value_parser = clap::value_parser!(usize))]
    workers: usize,
    /// Let GC collect while the manifest directory holds no Proxy (as `gc --allow-empty`).
    /// Without it, GC refuses to run while no Proxy is known, so an empty or wrong DIR never
    /// makes every instance an orphan.
    #[arg(long, alias = "allow-empty")]
    gc_allow_empty: bool,
    /// GC, host checks, deadlines, shutdown and proxy health (shared with `kubernetes`).
    #[command(flatten)]
    driver: super::DriverArgs,
    /// The pool gateways (served for every pool declaring `spec.gateway`).
    #[command(flatten)]
    gateway: super::gateway::GatewayLogArgs,
}

/// The options `a` asks for (a usage error for a value out of range).
pub fn options(a: StandaloneArgs) -> Result<StandaloneOptions, UsageError> {
    if a.workers == 0 {
        return Err(UsageError::new("--workers must be at least 1"));
    }
    let mut opts = StandaloneOptions::new(a.proxies);
    opts.config_path = a.config;
    opts.listen = a.listen;
    opts.allowed_hosts = a.allowed_hosts;
    opts.workers = a.workers;
    opts.gc_allow_empty = a.gc_allow_empty;
    let d = a.driver;
    opts.gc_interval = d.gc_interval;
    opts.gc.min_age = d.gc_min_age;
    opts.gc.dry_run = d.gc_dry_run;
    opts.check_interval = d.check_interval;
    opts.controller.provisioning_deadline = d.provisioning_deadline;
    opts.shutdown_grace = d
        .shutdown_grace
        .unwrap_or(standalone::DEFAULT_SHUTDOWN_GRACE);
    opts.health = d.health.settings()?;
    Ok(opts)
}

/// Runs `standalone` until a signal.
pub async fn run(a: StandaloneArgs) -> anyhow::Result<u8> {
    let gateway_args = a.gateway.clone();
    let mut opts = options(a)?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %opts.listen,
        proxies = %opts.proxies_dir.display(),
        config = %opts.config_path.as_deref().map_or_else(|| "(embedded default)".into(), |p| p.display().to_string()),
        "egress-proxies standalone starting"
    );
    // The pool gateways: every pool declaring `spec.gateway`, from the driver's member state.
    let (set, metrics) = super::gateway::start(&gateway_args)?;
    opts.extra_metrics = Some(Arc::new(metrics));
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(super::gateway::Sources::new()));
    opts.gateway = Some(tx);
    let entries: HashMap<String, ProxyPolicy> =
        standalone::load_config(opts.config_path.as_deref())
            .map(|cfg| {
                cfg.providers
                    .iter()
                    .map(|egress_core::config::ProviderEntry::Libvirt(e)| {
                        (e.name.clone(), e.policy.clone())
                    })
                    .collect()
            })
            .unwrap_or_default();
    let shutdown = shutdown_on_signals();
    let follow = tokio::spawn(super::gateway::follow(
        set.clone(),
        rx,
        None,
        entries,
        shutdown.clone(),
    ));
    let grace = gateway_args.gateway_shutdown_grace;
    let gateway_stop = {
        let set = set.clone();
        let s = shutdown.clone();
        tokio::spawn(async move {
            s.cancelled().await;
            set.shutdown(grace).await;
        })
    };
    let r = standalone::run(opts, shutdown.clone()).await;
    shutdown.cancel();
    let _ = follow.await;
    let _ = gateway_stop.await;
    match r {
        Ok(()) => Ok(EXIT_OK),
        Err(
            e @ (StandaloneError::Config(_)
            | StandaloneError::Providers(_)
            | StandaloneError::ProxiesDir { .. }),
        ) => Err(UsageError::new(e.to_string()).into()),
        Err(e @ StandaloneError::Listen { .. }) => {
            super::output::print_error(&e.to_string(), EXIT_FAILED);
            Ok(EXIT_FAILED)
        }
    }
}
