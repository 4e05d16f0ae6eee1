//! Dialling a member: TCP connect, then the member's own protocol with its own credentials
//! (HTTP `CONNECT host:port` with basic auth for tinyproxy, SOCKS5 with username/password for
//! dante), until the member says the tunnel to the target is open.
//!
//! Guarantees:
//! - The caller bounds the whole dial with one deadline (the attempt's); every read here is
//!   bounded: the member's HTTP reply head by [`MAX_REPLY`], SOCKS5 replies by the protocol.
//! - Bytes the member sends after its reply (a server that speaks first, in the same
//!   segment) are returned in [`Dialed::early`], never dropped.
//! - Each failure has a class ([`DialError`]) that decides failover: a member that cannot be
//!   reached, times out, rejects our credentials or speaks nonsense is *suspect* (tried last
//!   for a while) and the next member is tried; a member that could not reach the target is
//!   not suspect, the next member is tried; a member that refuses the destination by policy
//!   ends the attempts (every member has the same policy).
//! - Errors never carry bytes a member sent, only their class (a status code, a reply code).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::bufpool::{HEAD, PooledBuf};
use crate::model::{Credential, MemberProtocol};
use crate::socks::reply;
use crate::target::{Host, Target};

/// Largest member reply head read (tinyproxy's is under 200 bytes).
pub const MAX_REPLY: usize = crate::bufpool::HEAD_BUF;

/// Why a dial failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// The member's port could not be reached.
    #[error("cannot connect to the member: {0}")]
    Unreachable(String),
    /// The attempt's deadline passed.
    #[error("the member did not open the tunnel in time")]
    Timeout,
    /// The member rejected the gateway's credentials for it.
    #[error("the member rejected its credentials ({0})")]
    MemberAuth(String),
    /// The member refused the destination (its policy).
    #[error("the member's policy refuses the destination ({0})")]
    Denied(String),
    /// The member could not reach the target.
    #[error("the member could not reach the destination ({0})")]
    TargetFailed(String),
    /// The member's answer is not its protocol's.
    #[error("the member's answer is not valid: {0}")]
    Protocol(String),
}

impl DialError {
    /// Whether the member is suspect (tried last for a while).
    pub fn suspect(&self) -> bool {
        matches!(
            self,
            Self::Unreachable(_) | Self::Timeout | Self::MemberAuth(_) | Self::Protocol(_)
        )
    }

    /// Whether another member may be tried.
    pub fn retry(&self) -> bool {
        !matches!(self, Self::Denied(_))
    }

    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Timeout => "timeout",
            Self::MemberAuth(_) => "member_auth",
            Self::Denied(_) => "denied",
            Self::TargetFailed(_) => "target_failed",
            Self::Protocol(_) => "protocol",
        }
    }

    /// The SOCKS5 reply code a client gets when this was the last attempt.
    pub fn socks_code(&self) -> u8 {
        match self {
            Self::Denied(_) => reply::NOT_ALLOWED,
            Self::Timeout => reply::TTL_EXPIRED,
            Self::TargetFailed(_) => reply::HOST_UNREACHABLE,
            _ => reply::FAILURE,
        }
    }
}

/// An open tunnel through a member.
#[derive(Debug)]
pub struct Dialed {
    /// The stream (the target's bytes from here on).
    pub stream: TcpStream,
    /// Bytes of the target that came with the member's reply: the buffer and their range.
    pub early: Option<(PooledBuf, std::ops::Range<usize>)>,
}

fn io(e: &std::io::Error) -> DialError {
    DialError::Protocol(format!("i/o error: {}", e.kind()))
}

/// The CONNECT request the gateway sends an HTTP member.
pub fn connect_request(target: &Target, auth: Option<&str>) -> String {
    let mut r = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(a) = auth {
        r.push_str("Proxy-Authorization: ");
        r.push_str(a);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r
}

/// Opens a tunnel to `target` through the member at `addr`. `auth` is the member's
/// precomputed `Proxy-Authorization` value (HTTP), `creds` its credentials (SOCKS5).
pub async fn dial(
    addr: SocketAddr,
    protocol: MemberProtocol,
    auth: Option<&str>,
    creds: Option<&Credential>,
    target: &Target,
) -> Result<Dialed, DialError> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| DialError::Unreachable(e.kind().to_string()))?;
    // NB: the handshake is small request/response exchanges, and tunnelled protocols are
    // often interactive; Nagle would add delayed-ACK round trips.
    let _ = s.set_nodelay(true);
    match protocol {
        MemberProtocol::Http => http_connect(s, auth, target).await,
        MemberProtocol::Socks5 => {
            socks5_connect(&mut s, creds, target).await?;
            Ok(Dialed {
                stream: s,
                early: None,
            })
        }
    }
}

