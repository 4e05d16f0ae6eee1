//! The standalone HTTP endpoint: `GET /status` (JSON [`StatusDocument`]), `GET /metrics`
//! (the Prometheus text format, or OpenMetrics when `Accept` prefers it), `GET /healthz`
//! (the process is alive), `GET /readyz` (config
//! loaded and first adoption done), `GET /proxies` (JSON: every Proxy's row with its health
//! and egress IP), `GET /hosts` (JSON: every host's last check, [`HostHealth`]) and
//! `GET /healthy.txt` (one `ip:port` per line of every Running proxy the health engine
//! decided healthy, sorted; empty when none is or health checks are off; built from the rows a
//! chunk at a time like `/status`),
//! `GET /pools/NAME/healthy.txt` (or `/pools/NAMESPACE/NAME/healthy.txt`: `ip:port` of each
//! member the pool counts as available, sorted; 404 for an unknown pool). A listener may
//! answer only a subset ([`Routes`]): Kubernetes mode serves the probes on its main port and
//! the status views only on an opt-in second one.
//!
//! The fleet page ([`page`], routes in `fleet`): `GET /` (HTML: hosts, pools, proxies,
//! filters as query parameters, sparklines of the last hour from [`history`]), `GET
//! /fleet.json` (the fragment the page's script swaps in every few seconds) and `GET
//! /proxies/{namespace}/{name}` (one Proxy's row, JSON). A listener that serves `/` samples
//! its [`history`] every [`history::SAMPLE_INTERVAL`] for as long as it runs.
//!
//! `/status` and `/proxies` (with or without filters) are streamed ([`stream`]): their rows
//! are built and serialized a chunk at a time as the body is sent, so a request's memory is
//! the rows' UIDs plus one chunk, not the whole fleet's document and its JSON (the JSON is
//! the same, byte for byte). The other answers are built whole.
//!
//! Guarantees: request handling is bounded — at most [`MAX_CONNECTIONS`] connections at a
//! time (others wait in the kernel backlog), headers must arrive within
//! [`HEADER_READ_TIMEOUT`], a connection lives at most [`CONNECTION_DEADLINE`], request
//! bodies are never read, only GET/HEAD are answered. The server stops accepting when the
//! shutdown token fires.
//!
//! NB: hyper directly rather than axum: a few fixed GET routes, one path prefix and one
//! query string need no router, and hyper is already in the dependency tree (reqwest); axum would add a router,
//! tower middleware and their transitive crates for a `match` on the path.

use std::convert::Infallible;
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

use crate::status::StatusDocument;
use egress_core::metrics::MetricsFormat;

use crate::endpoints::Endpoints;
use crate::filters::Filters;
use crate::history::{self, History};
use crate::host_check::HostCheck;
use crate::reply::{json, respond};
use crate::stream::{Body, StatusBody, View};
use crate::{fleet, stream};

/// Most connections served at once.
// NB: the endpoint serves a Prometheus scraper, a health checker and an occasional `status`
// CLI; 64 leaves room for several of each while bounding memory under a connection flood.
pub const MAX_CONNECTIONS: usize = 64;
/// Time allowed for a request's headers to arrive.
// NB: loopback clients send headers at once; 10 s tolerates a loaded host, and cuts slowloris.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection is served (keep-alive included).
// NB: a scrape takes milliseconds; 60 s lets a keep-alive scraper reuse its connection for
// a scrape or two while bounding how long a slot can be held.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(60);

/// The `/healthy.txt` body: `ip:port` of every healthy Running proxy, one per line, sorted.
pub fn healthy_list(doc: &StatusDocument) -> String {
    sorted_lines(
        doc.proxies
            .iter()
            .filter_map(|p| p.healthy_endpoint())
            .map(|a| a.to_string())
            .collect(),
    )
}

/// [`healthy_list`] of `ep`'s rows, built a chunk at a time ([`Endpoints::status_rows`]) when
/// the driver has an outline, so only the healthy endpoints are held, not every row.
pub fn healthy_list_of(ep: &dyn Endpoints) -> String {
    let Some((_, uids)) = ep.status_outline() else {
        return healthy_list(&ep.status());
    };
    let mut eps = Vec::new();
    for chunk in uids.chunks(stream::CHUNK_ROWS) {
        eps.extend(
            ep.status_rows(chunk)
                .iter()
                .filter_map(|p| p.healthy_endpoint())
                .map(|a| a.to_string()),
        );
    }
    sorted_lines(eps)
}

