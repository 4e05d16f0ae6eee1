//! A proxy (or whatever listens at its address) cannot make the operator copy its reply into
//! status: every probe error describes the reply by its class only, never by its bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use egress_core::health::probe::{CheckTarget, ProxyEndpoint, probe};
use egress_core::model::ProxyProtocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Deadline of each probe (loopback peers answer at once).
const PROBE_DEADLINE: Duration = Duration::from_secs(10);
const SECRET: &str = "INTERNAL-SECRET-7f3a";

/// A listener on loopback that reads what the client sends, then writes each of `replies`
/// in turn (one per read) and closes.
async fn hostile(replies: Vec<Vec<u8>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let replies = replies.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                for r in replies {
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(&r).await;
                }
            });
        }
    });
    addr
}

fn target() -> CheckTarget {
    CheckTarget {
        host: "127.0.0.1".into(),
        port: 9,
        path: "/".into(),
    }
}

async fn error_of(addr: SocketAddr, protocol: ProxyProtocol) -> String {
    let ep = ProxyEndpoint {
        addr,
        protocol,
        credentials: None,
    };
    let e = tokio::time::timeout(PROBE_DEADLINE, probe(&ep, &target(), PROBE_DEADLINE))
        .await
        .expect("the probe ends by its deadline")
        .expect_err("a hostile reply is a failure");
    format!("{e} {e:?} {}", e.reason())
}

#[tokio::test]
async fn a_hostile_reply_never_lands_in_the_probe_error_only_its_class() {
    let cases: Vec<(&str, ProxyProtocol, Vec<Vec<u8>>)> = vec![
        (
            "refusal with a banner",
            ProxyProtocol::Http,
            vec![format!("HTTP/1.1 407 {SECRET}\r\nX-Leak: {SECRET}\r\n\r\n").into_bytes()],
        ),
        (
            "an internal service's banner",
            ProxyProtocol::Http,
            vec![format!("SSH-2.0-{SECRET}\r\n\r\n").into_bytes()],
        ),
        (
            "a banner and a close",
            ProxyProtocol::Http,
            vec![format!("220 {SECRET} ESMTP").into_bytes()],
        ),
        (
            "a tunnel, then a target page",
            ProxyProtocol::Http,
            vec![
                b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec(),
                format!("HTTP/1.1 500 {SECRET}\r\n\r\n").into_bytes(),
            ],
        ),
        (
            "a tunnel, then a body without an IP",
            ProxyProtocol::Http,
            vec![
                b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec(),
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{SECRET}",
                    SECRET.len()
                )
                .into_bytes(),
            ],
        ),
        (
            "not SOCKS",
            ProxyProtocol::Socks5,
            vec![SECRET.as_bytes().to_vec()],
        ),
    ];
    for (what, protocol, replies) in cases {
        let addr = hostile(replies).await;
        let e = error_of(addr, protocol).await;
        println!("{what}: {e}");
        assert!(!e.contains(SECRET), "{what}: reply bytes in the error: {e}");
        assert!(!e.contains("7f3a") && !e.contains("SSH-2.0"), "{what}: {e}");
    }
}
