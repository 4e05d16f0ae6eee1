//! The proxy software the guests run, for real, on loopback: the tinyproxy and dante configs
//! that `userdata::render` writes into the guest's user-data are started with Debian's
//! `tinyproxy` and `danted` (installed by .ci/setup-host) on 127.0.0.1, and the health engine
//! probes through them to the echo. This proves the rendered configs work with the real
//! daemons: the allowed networks and basic auth are enforced (never an open relay), and the
//! egress IP is read through them. Each daemon is a child process killed on drop.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_operator_fixtures::health_proxies as health_support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use egress_core::controller::ProxyCredentials;
use egress_core::controller::userdata::render;
use egress_core::health::probe::{CheckTarget, ProbeError, ProxyEndpoint, probe};
use egress_core::model::{ProxyProtocol, ProxySettings};
use egress_core::proxy_policy::GuestPolicy;
use egress_provider::libvirt::config::ProxyPolicy;
use health_support::start_echo;
use tokio::process::{Child, Command};

/// Bound on one probe (loopback answers in milliseconds).
const PROBE_DEADLINE: Duration = Duration::from_secs(5);
/// Bound on a daemon starting to listen.
const START_DEADLINE: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The content of the staged file `name` in rendered user-data.
fn staged(user_data: &str, name: &str) -> String {
    let v: serde_json::Value = serde_saphyr::from_str(user_data).unwrap();
    v["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(name))
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn settings(protocol: ProxyProtocol, port: u16, cidrs: &[&str]) -> ProxySettings {
    ProxySettings {
        port,
        protocol,
        allowed_client_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
        ..ProxySettings::default()
    }
}

/// The echo target is on loopback, a destination the guest's policy denies by default; the
/// provider entry lifts it here (`policy.allowedInternalCidrs`). No firewall runs here (see
/// tests/proxy_policy_real.rs for the policy itself), so only dante's rules see it.
fn loopback_allowed() -> GuestPolicy {
    GuestPolicy::from_entry(&ProxyPolicy {
        allowed_internal_cidrs: vec!["127.0.0.0/8".into()],
        ..ProxyPolicy::default()
    })
}

/// A daemon child, killed on drop (`kill_on_drop`).
struct Daemon {
    _child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn wait_listening(addr: SocketAddr) {
    let t0 = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(t0.elapsed() < START_DEADLINE, "{addr} never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn require(bin: &str) {
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: run `bash .ci/setup-host` (it installs tinyproxy and dante-server)"
    );
}

/// Starts tinyproxy with the rendered config, bound to 127.0.0.1; CONNECT may reach the
/// health target's port `target` (as the operator renders it for its own health checks).
async fn tinyproxy(cidrs: &[&str], creds: Option<&ProxyCredentials>, target: u16) -> Daemon {
    require("/usr/bin/tinyproxy");
    let port = free_port();
    let mut policy = loopback_allowed();
    policy.connect_default.push(target);
    let ud = render(&settings(ProxyProtocol::Http, port, cidrs), creds, &policy).unwrap();
    let conf = format!("Listen 127.0.0.1\n{}", staged(&ud, "tinyproxy.conf"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tinyproxy.conf");
    std::fs::write(&path, conf).unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    println!("starting tinyproxy on {addr} with {}", path.display());
    let child = Command::new("/usr/bin/tinyproxy")
        .arg("-d")
        .arg("-c")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(addr).await;
    Daemon {
        _child: child,
        addr,
        _dir: dir,
    }
}

/// Starts danted with the rendered config (the guest's start script puts the default route's
/// interface in `external`; here that is `lo`, and `internal` is 127.0.0.1).
async fn danted(cidrs: &[&str]) -> Daemon {
    require("/usr/sbin/danted");
    let port = free_port();
    let ud = render(
        &settings(ProxyProtocol::Socks5, port, cidrs),
        None,
        &loopback_allowed(),
    )
    .unwrap();
    let conf = staged(&ud, "danted.conf")
        .replace("@EXTERNAL@", "lo")
        .replace("internal: 0.0.0.0", "internal: 127.0.0.1")
        .replace("logoutput: syslog", "logoutput: stderr");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("danted.conf");
    std::fs::write(&path, conf).unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    println!("starting danted on {addr} with {}", path.display());
    let child = Command::new("/usr/sbin/danted")
        .arg("-f")
        .arg(&path)
        .arg("-N")
        .arg("1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(addr).await;
    Daemon {
        _child: child,
        addr,
        _dir: dir,
    }
}

fn ep(d: &Daemon, protocol: ProxyProtocol, creds: Option<ProxyCredentials>) -> ProxyEndpoint {
    ProxyEndpoint {
        addr: d.addr,
        protocol,
        credentials: creds,
    }
}

fn creds(password: &str) -> ProxyCredentials {
    ProxyCredentials {
        username: "alice".into(),
        password: password.into(),
    }
}

#[tokio::test]
async fn the_rendered_tinyproxy_config_tunnels_for_allowed_clients_and_reports_the_egress() {
    let (echo, _e) = start_echo().await;
    let target = CheckTarget::parse(&format!("http://{echo}/")).unwrap();
    let d = tinyproxy(&["127.0.0.0/8"], None, echo.port()).await;
    let ok = probe(&ep(&d, ProxyProtocol::Http, None), &target, PROBE_DEADLINE)
        .await
        .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
}

#[tokio::test]
async fn the_rendered_tinyproxy_config_refuses_clients_outside_its_networks() {
    let (echo, _e) = start_echo().await;
    let target = CheckTarget::parse(&format!("http://{echo}/")).unwrap();
    let d = tinyproxy(&["192.0.2.0/24"], None, echo.port()).await;
    let e = probe(&ep(&d, ProxyProtocol::Http, None), &target, PROBE_DEADLINE)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ProbeError::Tunnel(_) | ProbeError::Io(_)),
        "not an open relay: {e:?}"
    );
}

#[tokio::test]
async fn the_rendered_tinyproxy_config_requires_its_basic_auth() {
    let (echo, _e) = start_echo().await;
    let target = CheckTarget::parse(&format!("http://{echo}/")).unwrap();
    let d = tinyproxy(&[], Some(&creds("s3cr3t-pw-16chars")), echo.port()).await;
    let ok = probe(
        &ep(&d, ProxyProtocol::Http, Some(creds("s3cr3t-pw-16chars"))),
        &target,
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    let e = probe(
        &ep(&d, ProxyProtocol::Http, Some(creds("wrong-pw-16chars"))),
        &target,
        PROBE_DEADLINE,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ProbeError::Auth(_)), "{e:?}");
}

#[tokio::test]
async fn the_rendered_dante_config_tunnels_socks5_for_allowed_clients_only() {
    let (echo, _e) = start_echo().await;
    let target = CheckTarget::parse(&format!("http://{echo}/")).unwrap();
    let d = danted(&["127.0.0.0/8"]).await;
    let ok = probe(
        &ep(&d, ProxyProtocol::Socks5, None),
        &target,
        PROBE_DEADLINE,
    )
    .await
    .unwrap();
    assert_eq!(ok.egress_ip.to_string(), "127.0.0.1");
    let closed = danted(&["192.0.2.0/24"]).await;
    let e = probe(
        &ep(&closed, ProxyProtocol::Socks5, None),
        &target,
        PROBE_DEADLINE,
    )
    .await
    .unwrap_err();
    assert!(
        !matches!(e, ProbeError::Timeout(_)),
        "refused, not hung: {e:?}"
    );
}
