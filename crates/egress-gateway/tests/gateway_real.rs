//! The gateway with REAL members: Debian's tinyproxy and dante started with the configs a
//! guest gets (tests/support), each leaving from its own loopback address so the echo
//! target tells which member carried a connection. Needs root (tinyproxy drops to its user,
//! dante runs in a private mount namespace) and the packages of .ci/setup-host.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use egress_gateway::{Balance, ByteBudget, Limits, PoolSettings};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PW: &str = "client-password-1";

fn alice() -> Vec<egress_gateway::Credential> {
    vec![client("alice", PW), client("bob", "bob-password-22")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_spreads_connections_over_every_member_in_turn() {
    let e = echo().await;
    let m: Vec<Daemon> = vec![
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
        tinyproxy(2, "m2", "member-password-2222").await,
    ];
    let gw = Gateway::start(settings(), alice(), m.iter().map(member).collect()).await;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..30 {
        *seen
            .entry(ip_via_http(&gw, "alice", PW, &e).await.unwrap())
            .or_default() += 1;
    }
    let want: BTreeMap<String, u32> = m.iter().map(|d| (d.egress.to_string(), 10)).collect();
    assert_eq!(seen, want, "round robin gives each member its turn");
    // Least connections: three tunnels held open land on three different members.
    let mut s = settings();
    s.balance = Balance::LeastConnections;
    let gw2 = Gateway::start(s, alice(), m.iter().map(member).collect()).await;
    let mut held = Vec::new();
    let mut firsts = BTreeSet::new();
    for _ in 0..3 {
        let t = http_tunnel(gw2.http, "alice", PW, &e.addr.to_string())
            .await
            .unwrap();
        held.push(t);
    }
    for t in held {
        firsts.insert(echo_ip(t, e.addr).await);
    }
    assert_eq!(firsts.len(), 3, "{firsts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_to_one_member_across_a_hundred_connections() {
    let e = echo().await;
    let m: Vec<Daemon> = vec![
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
        tinyproxy(2, "m2", "member-password-2222").await,
    ];
    let gw = Gateway::start(settings(), alice(), m.iter().map(member).collect()).await;
    let mut seen = BTreeSet::new();
    for i in 0..100 {
        // Both listeners: a session is a session whatever the client protocol.
        let ip = if i % 2 == 0 {
            ip_via_http(&gw, "alice-session-cart42", PW, &e)
                .await
                .unwrap()
        } else {
            let t = socks_tunnel(gw.socks, "alice-session-cart42", PW, e.addr)
                .await
                .unwrap();
            echo_ip(t, e.addr).await
        };
        seen.insert(ip);
    }
    assert_eq!(seen.len(), 1, "one member for the session: {seen:?}");
    // Other sessions spread over the members (rendezvous hashing, not one member for all).
    let mut spread = BTreeSet::new();
    for s in 0..24 {
        spread.insert(
            ip_via_http(&gw, &format!("alice-session-s{s}"), PW, &e)
                .await
                .unwrap(),
        );
    }
    assert_eq!(spread.len(), 3, "{spread:?}");
    let text = gw.metrics_text();
    assert!(
        text.contains(
            "egress_proxies_gateway_sticky_sessions_total{pool=\"default/web\",result=\"hit\"} 99"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_sessions_member_moves_only_its_sessions_and_no_client_sees_an_error() {
    let e = echo().await;
    let mut m: Vec<Daemon> = vec![
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
        tinyproxy(2, "m2", "member-password-2222").await,
    ];
    let gw = Gateway::start(settings(), alice(), m.iter().map(member).collect()).await;
    let sessions: Vec<String> = (0..30).map(|s| format!("alice-session-k{s}")).collect();
    let mut before = BTreeMap::new();
    for s in &sessions {
        before.insert(s.clone(), ip_via_http(&gw, s, PW, &e).await.unwrap());
    }
    let victim = m[1].egress.to_string();
    assert!(
        before.values().any(|ip| *ip == victim),
        "some session on member 1"
    );
    m[1].kill().await;
    // The gateway still lists the dead member (health checks have not noticed yet): the next
    // connection of each of its sessions fails over, without an error to the client.
    let mut after = BTreeMap::new();
    for s in &sessions {
        let ip = ip_via_http(&gw, s, PW, &e)
            .await
            .unwrap_or_else(|err| panic!("{s}: the client saw an error: {err}"));
        after.insert(s.clone(), ip);
    }
    for s in &sessions {
        if before[s] == victim {
            assert_ne!(after[s], victim, "{s} moved off the dead member");
        } else {
            assert_eq!(after[s], before[s], "{s} stayed: its member lives");
        }
    }
    // Once the member is unpublished, its sessions land where the failover put them (their
    // second choice): the same member with or without the dead one in the list.
    gw.publish(vec![member(&m[0]), member(&m[2])]).await;
    for s in &sessions {
        assert_eq!(ip_via_http(&gw, s, PW, &e).await.unwrap(), after[s], "{s}");
    }
    let text = gw.metrics_text();
    assert!(
        !text.contains("egress_proxies_gateway_failovers_total{pool=\"default/web\"} 0\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_independent_gateways_route_a_session_to_the_same_member() {
    let e = echo().await;
    let m: Vec<Daemon> = vec![
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
        tinyproxy(2, "m2", "member-password-2222").await,
        tinyproxy(3, "m3", "member-password-3333").await,
    ];
    let members: Vec<_> = m.iter().map(member).collect();
    let mut reversed = members.clone();
    reversed.reverse();
    // Two gateways sharing nothing, seeing the members in different orders.
    let a = Gateway::start(settings(), alice(), members).await;
    let b = Gateway::start(settings(), alice(), reversed).await;
    for s in 0..16 {
        let u = format!("bob-session-x{s}");
        let via_a = ip_via_http(&a, &u, "bob-password-22", &e).await.unwrap();
        let via_b = ip_via_http(&b, &u, "bob-password-22", &e).await.unwrap();
        assert_eq!(via_a, via_b, "{u}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_never_cuts_an_open_tunnel_before_the_grace_and_cuts_it_after() {
    let b = blob().await;
    let e = echo().await;
    let m: Vec<Daemon> = vec![
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
    ];
    let mut s = settings();
    s.drain_grace = Duration::from_secs(3);
    let gw = Gateway::start(s, alice(), m.iter().map(member).collect()).await;
    // A session on member 0.
    let user = "alice-session-d0".to_owned();
    let first = ip_via_http(&gw, &user, PW, &e).await.unwrap();
    let on = if first == m[0].egress.to_string() {
        0
    } else {
        1
    };
    let mut t = http_tunnel(gw.http, &user, PW, &b.addr.to_string())
        .await
        .unwrap();
    // Announce a long exchange: 3 chunks up, 1 byte down at the end.
    let total = 3 * 1024u64;
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&total.to_be_bytes());
    h[8..].copy_from_slice(&1u64.to_be_bytes());
    t.write_all(&h).await.unwrap();
    let unpublished = Instant::now();
    gw.publish(vec![member(&m[1 - on])]).await;
    // New connections of the session go elsewhere at once.
    assert_eq!(
        ip_via_http(&gw, &user, PW, &e).await.unwrap(),
        m[1 - on].egress.to_string()
    );
    // The open tunnel keeps working inside the grace.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(unpublished.elapsed() < Duration::from_secs(3));
        t.write_all(&[1u8; 1024])
            .await
            .expect("still open within the grace");
    }
    let mut one = [0u8; 1];
    t.read_exact(&mut one)
        .await
        .expect("the target's answer came through");
    drop(t);
    let lines = gw.log_lines(3).await;
    assert_eq!(lines[2]["outcome"], "ok", "{lines:?}");
    assert_eq!(lines[2]["bytes_up"], 16 + total);
    // A second tunnel through the drained member, opened before the drain, idles past the
    // grace: it is cut then, not before.
    let b2 = blob().await;
    gw.publish(m.iter().map(member).collect()).await;
    let user2 = user.clone();
    let mut t2 = http_tunnel(gw.http, &user2, PW, &b2.addr.to_string())
        .await
        .unwrap();
    let drained = Instant::now();
    gw.publish(vec![member(&m[1 - on])]).await;
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(20), t2.read(&mut buf))
        .await
        .unwrap();
    let cut_after = drained.elapsed();
    assert!(matches!(r, Ok(0) | Err(_)), "cut: {r:?}");
    assert!(
        cut_after >= Duration::from_millis(2900),
        "cut after {cut_after:?}, before the grace"
    );
    assert!(
        cut_after < Duration::from_secs(8),
        "cut after {cut_after:?}"
    );
    // The session's two probes, the two tunnels: the second cut by the drain.
    let lines = gw.log_lines(4).await;
    assert_eq!(
        lines.iter().filter(|l| l["outcome"] == "drained").count(),
        1,
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused_the_same_way_whichever_part_is_wrong() {
    let e = echo().await;
    let m = tinyproxy(0, "m0", "member-password-0000").await;
    let gw = Gateway::start(settings(), alice(), vec![member(&m)]).await;
    let target = e.addr.to_string();
    let wrong_pw = http_tunnel(gw.http, "alice", "nope", &target)
        .await
        .unwrap_err();
    let wrong_user = http_tunnel(gw.http, "mallory", PW, &target)
        .await
        .unwrap_err();
    let other_pw = http_tunnel(gw.http, "alice", "bob-password-22", &target)
        .await
        .unwrap_err();
    let unknown_opt = http_tunnel(gw.http, "alice-sesion-x", PW, &target)
        .await
        .unwrap_err();
    assert!(wrong_pw.starts_with("HTTP/1.1 407 "), "{wrong_pw}");
    assert!(wrong_pw.contains("Proxy-Authenticate: Basic"), "{wrong_pw}");
    assert_eq!(wrong_pw, wrong_user, "no hint which part was wrong");
    assert_eq!(wrong_pw, other_pw);
    assert_eq!(wrong_pw, unknown_opt);
    let no_auth = {
        let mut s = tokio::net::TcpStream::connect(gw.http).await.unwrap();
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        read_head(&mut s).await
    };
    assert!(no_auth.starts_with("HTTP/1.1 407 "), "{no_auth}");
    assert_eq!(
        socks_tunnel(gw.socks, "alice", "nope", e.addr)
            .await
            .unwrap_err(),
        "auth status [1, 1]"
    );
    assert_eq!(
        socks_tunnel(gw.socks, "mallory", PW, e.addr)
            .await
            .unwrap_err(),
        "auth status [1, 1]"
    );
    // The right ones work, and the failures were counted.
    assert_eq!(
        ip_via_http(&gw, "alice", PW, &e).await.unwrap(),
        m.egress.to_string()
    );
    let text = gw.metrics_text();
    assert!(
        text.contains("egress_proxies_gateway_auth_failures_total{pool=\"default/web\"} 7"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_line_per_connection_with_exact_byte_counts() {
    let b = blob().await;
    let m = [
        tinyproxy(0, "m0", "member-password-0000").await,
        danted(1, "m1", "member-password-1111").await,
    ];
    let gw = Gateway::start(settings(), alice(), m.iter().map(member).collect()).await;
    let cases: [(u64, u64); 4] = [(0, 1), (100_000, 7), (3, 2_500_000), (1 << 20, 1 << 20)];
    for (i, (up, down)) in cases.iter().enumerate() {
        let t = if i % 2 == 0 {
            http_tunnel(gw.http, "alice", PW, &b.addr.to_string())
                .await
                .unwrap()
        } else {
            socks_tunnel(gw.socks, "bob-session-z", "bob-password-22", b.addr)
                .await
                .unwrap()
        };
        blob_exchange(t, *up, *down).await;
    }
    // One refused connection is one line too.
    let _ = http_tunnel(gw.http, "alice", "wrong", &b.addr.to_string())
        .await
        .unwrap_err();
    let lines = gw.log_lines(5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines_again = gw.log_lines(5).await;
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(lines_again.len(), 5);
    let mut ok: Vec<(u64, u64)> = lines
        .iter()
        .filter(|l| l["outcome"] == "ok")
        .map(|l| {
            (
                l["bytes_up"].as_u64().unwrap(),
                l["bytes_down"].as_u64().unwrap(),
            )
        })
        .collect();
    ok.sort();
    let mut want: Vec<(u64, u64)> = cases.iter().map(|(u, d)| (u + 16, *d)).collect();
    want.sort();
    assert_eq!(
        ok, want,
        "bytes each way: the 16-byte header plus the payloads"
    );
    for l in lines.iter().filter(|l| l["outcome"] == "ok") {
        assert_eq!(l["pool"], "default/web");
        assert_eq!(l["kind"], "connect");
        assert_eq!(l["target"], b.addr.to_string());
        assert!(l["member"].as_str().unwrap().starts_with("member-"));
        assert_eq!(l["attempts"], 1);
        assert!(l["time"].as_str().unwrap().ends_with('Z'));
        assert!(
            l["member_egress"][0]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.2")
        );
    }
    let socks: Vec<_> = lines.iter().filter(|l| l["listener"] == "socks5").collect();
    assert_eq!(socks.len(), 2);
    assert!(
        socks
            .iter()
            .all(|l| l["identity"] == "bob" && l["session"] == "z")
    );
    let refused: Vec<_> = lines
        .iter()
        .filter(|l| l["outcome"] == "auth_failed")
        .collect();
    assert_eq!(refused.len(), 1);
    assert!(refused[0].get("identity").is_none());
    // The metrics agree with the log.
    let text = gw.metrics_text();
    let up: u64 = want.iter().map(|w| w.0).sum();
    assert!(
        text.contains(&format!(
            "egress_proxies_gateway_bytes_total{{pool=\"default/web\",direction=\"up\"}} {up}"
        )),
        "{text}"
    );
    assert!(text.contains("egress_proxies_gateway_client_connections_total{pool=\"default/web\",identity=\"bob\"} 2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_dialled_with_their_own_protocol_and_credentials_and_a_bad_member_is_skipped() {
    let e = echo().await;
    let tiny = tinyproxy(0, "m0", "member-password-0000").await;
    let dante = danted(1, "m1", "member-password-1111").await;
    // A member whose credentials the gateway has wrong: refused by the member, skipped.
    let refusing = tinyproxy(2, "m2", "member-password-2222").await;
    let mut wrong = member(&refusing);
    wrong.credentials.as_mut().unwrap().password = "not-its-password".into();
    let mut s = settings();
    s.attempts = 3;
    let gw = Gateway::start(s, alice(), vec![member(&tiny), member(&dante), wrong]).await;
    let mut seen = BTreeSet::new();
    for i in 0..12 {
        let ip = if i % 2 == 0 {
            ip_via_http(&gw, "alice", PW, &e).await.unwrap()
        } else {
            let t = socks_tunnel(gw.socks, "alice", PW, e.addr).await.unwrap();
            echo_ip(t, e.addr).await
        };
        seen.insert(ip);
    }
    let want: BTreeSet<String> = [tiny.egress.to_string(), dante.egress.to_string()].into();
    assert_eq!(seen, want, "the member refusing the gateway is never used");
    let text = gw.metrics_text();
    assert!(
        !text.contains("egress_proxies_gateway_dial_failures_total{pool=\"default/web\",reason=\"member_auth\"} 0\n"),
        "{text}"
    );
    // An absolute-URI request through each kind of member.
    for egress_member in [&tiny, &dante] {
        let mut c = tokio::net::TcpStream::connect(gw.http).await.unwrap();
        let req = format!(
            "GET http://{}/ HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {}\r\n\r\n",
            e.addr,
            e.addr,
            base64_basic(&format!("alice-egress-{}", egress_member.egress), PW)
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut resp = String::new();
        tokio::time::timeout(IO_DEADLINE, c.read_to_string(&mut resp))
            .await
            .unwrap()
            .unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(
            resp.ends_with(&format!("{}\n", egress_member.egress)),
            "{resp}"
        );
    }
}

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_choice_limits_and_destination_rules_refuse_clearly() {
    let e = echo().await;
    let m = [
        tinyproxy(0, "m0", "member-password-0000").await,
        tinyproxy(1, "m1", "member-password-1111").await,
    ];
    let mut s: PoolSettings = settings();
    s.limits = Limits {
        max_connections: Some(1),
        bytes: Some(ByteBudget {
            bytes: 2000,
            period: Duration::from_secs(3600),
        }),
    };
    s.destinations.ports = vec![e.addr.port()];
    let gw = Gateway::start(s, alice(), m.iter().map(member).collect()).await;
    // -egress- picks exactly that member.
    for d in &m {
        for _ in 0..3 {
            // One open connection per identity: the previous one must have ended.
            gw.idle().await;
            assert_eq!(
                ip_via_http(
                    &gw,
                    &format!("bob-egress-{}", d.egress),
                    "bob-password-22",
                    &e
                )
                .await
                .unwrap(),
                d.egress.to_string()
            );
        }
    }
    gw.idle().await;
    let none = http_tunnel(
        gw.http,
        "bob-egress-192.0.2.9",
        "bob-password-22",
        &e.addr.to_string(),
    )
    .await
    .unwrap_err();
    assert!(none.starts_with("HTTP/1.1 503 "), "{none}");
    assert!(
        none.contains("no published member of the pool has egress address 192.0.2.9"),
        "{none}"
    );
    // A destination port outside the pool's allowlist: refused before any member is tried.
    let denied = http_tunnel(gw.http, "bob", "bob-password-22", "127.0.0.1:9")
        .await
        .unwrap_err();
    assert!(denied.starts_with("HTTP/1.1 403 "), "{denied}");
    assert!(
        denied.contains("port 9 is not among the pool's allowed destination ports"),
        "{denied}"
    );
    // One open connection per identity.
    let held = http_tunnel(gw.http, "alice", PW, &e.addr.to_string())
        .await
        .unwrap();
    let second = http_tunnel(gw.http, "alice", PW, &e.addr.to_string())
        .await
        .unwrap_err();
    assert!(second.starts_with("HTTP/1.1 429 "), "{second}");
    assert!(
        second.contains("already has 1 open connections"),
        "{second}"
    );
    let socks = socks_tunnel(gw.socks, "alice", PW, e.addr)
        .await
        .unwrap_err();
    assert_eq!(socks, "reply code 2");
    echo_ip(held, e.addr).await;
    // Bytes: the budget of 2000 is spent after a few requests; then refused.
    let mut refused = None;
    for i in 0..40 {
        gw.idle().await;
        match ip_via_http(&gw, "alice", PW, &e).await {
            Ok(_) => {}
            Err(r) => {
                refused = Some((i, r));
                break;
            }
        }
    }
    let (i, r) = refused.expect("the byte budget refused a connection");
    assert!(i > 0 && r.starts_with("HTTP/1.1 429 "), "{i}: {r}");
    assert!(r.contains("budget of 2000 bytes per 3600s"), "{r}");
    // Bad session syntax after a good password: a clear 400.
    let bad = http_tunnel(
        gw.http,
        "bob-session-a-ttl-5x",
        "bob-password-22",
        &e.addr.to_string(),
    )
    .await
    .unwrap_err();
    assert!(
        bad.starts_with("HTTP/1.1 400 ") && bad.contains("not a duration"),
        "{bad}"
    );
    let lines = gw.log_lines(10).await;
    assert!(lines.iter().any(|l| l["outcome"] == "limited"));
    assert!(
        lines
            .iter()
            .any(|l| l["outcome"] == "denied" && l["attempts"] == 0)
    );
    assert!(lines.iter().any(|l| l["outcome"] == "no_member"));
}
