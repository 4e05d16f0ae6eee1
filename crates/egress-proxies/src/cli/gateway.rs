//! The pool gateway in both modes: `egress-proxies gateway` (Kubernetes: its own Deployment,
//! leaderless, reading pools, member Proxies and credentials Secrets) and the gateway
//! `standalone` serves for every pool declaring `spec.gateway`. Both turn a driver's
//! membership source ([`GatewaySource`]s on a `watch`) into the data path's views
//! ([`egress_gateway::PoolView`]) and follow them ([`follow`]).
//!
//! Guarantees: the conversion is one function for both modes ([`view`]); an unchanged
//! source is not converted again; the gateway never writes pool state; SIGTERM/SIGINT stop
//! accepting at once and give open connections `--gateway-shutdown-grace` before they are
//! cut (exit 0); an address it cannot bind is exit 1; a bad flag is exit 2.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use egress_core::metrics::MetricsFormat;
use egress_core::model::ProxyProtocol;
use egress_core::pool::gateway::GatewayMode;
use egress_core::pool::gateway_source::GatewaySource;
use egress_core::proxy_policy::GuestPolicy;
use egress_gateway::{
    AccessLog, Balance, ByteBudget, Credential, Destinations, GatewayMetrics, GatewaySet, Limits,
    Listener, ListenerProtocol, LogTarget, Member, MemberProtocol, Net, PoolSettings, PoolView,
    Sessions, Timeouts, Views,
};
use egress_provider::libvirt::config::ProxyPolicy;
use egress_web::{Endpoints, Routes};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{EXIT_OK, UsageError};

/// Every pool gateway's source, by `namespace/name` (both drivers publish this).
pub type Sources = BTreeMap<String, Arc<GatewaySource>>;

/// Default address of the gateway process's `/metrics`, `/healthz` and `/readyz`.
// NB: 9466, after the standalone status port (9464) and the echo (9465).
pub const DEFAULT_GATEWAY_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9466);

/// The access log and shutdown settings of the gateway (shared by `gateway` and
/// `standalone`).
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayLogArgs {
    /// The pool gateways' access log (one JSON object per connection): `stderr`, `off`, or a
    /// file (rotated by size).
    #[arg(
        long = "gateway-access-log",
        alias = "access-log",
        value_name = "stderr|off|FILE",
        default_value = "stderr"
    )]
    pub gateway_access_log: String,
    /// Size at which the access-log file is rotated (to FILE.1, FILE.2, ...).
    #[arg(long = "gateway-access-log-max-bytes", value_name = "BYTES",
          default_value_t = 100 << 20)]
    pub gateway_access_log_max_bytes: u64,
    /// Rotated access-log files kept.
    #[arg(
        long = "gateway-access-log-keep",
        value_name = "N",
        default_value_t = 5
    )]
    pub gateway_access_log_keep: u32,
    /// Time open gateway connections get to finish at shutdown before they are cut.
    #[arg(long = "gateway-shutdown-grace", value_name = "DURATION",
          value_parser = humantime::parse_duration, default_value = "30s")]
    pub gateway_shutdown_grace: Duration,
    /// Threads that accept and serve the pool gateways' connections, each with its own
    /// listening socket per listener (`SO_REUSEPORT`); default: the CPUs the process may use.
    #[arg(long = "gateway-workers", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=egress_gateway::workers::MAX_WORKERS as i64))]
    pub gateway_workers: Option<u16>,
}

impl GatewayLogArgs {
    /// Where the access log goes.
    pub fn target(&self) -> LogTarget {
        match self.gateway_access_log.as_str() {
            "off" => LogTarget::Off,
            "stderr" | "-" => LogTarget::Stderr,
            path => LogTarget::File {
                path: PathBuf::from(path),
                max_bytes: self.gateway_access_log_max_bytes,
                keep: self.gateway_access_log_keep,
            },
        }
    }
}

/// Arguments of `gateway`.
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Kubeconfig file to connect with (default: $KUBECONFIG, ~/.kube/config, then the pod's
    /// service account).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Serve the gateways of pools in this namespace only (default: every namespace).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// The address the pools' listeners bind (their ports come from each pool's
    /// `spec.gateway.listeners`).
    #[arg(long, value_name = "IP", default_value = "0.0.0.0")]
    bind_address: IpAddr,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, value_name = "ADDR", default_value_t = DEFAULT_GATEWAY_LISTEN)]
    listen: SocketAddr,
    /// Whether the operator runs proxy health checks (`--health-target`): then only members
    /// healthy through themselves are used, as in the pool's Service.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    health_checks: bool,
    /// Access log and shutdown grace.
    #[command(flatten)]
    log: GatewayLogArgs,
}

