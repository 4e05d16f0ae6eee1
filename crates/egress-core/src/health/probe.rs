//! One health probe through a proxy: open a tunnel to the check target through the proxy
//! (HTTP `CONNECT`, optionally with basic auth, or SOCKS5, optionally with username/password),
//! send `GET <path>` over it and read the address the target saw.
//!
//! Guarantees:
//! - The whole probe (TCP connect, handshake, request, answer) runs under one deadline, the
//!   TCP connect to the proxy under a shorter one of its own ([`probe_within`]); the
//!   measured latency covers exactly that and nothing after the answer is read: closing the
//!   socket is not timed (finding L15).
//! - Every read is bounded: the proxy's reply headers by [`MAX_PROXY_REPLY`], the target's
//!   answer by [`MAX_ANSWER`]; nothing grows with what a peer sends.
//! - Errors are plain, bounded strings that never carry a byte of what a peer sent: a reply is
//!   described by its class only ([`describe_reply`]: an HTTP status code, "not HTTP",
//!   "binary", its length), so a proxy pointed at an internal service cannot make the
//!   operator copy that service's banner or page into status; they never carry the
//!   credentials either (only ever sent, never formatted).
//! - The answer format ([`parse_echo_body`]): the body is the caller's IP on one line (what
//!   `egress_web::echo` serves), or a JSON object with an `"ip"` string field (ipify, httpbin's
//!   `origin`-less variants, ifconfig.co's `/json`).
//!
//! NB: hand-written rather than reqwest: reqwest tunnels with CONNECT only for `https://`
//! targets (a plain `http://` target is sent as an absolute-URI GET to the proxy, which is not
//! the path clients use), builds a client (connection pool, resolver) per proxy, and cannot time
//! the probe alone. The two handshakes are a few dozen lines each (RFC 7231 §4.3.6, RFC 1928,
//! RFC 1929).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::controller::ProxyCredentials;
use crate::model::{ProxyProtocol, truncate};

/// Largest proxy reply (status line and headers) read before giving up.
// NB: tinyproxy's and squid's CONNECT replies are under 200 bytes; 8 KiB is nginx's default
// header buffer and leaves room for any proxy's extra headers.
pub const MAX_PROXY_REPLY: usize = 8 * 1024;
/// Largest target answer (headers and body) read.
// NB: our echo answers in ~120 bytes and JSON IP services in under 1 KiB; 16 KiB bounds a
// misconfigured target that serves a whole page.
pub const MAX_ANSWER: usize = 16 * 1024;
/// Longest description of a remote reply kept in an error (the description is ours; no
/// remote byte is kept).
// NB: the longest class description is under 60 characters; status messages stay small.
pub const MAX_REMOTE_TEXT: usize = 160;

/// Where the probe goes through the proxy: the check target's address and the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTarget {
    /// Host as sent in `CONNECT host:port` and the `Host` header (an IP literal or a name the
    /// proxy resolves).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Request path (starts with `/`).
    pub path: String,
}

/// Why a check target URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("health check target {url:?}: {reason}")]
pub struct TargetError {
    /// The URL as given.
    pub url: String,
    /// What is wrong.
    pub reason: String,
}

impl CheckTarget {
    /// Parses `http://HOST[:PORT][/PATH]`. Only `http` is accepted: the tunnel is end to end,
    /// and the answer (an IP) is not secret.
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        let bad = |reason: &str| TargetError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let u = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if u.scheme() != "http" {
            return Err(bad("only http:// targets are supported"));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(bad("credentials in the target URL are not supported"));
        }
        let host = match u.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(a)) => a.to_string(),
            Some(url::Host::Ipv6(a)) => format!("[{a}]"),
            None => return Err(bad("no host")),
        };
        let mut path = u.path().to_owned();
        if let Some(q) = u.query() {
            path.push('?');
            path.push_str(q);
        }
        Ok(Self {
            host,
            port: u.port_or_known_default().unwrap_or(80),
            path,
        })
    }

    fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// How to reach one proxy.
