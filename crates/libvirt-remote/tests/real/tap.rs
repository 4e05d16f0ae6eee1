//! A copy of the bytes the daemon sends, decoded afterwards into packets, so a test can say
//! exactly what libvirtd answered (e.g. to an upload abort) without trusting the client's
//! interpretation of it.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::BytesMut;
use libvirt_remote::frame::{Packet, PacketCodec};
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::codec::Decoder;

/// Bytes kept per tap; later bytes are not recorded. Only small exchanges are tapped (uploads
/// send much but receive a few packets), so 4 MiB is never reached in practice.
pub const TAP_LIMIT: usize = 4 << 20;

/// The recorded inbound bytes of one connection. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tap(Arc<Mutex<Vec<u8>>>);

impl Tap {
    fn record(&self, b: &[u8]) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = TAP_LIMIT.saturating_sub(v.len());
        v.extend_from_slice(&b[..b.len().min(room)]);
    }

    /// Every complete packet received so far, in order.
    pub fn packets(&self) -> Vec<Packet> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut buf = BytesMut::from(&bytes[..]);
        let mut out = Vec::new();
        while let Ok(Some(p)) = PacketCodec.decode(&mut buf) {
            out.push(p);
        }
        out
    }
}

/// An `AsyncRead` that records what passes through it into a [`Tap`].
pub struct TapReader<R> {
    inner: R,
    tap: Tap,
}

impl<R> TapReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, tap: Tap) -> Self {
        Self { inner, tap }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for TapReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            me.tap.record(&buf.filled()[before..]);
        }
        r
    }
}
