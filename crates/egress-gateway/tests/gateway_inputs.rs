//! Bad input at the gateway: malformed and oversized request heads, slow clients, the wrong
//! protocol on a listener, SOCKS5 version, method, command and address-type errors, random
//! bytes. Each gets a clear refusal (an HTTP status with a sentence, a SOCKS5 reply code, or
//! a close where the protocol has no way to answer), one access-log line, bounded memory, and
//! the gateway keeps serving a well-behaved client throughout (a real tinyproxy member).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use std::time::{Duration, Instant};

use egress_gateway::bufpool::HEAD;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PW: &str = "client-password-1";

async fn reply_to(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(IO_DEADLINE, s.read_to_end(&mut out))
        .await
        .expect("the gateway answered and closed");
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_refusals_and_everyone_else_is_still_served() {
    let e = echo().await;
    let m = tinyproxy(0, "m0", "member-password-0000").await;
    let mut s = settings();
    s.timeouts.request = Duration::from_secs(2);
    let gw = Gateway::start(s, vec![client("alice", PW)], vec![member(&m)]).await;

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\x16\x03\x01\x02\x00\x01\x00".to_vec(), "HTTP/1.1 400 "),
        (
            b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "HTTP/1.1 400 ",
        ),
        (
            b"GET ftp://x.example/ HTTP/1.1\r\n\r\n".to_vec(),
            "HTTP/1.1 400 ",
        ),
        (
            b"CONNECT nohostport HTTP/1.1\r\n\r\n".to_vec(),
            "HTTP/1.1 400 ",
        ),
        (
            b"CONNECT a.example:443 HTTP/9.9\r\n\r\n".to_vec(),
            "HTTP/1.1 400 ",
        ),
        (b"\x05\x01\x02".to_vec(), "HTTP/1.1 400 "),
        (
            [
                b"CONNECT a.example:443 HTTP/1.1\r\nX: ".as_slice(),
                &vec![b'a'; 20_000],
            ]
            .concat(),
            "HTTP/1.1 431 ",
        ),
    ];
    for (bytes, want) in &cases {
        let r = text(&reply_to(gw.http, bytes).await);
        assert!(
            r.starts_with(want),
            "{:?} -> {r}",
            text(&bytes[..bytes.len().min(40)])
        );
        assert!(
            r.contains("Proxy-Status: egress-proxies-gateway; error="),
            "{r}"
        );
        assert!(r.contains("Connection: close"), "{r}");
    }
    let r = text(&reply_to(gw.http, b"\x05\x01\x02").await);
    assert!(r.contains("look like SOCKS5"), "{r}");

    // SOCKS5 listener.
    assert_eq!(
        reply_to(gw.socks, &[4, 1, 0, 80, 1, 2, 3, 4, 0]).await,
        b"",
        "SOCKS4: closed"
    );
    assert_eq!(
        reply_to(gw.socks, b"CONNECT x:1 HTTP/1.1\r\n\r\n").await,
        b""
    );
    assert_eq!(
        reply_to(gw.socks, &[5, 1, 0]).await,
        [5, 0xff],
        "no username method"
    );
    let login = |user: &str| {
        let mut v = vec![5, 1, 2, 1, user.len() as u8];
        v.extend_from_slice(user.as_bytes());
        v.push(PW.len() as u8);
        v.extend_from_slice(PW.as_bytes());
        v
    };
    let bind = [login("alice"), vec![5, 2, 0, 1, 127, 0, 0, 1, 0, 80]].concat();
    assert_eq!(
        reply_to(gw.socks, &bind).await,
        [&[5u8, 2, 1, 0][..], &[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]].concat(),
        "BIND: command not supported"
    );
    let atyp = [login("alice"), vec![5, 1, 0, 9, 0, 0]].concat();
    assert_eq!(
        reply_to(gw.socks, &atyp).await,
        [&[5u8, 2, 1, 0][..], &[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]].concat()
    );
    // A bad session ID after a good password: the login succeeds, the request is refused.
    let bad_session = [
        login("alice-session-bad!id"),
        vec![5, 1, 0, 1, 127, 0, 0, 1, 0, 80],
    ]
    .concat();
    assert_eq!(
        reply_to(gw.socks, &bad_session).await,
        [&[5u8, 2, 1, 0][..], &[5, 1, 0, 1, 0, 0, 0, 0, 0, 0]].concat()
    );
    // An unknown name is a failed login.
    let unknown = [login("mallory"), vec![5, 1, 0, 1, 127, 0, 0, 1, 0, 80]].concat();
    assert_eq!(reply_to(gw.socks, &unknown).await, [5, 2, 1, 1]);

    // A slow client is cut at the request deadline; meanwhile others are served.
    let slow = tokio::spawn({
        let addr = gw.http;
        async move {
            let t0 = Instant::now();
            let mut s = TcpStream::connect(addr).await.unwrap();
            for b in b"CONNECT a.example:443 HTTP/1.1\r\n" {
                if s.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                if t0.elapsed() > Duration::from_secs(5) {
                    break;
                }
            }
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            (t0.elapsed(), text(&out))
        }
    });
    for _ in 0..5 {
        assert_eq!(
            ip_via_http(&gw, "alice", PW, &e).await.unwrap(),
            m.egress.to_string()
        );
    }
    let (took, r) = slow.await.unwrap();
    assert!(r.starts_with("HTTP/1.1 408 "), "{r}");
    assert!(took < Duration::from_secs(4), "{took:?}");

    // Random bytes: never a crash; every connection ends with one log line.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let n_random = 200;
    for i in 0..n_random {
        let len = (seed % 700) as usize;
        let mut b = Vec::with_capacity(len);
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b.push(seed as u8);
        }
        if i % 3 == 0 && !b.is_empty() {
            b[0] = 5;
        }
        let addr = if i % 2 == 0 { gw.http } else { gw.socks };
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&b).await;
        let _ = s.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(IO_DEADLINE, s.read_to_end(&mut out))
            .await
            .unwrap();
    }
    assert_eq!(
        ip_via_http(&gw, "alice", PW, &e).await.unwrap(),
        m.egress.to_string()
    );
    let expected = cases.len() + 1 + 7 + 1 + 5 + n_random + 1;
    let lines = gw.log_lines(expected).await;
    assert_eq!(lines.len(), expected, "one line per connection");
    assert!(lines.iter().any(|l| l["outcome"] == "request_timeout"));
    assert!(lines.iter().any(|l| l["outcome"] == "bad_request"));
    assert_eq!(gw.set.connections(), 0, "every connection ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_hold_no_buffer_and_are_cut_at_the_request_deadline() {
    let m = tinyproxy(0, "m0", "member-password-0000").await;
    let mut s = settings();
    s.timeouts.request = Duration::from_secs(3);
    let gw = Gateway::start(s, vec![client("alice", PW)], vec![member(&m)]).await;
    let before = HEAD.allocated();
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(TcpStream::connect(gw.http).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(gw.set.connections(), 500);
    // NB: other tests of this binary may take head buffers meanwhile; 500 idle clients
    // holding one each would show as hundreds.
    assert!(
        HEAD.allocated() - before < 50,
        "idle clients took buffers: {} before, {} after",
        before,
        HEAD.allocated()
    );
    let t0 = Instant::now();
    for mut s in idle {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(IO_DEADLINE, s.read_to_end(&mut out))
            .await
            .unwrap();
        assert!(text(&out).starts_with("HTTP/1.1 408 "));
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
}