#[derive(Debug, Clone)]
pub struct ProxyEndpoint {
    /// The proxy's address.
    pub addr: SocketAddr,
    /// HTTP CONNECT or SOCKS5.
    pub protocol: ProxyProtocol,
    /// Basic auth (HTTP) or username/password (SOCKS5), when the proxy requires it.
    pub credentials: Option<ProxyCredentials>,
}

/// A successful probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSuccess {
    /// The address the target saw.
    pub egress_ip: IpAddr,
    /// Connect to answer, through the proxy.
    pub latency: Duration,
}

/// Why a probe failed. [`ProbeError::reason`] is a stable CamelCase label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The probe did not finish within its deadline.
    #[error("no answer through the proxy within {0:?}")]
    Timeout(Duration),
    /// The proxy could not be reached.
    #[error("cannot connect to the proxy: {0}")]
    Connect(String),
    /// The proxy refused or failed the tunnel (its reply is quoted, bounded).
    #[error("the proxy refused the tunnel: {0}")]
    Tunnel(String),
    /// The proxy wants credentials we do not have, or rejected ours.
    #[error("the proxy rejected the credentials: {0}")]
    Auth(String),
    /// The target answered with something we cannot read.
    #[error("the check target's answer is not usable: {0}")]
    Answer(String),
    /// Reading or writing failed midway.
    #[error("i/o error during the probe: {0}")]
    Io(String),
}

impl ProbeError {
    /// A stable label (condition reason, metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "ProbeTimeout",
            Self::Connect(_) => "ProxyUnreachable",
            Self::Tunnel(_) => "TunnelRefused",
            Self::Auth(_) => "ProxyAuthFailed",
            Self::Answer(_) => "BadAnswer",
            Self::Io(_) => "ProbeIoError",
        }
    }
}

fn io(e: std::io::Error) -> ProbeError {
    ProbeError::Io(e.to_string())
}

fn remote(b: &[u8]) -> String {
    truncate(&describe_reply(b), MAX_REMOTE_TEXT)
}

/// The class of a peer's reply, in our own words: never a byte of the reply itself.
pub fn describe_reply(b: &[u8]) -> String {
    if let Some(code) = status_code(b) {
        return format!("an HTTP reply with status {code} ({} bytes)", b.len());
    }
    let class = if b.is_empty() {
        "nothing"
    } else if b.first() == Some(&0x16) {
        "what looks like a TLS record"
    } else if b
        .iter()
        .all(|c| c.is_ascii_graphic() || c.is_ascii_whitespace())
    {
        "text"
    } else {
        "binary data"
    };
    format!("{class} ({} bytes, not shown)", b.len())
}

/// Probes `target` through `proxy` within `deadline`.
pub async fn probe(
    proxy: &ProxyEndpoint,
    target: &CheckTarget,
    deadline: Duration,
) -> Result<ProbeSuccess, ProbeError> {
    probe_within(proxy, target, deadline, deadline).await
}

/// Probes `target` through `proxy` within `deadline`, the TCP connect to the proxy itself
/// within `connect` (at most `deadline`): a proxy that answers no SYN (its VM or host gone)
/// fails as [`ProbeError::Connect`] after `connect`, while a slow tunnel or target still has
/// the whole `deadline`.
pub async fn probe_within(
    proxy: &ProxyEndpoint,
    target: &CheckTarget,
    deadline: Duration,
    connect: Duration,
) -> Result<ProbeSuccess, ProbeError> {
    let start = Instant::now();
    let connect = connect.min(deadline);
    let run = async {
        let mut s = match tokio::time::timeout(connect, TcpStream::connect(proxy.addr)).await {
            Ok(r) => r.map_err(|e| ProbeError::Connect(e.to_string()))?,
            Err(_) => {
                return Err(ProbeError::Connect(format!(
                    "no answer to the connection within {connect:?}"
                )));
            }
        };
        // NB: small request/response exchanges; Nagle would add a delayed-ACK round trip.
        let _ = s.set_nodelay(true);
        match proxy.protocol {
            ProxyProtocol::Http => http_connect(&mut s, target, proxy.credentials.as_ref()).await?,
            ProxyProtocol::Socks5 => {
                socks5_connect(&mut s, target, proxy.credentials.as_ref()).await?;
            }
        }
        let ip = get_ip(&mut s, target).await?;
        let latency = start.elapsed();
        Ok::<_, ProbeError>((ip, latency, s))
    };
    match tokio::time::timeout(deadline, run).await {
        // The stream is dropped here, after the latency was taken (finding L15).
        Ok(Ok((egress_ip, latency, _stream))) => Ok(ProbeSuccess { egress_ip, latency }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ProbeError::Timeout(deadline)),
    }
}

