//! The pool gateway in standalone mode, through the real `egress-proxies standalone` binary:
//! a ProxyPool manifest declaring `spec.gateway` on a libvirt-fake host (a unix socket), whose
//! members' guest addresses (`10.1.0.N`, given by the fixtures' DHCP loop as a guest agent
//! would report them) are served by real tinyproxy processes. The test re-runs itself in a
//! fresh network namespace (`unshare -n`) where 10.0.0.0/8 is local on loopback, so the
//! members listen at their own guest addresses and nothing leaves the namespace; the child
//! must have run exactly this test. Health checks are on (through each member to the echo
//! target), so each member's egress address is the one its health check saw.
//!
//! What it proves, all through the user's path (manifest directory, provider config, flags):
//! the binary serves the pool's HTTP and SOCKS5 listeners from its own member state once the
//! members are healthy; round robin reaches every member; each client-credentials file is an
//! identity (a wrong password is refused with 407); a session sticks to one member over 20
//! connections; killing a session's member moves only the sessions it carried, and the next
//! connection of that session succeeds at once (failover before the first byte); `-egress-`
//! picks the member with that egress address; the access-log file has one line per
//! connection naming the pool, identity, member and outcome; removing `spec.gateway` from the
//! manifest closes its listeners; SIGTERM is exit 0.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ep_operator_fixtures::real_members::{Echo, echo, echo_ip, http_tunnel, socks_tunnel};
use standalone_support::{
    ALICE_PW, FakeHosts, HTTP_PORT, LOOPBACK_POLICY, MEMBER_PORT, MEMBER_PW, MEMBER_USER, Operator,
    SLOTS, get, manifest_dir, tinyproxies, write,
};

const TEST: &str = "standalone_serves_a_pools_gateway_from_its_own_member_state";
/// Set in the re-run inside the namespace.
const INNER: &str = "EPTEST_GATEWAY_STANDALONE_NETNS";
const ENTRY: &str = "eptest-gw";
const IMAGE: &str = "tiny";
const REPLICAS: usize = 3;
const SOCKS_PORT: u16 = 1080;
const BOB_PW: &str = "bob-password-0123456789ab";
/// Hang guard of every wait (fake hosts answer in microseconds; health rounds every second).
const DEADLINE: Duration = Duration::from_secs(90);

fn pool_manifest(dir: &Path, gateway: bool) {
    let gw = if gateway {
        format!(
            "  gateway:\n    listeners: [{{port: {HTTP_PORT}}}, {{port: {SOCKS_PORT}, protocol: socks5}}]\n    \
             clientCredentials: [alice.cred, bob.cred]\n    drainGrace: 0s\n"
        )
    } else {
        String::new()
    };
    write(
        dir,
        "fleet.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: fleet\n\
             spec:\n  replicas: {REPLICAS}\n  template:\n    spec:\n      provider: {ENTRY}\n      \
             image: {IMAGE}\n      proxy:\n        port: {MEMBER_PORT}\n        \
             credentialsRef: members.cred\n{gw}"
        ),
    );
}

