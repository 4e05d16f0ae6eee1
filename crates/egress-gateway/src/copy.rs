//! The byte copy of an open tunnel, both ways, by `splice(2)` through a pipe from the shared
//! pool ([`crate::pipes::PIPES`]), or through a buffer from the shared pool
//! ([`crate::bufpool::COPY`]) when no pipe can be made (out of descriptors).
//!
//! Each direction waits for its source to be readable *before* it takes a pipe (or buffer),
//! moves bytes while they keep coming, and gives the pipe back as soon as the source has
//! nothing more: an idle tunnel holds no pipe and no buffer, a busy one holds one per busy
//! direction, and no chunk allocates or creates a descriptor. A source's end of stream shuts
//! the other side's write half (half-close is carried through) — except the second end of
//! stream, which ends the tunnel: the caller's close of both sockets carries that FIN, one
//! `shutdown(2)` less per connection; the tunnel ends when both directions ended, on the first error, when it was silent both ways for the idle timeout,
//! or when cut (drain grace over, shutdown).
//!
//! NB: why `splice(2)`: the bytes go socket → pipe → socket inside the kernel, never through
//! user memory: `scripts/bench gateway` (docs/benchmarks.md) measured the gateway's CPU per
//! GiB falling well below a read/write copy's with 64 KiB buffers. The pipe is taken only
//! while a direction is busy, so 10,000 idle tunnels cost no pipe descriptors. Why not
//! `tokio::io::copy_bidirectional_with_sizes`: it allocates its two buffers when the tunnel
//! starts and holds them until it ends.
//!
//! Guarantees: byte counts are exact (what was written to the other side); a direction
//! yields to the scheduler at least every [`BURST`] chunks, so one fast tunnel cannot starve
//! the others; a pipe that still holds bytes when the copy stops (error, cut, the future
//! dropped) is closed, never reused; dropping the future closes no socket (the caller owns
//! the sockets).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use rustix::pipe::{SpliceFlags, splice};
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::bufpool::COPY;
use crate::pipes::{PIPES, PooledPipe};

/// Chunks a direction moves before it waits on readiness again (which yields when the task's
/// budget is spent).
pub const BURST: usize = 16;

/// Why a tunnel ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Both sides closed.
    Closed,
    /// A read or write failed (reset, broken pipe).
    Error(std::io::ErrorKind),
    /// Silent both ways for the idle timeout.
    Idle,
    /// Cut by the caller's signal.
    Cut,
}

/// Bytes moved and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Client → member (up).
    pub up: u64,
    /// Member → client (down).
    pub down: u64,
    /// How it ended.
    pub end: End,
}

/// Writes all of `b` to `to`, waiting for writability only when the socket is full.
pub async fn write_all(to: &TcpStream, mut b: &[u8]) -> std::io::Result<()> {
    while !b.is_empty() {
        match to.try_write(b) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => b = b.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Dir<'a> {
    from: &'a TcpStream,
    to: &'a TcpStream,
    total: &'a AtomicU64,
    last: &'a AtomicU64,
    /// Directions that reached their source's end of stream.
    ended: &'a AtomicU8,
    start: Instant,
    up: bool,
}

impl Dir<'_> {
    fn moved(&self, n: usize, on_bytes: &(dyn Fn(u64, bool) + Sync)) {
        let n = n as u64;
        self.total.fetch_add(n, Ordering::Relaxed);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
        on_bytes(n, self.up);
    }

    fn half_close(&self) {
        // Half-close: the other side sees our end of stream.
        let _ = SockRef::from(self.to).shutdown(std::net::Shutdown::Write);
    }
}

/// What a burst ended with.
enum Burst {
    /// The source has nothing more for now.
    Drained,
    /// The source's end of stream.
    Eof,
}