/// `eps` sorted, without duplicates, one per line.
fn sorted_lines(mut eps: Vec<String>) -> String {
    eps.sort();
    eps.dedup();
    let mut out = String::with_capacity(eps.len() * 22);
    for e in eps {
        out.push_str(&e);
        out.push('\n');
    }
    out
}

/// A whole body as the endpoint's [`Body`].
fn boxed(body: Full<Bytes>) -> Body {
    http_body_util::BodyExt::boxed(http_body_util::BodyExt::map_err(
        body,
        |never| match never {},
    ))
}

/// Which routes a listener answers; the others are 404.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// Every route (standalone mode: one loopback listener).
    All,
    /// `/metrics`, `/healthz` and `/readyz` only: what a port reachable from a whole cluster
    /// may show (no Proxy names, addresses or host errors).
    Probes,
    /// `/status`, `/proxies`, `/hosts` and `/healthy.txt` only (Kubernetes mode's opt-in
    /// status listener).
    Status,
}

impl Routes {
    /// Whether `path` is served under this set.
    pub fn serves(self, path: &str) -> bool {
        let probe = matches!(path, "/metrics" | "/healthz" | "/readyz");
        match self {
            Self::All => true,
            Self::Probes => probe,
            Self::Status => !probe,
        }
    }
}

/// Answers one request (pure with respect to the network: no I/O besides `ep`).
pub fn handle(ep: &dyn Endpoints, method: &Method, path: &str) -> Response<Body> {
    handle_request(ep, None, Routes::All, method, path, None)
}

