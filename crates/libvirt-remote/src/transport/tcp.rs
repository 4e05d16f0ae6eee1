//! TCP transport (for tests and benchmarks against an in-process fake; libvirtd's own TCP
//! listener is unauthenticated and is not used in production).
//!
//! Guarantees: dialing is bounded by a deadline; the kill switch shuts the socket down even
//! while a write is blocked on a full send buffer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::{KillSwitch, Transport};
use crate::error::{Error, Result};

/// Dials `addr` within `timeout`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Transport> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| Error::setup(format!("connecting to {addr} timed out"), false))?
        .map_err(|e| Error::setup(format!("cannot connect to {addr}: {e}"), false))?;
    from_stream(stream)
}

/// Wraps an already connected stream.
pub fn from_stream(stream: TcpStream) -> Result<Transport> {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| format!("tcp:{a}"))
        .unwrap_or_else(|_| "tcp:?".into());
    let kill = KillSwitch::noop();
    kill.push_socket(&stream)?;
    let (r, w) = stream.into_split();
    Ok(Transport::new(r, w, kill, peer))
}