fn net(n: &egress_core::proxy_policy::Net) -> Option<Net> {
    Net::parse(&n.to_string())
}

/// The data path's view of one pool's gateway. `bind` replaces the spec's address (the
/// Kubernetes Deployment binds every address); `entry` is the provider entry's policy when
/// known (standalone), whose destination rules and lifted networks then apply too.
pub fn view(src: &GatewaySource, bind: Option<IpAddr>, entry: Option<&ProxyPolicy>) -> PoolView {
    let p = &src.policy;
    let address = bind.unwrap_or(p.address);
    let spec_dest = &src.template.proxy.allowed_destinations;
    let default_entry = ProxyPolicy::default();
    let joined = GuestPolicy::for_proxy(entry.unwrap_or(&default_entry), spec_dest, &[]).ok();
    let destinations = match joined {
        Some(g) => Destinations {
            domains: g.domains.clone(),
            cidrs: g.cidrs.iter().filter_map(net).collect(),
            ports: g.ports.clone(),
            // NB: without the entry (Kubernetes) the gateway cannot know which internal
            // networks the admin lifted; the members enforce that.
            denied: if entry.is_some() {
                g.denied.iter().filter_map(net).collect()
            } else {
                Vec::new()
            },
            lifted: g.lifted.iter().filter_map(net).collect(),
        },
        None => Destinations {
            domains: spec_dest.domains.clone(),
            cidrs: spec_dest
                .cidrs
                .iter()
                .filter_map(|c| Net::parse(c))
                .collect(),
            ports: spec_dest.ports.clone(),
            ..Destinations::default()
        },
    };
    let proto = |p: ProxyProtocol| match p {
        ProxyProtocol::Http => ListenerProtocol::Http,
        ProxyProtocol::Socks5 => ListenerProtocol::Socks5,
    };
    let cred = |c: &egress_core::controller::ProxyCredentials| Credential {
        username: c.username.clone(),
        password: c.password.clone(),
    };
    PoolView {
        key: src.key(),
        settings: PoolSettings {
            listeners: p
                .listeners
                .iter()
                .map(|(port, pr)| Listener {
                    addr: SocketAddr::new(address, *port),
                    protocol: proto(*pr),
                })
                .collect(),
            balance: match p.mode {
                GatewayMode::RoundRobin => Balance::RoundRobin,
                GatewayMode::LeastConnections => Balance::LeastConnections,
            },
            sessions: Sessions {
                enabled: p.sessions,
                default_ttl: p.default_ttl,
                max_ttl: p.max_ttl,
            },
            attempts: p.attempts,
            timeouts: Timeouts {
                request: p.request_timeout,
                connect: p.connect_timeout,
                tunnel_idle: p.tunnel_timeout,
            },
            drain_grace: p.drain_grace,
            limits: Limits {
                max_connections: p.max_connections,
                bytes: p
                    .bytes_per_period
                    .map(|(bytes, period)| ByteBudget { bytes, period }),
            },
            destinations,
        },
        clients: src.clients.iter().map(cred).collect(),
        members: src
            .members
            .iter()
            .map(|m| Member {
                uid: m.uid.clone(),
                name: m.name.clone(),
                addr: m.addr,
                protocol: match m.protocol {
                    ProxyProtocol::Http => MemberProtocol::Http,
                    ProxyProtocol::Socks5 => MemberProtocol::Socks5,
                },
                credentials: m.credentials.as_ref().map(cred),
                egress: m.egress.clone(),
            })
            .collect(),
    }
}

/// Applies `sources` to `set` until `stop`: each change converted ([`view`]) and applied;
/// an unchanged pool keeps its view.
pub async fn follow(
    set: GatewaySet,
    mut sources: watch::Receiver<Arc<Sources>>,
    bind: Option<IpAddr>,
    entries: HashMap<String, ProxyPolicy>,
    stop: CancellationToken,
) {
    let mut cache: HashMap<String, (Arc<GatewaySource>, Arc<PoolView>)> = HashMap::new();
    loop {
        let current = Arc::clone(&sources.borrow_and_update());
        let mut views = Views::new();
        let mut next = HashMap::new();
        for (key, src) in current.iter() {
            let v = match cache.get(key) {
                Some((s, v)) if Arc::ptr_eq(s, src) => Arc::clone(v),
                _ => Arc::new(view(src, bind, entries.get(&src.template.provider))),
            };
            views.insert(key.clone(), Arc::clone(&v));
            next.insert(key.clone(), (Arc::clone(src), v));
        }
        cache = next;
        set.apply(&views).await;
        tokio::select! {
            () = stop.cancelled() => return,
            r = sources.changed() => if r.is_err() {
                stop.cancelled().await;
                return;
            },
        }
    }
}

