//! The drain of a rotated member in standalone mode, through the real `egress-proxies
//! standalone` binary: a ProxyPool declaring `spec.gateway` (its `drainGrace` is the pool's
//! drain grace) on a libvirt-fake host, whose members' guest addresses are served by real
//! tinyproxy processes, in a fresh network namespace (`unshare -n`) where 10.0.0.0/8 is local
//! (as in `gateway_standalone_process.rs`; the child must have run exactly this test).
//!
//! What it proves: a tunnel is open through the gateway to a member; the template changes
//! (a rotation); the moment `/status` shows that member unpublished (`drainingSince`), it is
//! already gone from `/pools/fleet/healthy.txt`, and within a second the gateway no longer
//! chooses it (`-egress-ADDRESS` naming it is refused, round robin never reaches it); its
//! Proxy and VM stay, and the open tunnel keeps carrying bytes, until the grace is nearly
//! over; the member is deleted only after the grace (its VM gone from the host); the
//! replacements carry the pool.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use ep_operator_fixtures::real_members::{echo, echo_ip, http_tunnel};
use standalone_support::{
    ALICE_PW, FakeHosts, HTTP_PORT, LOOPBACK_POLICY, MEMBER_PORT, MEMBER_PW, MEMBER_USER, Operator,
    SLOTS, get, manifest_dir, tinyproxies, write,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const TEST: &str = "a_rotated_member_is_unpublished_at_once_and_deleted_after_the_drain_grace";
/// Set in the re-run inside the namespace.
const INNER: &str = "EPTEST_GATEWAY_DRAIN_STANDALONE_NETNS";
const ENTRY: &str = "eptest-gwd";
const IMAGE: &str = "tiny";
const REPLICAS: usize = 2;
/// The gateway's `drainGrace`, and so the pool's drain grace.
const GRACE: Duration = Duration::from_secs(12);
/// Hang guard of every wait.
const DEADLINE: Duration = Duration::from_secs(90);

/// The pool; `rev` is a template label (changing it rotates every member).
fn pool_manifest(dir: &Path, rev: u32) {
    write(
        dir,
        "fleet.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: fleet\n\
             spec:\n  replicas: {REPLICAS}\n  template:\n    metadata:\n      labels: {{rev: \"{rev}\"}}\n    \
             spec:\n      provider: {ENTRY}\n      image: {IMAGE}\n      proxy:\n        \
             port: {MEMBER_PORT}\n        credentialsRef: members.cred\n  gateway:\n    \
             listeners: [{{port: {HTTP_PORT}}}]\n    clientCredentials: [alice.cred]\n    \
             drainGrace: {}s\n",
            GRACE.as_secs()
        ),
    );
}

/// One member as `/status` shows it.
#[derive(Debug, Clone)]
struct Row {
    available: bool,
    draining: bool,
    ip: Option<String>,
    phase: String,
    /// Its VM's domain name on the host (from its `libvirt://ENTRY/HOST/NAME` provider ID).
    domain: Option<String>,
}

/// The pool's members by name (with their Proxy's IP and phase).
async fn members(addr: SocketAddr) -> BTreeMap<String, Row> {
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
    let proxies: BTreeMap<&str, &serde_json::Value> = doc["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?, p)))
        .collect();
    pool["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let name = m["name"].as_str()?;
            let p = proxies.get(name);
            Some((
                name.to_owned(),
                Row {
                    available: m["available"] == true,
                    draining: m.get("drainingSince").is_some_and(|v| v.is_string()),
                    ip: p.and_then(|p| p["ip"].as_str()).map(str::to_owned),
                    phase: p.and_then(|p| p["phase"].as_str()).unwrap_or("").to_owned(),
                    domain: p
                        .and_then(|p| p["providerId"].as_str())
                        .and_then(|id| id.rsplit('/').next())
                        .map(str::to_owned),
                },
            ))
        })
        .collect()
}