/// Reads until the end of the header block (`\r\n\r\n`), at most `max` bytes; returns the
/// header block and whatever followed it.
async fn read_head<S: AsyncRead + Unpin>(
    s: &mut S,
    max: usize,
) -> Result<(Vec<u8>, Vec<u8>), ProbeError> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() >= max {
            return Err(ProbeError::Answer(format!(
                "headers longer than {max} bytes"
            )));
        }
        let n = s.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            return Err(ProbeError::Io(format!(
                "connection closed after {} bytes: {}",
                buf.len(),
                remote(&buf)
            )));
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// The status code of an HTTP/1.x status line.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

fn first_line(head: &[u8]) -> String {
    remote(head)
}

async fn http_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &CheckTarget,
    creds: Option<&ProxyCredentials>,
) -> Result<(), ProbeError> {
    let auth = target.authority();
    let mut req = format!("CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n");
    if let Some(c) = creds {
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", c.username, c.password));
        req.push_str("Proxy-Authorization: Basic ");
        req.push_str(&token);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let (head, rest) = read_head(s, MAX_PROXY_REPLY).await?;
    // NB: the status decides first: a refusal (407 from tinyproxy) carries an HTML body.
    match status_code(&head) {
        Some(200..=299) if !rest.is_empty() => Err(ProbeError::Tunnel(
            "the proxy sent data before the tunnel was used".into(),
        )),
        Some(200..=299) => Ok(()),
        // NB: 407 is the standard; tinyproxy 1.11 answers a bad password with 401.
        Some(401 | 407) => Err(ProbeError::Auth(first_line(&head))),
        Some(_) => Err(ProbeError::Tunnel(first_line(&head))),
        None => Err(ProbeError::Tunnel(format!(
            "not an HTTP reply: {}",
            first_line(&head)
        ))),
    }
}

async fn read_exact<S: AsyncRead + Unpin>(s: &mut S, buf: &mut [u8]) -> Result<(), ProbeError> {
    s.read_exact(buf).await.map(|_| ()).map_err(io)
}

async fn socks5_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &CheckTarget,
    creds: Option<&ProxyCredentials>,
) -> Result<(), ProbeError> {
    // Greeting: version 5, offered methods (0 = none, 2 = username/password).
    let hello: &[u8] = if creds.is_some() {
        &[5, 2, 0, 2]
    } else {
        &[5, 1, 0]
    };
    s.write_all(hello).await.map_err(io)?;
    let mut r = [0u8; 2];
    read_exact(s, &mut r).await?;
    match r {
        [5, 0] => {}
        [5, 2] => {
            let Some(c) = creds else {
                return Err(ProbeError::Auth("the proxy requires a username".into()));
            };
            let (u, p) = (c.username.as_bytes(), c.password.as_bytes());
            let (Ok(ul), Ok(pl)) = (u8::try_from(u.len()), u8::try_from(p.len())) else {
                return Err(ProbeError::Auth("credentials longer than 255 bytes".into()));
            };
            let mut m = Vec::with_capacity(3 + u.len() + p.len());
            m.push(1);
            m.push(ul);
            m.extend_from_slice(u);
            m.push(pl);
            m.extend_from_slice(p);
            s.write_all(&m).await.map_err(io)?;
            read_exact(s, &mut r).await?;
            if r.get(1) != Some(&0) {
                return Err(ProbeError::Auth("username/password rejected".into()));
            }
        }
        [5, 0xff] => {
            return Err(ProbeError::Auth(
                "the proxy accepts none of the offered methods".into(),
            ));
        }
        other => {
            return Err(ProbeError::Tunnel(format!(
                "not a SOCKS5 reply: {}",
                remote(&other)
            )));
        }
    }
    // CONNECT request.
    let mut m = vec![5, 1, 0];
    let host = target.host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => {
            m.push(1);
            m.extend_from_slice(&a.octets());
        }
        Ok(IpAddr::V6(a)) => {
            m.push(4);
            m.extend_from_slice(&a.octets());
        }
        Err(_) => {
            let Ok(l) = u8::try_from(host.len()) else {
                return Err(ProbeError::Tunnel("target host name too long".into()));
            };
            m.push(3);
            m.push(l);
            m.extend_from_slice(host.as_bytes());
        }
    }
    m.extend_from_slice(&target.port.to_be_bytes());
    s.write_all(&m).await.map_err(io)?;
    let mut head = [0u8; 4];
    read_exact(s, &mut head).await?;
    let [ver, rep, _, atyp] = head;
    if ver != 5 {
        return Err(ProbeError::Tunnel(format!(
            "not a SOCKS5 reply (version {ver})"
        )));
    }
    if rep != 0 {
        return Err(ProbeError::Tunnel(format!("SOCKS5 reply code {rep}")));
    }
    // Skip the bound address and port.
    let skip = match atyp {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut l = [0u8; 1];
            read_exact(s, &mut l).await?;
            let [len] = l;
            usize::from(len) + 2
        }
        other => {
            return Err(ProbeError::Tunnel(format!(
                "SOCKS5 reply with address type {other}"
            )));
        }
    };
    let mut rest = vec![0u8; skip];
    read_exact(s, &mut rest).await
}

