//! The HTTP side of a listener: a client's request head read with check-then-parse, turned
//! into a tunnel request (`CONNECT host:port`) or an absolute-URI request rewritten for the
//! origin (`GET http://host/path` → `GET /path` with `Connection: close`), and the replies the
//! gateway writes.
//!
//! Guarantees:
//! - **Check, then parse**: [`parse`] looks at the method token and for the end of the head
//!   before it runs the parser (`httparse`, with at most [`MAX_HEADERS`] headers on the
//!   stack); an incomplete head is `Ok(None)`, a head past [`MAX_HEAD`] bytes is refused with
//!   431, anything else malformed with 400. Nothing allocates before the head is complete.
//! - **One request per connection** for absolute-URI requests: the rewritten head carries
//!   `Connection: close` and drops the hop-by-hop headers (`Connection`, `Keep-Alive`,
//!   `Proxy-Connection`, `Proxy-Authorization`, `TE`, `Trailer`, `Upgrade`); a request with
//!   both `Content-Length` and `Transfer-Encoding`, or several `Content-Length`s, is refused
//!   (the framing would be ambiguous).
//! - Replies never echo raw client bytes: messages are our own sentences with any client text
//!   escaped ([`crate::text::clip`] and `{:?}`), and header values are sanitised.

use memchr::memmem;

use crate::auth;
use crate::target::{Host, Target, parse_port};

/// The largest request head accepted (HAProxy's default `tune.bufsize` is 16 KiB; nginx's
/// large header buffers are 8 KiB).
pub const MAX_HEAD: usize = crate::bufpool::HEAD_BUF;
/// Most header fields in a request head.
pub const MAX_HEADERS: usize = 64;
/// Longest method token.
const MAX_METHOD: usize = 16;

/// What the client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `CONNECT host:port`: a tunnel.
    Connect,
    /// An absolute-URI request (`GET http://host/path`), forwarded once.
    Forward,
}

impl Kind {
    /// The access log's `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Forward => "forward",
        }
    }
}

/// A complete, valid request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Tunnel or forward.
    pub kind: Kind,
    /// The destination.
    pub target: Target,
    /// The `Proxy-Authorization` credentials, when present and well-formed.
    pub credentials: Option<(String, Vec<u8>)>,
    /// For [`Kind::Forward`]: the head to send the origin.
    pub forward_head: Option<Vec<u8>>,
    /// Bytes of the buffer the head took (what follows is body or early data).
    pub head_len: usize,
}

/// A refused request: the status to answer and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct HttpError {
    /// The HTTP status.
    pub status: u16,
    /// A sentence for the client and the log.
    pub message: String,
}

fn bad(message: impl Into<String>) -> HttpError {
    HttpError {
        status: 400,
        message: message.into(),
    }
}

/// The cheap check: is this the start of an HTTP request line? `Ok(false)`: too early to say.
fn check_method(buf: &[u8]) -> Result<bool, HttpError> {
    for (i, b) in buf.iter().take(MAX_METHOD + 1).enumerate() {
        match b {
            b'A'..=b'Z' => {}
            b' ' if i > 0 => return Ok(true),
            _ => {
                return Err(bad(if buf.first() == Some(&5) {
                    "this listener speaks HTTP; the bytes look like SOCKS5 (use the pool's \
                     socks5 listener)"
                } else {
                    "not an HTTP request (expected METHOD target HTTP/1.x)"
                }));
            }
        }
    }
    if buf.len() > MAX_METHOD {
        return Err(bad("not an HTTP request (method too long)"));
    }
    Ok(false)
}

