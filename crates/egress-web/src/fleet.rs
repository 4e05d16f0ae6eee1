//! The fleet page's routes: `GET /` (the page, [`page::render_page`]), `GET /fleet.json` (the
//! fragment the page's script swaps in, [`page::fragment`]) and
//! `GET /proxies/{namespace}/{name}` (one Proxy's row of `/status`, JSON).
//!
//! Guarantees: each answer is built from one [`Endpoints::status`] document (plus
//! [`Endpoints::hosts`] and a copy of the history), so the page, the fragment and `/status`
//! show the same facts; the HTML answers carry [`page::content_security_policy`],
//! `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` and
//! `Cache-Control: no-store`; a path this module does not know is left to the other routes.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use crate::endpoints::Endpoints;
use crate::filters::Filters;
use crate::history::History;
use crate::page::{self, Fleet};
use crate::reply::{json, respond};

fn harden(mut r: Response<Full<Bytes>>, csp: bool) -> Response<Full<Bytes>> {
    let h = r.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if csp {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(page::content_security_policy()),
        );
    }
    r
}

/// The answer to `path` when it is one of the fleet routes, else `None`.
pub(super) fn answer(
    ep: &dyn Endpoints,
    history: Option<&History>,
    path: &str,
    query: Option<&str>,
) -> Option<Response<Full<Bytes>>> {
    match path {
        "/" | "/fleet.json" => {
            let doc = ep.status();
            let hosts = ep.hosts();
            let snapshot = history.map(History::snapshot).unwrap_or_default();
            let pools: Vec<page::PoolSummary> = doc
                .pools
                .iter()
                .map(|p| page::PoolSummary {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    ready: p.status.available_replicas,
                    desired: p.desired,
                })
                .collect();
            let fleet = Fleet {
                doc: &doc,
                hosts: &hosts,
                pools: &pools,
                history: &snapshot,
            };
            let filters = Filters::from_query(query);
            Some(if path == "/" {
                harden(
                    respond(
                        StatusCode::OK,
                        "text/html; charset=utf-8",
                        page::render_page(&fleet, &filters),
                    ),
                    true,
                )
            } else {
                harden(json(&page::fragment(&fleet, &filters)), false)
            })
        }
        _ => {
            let rest = path.strip_prefix("/proxies/")?;
            let (ns, name) = rest.split_once('/')?;
            if ns.is_empty() || name.is_empty() || name.contains('/') {
                return None;
            }
            let doc = ep.status();
            // NB: compare encoded forms, so a link the page made always finds its row and no
            // percent-decoding of hostile input is needed.
            let row = doc.proxies.iter().find(|p| {
                page::encode_segment(&p.namespace) == ns && page::encode_segment(&p.name) == name
            });
            Some(harden(
                match row {
                    Some(r) => json(r),
                    None => respond(StatusCode::NOT_FOUND, "text/plain", "no such proxy\n"),
                },
                false,
            ))
        }
    }
}