async fn pump(d: Dir<'_>, on_bytes: &(dyn Fn(u64, bool) + Sync)) -> std::io::Result<()> {
    loop {
        d.from.readable().await?;
        let burst = match PIPES.take() {
            Ok(pipe) => splice_burst(&d, pipe, on_bytes).await?,
            Err(_) => buffer_burst(&d, on_bytes).await?,
        };
        if let Burst::Eof = burst {
            // NB: the second end of stream ends the tunnel and the caller closes both sockets
            // at once, which sends this FIN; the half-close is only for the first.
            if d.ended.fetch_add(1, Ordering::AcqRel) == 0 {
                d.half_close();
            }
            return Ok(());
        }
    }
}

const SPLICE: SpliceFlags = SpliceFlags::MOVE.union(SpliceFlags::NONBLOCK);

/// Up to [`BURST`] chunks source → pipe → other side, the pipe emptied after each.
// NB: the pipe is empty before each splice in, so EAGAIN there means the source has nothing
// (`try_io` then clears its readiness); during the splice out the pipe has bytes, so EAGAIN
// means the other side is full.
async fn splice_burst(
    d: &Dir<'_>,
    pipe: PooledPipe,
    on_bytes: &(dyn Fn(u64, bool) + Sync),
) -> std::io::Result<Burst> {
    let Some((r, w)) = pipe.ends() else {
        return Err(std::io::ErrorKind::BrokenPipe.into());
    };
    for _ in 0..BURST {
        let got = d.from.try_io(Interest::READABLE, || {
            Ok(splice(
                d.from,
                None,
                w,
                None,
                crate::pipes::PIPE_SIZE,
                SPLICE,
            )?)
        });
        match got {
            Ok(0) => return Ok(Burst::Eof),
            Ok(n) => pipe.set_held(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Burst::Drained),
            Err(e) => return Err(e),
        }
        while pipe.held() > 0 {
            let put = d.to.try_io(Interest::WRITABLE, || {
                Ok(splice(r, None, d.to, None, pipe.held(), SPLICE)?)
            });
            match put {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    pipe.set_held(pipe.held().saturating_sub(n));
                    d.moved(n, on_bytes);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => d.to.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(Burst::Drained)
}

/// Up to [`BURST`] chunks through a pooled buffer (when no pipe can be made).
async fn buffer_burst(
    d: &Dir<'_>,
    on_bytes: &(dyn Fn(u64, bool) + Sync),
) -> std::io::Result<Burst> {
    let mut buf = COPY.take();
    for _ in 0..BURST {
        match d.from.try_read(&mut buf) {
            Ok(0) => return Ok(Burst::Eof),
            Ok(n) => {
                write_all(d.to, buf.get(..n).unwrap_or_default()).await?;
                d.moved(n, on_bytes);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(Burst::Drained)
}

/// Copies both ways between `client` and `member` until the tunnel ends (see the module
/// doc); `on_bytes(n, up)` is called once per chunk written; `cut` ends it early. The caller
/// closes both sockets when it returns (after two ends of stream, that close is the last FIN).
pub async fn tunnel(
    client: &TcpStream,
    member: &TcpStream,
    idle: Duration,
    cut: impl std::future::Future<Output = ()>,
    on_bytes: &(dyn Fn(u64, bool) + Sync),
) -> Copied {
    let start = Instant::now();
    let (up, down, last) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let ended = AtomicU8::new(0);
    let both = async {
        tokio::try_join!(
            pump(
                Dir {
                    from: client,
                    to: member,
                    total: &up,
                    last: &last,
                    ended: &ended,
                    start,
                    up: true,
                },
                on_bytes,
            ),
            pump(
                Dir {
                    from: member,
                    to: client,
                    total: &down,
                    last: &last,
                    ended: &ended,
                    start,
                    up: false,
                },
                on_bytes,
            ),
        )
    };
    let silence = async {
        loop {
            let since = Duration::from_millis(last.load(Ordering::Relaxed));
            let due = start + since + idle;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    };
    let end = tokio::select! {
        biased;
        () = cut => End::Cut,
        r = both => match r {
            Ok(_) => End::Closed,
            Err(e) => End::Error(e.kind()),
        },
        () = silence => End::Idle,
    };
    Copied {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        end,
    }
}
