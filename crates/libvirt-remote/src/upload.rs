//! Upload streams (`STORAGE_VOL_UPLOAD`): bytes from any `AsyncRead` into a volume.
//!
//! Guarantees (finding H2), every path ends in bounded time and leaves nothing behind:
//! - the source fails → the stream is aborted and the source's error returned;
//! - the daemon fails mid-stream (disk full, volume deleted) → sending stops at once and the
//!   daemon's error is returned;
//! - the deadline passes or the future is dropped → the stream is aborted, and if the daemon
//!   does not confirm within the abort budget the connection is killed;
//! - no task outlives the call except, after a drop, one bounded abort task.
//!
//! Uploads should run on a dedicated connection, so that killing it never hurts other callers.

pub mod source;

pub use source::{FileSource, UploadSource};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::mpsc;

use crate::conn::{
    Connection, OUTBOUND_QUEUE, STREAM_QUEUE, Shared, Waiter, remote_header, remote_packet,
    reply_result, stream_error,
};
use crate::error::{DeathReason, Error, Kind, Result};
use crate::frame::{
    LEGACY_STREAM_PAYLOAD, MAX_PAYLOAD, MIN_PACKET, MessageType, Packet, Status, packet_prefix,
};

/// Default upload chunk: the largest stream payload every libvirt version accepts.
pub const DEFAULT_CHUNK: usize = LEGACY_STREAM_PAYLOAD;
/// Capacity an upload's read buffer starts with (it grows to the chunk size as needed).
const INITIAL_BUFFER: usize = 64 * 1024;
/// Default time the daemon gets to confirm an abort before the connection is killed.
// NB: libvirtd confirms an abort in milliseconds; 5 s covers a loaded host without letting a
// frozen one hold the caller.
pub const DEFAULT_ABORT_BUDGET: Duration = Duration::from_secs(5);
/// Default time the daemon gets to confirm the end of a finished upload (it flushes the
/// volume to disk first).
pub const DEFAULT_FINISH_TIMEOUT: Duration = Duration::from_secs(120);

/// How an upload behaves.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Bytes per stream packet (1 ..= 32 MiB - 24).
    pub chunk_size: usize,
    /// Deadline for the whole upload; `None` means only the per-step bounds apply.
    pub deadline: Option<Duration>,
    /// How long an abort may wait for the daemon's confirmation.
    pub abort_budget: Duration,
    /// How long the daemon may take to confirm a completed upload.
    pub finish_timeout: Duration,
}

impl Default for UploadOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK,
            deadline: None,
            abort_budget: DEFAULT_ABORT_BUDGET,
            finish_timeout: DEFAULT_FINISH_TIMEOUT,
        }
    }
}

/// Tracks an open stream; if it is dropped unfinished, aborts it in a bounded background
/// task (or kills the connection when no runtime is available).
struct StreamGuard {
    shared: Arc<Shared>,
    serial: u32,
    proc_: i32,
    rx: Option<mpsc::Receiver<Packet>>,
    finished: bool,
    abort_budget: Duration,
}

impl StreamGuard {
    fn rx(&mut self) -> Result<&mut mpsc::Receiver<Packet>> {
        match self.rx.as_mut() {
            Some(rx) => Ok(rx),
            None => Err(Error::protocol("stream receiver already taken")),
        }
    }

    /// Sends an abort and waits (bounded) for the daemon to confirm; kills the connection
    /// when it does not.
    async fn abort(&mut self) {
        self.finished = true;
        let rx = self.rx.take();
        abort_stream(
            self.shared.clone(),
            self.serial,
            self.proc_,
            rx,
            self.abort_budget,
        )
        .await;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.finished {
            self.shared.remove(self.serial);
            return;
        }
        let shared = self.shared.clone();
        let (serial, proc_, budget, rx) =
            (self.serial, self.proc_, self.abort_budget, self.rx.take());
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(abort_stream(shared, serial, proc_, rx, budget));
            }
            Err(_) => shared.die(DeathReason::StreamAbortTimeout),
        }
    }
}

async fn abort_stream(
    shared: Arc<Shared>,
    serial: u32,
    proc_: i32,
    rx: Option<mpsc::Receiver<Packet>>,
    budget: Duration,
) {
    let confirmed = async {
        let pkt = remote_packet(proc_, MessageType::Stream, serial, Status::Error, &[]).ok()?;
        shared.send(pkt).await.ok()?;
        let mut rx = rx?;
        rx.recv().await
    };
    let ok = matches!(tokio::time::timeout(budget, confirmed).await, Ok(Some(_)));
    shared.remove(serial);
    if !ok && !shared.is_dead() {
        tracing::warn!(
            serial,
            "upload abort not confirmed in {budget:?}; killing the connection"
        );
        shared.die(DeathReason::StreamAbortTimeout);
    }
}

