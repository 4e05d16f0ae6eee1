//! Pipes for the copy's `splice(2)` path, shared by every connection like the buffers of
//! [`crate::bufpool`]: a tunnel direction holds a pipe only while bytes are in flight (spliced
//! in from the source and not yet spliced out to the other side), so an idle tunnel holds no
//! pipe and no descriptor beyond its two sockets.
//!
//! Guarantees: a [`PooledPipe`] goes back to its pool when dropped **only if it is empty**
//! (every byte spliced in was spliced out); a pipe dropped with bytes in it (a write error, a
//! cut or a dropped copy future in the middle of a chunk) is closed, so no tunnel ever sees
//! another's bytes. The pool keeps at most its `keep` free pipes (two descriptors each);
//! [`PipePool::made`] counts every pipe ever created and [`PipePool::out`] the pipes on loan,
//! which the tests use to prove a long copy creates no pipe per chunk and an idle tunnel holds
//! none.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};

use rustix::pipe::{PipeFlags, fcntl_setpipe_size, pipe_with};

/// Capacity asked for each pipe: what one `splice(2)` moves at most.
// NB: measured with `scripts/bench gateway` (docs/benchmarks.md): 256 KiB moves a 1 GiB
// transfer in 4× fewer splice pairs than the default 64 KiB pipe. An unprivileged user past
// `fs.pipe-user-pages-soft` gets smaller pipes, which still work.
pub const PIPE_SIZE: usize = 256 * 1024;
/// Free pipes kept for reuse.
// NB: 64 pipes = 128 descriptors and at most 16 MiB of pipe pages when full (they are kept
// empty, so in fact none): the descriptors count against the open-file limit the idle
// connections also use.
pub const PIPE_KEEP: usize = 64;

/// The copy's pipes.
pub static PIPES: LazyLock<PipePool> = LazyLock::new(|| PipePool::new(PIPE_KEEP));

/// A pool of empty pipes.
#[derive(Debug)]
pub struct PipePool {
    keep: usize,
    free: Mutex<Vec<(OwnedFd, OwnedFd)>>,
    made: AtomicU64,
    out: AtomicUsize,
}

impl PipePool {
    /// An empty pool keeping at most `keep` free pipes.
    pub fn new(keep: usize) -> Self {
        Self {
            keep,
            free: Mutex::new(Vec::new()),
            made: AtomicU64::new(0),
            out: AtomicUsize::new(0),
        }
    }

    /// An empty pipe (non-blocking, close-on-exec), from the pool or new; an error when no
    /// pipe can be made (out of descriptors), which the copy answers with its buffer path.
    pub fn take(&'static self) -> std::io::Result<PooledPipe> {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let (r, w) = match reused {
            Some(p) => p,
            None => {
                let (r, w) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
                // Best effort: a smaller pipe only means more splices.
                let _ = fcntl_setpipe_size(&w, PIPE_SIZE);
                self.made.fetch_add(1, Ordering::Relaxed);
                (r, w)
            }
        };
        self.out.fetch_add(1, Ordering::Relaxed);
        Ok(PooledPipe {
            fds: Some((r, w)),
            held: AtomicUsize::new(0),
            pool: self,
        })
    }

    /// Pipes created since start.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Pipes on loan now.
    pub fn out(&self) -> usize {
        self.out.load(Ordering::Relaxed)
    }

    /// Free pipes kept now.
    pub fn kept(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A pipe on loan from a [`PipePool`], with the count of bytes it holds.
#[derive(Debug)]
pub struct PooledPipe {
    fds: Option<(OwnedFd, OwnedFd)>,
    held: AtomicUsize,
    pool: &'static PipePool,
}

impl PooledPipe {
    /// The read and write ends (`None` only during drop).
    pub fn ends(&self) -> Option<(BorrowedFd<'_>, BorrowedFd<'_>)> {
        self.fds.as_ref().map(|(r, w)| (r.as_fd(), w.as_fd()))
    }

    /// Bytes in the pipe, as its user counted them.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Records the bytes in the pipe; its user keeps this exact (spliced in − spliced out).
    pub fn set_held(&self, n: usize) {
        self.held.store(n, Ordering::Relaxed);
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        self.pool.out.fetch_sub(1, Ordering::Relaxed);
        let Some(fds) = self.fds.take() else {
            return;
        };
        if self.held() != 0 {
            // Bytes still in it belong to a tunnel that ended: close, never reuse.
            return;
        }
        let mut free = self
            .pool
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if free.len() < self.pool.keep {
            free.push(fds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static P: LazyLock<PipePool> = LazyLock::new(|| PipePool::new(2));

    #[test]
    fn empty_pipes_come_back_a_bounded_number_are_kept_and_a_full_one_is_closed() {
        let a = P.take().unwrap();
        let b = P.take().unwrap();
        let c = P.take().unwrap();
        assert_eq!((P.made(), P.out()), (3, 3));
        drop((a, b, c));
        assert_eq!((P.out(), P.kept()), (0, 2), "two kept, the third closed");
        let a = P.take().unwrap();
        assert_eq!(P.made(), 3, "reused");
        rustix::io::write(a.ends().unwrap().1, b"left over").unwrap();
        a.set_held(9);
        drop(a);
        assert_eq!(P.kept(), 1, "a pipe with bytes in it is not kept");
        let a = P.take().unwrap();
        let mut buf = [0u8; 16];
        let r = rustix::io::read(a.ends().unwrap().0, &mut buf);
        assert!(
            matches!(r, Err(rustix::io::Errno::AGAIN)),
            "the reused pipe is empty: {r:?}"
        );
    }
}
