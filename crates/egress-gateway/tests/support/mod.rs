//! The gateway tests' harness: a gateway set built from views over real members
//! ([`ep_operator_fixtures::real_members`]), its access log and metrics.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_core::model::ProxyProtocol;
use egress_gateway::{
    AccessLog, Credential, GatewayMetrics, GatewaySet, Listener, ListenerProtocol, LogTarget,
    Member, MemberProtocol, PoolSettings, PoolView, Views,
};
pub use ep_operator_fixtures::real_members::*;

/// The pool key of the tests' views.
pub const POOL: &str = "default/web";

/// The member as a driver would publish it.
pub fn member(d: &Daemon) -> Member {
    Member {
        uid: d.uid.clone(),
        name: format!("member-{}", d.egress.octets()[3]),
        addr: d.addr,
        protocol: match d.protocol {
            ProxyProtocol::Http => MemberProtocol::Http,
            ProxyProtocol::Socks5 => MemberProtocol::Socks5,
        },
        credentials: Some(Credential {
            username: d.creds.username.clone(),
            password: d.creds.password.clone(),
        }),
        egress: vec![IpAddr::V4(d.egress)],
    }
}

/// A gateway set serving one pool on an HTTP and a SOCKS5 listener (ports chosen by the
/// kernel), its access log in a temporary file.
pub struct Gateway {
    pub set: GatewaySet,
    pub metrics: GatewayMetrics,
    pub http: SocketAddr,
    pub socks: SocketAddr,
    pub log: PathBuf,
    pub settings: PoolSettings,
    pub clients: Vec<Credential>,
    _dir: tempfile::TempDir,
}

pub fn client(user: &str, password: &str) -> Credential {
    Credential {
        username: user.into(),
        password: password.into(),
    }
}

pub fn settings() -> PoolSettings {
    PoolSettings {
        listeners: vec![
            Listener {
                addr: "127.0.0.1:0".parse().unwrap(),
                protocol: ListenerProtocol::Http,
            },
            Listener {
                addr: "127.0.0.1:0".parse().unwrap(),
                protocol: ListenerProtocol::Socks5,
            },
        ],
        ..PoolSettings::default()
    }
}

pub fn views(settings: &PoolSettings, clients: &[Credential], members: Vec<Member>) -> Views {
    let mut v = Views::new();
    v.insert(
        POOL.to_owned(),
        Arc::new(PoolView {
            key: POOL.to_owned(),
            settings: settings.clone(),
            clients: clients.to_vec(),
            members,
        }),
    );
    v
}

impl Gateway {
    pub async fn start(
        settings: PoolSettings,
        clients: Vec<Credential>,
        members: Vec<Member>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        let metrics = GatewayMetrics::new();
        let access = AccessLog::start(
            LogTarget::File {
                path: log.clone(),
                max_bytes: 64 << 20,
                keep: 1,
            },
            metrics.clone(),
        )
        .unwrap();
        // Two workers, each its own `SO_REUSEPORT` socket per listener: the production shape.
        let workers = egress_gateway::Workers::new(2).unwrap();
        let set = GatewaySet::with_workers(metrics.clone(), access, workers);
        set.apply(&views(&settings, &clients, members)).await;
        let l = set.listening();
        let find = |p| {
            l.iter()
                .find(|x| x.listener.protocol == p)
                .map(|x| x.local)
                .unwrap()
        };
        Self {
            http: find(ListenerProtocol::Http),
            socks: find(ListenerProtocol::Socks5),
            set,
            metrics,
            log,
            settings,
            clients,
            _dir: dir,
        }
    }

    /// Publishes `members` (the settings and clients unchanged).
    pub async fn publish(&self, members: Vec<Member>) {
        self.set
            .apply(&views(&self.settings, &self.clients, members))
            .await;
    }

    /// The access-log lines written so far (the writer flushes within 200 ms of a quiet
    /// queue; this waits until `n` lines are there or fails).
    pub async fn log_lines(&self, n: usize) -> Vec<serde_json::Value> {
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                t0.elapsed() < IO_DEADLINE,
                "{} access-log lines, expected {n}:\n{text}",
                lines.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until no client connection is open (a client's close reaches the gateway a
    /// moment after the client saw the end).
    pub async fn idle(&self) {
        let t0 = Instant::now();
        while self.set.connections() > 0 {
            assert!(
                t0.elapsed() < IO_DEADLINE,
                "{} connections stay open",
                self.set.connections()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The metrics exposition.
    pub fn metrics_text(&self) -> String {
        let mut reg = prometheus_client::registry::Registry::with_prefix("egress_proxies");
        reg.register_collector(Box::new(self.metrics.clone()));
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
        s
    }
}

/// The egress IP the echo sees through the gateway's HTTP listener as `user`.
pub async fn ip_via_http(
    gw: &Gateway,
    user: &str,
    password: &str,
    echo: &Echo,
) -> Result<String, String> {
    let s = http_tunnel(gw.http, user, password, &echo.addr.to_string()).await?;
    Ok(echo_ip(s, echo.addr).await)
}