/// Parses the request head at the start of `buf`: `Ok(None)` until it is complete.
pub fn parse(buf: &[u8]) -> Result<Option<Request>, HttpError> {
    if !check_method(buf)? {
        return Ok(None);
    }
    let window = buf.get(..MAX_HEAD.min(buf.len())).unwrap_or_default();
    let ends = memmem::find(window, b"\n\r\n").is_some() || memmem::find(window, b"\n\n").is_some();
    if !ends {
        return if buf.len() >= MAX_HEAD {
            Err(HttpError {
                status: 431,
                message: format!("the request head is larger than {MAX_HEAD} bytes"),
            })
        } else {
            Ok(None)
        };
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError {
                status: 431,
                message: format!("more than {MAX_HEADERS} header fields"),
            });
        }
        Err(e) => return Err(bad(format!("malformed request head: {e}"))),
    };
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Ok(None);
    };
    let mut credentials = None;
    let mut auth_seen = false;
    let (mut lengths, mut chunked) = (0, false);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("proxy-authorization") {
            if auth_seen {
                return Err(bad("more than one Proxy-Authorization header"));
            }
            auth_seen = true;
            credentials = auth::parse_basic(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
    }
    if lengths > 1 || (lengths == 1 && chunked) {
        return Err(bad(
            "ambiguous body framing (several Content-Length, or Content-Length with \
             Transfer-Encoding)",
        ));
    }
    if method == "CONNECT" {
        let target = Target::parse_authority(path).ok_or_else(|| {
            bad(format!(
                "CONNECT target {:?} is not host:port",
                crate::text::clip(path, 300)
            ))
        })?;
        return Ok(Some(Request {
            kind: Kind::Connect,
            target,
            credentials,
            forward_head: None,
            head_len,
        }));
    }
    let (authority, origin) = split_absolute(path)?;
    let target = parse_uri_authority(authority)?;
    let mut head = Vec::with_capacity(head_len + 32);
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    if !origin.starts_with('/') {
        head.push(b'/');
    }
    head.extend_from_slice(origin.as_bytes());
    head.extend_from_slice(if version == 0 {
        b" HTTP/1.0\r\nHost: "
    } else {
        b" HTTP/1.1\r\nHost: "
    });
    head.extend_from_slice(authority.as_bytes());
    head.extend_from_slice(b"\r\n");
    for h in req.headers.iter() {
        let hop = [
            "host",
            "proxy-authorization",
            "proxy-connection",
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
        ]
        .iter()
        .any(|n| h.name.eq_ignore_ascii_case(n));
        if !hop {
            head.extend_from_slice(h.name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(h.value);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(Request {
        kind: Kind::Forward,
        target,
        credentials,
        forward_head: Some(head),
        head_len,
    }))
}

/// Splits `http://AUTHORITY/rest` into the authority and the origin-form rest.
fn split_absolute(path: &str) -> Result<(&str, &str), HttpError> {
    let scheme_end = path.find("://");
    let Some(i) = scheme_end.filter(|i| *i > 0 && *i < 10) else {
        return Err(bad(
            "this is a proxy: send CONNECT host:port, or an absolute URI (http://host/path)",
        ));
    };
    let (scheme, rest) = path.split_at(i);
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad(format!(
            "scheme {:?} is not forwarded: use CONNECT for https and other protocols",
            crate::text::clip(scheme, 10)
        )));
    }
    let rest = rest.get(3..).unwrap_or_default();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, origin) = rest.split_at(end);
    Ok((authority, if origin.is_empty() { "/" } else { origin }))
}

/// The target of an absolute URI's authority (`host[:port]`, port 80 by default).
fn parse_uri_authority(a: &str) -> Result<Target, HttpError> {
    let refuse = || {
        bad(format!(
            "the URI's host {:?} is not a host name or address",
            crate::text::clip(a, 300)
        ))
    };
    if a.contains('@') {
        return Err(bad(
            "credentials in the URI are not forwarded; remove user@",
        ));
    }
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
            (h, parse_port(p).ok_or_else(refuse)?)
        }
        _ => (a, 80),
    };
    Ok(Target {
        host: Host::parse(host).ok_or_else(refuse)?,
        port,
    })
}

