//! The SOCKS5 side of a listener (RFC 1928, username/password from RFC 1929): the client's
//! three messages parsed from a buffer, check then parse, and the replies.
//!
//! Guarantees: each parser looks only at the bytes it needs, returns `Ok(None)` while the
//! message is incomplete and never reads past it (what follows, pipelined by an eager client,
//! stays in the buffer); every message is bounded by the protocol (at most 513 bytes), so a
//! fixed buffer always suffices; a wrong version, an empty method list, an unknown command or
//! address type is an error naming it, with the reply code the client gets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::target::{Host, Target, normalize};

/// Reply codes (RFC 1928 §6).
pub mod reply {
    /// Succeeded.
    pub const OK: u8 = 0;
    /// General SOCKS server failure.
    pub const FAILURE: u8 = 1;
    /// Connection not allowed by ruleset.
    pub const NOT_ALLOWED: u8 = 2;
    /// Network unreachable.
    pub const NETWORK_UNREACHABLE: u8 = 3;
    /// Host unreachable.
    pub const HOST_UNREACHABLE: u8 = 4;
    /// Connection refused.
    pub const REFUSED: u8 = 5;
    /// TTL expired (used for a timeout).
    pub const TTL_EXPIRED: u8 = 6;
    /// Command not supported.
    pub const COMMAND: u8 = 7;
    /// Address type not supported.
    pub const ADDRESS_TYPE: u8 = 8;
}

/// Longest SOCKS5 message a client sends (the username/password one).
pub const MAX_MESSAGE: usize = 3 + 255 + 255;

/// A refused message: what to tell the client and the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SocksError {
    /// The reply code for a request error; `None` for errors before the request (the
    /// connection is closed, after a method refusal where the protocol has one).
    pub code: Option<u8>,
    /// A sentence.
    pub message: String,
}

fn err(code: Option<u8>, message: impl Into<String>) -> SocksError {
    SocksError {
        code,
        message: message.into(),
    }
}

/// The greeting: which methods the client offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    /// Username/password (method 2) is offered.
    pub userpass: bool,
    /// Bytes it took.
    pub len: usize,
}

/// Parses the greeting `VER NMETHODS METHODS...`.
pub fn parse_greeting(b: &[u8]) -> Result<Option<Greeting>, SocksError> {
    let Some(&ver) = b.first() else {
        return Ok(None);
    };
    if ver != 5 {
        return Err(err(
            None,
            if ver.is_ascii_uppercase() {
                "this listener speaks SOCKS5; the bytes look like HTTP (use the pool's http \
                 listener)"
                    .to_owned()
            } else {
                format!("SOCKS version {ver} is not supported (only 5)")
            },
        ));
    }
    let Some(&n) = b.get(1) else {
        return Ok(None);
    };
    if n == 0 {
        return Err(err(None, "the SOCKS5 greeting offers no method"));
    }
    let len = 2 + usize::from(n);
    let Some(methods) = b.get(2..len) else {
        return Ok(None);
    };
    Ok(Some(Greeting {
        userpass: methods.contains(&2),
        len,
    }))
}

/// Username/password as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPass<'a> {
    /// The username bytes.
    pub username: &'a [u8],
    /// The password bytes.
    pub password: &'a [u8],
    /// Bytes it took.
    pub len: usize,
}

/// Parses the username/password message `VER=1 ULEN UNAME PLEN PASSWD`.
pub fn parse_userpass(b: &[u8]) -> Result<Option<UserPass<'_>>, SocksError> {
    let Some(&ver) = b.first() else {
        return Ok(None);
    };
    if ver != 1 {
        return Err(err(
            None,
            format!("username/password version {ver} is not supported (only 1)"),
        ));
    }
    let Some(&ul) = b.get(1) else {
        return Ok(None);
    };
    let uend = 2 + usize::from(ul);
    let Some(&pl) = b.get(uend) else {
        return Ok(None);
    };
    let len = uend + 1 + usize::from(pl);
    let (Some(username), Some(password)) = (b.get(2..uend), b.get(uend + 1..len)) else {
        return Ok(None);
    };
    Ok(Some(UserPass {
        username,
        password,
        len,
    }))
}