async fn http_connect(
    mut s: TcpStream,
    auth: Option<&str>,
    target: &Target,
) -> Result<Dialed, DialError> {
    s.write_all(connect_request(target, auth).as_bytes())
        .await
        .map_err(|e| io(&e))?;
    let mut buf = HEAD.take();
    let mut filled = 0;
    loop {
        let n = s
            .read(buf.get_mut(filled..).unwrap_or_default())
            .await
            .map_err(|e| io(&e))?;
        if n == 0 {
            return Err(DialError::Protocol(format!(
                "the member closed the connection after {filled} bytes of its reply"
            )));
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(buf.get(..filled).unwrap_or_default()) {
            Ok(httparse::Status::Complete(len)) => {
                let code = resp.code.unwrap_or(0);
                return match code {
                    200..=299 => Ok(Dialed {
                        stream: s,
                        early: (filled > len).then_some((buf, len..filled)),
                    }),
                    // NB: 407 is the standard; tinyproxy 1.11 answers a bad password with 401.
                    401 | 407 => Err(DialError::MemberAuth(format!("HTTP {code}"))),
                    403 => Err(DialError::Denied(format!("HTTP {code}"))),
                    500..=599 => Err(DialError::TargetFailed(format!("HTTP {code}"))),
                    _ => Err(DialError::Protocol(format!("HTTP {code}"))),
                };
            }
            Ok(httparse::Status::Partial) if filled < MAX_REPLY => {}
            Ok(httparse::Status::Partial) => {
                return Err(DialError::Protocol(format!(
                    "reply head longer than {MAX_REPLY} bytes"
                )));
            }
            Err(_) => return Err(DialError::Protocol("not an HTTP reply".into())),
        }
    }
}

async fn socks5_connect(
    s: &mut TcpStream,
    creds: Option<&Credential>,
    target: &Target,
) -> Result<(), DialError> {
    // Offer exactly what we have: username/password with credentials, else none.
    let hello: &[u8] = if creds.is_some() {
        &[5, 1, 2]
    } else {
        &[5, 1, 0]
    };
    s.write_all(hello).await.map_err(|e| io(&e))?;
    let mut r = [0u8; 2];
    s.read_exact(&mut r).await.map_err(|e| io(&e))?;
    match (r, creds) {
        ([5, 0], _) => {}
        ([5, 2], Some(c)) => {
            let (u, p) = (c.username.as_bytes(), c.password.as_bytes());
            let (Ok(ul), Ok(pl)) = (u8::try_from(u.len()), u8::try_from(p.len())) else {
                return Err(DialError::MemberAuth(
                    "credentials longer than 255 bytes".into(),
                ));
            };
            let mut m = Vec::with_capacity(3 + u.len() + p.len());
            m.extend_from_slice(&[1, ul]);
            m.extend_from_slice(u);
            m.push(pl);
            m.extend_from_slice(p);
            s.write_all(&m).await.map_err(|e| io(&e))?;
            s.read_exact(&mut r).await.map_err(|e| io(&e))?;
            if r[1] != 0 {
                return Err(DialError::MemberAuth("username/password rejected".into()));
            }
        }
        ([5, 0xff], _) | ([5, 2], None) => {
            return Err(DialError::MemberAuth(
                "the member accepts none of the offered methods".into(),
            ));
        }
        _ => return Err(DialError::Protocol("not a SOCKS5 method reply".into())),
    }
    let mut m = Vec::with_capacity(262);
    m.extend_from_slice(&[5, 1, 0]);
    match &target.host {
        Host::Ip(std::net::IpAddr::V4(a)) => {
            m.push(1);
            m.extend_from_slice(&a.octets());
        }
        Host::Ip(std::net::IpAddr::V6(a)) => {
            m.push(4);
            m.extend_from_slice(&a.octets());
        }
        Host::Name(n) => {
            let Ok(l) = u8::try_from(n.len()) else {
                return Err(DialError::Denied("host name longer than 255 bytes".into()));
            };
            m.extend_from_slice(&[3, l]);
            m.extend_from_slice(n.as_bytes());
        }
    }
    m.extend_from_slice(&target.port.to_be_bytes());
    s.write_all(&m).await.map_err(|e| io(&e))?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(|e| io(&e))?;
    let [ver, rep, _, atyp] = head;
    if ver != 5 {
        return Err(DialError::Protocol(format!(
            "SOCKS version {ver} in the reply"
        )));
    }
    match rep {
        reply::OK => {}
        reply::NOT_ALLOWED => return Err(DialError::Denied(format!("SOCKS5 reply {rep}"))),
        1 | 3..=6 => return Err(DialError::TargetFailed(format!("SOCKS5 reply {rep}"))),
        _ => return Err(DialError::Protocol(format!("SOCKS5 reply {rep}"))),
    }
    let skip = match atyp {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut l = [0u8; 1];
            s.read_exact(&mut l).await.map_err(|e| io(&e))?;
            usize::from(l[0]) + 2
        }
        other => {
            return Err(DialError::Protocol(format!(
                "SOCKS5 reply with address type {other}"
            )));
        }
    };
    let mut rest = [0u8; 257];
    s.read_exact(rest.get_mut(..skip).unwrap_or_default())
        .await
        .map_err(|e| io(&e))?;
    Ok(())
}
