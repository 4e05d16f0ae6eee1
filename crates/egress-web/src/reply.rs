//! Whole responses of the serving layer: a status code, a content type and a body.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

/// `v` as JSON (500 when it cannot be encoded).
pub(crate) fn json<T: serde::Serialize>(v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(j) => respond(StatusCode::OK, "application/json", j),
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("cannot encode: {e}\n"),
        ),
    }
}

/// A response with `code`, `content_type` and `body`.
pub(crate) fn respond(
    code: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}
