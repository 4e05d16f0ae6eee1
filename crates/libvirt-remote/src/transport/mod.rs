//! Byte-stream transports a connection runs over, each with a kill switch that tears the
//! underlying socket down without the peer's cooperation.
//!
//! Guarantees: [`KillSwitch::kill`] returns immediately, never waits on the peer, and is
//! idempotent; after it, any read or write blocked on the socket completes with an error.
//! Outbound packets go through a [`PacketSink`] as owned [`Bytes`], so a transport that can
//! send a buffer without copying it (the SSH channel) does; any `AsyncWrite` is a sink.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};

pub mod ssh;
pub mod tcp;
pub mod unix;

/// The default socket path of the system libvirtd.
pub const DEFAULT_SOCKET: &str = "/run/libvirt/libvirt-sock";

/// How long dialing a socket may take before it is abandoned.
// NB: local sockets answer in microseconds; 10 s only matters for a wedged daemon.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

type KillFn = Box<dyn FnOnce() + Send>;

/// Shuts a transport's socket down at once. Cheap to clone; the first `kill` runs the
/// teardown actions, later ones do nothing.
#[derive(Clone, Default)]
pub struct KillSwitch(Arc<Mutex<Vec<KillFn>>>);

impl std::fmt::Debug for KillSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KillSwitch")
    }
}

impl KillSwitch {
    /// A switch with no teardown actions (for in-memory streams, which close on drop).
    pub fn noop() -> Self {
        Self::default()
    }

    /// Adds an action to run on kill. If the switch was already used, runs it now.
    pub fn push(&self, f: impl FnOnce() + Send + 'static) {
        let mut guard = match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.push(Box::new(f));
    }

    /// Adds a `shutdown(SHUT_RDWR)` of this socket (a duplicate of its descriptor is kept,
    /// so the shutdown reaches the socket even while another task owns the stream).
    pub fn push_socket(&self, sock: &impl AsFd) -> Result<()> {
        let fd: OwnedFd = sock
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::setup(format!("cannot duplicate socket: {e}"), false))?;
        self.push(move || {
            let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Both);
            drop(fd);
        });
        Ok(())
    }

    /// Runs every teardown action once. Never blocks on the peer.
    pub fn kill(&self) {
        let actions = {
            let mut guard = match self.0.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            std::mem::take(&mut *guard)
        };
        for a in actions {
            a();
        }
    }
}

/// Where a connection's outbound packets go: one whole packet at a time, handed over as owned
/// bytes (cheap to clone), so the transport may keep them without copying.
///
/// Asked of an implementation: `send` returns once the transport holds the bytes (they go
/// out in order, before any later packet) or with an error if they never will. A `send`
/// future dropped midway may leave part of a packet sent: the connection drops a future only
/// when it is dead, and never uses the sink again.
pub trait PacketSink: Send {
    /// Hands one whole packet (length word included) to the transport.
    fn send(&mut self, packet: Bytes) -> BoxFuture<'_, std::io::Result<()>>;
    /// Pushes out anything buffered; called when no further packet is queued.
    fn flush(&mut self) -> BoxFuture<'_, std::io::Result<()>>;
    /// The sink as a plain byte writer (e.g. to wrap it for tracing); it may copy where the
    /// sink did not.
    fn into_async_write(self: Box<Self>) -> Box<dyn AsyncWrite + Send + Unpin>;
}

impl<S: PacketSink + ?Sized> PacketSink for Box<S> {
    fn send(&mut self, packet: Bytes) -> BoxFuture<'_, std::io::Result<()>> {
        (**self).send(packet)
    }

    fn flush(&mut self) -> BoxFuture<'_, std::io::Result<()>> {
        (**self).flush()
    }

    fn into_async_write(self: Box<Self>) -> Box<dyn AsyncWrite + Send + Unpin> {
        (*self).into_async_write()
    }
}

/// Any byte writer as a [`PacketSink`] (`write_all` of each packet).
pub struct IoSink<W>(pub W);

impl<W: AsyncWrite + Send + Unpin + 'static> PacketSink for IoSink<W> {
    fn send(&mut self, packet: Bytes) -> BoxFuture<'_, std::io::Result<()>> {
        Box::pin(async move { self.0.write_all(&packet).await })
    }

    fn flush(&mut self) -> BoxFuture<'_, std::io::Result<()>> {
        Box::pin(self.0.flush())
    }

    fn into_async_write(self: Box<Self>) -> Box<dyn AsyncWrite + Send + Unpin> {
        Box::new(self.0)
    }
}

/// A connected byte stream, split for one reader and one writer, with its kill switch.
pub struct Transport {
    pub(crate) reader: Box<dyn AsyncRead + Send + Unpin>,
    pub(crate) writer: Box<dyn PacketSink>,
    pub(crate) kill: KillSwitch,
    pub(crate) peer: String,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("peer", &self.peer)
            .finish()
    }
}

impl Transport {
    /// A transport from separate halves.
    pub fn new(
        reader: impl AsyncRead + Send + Unpin + 'static,
        writer: impl AsyncWrite + Send + Unpin + 'static,
        kill: KillSwitch,
        peer: impl Into<String>,
    ) -> Self {
        Self::with_sink(reader, IoSink(writer), kill, peer)
    }

    /// A transport from a reader and a packet sink.
    pub fn with_sink(
        reader: impl AsyncRead + Send + Unpin + 'static,
        sink: impl PacketSink + 'static,
        kill: KillSwitch,
        peer: impl Into<String>,
    ) -> Self {
        Self {
            reader: Box::new(reader),
            writer: Box::new(sink),
            kill,
            peer: peer.into(),
        }
    }

    /// A transport over any bidirectional stream (e.g. `tokio::io::duplex` in tests).
    pub fn from_stream(
        stream: impl AsyncRead + AsyncWrite + Send + 'static,
        kill: KillSwitch,
        peer: impl Into<String>,
    ) -> Self {
        let (r, w) = tokio::io::split(stream);
        Self::new(r, w, kill, peer)
    }

    /// Takes the transport apart (e.g. to wrap its halves for tracing or counting) so it can
    /// be rebuilt with [`Transport::new`]. The writer is the sink as a byte writer, which may
    /// copy where the sink did not; [`Transport::into_sink_parts`] keeps the sink.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(
        self,
    ) -> (
        Box<dyn AsyncRead + Send + Unpin>,
        Box<dyn AsyncWrite + Send + Unpin>,
        KillSwitch,
        String,
    ) {
        (
            self.reader,
            self.writer.into_async_write(),
            self.kill,
            self.peer,
        )
    }

    /// Takes the transport apart, keeping its packet sink, so it can be rebuilt with
    /// [`Transport::with_sink`].
    #[allow(clippy::type_complexity)]
    pub fn into_sink_parts(
        self,
    ) -> (
        Box<dyn AsyncRead + Send + Unpin>,
        Box<dyn PacketSink>,
        KillSwitch,
        String,
    ) {
        (self.reader, self.writer, self.kill, self.peer)
    }

    /// A description of the peer, for logs.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The transport's kill switch.
    pub fn kill_switch(&self) -> KillSwitch {
        self.kill.clone()
    }
}