/// The pool's available members: name → guest IP.
async fn available(addr: SocketAddr) -> BTreeMap<String, String> {
    let Some(doc) = get(addr, "/status").await else {
        return BTreeMap::new();
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(&doc) else {
        return BTreeMap::new();
    };
    let Some(pool) = doc["pools"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "fleet"))
    else {
        return BTreeMap::new();
    };
    // NB: the pool's rows say which members are available, the proxies' rows their IP.
    let ips: BTreeMap<&str, &str> = doc["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?, p["ip"].as_str()?)))
        .collect();
    pool["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["available"] == true)
        .filter_map(|m| {
            let name = m["name"].as_str()?;
            Some((name.to_owned(), (*ips.get(name)?).to_owned()))
        })
        .collect()
}

/// The egress address (as the echo saw it) of one HTTP CONNECT through the gateway as `user`.
async fn via(user: &str, password: &str, e: &Echo) -> Result<String, String> {
    let gw = SocketAddr::from((Ipv4Addr::LOCALHOST, HTTP_PORT));
    let t = tokio::time::timeout(
        Duration::from_secs(20),
        http_tunnel(gw, user, password, &e.addr.to_string()),
    )
    .await
    .map_err(|_| "no answer within 20 s".to_owned())??;
    Ok(echo_ip(t, e.addr).await)
}

/// The access log's lines (JSON objects).
fn access_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn standalone_serves_a_pools_gateway_from_its_own_member_state() {
    if std::env::var_os(INNER).is_some() {
        standalone_support::block_on(inside());
        return;
    }
    // A fresh network namespace where 10.0.0.0/8 is local: the members' guest addresses.
    standalone_support::rerun_in_netns(TEST, INNER);
}

async fn inside() {
    let work = tempfile::tempdir().unwrap();
    // The host: a libvirt-fake on a unix socket, the image published, addresses by "DHCP".
    let hosts = FakeHosts::start(work.path(), ENTRY, IMAGE, &["h1"]).await;
    // The members: a real tinyproxy at each guest address, leaving from its own address.
    let e = echo().await;
    let mut members = tinyproxies(SLOTS, MEMBER_PORT, MEMBER_USER, MEMBER_PW).await;
    let egress_of = |ip: &str| members[&ip.parse::<Ipv4Addr>().unwrap()].egress.to_string();

    let cfg = work.path().join("providers.yaml");
    hosts.write_config(&cfg, ENTRY, IMAGE, LOOPBACK_POLICY);
    let dir = manifest_dir(
        work.path(),
        &[
            ("members.cred", MEMBER_USER, MEMBER_PW),
            ("alice.cred", "alice", ALICE_PW),
            ("bob.cred", "bob", BOB_PW),
        ],
    );
    pool_manifest(&dir, true);
    let access = work.path().join("access.log");
    let log = work.path().join("operator.log");
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 9464));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        "1s",
        [
            OsStr::new("--health-target"),
            OsStr::new(&format!("http://{}/", e.addr)),
            OsStr::new("--health-interval"),
            OsStr::new("1s"),
            OsStr::new("--gateway-access-log"),
            access.as_os_str(),
        ],
        log,
        40,
    );

    // Every member healthy, then the gateway serves.
    let t0 = Instant::now();
    let pool = loop {
        let m = available(listen).await;
        if m.len() == REPLICAS {
            break m;
        }
        op.assert_running();
        assert!(
            t0.elapsed() < DEADLINE,
            "members {m:?} after {DEADLINE:?}: {:?}\n{}",
            get(listen, "/status").await,
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "eptest: {REPLICAS} members healthy after {:.1} s: {pool:?}",
        t0.elapsed().as_secs_f64()
    );
    let egress: BTreeMap<String, String> = pool
        .iter()
        .map(|(n, ip)| (egress_of(ip), n.clone()))
        .collect();
    // NB: the listeners may be up before the gateway has seen the members (each such
    // connection is refused and logged as `no_member`).
    let mut early = 0usize;
    let first = loop {
        match via("alice", ALICE_PW, &e).await {
            Ok(ip) => break ip,
            Err(err) => {
                assert!(err.starts_with("HTTP/1.1 503"), "{err}");
                early += 1;
                assert!(
                    t0.elapsed() < DEADLINE,
                    "the gateway never served: {err}\n{}",
                    op.tail()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut connections = early + 1;
    assert!(
        egress.contains_key(&first),
        "{first} is no member's egress: {egress:?}"
    );

    // Round robin reaches every member.
    let mut seen = BTreeSet::from([first]);
    for _ in 0..3 * REPLICAS {
        seen.insert(via("alice", ALICE_PW, &e).await.unwrap());
        connections += 1;
    }
    assert_eq!(
        seen,
        egress.keys().cloned().collect(),
        "round robin over every member"
    );

    // The second identity, over SOCKS5; a wrong password is refused without a hint.
    let socks = SocketAddr::from((Ipv4Addr::LOCALHOST, SOCKS_PORT));
    let t = socks_tunnel(socks, "bob", BOB_PW, e.addr).await.unwrap();
    assert!(egress.contains_key(&echo_ip(t, e.addr).await));
    connections += 1;
    let refused = via("bob", ALICE_PW, &e).await.unwrap_err();
    assert!(refused.starts_with("HTTP/1.1 407"), "{refused}");
    connections += 1;

    // Sessions: each sticks to one member.
    let mut sessions: BTreeMap<String, String> = BTreeMap::new();
    for s in 0..12 {
        let user = format!("alice-session-s{s}");
        let ip = via(&user, ALICE_PW, &e).await.unwrap();
        sessions.insert(user, ip);
        connections += 1;
    }
    let (s0, s0_ip) = sessions
        .iter()
        .next()
        .map(|(u, ip)| (u.clone(), ip.clone()))
        .unwrap();
    for _ in 0..20 {
        assert_eq!(via(&s0, ALICE_PW, &e).await.unwrap(), s0_ip, "{s0} sticks");
        connections += 1;
    }
    assert!(
        sessions.values().collect::<BTreeSet<_>>().len() > 1,
        "12 sessions spread over more than one member: {sessions:?}"
    );

    // -egress- picks that member.
    for ip in egress.keys() {
        let user = format!("alice-egress-{ip}");
        assert_eq!(&via(&user, ALICE_PW, &e).await.unwrap(), ip);
        connections += 1;
    }

    // Kill the first session's member: that session's next connection succeeds on another
    // member at once; every session on another member stays where it was.
    let dead_name = egress[&s0_ip].clone();
    let dead_ip: Ipv4Addr = pool[&dead_name].parse().unwrap();
    drop(members.remove(&dead_ip));
    let moved = via(&s0, ALICE_PW, &e)
        .await
        .expect("no client error after its member died");
    connections += 1;
    assert_ne!(moved, s0_ip);
    for (user, ip) in &sessions {
        let now = via(user, ALICE_PW, &e).await.unwrap();
        connections += 1;
        if *ip != s0_ip {
            assert_eq!(&now, ip, "{user} was on a live member and must not move");
        } else {
            assert_ne!(&now, ip, "{user} was on the dead member");
        }
    }

    // The access log: one line per connection, each naming what it should.
    let t1 = Instant::now();
    let lines = loop {
        let l = access_lines(&access);
        if l.len() >= connections {
            break l;
        }
        assert!(
            t1.elapsed() < DEADLINE,
            "{} access-log lines for {connections} connections",
            l.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lines.len(), connections, "one line per connection");
    let names: BTreeSet<&String> = pool.keys().collect();
    for l in &lines {
        assert_eq!(l["pool"], "default/fleet", "{l}");
        if l["outcome"] == "auth_failed" {
            assert!(l.get("identity").is_none(), "{l}");
            continue;
        }
        if l["outcome"] == "no_member" {
            continue;
        }
        assert_eq!(l["outcome"], "ok", "{l}");
        assert!(
            ["alice", "bob"].contains(&l["identity"].as_str().unwrap()),
            "{l}"
        );
        assert!(
            names.contains(&l["member"].as_str().unwrap().to_owned()),
            "{l}"
        );
        assert!(l["bytes_down"].as_u64().unwrap() > 0, "{l}");
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["outcome"] == "auth_failed")
            .count(),
        1
    );
    assert_eq!(
        lines.iter().filter(|l| l["outcome"] == "no_member").count(),
        early
    );
    assert_eq!(
        lines.iter().filter(|l| l["listener"] == "socks5").count(),
        1
    );
    assert!(
        lines
            .iter()
            .any(|l| l["session"] == "s0" && l["attempts"] == 2 && l["outcome"] == "ok"),
        "the failover is logged as two attempts"
    );

    // No gateway in the manifest: its listeners close.
    pool_manifest(&dir, false);
    let t2 = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", HTTP_PORT))
        .await
        .is_ok()
        || tokio::net::TcpStream::connect(("127.0.0.1", SOCKS_PORT))
            .await
            .is_ok()
    {
        assert!(
            t2.elapsed() < DEADLINE,
            "the gateway still listens\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // SIGTERM: exit 0.
    let pid = op.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let t3 = Instant::now();
    let status = loop {
        if let Some(s) = op.child.try_wait().unwrap() {
            break s;
        }
        assert!(t3.elapsed() < DEADLINE, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", op.tail());
    println!("eptest: {connections} connections through the standalone gateway, all as documented");
}
