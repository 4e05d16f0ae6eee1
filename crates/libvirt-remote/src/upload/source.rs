//! Where an upload's bytes come from: [`UploadSource`] fills each frame buffer in place.
//!
//! Two kinds: any `AsyncRead` (its bytes are copied from the reader into the frame, e.g. an
//! HTTP body), and [`FileSource`], a local file read straight into the frames on tokio's
//! blocking pool, several frames per blocking call and one batch ahead of the sender.
//!
//! Guarantees: a source never yields more than it was asked for, so an upload never sends
//! past its declared length; a [`FileSource`] dropped mid-read leaves at most one batch read
//! running, which ends on its own and frees its buffers; no buffer is allocated per frame
//! once the upload runs (the buffers circulate between the upload and the source).

use std::collections::VecDeque;
use std::future::Future;
use std::io::Read;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

/// Frames a [`FileSource`] reads in one blocking call.
// NB: one blocking-pool hop costs two thread wake-ups; at 4 frames of 256 KiB per hop they
// are a quarter of what a hop per frame (tokio's `File`) costs, for 1 MiB held ahead.
pub const FILE_BATCH: usize = 4;

/// Where an upload's bytes come from.
pub trait UploadSource: Send {
    /// Appends bytes to `buf` (which already holds the packet's prefix) until it holds
    /// `len` bytes, or fewer only at the end of the input; returns the filled buffer: `buf`
    /// itself, or another one holding the same prefix length (the source keeps `buf` then).
    fn fill(
        &mut self,
        buf: BytesMut,
        len: usize,
    ) -> impl Future<Output = std::io::Result<BytesMut>> + Send;
}

impl<R: AsyncRead + Unpin + Send> UploadSource for R {
    async fn fill(&mut self, mut buf: BytesMut, len: usize) -> std::io::Result<BytesMut> {
        while buf.len() < len {
            let before = buf.len();
            let mut limited = (&mut *self).take((len - before) as u64);
            if limited.read_buf(&mut buf).await? == 0 {
                break;
            }
        }
        Ok(buf)
    }
}

/// A local file as an upload source: read on tokio's blocking pool straight into the frame
/// buffers ([`FILE_BATCH`] frames per call, the next batch read while the current one is
/// sent), so no byte is copied between the read and the send, and no more than `limit`
/// bytes are read.
pub struct FileSource {
    /// The file, while no batch read holds it.
    file: Option<std::fs::File>,
    /// Bytes still to read (the upload's declared length).
    left: u64,
    /// Filled frames, in file order.
    ready: VecDeque<BytesMut>,
    /// Empty buffers to read the next batch into.
    spare: Vec<BytesMut>,
    /// The batch being read.
    job: Option<JoinHandle<Batch>>,
    /// The frame length and prefix length of the upload, once known.
    shape: Option<(usize, usize)>,
    /// Whether the input has ended (end of file, the limit, or an error).
    ended: bool,
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("left", &self.left)
            .field("ready", &self.ready.len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl FileSource {
    /// Reads `file` from its current position, at most `limit` bytes (`None`: to its end).
    pub fn new(file: std::fs::File, limit: Option<u64>) -> Self {
        let left = limit.unwrap_or(u64::MAX);
        Self {
            file: Some(file),
            left,
            ready: VecDeque::with_capacity(FILE_BATCH),
            spare: Vec::with_capacity(FILE_BATCH),
            job: None,
            shape: None,
            ended: left == 0,
        }
    }

    /// Starts reading the next batch into the spare buffers (topped up to [`FILE_BATCH`]),
    /// unless a batch is being read or the input has ended.
    fn start(&mut self) {
        let Some((len, prefix)) = self.shape else {
            return;
        };
        if self.job.is_some() || self.ended {
            return;
        }
        let Some(file) = self.file.take() else {
            return;
        };
        let mut bufs = std::mem::take(&mut self.spare);
        while bufs.len() < FILE_BATCH {
            bufs.push(BytesMut::with_capacity(len));
        }
        let left = self.left;
        self.job = Some(tokio::task::spawn_blocking(move || {
            read_batch(file, bufs, len, prefix, left)
        }));
    }

    /// Takes a finished batch in.
    fn collect(&mut self, batch: Batch) -> std::io::Result<()> {
        self.file = Some(batch.file);
        self.left = self.left.saturating_sub(batch.read);
        self.ended |= batch.ended;
        self.ready.extend(batch.filled);
        batch.result
    }
}

/// What a batch read gives back.
struct Batch {
    file: std::fs::File,
    /// The buffers read into, in order; the last one may be short (the input ended).
    filled: Vec<BytesMut>,
    /// Bytes read.
    read: u64,
    /// Whether the input ended (end of file, the limit reached, or an error).
    ended: bool,
    result: std::io::Result<()>,
}

/// Reads into each buffer in turn (each cleared to `prefix` zero bytes, then filled up to
/// `len`), stopping at the end of the file, after `left` bytes, or at an error.
fn read_batch(
    mut file: std::fs::File,
    bufs: Vec<BytesMut>,
    len: usize,
    prefix: usize,
    mut left: u64,
) -> Batch {
    let mut filled = Vec::with_capacity(bufs.len());
    let (mut read, mut ended, mut result) = (0u64, left == 0, Ok(()));
    for b in bufs {
        if ended {
            break;
        }
        // NB: a Vec (not BytesMut) so `read_to_end` reads into the spare capacity without
        // zeroing it first; the conversions do not copy the data.
        let mut v: Vec<u8> = b.into();
        v.clear();
        v.resize(prefix, 0);
        v.reserve_exact(len.saturating_sub(prefix));
        let want = (len.saturating_sub(prefix) as u64).min(left);
        let got = match (&mut file).take(want).read_to_end(&mut v) {
            Ok(n) => n as u64,
            Err(e) => {
                result = Err(e);
                0
            }
        };
        left = left.saturating_sub(got);
        read += got;
        ended = result.is_err() || got < want || left == 0;
        filled.push(BytesMut::from(bytes::Bytes::from(v)));
    }
    Batch {
        file,
        filled,
        read,
        ended,
        result,
    }
}

impl UploadSource for FileSource {
    async fn fill(&mut self, mut buf: BytesMut, len: usize) -> std::io::Result<BytesMut> {
        let prefix = buf.len();
        match self.shape {
            None => self.shape = Some((len, prefix)),
            Some(shape) if shape != (len, prefix) => {
                return Err(std::io::Error::other(
                    "the frame size changed during an upload from a file",
                ));
            }
            Some(_) => {}
        }
        buf.clear();
        self.spare.push(buf);
        if self.ready.is_empty() {
            self.start();
            if let Some(job) = self.job.take() {
                let batch = job.await.map_err(std::io::Error::other)?;
                self.collect(batch)?;
            }
        }
        match self.ready.pop_front() {
            Some(frame) => {
                if self.ready.is_empty() {
                    // Read the next batch while this frame is sent.
                    self.start();
                }
                Ok(frame)
            }
            None => {
                // The end of the input: a frame with no data.
                let mut b = self.spare.pop().unwrap_or_default();
                b.clear();
                b.put_bytes(0, prefix);
                Ok(b)
            }
        }
    }
}