/// What the daemon said while we were sending.
fn interrupted(shared: &Shared, pkt: Option<Packet>) -> Error {
    match pkt {
        None => shared.dead_error(),
        Some(p) if p.header.status == Status::Error => stream_error(shared, &p),
        Some(p) => {
            // NB: the daemon broke the stream protocol; its side of the stream is in an
            // unknown state, so the (dedicated) connection goes too.
            let msg = format!(
                "unexpected {:?}/{:?} packet during an upload",
                p.header.mtype, p.header.status
            );
            shared.die(DeathReason::Malformed(msg.clone()));
            Error::protocol(msg)
        }
    }
}

/// How many sent frames an upload remembers to take their buffers back. Above the most that
/// can be in flight at once (the connection's queue, the one being written, and the SSH
/// session's own queue), so in a steady upload the oldest is free again by the time it is
/// needed.
const FRAME_POOL: usize = OUTBOUND_QUEUE + 4;

/// The frame buffers of one upload, reused: a sent frame is remembered (a reference) and
/// its allocation taken back once the transport has dropped its own references. No frame is
/// allocated in a steady upload; when the oldest remembered frame is still in use (the
/// transport lags), it is forgotten (it is freed when the transport drops it) and a new one
/// allocated, so at most `FRAME_POOL` buffers are held here beyond those in flight.
struct Frames {
    sent: VecDeque<Bytes>,
    /// Buffers allocated (for tests and the benchmark's accounting).
    allocated: u64,
}

impl Frames {
    fn new() -> Self {
        Self {
            sent: VecDeque::with_capacity(FRAME_POOL),
            allocated: 0,
        }
    }

    /// An empty buffer: a reused one, or a new one of `capacity`.
    fn take(&mut self, capacity: usize) -> BytesMut {
        if self.sent.front().is_some_and(Bytes::is_unique)
            && let Some(front) = self.sent.pop_front()
            && let Ok(mut b) = front.try_into_mut()
        {
            b.clear();
            return b;
        }
        if self.sent.len() >= FRAME_POOL {
            self.sent.pop_front();
        }
        self.allocated += 1;
        BytesMut::with_capacity(capacity)
    }

    fn keep(&mut self, frame: Bytes) {
        self.sent.push_back(frame);
    }
}

impl Connection {
    /// Runs an upload stream for procedure `proc_` with XDR-encoded `args`, sending every
    /// byte of `src`. Returns the number of bytes sent.
    pub async fn upload<S: UploadSource>(
        &self,
        proc_: i32,
        args: Bytes,
        mut src: S,
        opts: &UploadOptions,
    ) -> Result<u64> {
        if opts.chunk_size == 0 || opts.chunk_size > MAX_PAYLOAD {
            return Err(Error::setup(
                format!(
                    "invalid upload chunk_size = {}: must be between 1 and {MAX_PAYLOAD}",
                    opts.chunk_size
                ),
                true,
            ));
        }
        let shared = self.shared().clone();
        let serial = shared.next_serial();
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        shared.register(serial, Waiter::Stream(tx))?;
        let mut guard = StreamGuard {
            shared: shared.clone(),
            serial,
            proc_,
            rx: Some(rx),
            finished: false,
            abort_budget: opts.abort_budget,
        };
        let call_timeout = shared.config().call_timeout;

        // 1. The call and its reply.
        let call = remote_packet(proc_, MessageType::Call, serial, Status::Ok, &args)?;
        let opened = tokio::time::timeout(call_timeout, async {
            shared.send(call).await?;
            guard.rx()?.recv().await.ok_or_else(|| shared.dead_error())
        })
        .await;
        match opened {
            Err(_) => {
                guard.abort().await;
                return Err(Error::timeout("upload call"));
            }
            Ok(Err(e)) => {
                guard.finished = true;
                return Err(e);
            }
            Ok(Ok(pkt)) => {
                if let Err(e) = reply_result(&shared, pkt) {
                    guard.finished = true;
                    return Err(e);
                }
            }
        }

        // 2. Data, then the end-of-stream confirmation.
        let body = send_body(&shared, &mut guard, &mut src, opts);
        let res = match opts.deadline {
            Some(d) => match tokio::time::timeout(d, body).await {
                Ok(r) => r,
                Err(_) => Err(Error::timeout("upload")),
            },
            None => body.await,
        };
        match res {
            Ok(n) => {
                guard.finished = true;
                Ok(n)
            }
            Err(e) if e.is_timeout() || e.source_error().is_some() => {
                if !guard.finished {
                    guard.abort().await;
                }
                Err(e)
            }
            Err(e) => {
                guard.finished = true;
                Err(e)
            }
        }
    }
}