/// The gateway's metrics and access log, started from `log`.
pub fn start(log: &GatewayLogArgs) -> anyhow::Result<(GatewaySet, GatewayMetrics)> {
    let metrics = GatewayMetrics::new();
    let target = log.target();
    let access = AccessLog::start(target, metrics.clone()).map_err(|e| {
        UsageError::new(format!(
            "--gateway-access-log {}: cannot open it: {e}",
            log.gateway_access_log
        ))
    })?;
    let count = log
        .gateway_workers
        .map_or_else(egress_gateway::workers::default_count, usize::from);
    let workers = egress_gateway::Workers::new(count)
        .map_err(|e| UsageError::new(format!("--gateway-workers {count}: {e}")))?;
    Ok((
        GatewaySet::with_workers(metrics.clone(), access, workers),
        metrics,
    ))
}

/// What the gateway process serves on `--listen`.
#[derive(Debug)]
struct GatewayEndpoints {
    registry: Registry,
    ready: AtomicBool,
}

impl Endpoints for GatewayEndpoints {
    fn status(&self) -> egress_web::status::StatusDocument {
        egress_web::status::StatusDocument {
            generated_at: String::new(),
            proxies: Vec::new(),
            hosts: Vec::new(),
            manifest_errors: Vec::new(),
            pools: Vec::new(),
        }
    }

