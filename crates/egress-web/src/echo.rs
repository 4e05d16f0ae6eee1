//! The check target: a tiny HTTP server that answers every `GET` with the caller's address
//! (`egress-proxies echo --listen ADDR`, or [`serve`] inside any process).
//!
//! Format (documented for users who run their own target): status 200,
//! `Content-Type: text/plain`, body = the caller's IP address followed by one `\n`, e.g.
//! `203.0.113.7\n` (IPv4-mapped IPv6 callers are shown as IPv4). The health engine also accepts
//! a JSON body `{"ip": "203.0.113.7"}` from other targets (`egress_core::health::probe::parse_echo_body`).
//!
//! Guarantees: bounded like the status endpoint — at most [`MAX_CONNECTIONS`] connections at
//! once, headers within [`HEADER_READ_TIMEOUT`], each connection at most
//! [`CONNECTION_DEADLINE`]; bodies are never read; only GET/HEAD are answered. It never makes
//! an outgoing connection. It stops accepting when the token fires.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Most connections served at once.
// NB: one check per proxy per interval; the health engine runs at most 64 at once, so 1024
// serves sixteen operators' rounds at full concurrency while bounding sockets and memory.
pub const MAX_CONNECTIONS: usize = 1024;
/// Time allowed for a request's headers to arrive.
// NB: the request arrives through a proxy right after the tunnel opens; 10 s covers a slow
// proxy and cuts slowloris clients.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection is served.
// NB: a check is one request; 30 s bounds a slot held by a client that never closes.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);

/// The body answered to a caller at `peer`: its IP and a newline.
pub fn answer_body(peer: SocketAddr) -> String {
    let ip = match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    format!("{ip}\n")
}

fn respond(method: &Method, peer: SocketAddr) -> Response<Full<Bytes>> {
    let (code, body) = if method == Method::GET || method == Method::HEAD {
        (StatusCode::OK, answer_body(peer))
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".into(),
        )
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    r
}

/// Serves the echo on `listener` until `shutdown` fires.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "echo: accept failed");
                    // NB: EMFILE and friends: back off briefly instead of spinning.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = respond(req.method(), peer);
                async move { Ok::<_, Infallible>(r) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_DEADLINE, conn) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_body_is_the_callers_ip_on_one_line_with_mapped_v6_shown_as_v4() {
        assert_eq!(
            answer_body("127.0.0.1:5000".parse().unwrap()),
            "127.0.0.1\n"
        );
        assert_eq!(
            answer_body("[::ffff:192.0.2.1]:1".parse().unwrap()),
            "192.0.2.1\n"
        );
        assert_eq!(
            answer_body("[2001:db8::2]:1".parse().unwrap()),
            "2001:db8::2\n"
        );
    }
}
