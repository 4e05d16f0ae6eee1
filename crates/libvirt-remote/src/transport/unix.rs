//! Unix-socket transport to a local libvirtd (e.g. `/run/libvirt/libvirt-sock`).
//!
//! Guarantees: dialing is bounded by a deadline; the kill switch shuts the socket down even
//! while the connection's tasks own both halves.

use std::path::Path;
use std::time::Duration;

use tokio::net::UnixStream;

use super::{KillSwitch, Transport};
use crate::error::{Error, Result};

/// Dials a unix socket within `timeout`.
pub async fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Transport> {
    let path = path.as_ref();
    let stream = tokio::time::timeout(timeout, UnixStream::connect(path))
        .await
        .map_err(|_| Error::setup(format!("connecting to {} timed out", path.display()), false))?
        .map_err(|e| Error::setup(format!("cannot connect to {}: {e}", path.display()), false))?;
    let kill = KillSwitch::noop();
    kill.push_socket(&stream)?;
    let (r, w) = stream.into_split();
    Ok(Transport::new(
        r,
        w,
        kill,
        format!("unix:{}", path.display()),
    ))
}