/// Answers one request the way [`serve_routes`] does, except that `/status` and `/proxies`
/// are serialized a chunk at a time from one whole [`Endpoints::status`] document
/// ([`StatusBody::from_document`]; the server builds their rows a chunk at a time too,
/// [`handle_shared`]): the fleet page's routes (with `history`, empty when `None`, and the
/// filters of `query`), `/status` and `/proxies` restricted to the rows the filters of
/// `query` keep ([`page::Filters`]), then [`handle_routes`].
pub fn handle_request(
    ep: &dyn Endpoints,
    history: Option<&History>,
    routes: Routes,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Response<Body> {
    if (method == Method::GET || method == Method::HEAD)
        && routes.serves(path)
        && let Some(r) = fleet::answer(ep, history, path, query)
    {
        return r.map(boxed);
    }
    // `/status` and `/proxies`, with filters (`?phase=Running&host=h1`...) or without.
    if let Some(view) = status_view(routes, method, path) {
        let f = Filters::from_query(query);
        return streamed(StatusBody::from_document(ep.status(), view, &f));
    }
    handle_routes(ep, routes, method, path)
}

/// [`handle_request`] as the server answers it: `/status` and `/proxies` build their rows a
/// chunk at a time from the driver's state as the body is sent ([`StatusBody::live`]).
pub fn handle_shared(
    ep: &Arc<dyn Endpoints>,
    history: Option<&History>,
    routes: Routes,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Response<Body> {
    if let Some(view) = status_view(routes, method, path) {
        let f = Filters::from_query(query);
        return streamed(StatusBody::live(Arc::clone(ep), view, &f));
    }
    handle_request(ep.as_ref(), history, routes, method, path, query)
}

/// Which streamed view answers `method path` on a listener serving `routes`, if any.
fn status_view(routes: Routes, method: &Method, path: &str) -> Option<View> {
    if (method != Method::GET && method != Method::HEAD) || !routes.serves(path) {
        return None;
    }
    match path {
        "/status" => Some(View::Status),
        "/proxies" => Some(View::Proxies),
        _ => None,
    }
}

/// A streamed JSON answer, or a 500 when even its outline cannot be encoded.
fn streamed(body: Result<StatusBody, serde_json::Error>) -> Response<Body> {
    match body {
        Ok(b) => {
            let mut r = Response::new(http_body_util::BodyExt::boxed(b));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("cannot encode status: {e}\n"),
        )
        .map(boxed),
    }
}

/// The JSON and text routes (every route but the fleet page's) restricted to `routes`: any
/// other path is 404 whatever it would have answered.
pub fn handle_routes(
    ep: &dyn Endpoints,
    routes: Routes,
    method: &Method,
    path: &str,
) -> Response<Body> {
    if let Some(view) = status_view(routes, method, path) {
        let f = Filters::default();
        return streamed(StatusBody::from_document(ep.status(), view, &f));
    }
    fixed_routes(ep, routes, method, path).map(boxed)
}

/// Every route of [`handle_routes`] but the streamed ones.
fn fixed_routes(
    ep: &dyn Endpoints,
    routes: Routes,
    method: &Method,
    path: &str,
) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET is served\n",
        );
    }
    if !routes.serves(path) {
        return respond(StatusCode::NOT_FOUND, "text/plain", "not found\n");
    }
    match path {
        "/metrics" => metrics_full(ep, None),
        "/hosts" => json(&ep.hosts()),
        "/healthy.txt" => respond(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            healthy_list_of(ep),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        p if p.starts_with("/pools/") && p.ends_with("/healthy.txt") => {
            let middle = p
                .strip_prefix("/pools/")
                .and_then(|m| m.strip_suffix("/healthy.txt"))
                .unwrap_or_default();
            let (namespace, name) = middle.split_once('/').unwrap_or(("default", middle));
            match ep.pool_healthy(namespace, name) {
                Some(body) if !name.contains('/') => {
                    respond(StatusCode::OK, "text/plain; charset=utf-8", body)
                }
                _ => respond(StatusCode::NOT_FOUND, "text/plain", "no such pool\n"),
            }
        }
        "/readyz" => {
            if ep.ready() {
                respond(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {}\n", ep.not_ready_reason()),
                )
            }
        }
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// `/metrics` in the format the `Accept` header negotiates ([`MetricsFormat::negotiate`]).
pub fn metrics(ep: &dyn Endpoints, accept: Option<&str>) -> Response<Body> {
    metrics_full(ep, accept).map(boxed)
}

fn metrics_full(ep: &dyn Endpoints, accept: Option<&str>) -> Response<Full<Bytes>> {
    let format = MetricsFormat::negotiate(accept);
    respond(StatusCode::OK, format.content_type(), ep.metrics(format))
}

/// The answer to a request whose `Host` the listener does not answer to.
fn misdirected() -> Response<Body> {
    respond(
        StatusCode::MISDIRECTED_REQUEST,
        "text/plain",
        "this endpoint answers requests addressed to an IP address, localhost or a name given \
         with --allowed-host; the Host header named another (a DNS rebinding page?)\n"
            .to_owned(),
    )
    .map(boxed)
}

/// Serves every route on `listener` until `shutdown` fires. Connections in flight end on
/// their own deadline.
pub async fn serve(listener: TcpListener, ep: Arc<dyn Endpoints>, shutdown: CancellationToken) {
    serve_routes(listener, ep, Routes::All, shutdown).await;
}

/// [`serve`] answering only `routes` (any other path is 404), to the `Host` names of
/// [`HostCheck::default`] (IP literals and `localhost`).
pub async fn serve_routes(
    listener: TcpListener,
    ep: Arc<dyn Endpoints>,
    routes: Routes,
    shutdown: CancellationToken,
) {
    serve_checked(listener, ep, routes, HostCheck::default(), shutdown).await;
}

/// [`serve_routes`] answering a request only when `hosts` admits its `Host` header; any
/// other is 421 Misdirected Request, whatever its path (see [`crate::host_check`]).
pub async fn serve_checked(
    listener: TcpListener,
    ep: Arc<dyn Endpoints>,
    routes: Routes,
    hosts: HostCheck,
    shutdown: CancellationToken,
) {
    let hosts = Arc::new(hosts);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let history = Arc::new(History::new());
    // NB: the sampler stops with the server, also when this future is dropped rather than
    // shut down (the guard cancels its token).
    let sampler_stop = shutdown.child_token();
    let _sampler_guard = sampler_stop.clone().drop_guard();
    if routes.serves("/") {
        tokio::spawn(history::run_sampler(
            Arc::clone(&ep),
            Arc::clone(&history),
            history::SAMPLE_INTERVAL,
            sampler_stop,
        ));
    }
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "status endpoint: accept failed");
                    // NB: EMFILE and friends: back off briefly instead of spinning.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let ep = Arc::clone(&ep);
        let history = Arc::clone(&history);
        let hosts = Arc::clone(&hosts);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req: Request<Incoming>| {
                let path = req.uri().path();
                let host = req.headers().get(hyper::header::HOST);
                let r = if !hosts.allows(host.map(hyper::header::HeaderValue::as_bytes)) {
                    misdirected()
                } else if path == "/metrics"
                    && routes.serves(path)
                    && (req.method() == Method::GET || req.method() == Method::HEAD)
                {
                    let accept = req.headers().get(hyper::header::ACCEPT);
                    metrics(ep.as_ref(), accept.and_then(|v| v.to_str().ok()))
                } else {
                    handle_shared(
                        &ep,
                        Some(&history),
                        routes,
                        req.method(),
                        path,
                        req.uri().query(),
                    )
                };
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

    struct Fixed(bool);
    impl Endpoints for Fixed {
        fn status(&self) -> StatusDocument {
            StatusDocument {
                generated_at: "t".into(),
                proxies: vec![],
                hosts: vec![],
                manifest_errors: vec![],
                pools: vec![],
            }
        }
        fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
            "m 1\n".into()
        }
        fn ready(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn routes_answer_and_readiness_follows_adoption() {
        let ep = Fixed(false);
        assert_eq!(
            handle(&ep, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
        assert_eq!(
            handle(&ep, &Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            handle(&Fixed(true), &Method::GET, "/readyz").status(),
            StatusCode::OK
        );
        assert_eq!(
            handle(&ep, &Method::GET, "/status").status(),
            StatusCode::OK
        );
        assert_eq!(
            handle(&ep, &Method::GET, "/nope").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            handle(&ep, &Method::POST, "/status").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn a_restricted_listener_answers_only_its_routes() {
        let ep = Fixed(true);
        for path in ["/metrics", "/healthz", "/readyz"] {
            let probes = handle_routes(&ep, Routes::Probes, &Method::GET, path);
            assert_eq!(probes.status(), StatusCode::OK, "{path}");
            let status = handle_routes(&ep, Routes::Status, &Method::GET, path);
            assert_eq!(status.status(), StatusCode::NOT_FOUND, "{path}");
        }
        for path in ["/status", "/proxies", "/hosts", "/healthy.txt"] {
            let probes = handle_routes(&ep, Routes::Probes, &Method::GET, path);
            assert_eq!(probes.status(), StatusCode::NOT_FOUND, "{path}");
            let status = handle_routes(&ep, Routes::Status, &Method::GET, path);
            assert_eq!(status.status(), StatusCode::OK, "{path}");
            let all = handle_routes(&ep, Routes::All, &Method::GET, path);
            assert_eq!(all.status(), StatusCode::OK, "{path}");
        }
    }

    #[tokio::test]
    async fn a_request_naming_another_host_is_refused_before_any_route() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve_checked(
            l,
            Arc::new(Fixed(true)),
            Routes::All,
            HostCheck::new(["status.example.test"]),
            stop.clone(),
        ));
        for (host, code) in [
            ("rebind.example", "421"),
            ("127.0.0.1", "200"),
            ("status.example.test", "200"),
        ] {
            for path in ["/status", "/metrics", "/"] {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!(
                        "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\nConnection: close\r\n\r\n",
                        addr.port()
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
                let mut buf = String::new();
                s.read_to_string(&mut buf).await.unwrap();
                assert!(
                    buf.starts_with(&format!("HTTP/1.1 {code}")),
                    "{host} {path}: {buf}"
                );
            }
        }
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn the_server_answers_over_loopback_and_stops_on_shutdown() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(l, Arc::new(Fixed(true)), stop.clone()));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        assert!(buf.starts_with("HTTP/1.1 200"), "{buf}");
        assert!(buf.ends_with("m 1\n"), "{buf}");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
