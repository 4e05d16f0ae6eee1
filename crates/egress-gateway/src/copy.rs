//! The byte copy of an open tunnel, both ways, with buffers from the shared pool
//! ([`crate::bufpool::COPY`]).
//!
//! Each direction waits for its source to be readable *before* it takes a buffer, reads and
//! writes while bytes keep coming, and gives the buffer back as soon as the source has nothing
//! more: an idle tunnel holds no buffer, a busy one holds one per busy direction, and no chunk
//! allocates. A source's end of stream shuts the other side's write half (half-close is
//! carried through); the tunnel ends when both directions ended, on the first error, when it
//! was silent both ways for the idle timeout, or when cut (drain grace over, shutdown).
//!
//! NB: why not `tokio::io::copy_bidirectional_with_sizes`: it allocates its two buffers when
//! the tunnel starts and holds them until it ends, so 10,000 idle tunnels would hold 10,000 ×
//! 2 buffers; and why not `splice(2)`: it needs two pipes (four descriptors) per tunnel and
//! `unsafe` or a syscall crate, while the bench (docs/benchmarks.md) shows this copy already
//! at the member's own throughput.
//!
//! Guarantees: byte counts are exact (what was written to the other side); a direction
//! yields to the scheduler at least every [`BURST`] chunks, so one fast tunnel cannot starve
//! the others; dropping the future closes nothing by itself (the caller owns the sockets).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::bufpool::COPY;

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
    start: Instant,
    up: bool,
}

async fn pump(d: Dir<'_>, on_bytes: &(dyn Fn(u64, bool) + Sync)) -> std::io::Result<()> {
    loop {
        d.from.readable().await?;
        let mut buf = COPY.take();
        for _ in 0..BURST {
            match d.from.try_read(&mut buf) {
                Ok(0) => {
                    // Half-close: the other side sees our end of stream.
                    let _ = SockRef::from(d.to).shutdown(std::net::Shutdown::Write);
                    return Ok(());
                }
                Ok(n) => {
                    write_all(d.to, buf.get(..n).unwrap_or_default()).await?;
                    let n = n as u64;
                    d.total.fetch_add(n, Ordering::Relaxed);
                    let ms = u64::try_from(d.start.elapsed().as_millis()).unwrap_or(u64::MAX);
                    d.last.store(ms, Ordering::Relaxed);
                    on_bytes(n, d.up);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Copies both ways between `client` and `member` until the tunnel ends (see the module
/// doc); `on_bytes(n, up)` is called once per chunk written; `cut` ends it early.
pub async fn tunnel(
    client: &TcpStream,
    member: &TcpStream,
    idle: Duration,
    cut: impl std::future::Future<Output = ()>,
    on_bytes: &(dyn Fn(u64, bool) + Sync),
) -> Copied {
    let start = Instant::now();
    let (up, down, last) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let both = async {
        tokio::try_join!(
            pump(
                Dir {
                    from: client,
                    to: member,
                    total: &up,
                    last: &last,
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
