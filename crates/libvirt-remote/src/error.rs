//! The client's error: opaque, with predicates, so callers never match internals.
//!
//! Guarantees: every failure is exactly one of connection-class (the connection is dead and
//! every call on it fails), timeout (this call's deadline passed; the connection may live),
//! remote (the daemon answered with a `remote_error`), protocol (a reply we could not decode;
//! the connection is killed), source (an upload's reader failed), or setup (transport or
//! authentication could not be established, with a permanent/transient hint).

use std::fmt;
use std::sync::Arc;

use crate::proto::RemoteErrorWire;

/// Why a connection died. Shared by every call that fails because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeathReason {
    /// The peer closed the stream.
    Eof,
    /// Reading or writing the transport failed.
    Io(String),
    /// The peer sent bytes that are not a valid packet.
    Malformed(String),
    /// The peer stopped answering keepalives.
    KeepaliveTimeout {
        /// Intervals without any inbound traffic.
        missed: u32,
    },
    /// Closed by this side (`close`, `kill`, or every handle dropped).
    Closed,
    /// Killed because an upload could not be ended cleanly in its budget.
    StreamAbortTimeout,
}

impl fmt::Display for DeathReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Eof => write!(f, "the peer closed the connection"),
            Self::Io(e) => write!(f, "transport I/O failed: {e}"),
            Self::Malformed(e) => write!(f, "the peer sent a malformed packet: {e}"),
            Self::KeepaliveTimeout { missed } => {
                write!(
                    f,
                    "no traffic from the peer for {missed} keepalive intervals"
                )
            }
            Self::Closed => write!(f, "the connection was closed"),
            Self::StreamAbortTimeout => {
                write!(
                    f,
                    "an upload could not be aborted in time; connection killed"
                )
            }
        }
    }
}

/// A libvirt error as the daemon reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    /// `virErrorNumber` (see libvirt's `virterror.h`), e.g. 42 for "no domain".
    pub code: i32,
    /// `virErrorDomain`: the subsystem that raised it.
    pub domain: i32,
    /// The daemon's message, if any.
    pub message: String,
    /// `virErrorLevel`.
    pub level: i32,
}

impl From<RemoteErrorWire> for RemoteError {
    fn from(w: RemoteErrorWire) -> Self {
        Self {
            code: w.code,
            domain: w.domain,
            message: w.message.unwrap_or_default(),
            level: w.level,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Kind {
    Connection(DeathReason),
    Timeout(&'static str),
    Remote(RemoteError),
    Protocol(String),
    Source(Arc<std::io::Error>),
    Setup { message: String, permanent: bool },
}

/// The error every client operation returns.
#[derive(Debug)]
pub struct Error(Box<Kind>);

impl Error {
    pub(crate) fn new(kind: Kind) -> Self {
        Self(Box::new(kind))
    }

    pub(crate) fn connection(reason: DeathReason) -> Self {
        Self::new(Kind::Connection(reason))
    }

    pub(crate) fn timeout(what: &'static str) -> Self {
        Self::new(Kind::Timeout(what))
    }

    pub(crate) fn protocol(msg: impl Into<String>) -> Self {
        Self::new(Kind::Protocol(msg.into()))
    }

    /// A transport or authentication setup failure. `permanent` means retrying with the
    /// same configuration cannot succeed (e.g. a host key mismatch).
    pub fn setup(message: impl Into<String>, permanent: bool) -> Self {
        Self::new(Kind::Setup {
            message: message.into(),
            permanent,
        })
    }

    /// The connection is dead (or could not be established at the transport level);
    /// redialing may help.
    pub fn is_connection(&self) -> bool {
        matches!(
            *self.0,
            Kind::Connection(_)
                | Kind::Setup {
                    permanent: false,
                    ..
                }
        )
    }

    /// This call's deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(*self.0, Kind::Timeout(_))
    }

    /// Retrying with the same configuration cannot succeed (e.g. host key mismatch,
    /// revoked key, authentication refused).
    pub fn is_permanent(&self) -> bool {
        matches!(
            *self.0,
            Kind::Setup {
                permanent: true,
                ..
            }
        )
    }

    /// The libvirt error code, when the daemon answered with an error.
    pub fn libvirt_code(&self) -> Option<i32> {
        self.remote().map(|r| r.code)
    }

    /// The daemon's error, when it answered with one.
    pub fn remote(&self) -> Option<&RemoteError> {
        match &*self.0 {
            Kind::Remote(r) => Some(r),
            _ => None,
        }
    }

    /// Why the connection died, for connection-class errors.
    pub fn death_reason(&self) -> Option<&DeathReason> {
        match &*self.0 {
            Kind::Connection(r) => Some(r),
            _ => None,
        }
    }

    /// The upload source's own error, when the source failed.
    pub fn source_error(&self) -> Option<&std::io::Error> {
        match &*self.0 {
            Kind::Source(e) => Some(e),
            _ => None,
        }
    }

    /// A reply could not be decoded (the connection has been killed).
    pub fn is_protocol(&self) -> bool {
        matches!(*self.0, Kind::Protocol(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Kind::Connection(r) => write!(f, "libvirt connection lost: {r}"),
            Kind::Timeout(what) => write!(f, "libvirt {what} timed out"),
            Kind::Remote(r) => write!(f, "libvirt error {}: {}", r.code, r.message),
            Kind::Protocol(m) => write!(f, "libvirt protocol error: {m}"),
            Kind::Source(e) => write!(f, "upload source failed: {e}"),
            Kind::Setup { message, .. } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.0 {
            Kind::Source(e) => Some(&**e),
            _ => None,
        }
    }
}

impl From<RemoteError> for Error {
    fn from(r: RemoteError) -> Self {
        Self::new(Kind::Remote(r))
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