/// The reply that opens a tunnel.
pub const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A header-safe copy of `s` for a quoted-string (no control characters, `"` and `\`
/// escaped), at most 300 bytes.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(300) + 2);
    for c in crate::text::clip(s, 300).chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_graphic() || c == ' ' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

/// An error reply: status line, `Proxy-Status` (RFC 9209) with `error` (a token of that
/// RFC's registry) and the message as `details`, `Proxy-Authenticate` on 407, the message as
/// a one-line plain-text body, `Connection: close`.
pub fn error_reply(status: u16, error: &str, message: &str) -> Vec<u8> {
    let body = format!("{}\n", quoted(message));
    let mut r = format!(
        "HTTP/1.1 {status} {}\r\nProxy-Status: egress-proxies-gateway; error={error}; \
         details=\"{}\"\r\n",
        reason(status),
        quoted(message)
    );
    if status == 407 {
        r.push_str("Proxy-Authenticate: Basic realm=\"egress-proxies gateway\"\r\n");
    }
    r.push_str(&format!(
        "Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    r.into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Found by the `gateway_parsers` fuzz target (minimised by hand): header lines written
    /// `Name:value` with bare LF grow by up to two bytes each when rewritten as
    /// `Name: value\r\n`; the forwarded head stays bounded by that, well-formed, and ends
    /// in one `Connection: close` and one end of head.
    #[test]
    fn a_forwarded_head_of_tight_lf_only_headers_grows_by_at_most_two_bytes_a_header() {
        let mut raw = b"POST http://h.example:8080/a?b=1 HTTP/1.1\n".to_vec();
        for i in 0..MAX_HEADERS - 1 {
            raw.extend_from_slice(format!("http://h.e{i}:8/a\n").as_bytes());
        }
        raw.extend_from_slice(b"\nabc");
        let r = parse(&raw).unwrap().unwrap();
        assert_eq!((r.kind, r.head_len), (Kind::Forward, raw.len() - 3));
        let h = r.forward_head.unwrap();
        let text = String::from_utf8(h.clone()).unwrap();
        assert!(text.starts_with("POST /a?b=1 HTTP/1.1\r\nHost: h.example:8080\r\n"));
        assert!(text.contains("\r\nhttp: //h.e0:8/a\r\n"));
        assert!(text.ends_with("Connection: close\r\n\r\n"));
        assert_eq!(text.matches("\r\n\r\n").count(), 1);
        assert!(
            h.len() > r.head_len + 64,
            "the case the fuzz oracle first missed"
        );
        assert!(h.len() <= r.head_len + 64 + "h.example:8080".len() + 2 * MAX_HEADERS);
    }

    #[test]
    fn a_connect_head_parses_with_its_credentials_and_early_data_after_it() {
        let raw = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\
                    Proxy-Authorization: Basic dTpw\r\n\r\n\x16\x03\x01";
        let r = parse(raw).unwrap().unwrap();
        assert_eq!(r.kind, Kind::Connect);
        assert_eq!(r.target.to_string(), "example.com:443");
        assert_eq!(r.credentials, Some(("u".into(), b"p".to_vec())));
        assert_eq!(&raw[r.head_len..], b"\x16\x03\x01");
        for cut in 0..raw.len() - 3 {
            assert_eq!(parse(&raw[..cut]).unwrap(), None, "prefix {cut}");
        }
    }

    #[test]
    fn an_absolute_uri_request_is_rewritten_for_the_origin_with_connection_close() {
        let raw = b"GET http://Example.com:8080/a?b=1 HTTP/1.1\r\nHost: wrong\r\n\
                    Proxy-Connection: keep-alive\r\nAccept: */*\r\nProxy-Authorization: Basic dTpw\r\n\r\n";
        let r = parse(raw).unwrap().unwrap();
        assert_eq!(r.kind, Kind::Forward);
        assert_eq!(r.target.to_string(), "example.com:8080");
        assert_eq!(
            String::from_utf8(r.forward_head.unwrap()).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let r = parse(b"GET http://h.example HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.target.to_string(), "h.example:80");
        assert!(
            String::from_utf8(r.forward_head.unwrap())
                .unwrap()
                .starts_with("GET / HTTP/1.0\r\nHost: h.example\r\n")
        );
    }

    #[test]
    fn bad_heads_are_refused_with_a_status_and_a_sentence() {
        let status = |b: &[u8]| parse(b).unwrap_err().status;
        assert_eq!(status(b"\x05\x01\x02"), 400);
        assert_eq!(status(b"\x16\x03\x01\x02\x00"), 400);
        assert_eq!(status(b"GET /index.html HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET https://x.example/ HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET http://u:p@x.example/ HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"CONNECT x.example HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(
            status(b"POST http://x.example/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"CONNECT a:1 HTTP/1.1\r\nProxy-Authorization: Basic dTpw\r\nProxy-Authorization: Basic dTpw\r\n\r\n"),
            400
        );
        assert_eq!(status(b"ABCDEFGHIJKLMNOPQRSTU"), 400);
        let mut big = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert_eq!(status(&big), 431);
        let mut many = b"CONNECT a:1 HTTP/1.1\r\n".to_vec();
        for i in 0..70 {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(status(&many), 431);
        // Incomplete is not an error.
        assert_eq!(parse(b"").unwrap(), None);
        assert_eq!(parse(b"CONN").unwrap(), None);
    }

    #[test]
    fn error_replies_are_one_safe_header_block() {
        let r = String::from_utf8(error_reply(407, "http_request_denied", "a \"b\"\r\nc")).unwrap();
        assert!(
            r.starts_with("HTTP/1.1 407 Proxy Authentication Required\r\n"),
            "{r}"
        );
        assert!(r.contains("details=\"a \\\"b\\\"??c\""), "{r}");
        assert!(r.contains("Proxy-Authenticate: Basic"), "{r}");
        assert_eq!(r.matches("\r\n\r\n").count(), 1, "{r}");
    }
}