/// Sends the body; on a source error returns it without aborting (the caller aborts).
///
/// Each frame is built in place: the data is read straight into a buffer after room for the
/// packet's length word and header, which are written last, and the buffer itself is queued
/// (no copy into a separate packet). The connection's bounded queue keeps the writer busy
/// while the next frame is read, and bounds the data in flight.
async fn send_body<S: UploadSource>(
    shared: &Arc<Shared>,
    guard: &mut StreamGuard,
    src: &mut S,
    opts: &UploadOptions,
) -> Result<u64> {
    let serial = guard.serial;
    let proc_ = guard.proc_;
    let header = remote_header(proc_, MessageType::Stream, serial, Status::Continue);
    let frame_len = MIN_PACKET + opts.chunk_size;
    let mut sent: u64 = 0;
    let mut frames = Frames::new();
    // NB: until a first frame is full, a new buffer starts at most INITIAL_BUFFER and grows
    // (in a reader's reads) as the body needs, so a small body (a 50 KiB seed) never holds a
    // whole chunk while hundreds of uploads run at once; after it, a bulk upload allocates
    // whole frames, and its reused buffers keep their size.
    let mut new_buffer = frame_len.min(MIN_PACKET + INITIAL_BUFFER);
    loop {
        let mut buf = frames.take(new_buffer);
        buf.put_bytes(0, MIN_PACKET);
        let rx = guard.rx()?;
        let read = tokio::select! {
            biased;
            pkt = rx.recv() => return Err(interrupted(shared, pkt)),
            r = src.fill(buf, frame_len) => r,
        };
        let mut buf = match read {
            Ok(b) if b.len() >= MIN_PACKET && b.len() <= frame_len => b,
            Ok(b) => {
                return Err(Error::protocol(format!(
                    "the upload source returned a frame of {} bytes (expected {MIN_PACKET} to \
                     {frame_len})",
                    b.len()
                )));
            }
            Err(e) => return Err(Error::new(Kind::Source(Arc::new(e)))),
        };
        let n = buf.len() - MIN_PACKET;
        if n == 0 {
            break;
        }
        if buf.len() == frame_len {
            new_buffer = frame_len;
        }
        let prefix = packet_prefix(&header, n)
            .map_err(|e| Error::protocol(format!("cannot encode packet: {e}")))?;
        if let Some(room) = buf.get_mut(..MIN_PACKET) {
            room.copy_from_slice(&prefix);
        }
        let pkt = buf.freeze();
        frames.keep(pkt.clone());
        let rx = guard.rx()?;
        tokio::select! {
            biased;
            pkt = rx.recv() => return Err(interrupted(shared, pkt)),
            r = shared.send(pkt) => r?,
        }
        sent = sent.saturating_add(n as u64);
    }
    tracing::trace!(serial, sent, buffers = frames.allocated, "upload body sent");
    // End of data: send the finish packet, then wait for the daemon's confirmation.
    let fin = remote_packet(proc_, MessageType::Stream, serial, Status::Ok, &[])?;
    let rx = guard.rx()?;
    tokio::select! {
        biased;
        pkt = rx.recv() => return Err(interrupted(shared, pkt)),
        r = shared.send(fin) => r?,
    }
    let confirm = tokio::time::timeout(opts.finish_timeout, guard.rx()?.recv()).await;
    match confirm {
        Err(_) => {
            // The data is sent; the daemon is not answering. Nothing to abort: kill.
            guard.finished = true;
            shared.die(DeathReason::StreamAbortTimeout);
            Err(Error::timeout("upload finish"))
        }
        Ok(Some(p)) if p.header.status == Status::Ok => Ok(sent),
        Ok(pkt) => {
            guard.finished = true;
            Err(interrupted(shared, pkt))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sent(frames: &mut Frames, fill: u8) -> Bytes {
        let mut b = frames.take(1000);
        b.put_bytes(fill, 1000);
        let f = b.freeze();
        frames.keep(f.clone());
        f
    }

    #[test]
    fn a_frame_buffer_is_reused_once_the_transport_has_dropped_it() {
        let mut frames = Frames::new();
        let first = sent(&mut frames, 1);
        let addr = first.as_ptr();
        drop(first); // the transport is done with it
        let again = frames.take(1000);
        assert_eq!(again.as_ptr(), addr, "the same allocation, taken back");
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(frames.allocated, 1);
    }

    #[test]
    fn a_lagging_transport_gets_new_buffers_and_the_pool_stays_bounded() {
        let mut frames = Frames::new();
        // The transport still holds every frame: each take allocates, none is reused, and
        // the remembered frames never pass FRAME_POOL.
        let held: Vec<Bytes> = (0..3 * FRAME_POOL)
            .map(|i| sent(&mut frames, i as u8))
            .collect();
        assert_eq!(frames.allocated, held.len() as u64);
        assert!(frames.sent.len() <= FRAME_POOL);
        // Every frame kept its own bytes (no buffer was reused while still in use).
        for (i, f) in held.iter().enumerate() {
            assert!(f.iter().all(|b| *b == i as u8), "frame {i} was overwritten");
        }
    }
}