async fn get_ip<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &CheckTarget,
) -> Result<IpAddr, ProbeError> {
    let host_header = if target.port == 80 {
        target.host.clone()
    } else {
        target.authority()
    };
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: egress-proxies-health\r\n\
         Accept: text/plain, application/json\r\nConnection: close\r\n\r\n",
        target.path
    );
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let (head, mut body) = read_head(s, MAX_ANSWER).await?;
    match status_code(&head) {
        Some(200) => {}
        _ => {
            return Err(ProbeError::Answer(format!(
                "the target answered {}",
                first_line(&head)
            )));
        }
    }
    let length = content_length(&head);
    let want = length.unwrap_or(MAX_ANSWER).min(MAX_ANSWER);
    let mut chunk = [0u8; 1024];
    while body.len() < want {
        let n = s.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    body.truncate(want);
    parse_echo_body(&body)
        .ok_or_else(|| ProbeError::Answer(format!("no IP in the answer: {}", remote(&body))))
}

fn content_length(head: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    })
}

/// The IP in a check target's answer: the whole body trimmed (one line: `203.0.113.7`), or a
/// JSON object's `"ip"` string (`{"ip": "203.0.113.7"}`). `None` when neither.
pub fn parse_echo_body(body: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(body).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get("ip")?.as_str()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_answer_is_a_plain_ip_line_or_a_json_ip_field() {
        assert_eq!(
            parse_echo_body(b"203.0.113.7\n"),
            Some("203.0.113.7".parse().unwrap())
        );
        assert_eq!(
            parse_echo_body(br#"{"ip": "2001:db8::1", "x": 1}"#),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(parse_echo_body(b"<html>hi</html>"), None);
        assert_eq!(parse_echo_body(br#"{"ip": 5}"#), None);
    }

    #[test]
    fn targets_parse_from_http_urls_only() {
        let t = CheckTarget::parse("http://127.0.0.1:8080/ip?x=1").unwrap();
        assert_eq!(
            t,
            CheckTarget {
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/ip?x=1".into()
            }
        );
        assert_eq!(CheckTarget::parse("http://echo.example").unwrap().port, 80);
        assert_eq!(
            CheckTarget::parse("http://[::1]:9/").unwrap().authority(),
            "[::1]:9"
        );
        assert!(CheckTarget::parse("https://echo.example/").is_err());
        assert!(CheckTarget::parse("http://u:p@echo.example/").is_err());
    }

    #[test]
    fn status_lines_and_lengths_are_read_from_the_head() {
        assert_eq!(status_code(b"HTTP/1.1 407 Proxy Auth\r\n\r\n"), Some(407));
        assert_eq!(status_code(b"SSH-2.0\r\n\r\n"), None);
        assert_eq!(
            content_length(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n"),
            Some(12)
        );
    }
}