    fn metrics(&self, format: MetricsFormat) -> String {
        let mut out = String::new();
        let r = match format {
            MetricsFormat::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            MetricsFormat::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        if r.is_err() {
            out.clear();
        }
        out
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn not_ready_reason(&self) -> String {
        "waiting for the first listing of ProxyPools and their member Proxies".into()
    }
}

/// Runs `gateway` (Kubernetes mode) until a signal.
pub async fn run(a: GatewayArgs) -> anyhow::Result<u8> {
    if a.namespace.as_deref().is_some_and(str::is_empty) {
        return Err(UsageError::new("--namespace must not be empty").into());
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "egress-proxies gateway starting"
    );
    let client = super::kube_client::client(a.kubeconfig.as_deref()).await?;
    let (set, metrics) = start(&a.log)?;
    let mut registry = Registry::with_prefix(egress_core::metrics::PREFIX);
    registry.register(
        "gateway_build",
        "The running build of the gateway process: version and commit (value 1)",
        prometheus_client::metrics::info::Info::new(vec![
            ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            (
                "commit".to_owned(),
                option_env!("EGRESS_PROXIES_GIT_COMMIT")
                    .unwrap_or("unknown")
                    .to_owned(),
            ),
        ]),
    );
    registry.register_collector(Box::new(metrics));
    let endpoints = Arc::new(GatewayEndpoints {
        registry,
        ready: AtomicBool::new(false),
    });
    let shutdown = egress_core::background::signals::shutdown_on_signals();
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    tracing::info!(listen = %a.listen, "serving /metrics, /healthz, /readyz");
    let stop_http = CancellationToken::new();
    let http = tokio::spawn(egress_web::serve_routes(
        listener,
        Arc::clone(&endpoints) as Arc<dyn Endpoints>,
        Routes::Probes,
        stop_http.clone(),
    ));
    let (tx, rx) = watch::channel(Arc::new(Sources::new()));
    let ready = CancellationToken::new();
    let source = tokio::spawn(egress_kube::gateway_source::run(
        client,
        egress_kube::gateway_source::SourceOptions {
            namespace: a.namespace,
            health_checks: a.health_checks,
        },
        tx,
        ready.clone(),
        shutdown.clone(),
    ));
    let ep = Arc::clone(&endpoints);
    let r = ready.clone();
    let s = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = r.cancelled() => ep.ready.store(true, Ordering::Relaxed),
            () = s.cancelled() => {}
        }
    });
    follow(
        set.clone(),
        rx,
        Some(a.bind_address),
        HashMap::new(),
        shutdown.clone(),
    )
    .await;
    tracing::info!(
        open = set.connections(),
        grace = ?a.log.gateway_shutdown_grace,
        "egress-proxies gateway: stopping; open connections get the grace"
    );
    endpoints.ready.store(false, Ordering::Relaxed);
    set.shutdown(a.log.gateway_shutdown_grace).await;
    let _ = source.await;
    stop_http.cancel();
    let _ = http.await;
    tracing::info!("egress-proxies gateway: stopped");
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use egress_core::pool::gateway::GatewaySpec;
    use egress_core::pool::gateway_source::GatewayMember;

    fn source(spec: &str, template: &str) -> GatewaySource {
        let g: GatewaySpec = serde_saphyr::from_str(spec).unwrap();
        GatewaySource {
            namespace: "team-a".into(),
            name: "web".into(),
            policy: g.validate(true).unwrap(),
            template: serde_saphyr::from_str(template).unwrap(),
            clients: vec![egress_core::controller::ProxyCredentials {
                username: "alice".into(),
                password: "pw".into(),
            }],
            members: vec![GatewayMember {
                uid: "u1".into(),
                name: "web-abc".into(),
                addr: "10.0.0.5:1080".parse().unwrap(),
                protocol: ProxyProtocol::Socks5,
                credentials: None,
                egress: vec!["203.0.113.7".parse().unwrap()],
            }],
        }
    }

    #[test]
    fn a_source_becomes_the_data_paths_view_with_the_entrys_destination_rules() {
        let src = source(
            "address: 0.0.0.0\nlisteners: [{port: 3128}, {port: 1080, protocol: socks5}]\n\
             mode: LeastConnections\nsessions: {defaultTTL: 10m}\nfailover: {attempts: 2, connectTimeout: 3s}\n\
             drainGrace: 1m\nlimits: {maxConnections: 5, bytesPerPeriod: 1000, period: 1h}\n",
            "provider: home\nimage: i\nproxy: {allowedClientCidrs: [10.0.0.0/8], \
             allowedDestinations: {ports: [443]}}\n",
        );
        let entry = ProxyPolicy {
            allowed_internal_cidrs: vec!["10.9.0.0/16".into()],
            ..ProxyPolicy::default()
        };
        let v = view(&src, None, Some(&entry));
        assert_eq!(v.key, "team-a/web");
        let s = &v.settings;
        assert_eq!(
            s.listeners,
            [
                Listener {
                    addr: "0.0.0.0:3128".parse().unwrap(),
                    protocol: ListenerProtocol::Http
                },
                Listener {
                    addr: "0.0.0.0:1080".parse().unwrap(),
                    protocol: ListenerProtocol::Socks5
                },
            ]
        );
        assert_eq!(s.balance, Balance::LeastConnections);
        assert_eq!(s.sessions.default_ttl, Some(Duration::from_secs(600)));
        assert_eq!(
            (s.attempts, s.timeouts.connect),
            (2, Duration::from_secs(3))
        );
        assert_eq!(s.drain_grace, Duration::from_secs(60));
        assert_eq!(
            s.limits.bytes,
            Some(ByteBudget {
                bytes: 1000,
                period: Duration::from_secs(3600)
            })
        );
        assert_eq!(s.destinations.ports, [443]);
        let t = |a: &str| egress_gateway::target::Target::parse_authority(a).unwrap();
        assert!(
            s.destinations.check(&t("10.1.0.1:443")).is_err(),
            "internal"
        );
        assert!(
            s.destinations.check(&t("10.9.1.1:443")).is_ok(),
            "lifted by the entry"
        );
        assert!(s.destinations.check(&t("203.0.113.1:80")).is_err(), "port");
        assert_eq!(v.members[0].protocol, MemberProtocol::Socks5);
        assert_eq!(v.clients[0].username, "alice");
        // Kubernetes: the bind address replaces the spec's, internal networks are the
        // members' to refuse (the entry is unknown).
        let k = view(&src, Some("127.0.0.3".parse().unwrap()), None);
        assert_eq!(
            k.settings.listeners[0].addr,
            "127.0.0.3:3128".parse().unwrap()
        );
        assert!(k.settings.destinations.check(&t("10.1.0.1:443")).is_ok());
        assert!(k.settings.destinations.check(&t("10.1.0.1:80")).is_err());
    }
}
