//! Fixed-size buffers shared by every connection, as HAProxy pools its buffers: a connection
//! holds one only while bytes are in flight (read and not yet written), so an idle tunnel
//! holds none and the steady state allocates nothing.
//!
//! Guarantees: a [`PooledBuf`] goes back to its pool when dropped, on every path; the pool
//! keeps at most its `keep` free buffers (what a burst made beyond that is freed), so its
//! memory is bounded by `keep` plus the buffers in flight; [`BufPool::allocated`] counts every
//! buffer ever made, which the tests use to prove a long copy allocates nothing per chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};

/// Size of a copy buffer.
// NB: measured with `scripts/bench gateway` (docs/benchmarks.md): 64 KiB moves a 1 GiB
// CONNECT transfer through a tinyproxy member as fast as larger buffers, and fewer read/write
// pairs than HAProxy's 16 KiB; only connections with bytes in flight hold one.
pub const COPY_BUF: usize = 64 * 1024;
/// Free copy buffers kept for reuse.
// NB: 256 × 64 KiB = 16 MiB at most kept idle after a burst of 256 busy tunnels at once.
pub const COPY_KEEP: usize = 256;
/// Size of a request-head buffer (the largest request head accepted, plus room to see its
/// end).
pub const HEAD_BUF: usize = 8 * 1024;
/// Free head buffers kept for reuse.
// NB: 1024 × 8 KiB = 8 MiB: enough for a thousand handshakes in flight.
pub const HEAD_KEEP: usize = 1024;

/// The copy buffers.
pub static COPY: LazyLock<BufPool> = LazyLock::new(|| BufPool::new(COPY_BUF, COPY_KEEP));
/// The request-head buffers.
pub static HEAD: LazyLock<BufPool> = LazyLock::new(|| BufPool::new(HEAD_BUF, HEAD_KEEP));

/// A pool of buffers of one size.
#[derive(Debug)]
pub struct BufPool {
    size: usize,
    keep: usize,
    free: Mutex<Vec<Box<[u8]>>>,
    allocated: AtomicU64,
}

impl BufPool {
    /// An empty pool of `size`-byte buffers keeping at most `keep` free ones.
    pub fn new(size: usize, keep: usize) -> Self {
        Self {
            size,
            keep,
            free: Mutex::new(Vec::new()),
            allocated: AtomicU64::new(0),
        }
    }

    /// A buffer (zeroed when new; a reused one holds old bytes, which callers never read
    /// before writing).
    pub fn take(&'static self) -> PooledBuf {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let buf = reused.unwrap_or_else(|| {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            vec![0u8; self.size].into_boxed_slice()
        });
        PooledBuf {
            buf: Some(buf),
            pool: self,
        }
    }

    /// Buffers made since start.
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    fn give_back(&self, buf: Box<[u8]>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < self.keep {
            free.push(buf);
        }
    }
}

/// A buffer on loan from a [`BufPool`].
#[derive(Debug)]
pub struct PooledBuf {
    buf: Option<Box<[u8]>>,
    pool: &'static BufPool,
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or_default()
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static P: LazyLock<BufPool> = LazyLock::new(|| BufPool::new(16, 2));

    #[test]
    fn buffers_come_back_and_the_pool_keeps_a_bounded_number() {
        let a = P.take();
        let b = P.take();
        let c = P.take();
        assert_eq!((a.len(), P.allocated()), (16, 3));
        drop((a, b, c));
        let _a = P.take();
        let _b = P.take();
        assert_eq!(P.allocated(), 3, "two were kept and reused");
        let _c = P.take();
        assert_eq!(P.allocated(), 4, "the third was freed, not kept");
    }
}