/// A TCP target that first sends the caller's IP and a newline, then echoes every byte.
async fn ping_target() -> (SocketAddr, CancellationToken) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        loop {
            let (mut c, peer) = tokio::select! {
                () = s.cancelled() => return,
                a = l.accept() => a.unwrap(),
            };
            tokio::spawn(async move {
                if c.write_all(format!("{}\n", peer.ip()).as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                let mut buf = [0u8; 1024];
                loop {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, stop)
}

/// Sends `word` through the open tunnel and reads it back (within 3 s).
async fn ping(
    t: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    word: &str,
) -> Result<(), String> {
    let go = async {
        t.get_mut()
            .write_all(format!("{word}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let n = t.read_line(&mut line).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed".to_owned());
        }
        (line.trim() == word)
            .then_some(())
            .ok_or_else(|| format!("echoed {line:?}"))
    };
    tokio::time::timeout(Duration::from_secs(3), go)
        .await
        .map_err(|_| "no echo within 3 s".to_owned())?
}

#[test]
fn a_rotated_member_is_unpublished_at_once_and_deleted_after_the_drain_grace() {
    if std::env::var_os(INNER).is_some() {
        standalone_support::block_on(inside());
        return;
    }
    standalone_support::rerun_in_netns(TEST, INNER);
}

async fn inside() {
    let work = tempfile::tempdir().unwrap();
    let hosts = FakeHosts::start(work.path(), ENTRY, IMAGE, &["h1"]).await;
    let e = echo().await;
    let (target, stop_target) = ping_target().await;
    let _target = stop_target.drop_guard();
    let daemons = tinyproxies(SLOTS, MEMBER_PORT, MEMBER_USER, MEMBER_PW).await;
    let fake = &hosts.fakes["h1"];
    let egress_of = |ip: &str| daemons[&ip.parse::<Ipv4Addr>().unwrap()].egress.to_string();

    let cfg = work.path().join("providers.yaml");
    hosts.write_config(&cfg, ENTRY, IMAGE, LOOPBACK_POLICY);
    let dir = manifest_dir(
        work.path(),
        &[
            ("members.cred", MEMBER_USER, MEMBER_PW),
            ("alice.cred", "alice", ALICE_PW),
        ],
    );
    pool_manifest(&dir, 1);
    let log = work.path().join("operator.log");
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 9464));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        "1s",
        [
            "--health-target",
            &format!("http://{}/", e.addr),
            "--health-interval",
            "1s",
            "--gateway-access-log",
            "off",
        ],
        log,
        60,
    );

    // Every member healthy, and the gateway serving.
    let t0 = Instant::now();
    let first = loop {
        let m = members(listen).await;
        if m.values().filter(|r| r.available).count() == REPLICAS {
            break m;
        }
        op.assert_running();
        assert!(
            t0.elapsed() < DEADLINE,
            "members {m:?} after {DEADLINE:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let gw = SocketAddr::from((Ipv4Addr::LOCALHOST, HTTP_PORT));
    // A tunnel through the gateway to the ping target, held open; the target names the
    // member's egress address.
    let (mut tunnel, egress) = loop {
        match http_tunnel(gw, "alice", ALICE_PW, &target.to_string()).await {
            Ok(s) => {
                let mut t = tokio::io::BufReader::new(s);
                let mut line = String::new();
                t.read_line(&mut line).await.unwrap();
                break (t, line.trim().to_owned());
            }
            Err(err) => {
                assert!(err.starts_with("HTTP/1.1 503"), "{err}");
                assert!(
                    t0.elapsed() < DEADLINE,
                    "the gateway never served\n{}",
                    op.tail()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let held = first
        .iter()
        .find(|(_, r)| r.ip.as_deref().is_some_and(|ip| egress_of(ip) == egress))
        .map(|(n, r)| (n.clone(), r.ip.clone().unwrap()))
        .unwrap_or_else(|| panic!("{egress} is no member's egress: {first:?}"));
    let (held, held_ip) = held;
    ping(&mut tunnel, "before").await.unwrap();
    println!(
        "eptest: {REPLICAS} members after {:.1} s; a tunnel through {held} ({egress})",
        t0.elapsed().as_secs_f64()
    );

    // Rotate: a new template label.
    pool_manifest(&dir, 2);
    let t1 = Instant::now();
    let (unpublished_at, domain) = loop {
        let m = members(listen).await;
        let healthy = get(listen, "/pools/fleet/healthy.txt")
            .await
            .unwrap_or_default();
        let row = m.get(&held).cloned();
        if let Some(r) = &row
            && r.draining
        {
            // Unpublished: already off the healthy list, its Proxy (and VM) still there.
            assert!(!r.available, "{r:?}");
            assert!(
                !healthy.contains(&format!("{held_ip}:{MEMBER_PORT}")),
                "{held} unpublished but still in healthy.txt:\n{healthy}"
            );
            assert_eq!(r.phase, "Running", "{r:?}");
            break (Instant::now(), r.domain.clone().expect("its VM"));
        }
        assert!(
            row.is_some_and(|r| r.ip.is_some()),
            "{held} went without being unpublished first: {m:?}\n{}",
            op.tail()
        );
        assert!(
            t1.elapsed() < DEADLINE,
            "{held} never unpublished: {m:?}\n{}",
            op.tail()
        );
        ping(&mut tunnel, "rotating").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "eptest: {held} unpublished {:.1} s after the template change",
        t1.elapsed().as_secs_f64()
    );
    // The gateway stops choosing it within a second: its egress address names no member.
    let by_egress = format!("alice-egress-{egress}");
    loop {
        match http_tunnel(gw, &by_egress, ALICE_PW, &e.addr.to_string()).await {
            Err(err) => {
                assert!(err.starts_with("HTTP/1.1 "), "{err}");
                break;
            }
            Ok(_) => assert!(
                unpublished_at.elapsed() < Duration::from_secs(1),
                "the gateway still chose {held} a second after it was unpublished"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..4 {
        let t = http_tunnel(gw, "alice", ALICE_PW, &e.addr.to_string())
            .await
            .unwrap();
        assert_ne!(echo_ip(t, e.addr).await, egress, "round robin chose {held}");
    }
    // The open tunnel works, and the member stays, until the grace is nearly over.
    let mut pings = 0;
    while unpublished_at.elapsed() + Duration::from_millis(1500) < GRACE {
        ping(&mut tunnel, &format!("drain-{pings}"))
            .await
            .unwrap_or_else(|err| {
                panic!(
                    "the tunnel through {held} broke {:.1} s into the grace: {err}\n{}",
                    unpublished_at.elapsed().as_secs_f64(),
                    op.tail()
                )
            });
        pings += 1;
        let m = members(listen).await;
        let r = m.get(&held);
        assert!(
            r.is_some_and(|r| r.draining && r.phase == "Running") && fake.domain(&domain).is_some(),
            "{held} (VM {domain}) not kept {:.1} s into the grace: {r:?}\n{}",
            unpublished_at.elapsed().as_secs_f64(),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "eptest: {pings} pings through {held} during its grace; its Proxy kept {:.1} s",
        unpublished_at.elapsed().as_secs_f64()
    );
    // Then it is deleted: its Proxy and its VM go.
    let gone_at = loop {
        let m = members(listen).await;
        if !m.contains_key(&held) && fake.domain(&domain).is_none() {
            break Instant::now();
        }
        assert!(
            unpublished_at.elapsed() < GRACE + DEADLINE,
            "{held} not deleted after its grace: {m:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let waited = gone_at - unpublished_at;
    assert!(
        waited + Duration::from_millis(1500) >= GRACE,
        "{held} deleted {:.1} s after it was unpublished, before the grace {GRACE:?}",
        waited.as_secs_f64()
    );
    println!(
        "eptest: {held} deleted {:.1} s after it was unpublished (grace {GRACE:?})",
        waited.as_secs_f64()
    );
    // The rotation ends with two current members carrying the pool.
    let t2 = Instant::now();
    loop {
        let m = members(listen).await;
        let ok: BTreeSet<&String> = m
            .iter()
            .filter(|(_, r)| r.available && !r.draining)
            .map(|(n, _)| n)
            .collect();
        if ok.len() == REPLICAS && !ok.iter().any(|n| first.contains_key(*n)) {
            break;
        }
        assert!(t2.elapsed() < DEADLINE, "{m:?}\n{}", op.tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = http_tunnel(gw, "alice", ALICE_PW, &e.addr.to_string())
        .await
        .unwrap();
    assert_ne!(echo_ip(t, e.addr).await, egress);
    drop(op);
    println!("eptest: the rotated member drained for its grace, then went");
}