/// Parses the request `VER CMD RSV ATYP DST.ADDR DST.PORT`; only CONNECT is accepted.
pub fn parse_request(b: &[u8]) -> Result<Option<(Target, usize)>, SocksError> {
    let Some(head) = b.get(..4) else {
        if b.first().is_some_and(|v| *v != 5) {
            return Err(err(
                Some(reply::FAILURE),
                "the SOCKS5 request has the wrong version",
            ));
        }
        return Ok(None);
    };
    let &[ver, cmd, _, atyp] = head else {
        return Ok(None);
    };
    if ver != 5 {
        return Err(err(
            Some(reply::FAILURE),
            format!("the SOCKS5 request has version {ver}"),
        ));
    }
    if cmd != 1 {
        return Err(err(
            Some(reply::COMMAND),
            format!("SOCKS5 command {cmd} is not supported: the gateway carries CONNECT (1) only"),
        ));
    }
    let (host, end) = match atyp {
        1 => {
            let Some(a) = b.get(4..8) else {
                return Ok(None);
            };
            let mut o = [0u8; 4];
            o.copy_from_slice(a);
            (Host::Ip(IpAddr::V4(Ipv4Addr::from(o))), 8)
        }
        4 => {
            let Some(a) = b.get(4..20) else {
                return Ok(None);
            };
            let mut o = [0u8; 16];
            o.copy_from_slice(a);
            (Host::Ip(normalize(IpAddr::V6(Ipv6Addr::from(o)))), 20)
        }
        3 => {
            let Some(&l) = b.get(4) else { return Ok(None) };
            let end = 5 + usize::from(l);
            let Some(name) = b.get(5..end) else {
                return Ok(None);
            };
            let host = Host::name(name).ok_or_else(|| {
                err(
                    Some(reply::HOST_UNREACHABLE),
                    "the SOCKS5 request's host name is not a valid name",
                )
            })?;
            (host, end)
        }
        other => {
            return Err(err(
                Some(reply::ADDRESS_TYPE),
                format!("SOCKS5 address type {other} is not supported"),
            ));
        }
    };
    let Some(&[p0, p1]) = b.get(end..end + 2) else {
        return Ok(None);
    };
    let port = u16::from_be_bytes([p0, p1]);
    if port == 0 {
        return Err(err(Some(reply::NOT_ALLOWED), "destination port 0"));
    }
    Ok(Some((Target { host, port }, end + 2)))
}

/// The reply with `code` (bound address 0.0.0.0:0: the client learns nothing of the
/// member's side).
pub fn reply(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn the_three_messages_parse_incrementally_and_leave_what_follows() {
        let g = [5, 2, 0, 2, 0xAA];
        for cut in 0..4 {
            assert_eq!(parse_greeting(&g[..cut]).unwrap(), None);
        }
        assert_eq!(
            parse_greeting(&g).unwrap(),
            Some(Greeting {
                userpass: true,
                len: 4
            })
        );
        let up = [1, 5, b'a', b'l', b'i', b'c', b'e', 2, b'p', b'w', 9];
        for cut in 0..10 {
            assert_eq!(parse_userpass(&up[..cut]).unwrap(), None, "{cut}");
        }
        let p = parse_userpass(&up).unwrap().unwrap();
        assert_eq!(
            (p.username, p.password, p.len),
            (&b"alice"[..], &b"pw"[..], 10)
        );
        let mut r = vec![5, 1, 0, 3, 11];
        r.extend_from_slice(b"example.com");
        r.extend_from_slice(&443u16.to_be_bytes());
        for cut in 0..r.len() {
            assert_eq!(parse_request(&r[..cut]).unwrap(), None, "{cut}");
        }
        let (t, n) = parse_request(&r).unwrap().unwrap();
        assert_eq!((t.to_string(), n), ("example.com:443".into(), r.len()));
        let (t, _) = parse_request(&[5, 1, 0, 1, 192, 0, 2, 1, 0, 80])
            .unwrap()
            .unwrap();
        assert_eq!(t.to_string(), "192.0.2.1:80");
    }

    #[test]
    fn wrong_versions_commands_and_address_types_get_their_reply_codes() {
        assert_eq!(parse_greeting(&[4, 1, 0]).unwrap_err().code, None);
        assert!(
            parse_greeting(b"CONNECT")
                .unwrap_err()
                .message
                .contains("HTTP")
        );
        assert!(parse_greeting(&[5, 0]).is_err());
        assert!(parse_userpass(&[2, 0, 0]).is_err());
        assert_eq!(
            parse_request(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 80])
                .unwrap_err()
                .code,
            Some(reply::COMMAND)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 9]).unwrap_err().code,
            Some(reply::ADDRESS_TYPE)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 1, b' ', 0, 80])
                .unwrap_err()
                .code,
            Some(reply::HOST_UNREACHABLE)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 1, 1, 2, 3, 4, 0, 0])
                .unwrap_err()
                .code,
            Some(reply::NOT_ALLOWED)
        );
    }
}
