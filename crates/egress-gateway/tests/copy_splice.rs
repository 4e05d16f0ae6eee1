//! The tunnel copy (`splice(2)` through pooled pipes) on its own, between loopback sockets:
//! bytes intact both ways with half-close, a large transfer that creates no pipe per chunk,
//! idle tunnels that hold no pipe, a cut that ends a tunnel with bytes in flight at once, and
//! a dropped copy future whose pipe (with bytes in it) is never reused. The tests share the
//! pipe pool's counters, so they take turns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use egress_gateway::bufpool::COPY;
use egress_gateway::copy::{self, Copied, End};
use egress_gateway::pipes::PIPES;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const IDLE: Duration = Duration::from_secs(60);
/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(60);

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

/// The two outer ends (what the client and the member hold) and the copy between the inner
/// ends, ended by `cut`.
struct Rig {
    client: TcpStream,
    member: TcpStream,
    copy: JoinHandle<Copied>,
}

async fn rig(cut: CancellationToken) -> Rig {
    let (client, c_in) = pair().await;
    let (member, m_in) = pair().await;
    let copy = tokio::spawn(async move {
        copy::tunnel(&c_in, &m_in, IDLE, cut.cancelled_owned(), &|_, _| {}).await
    });
    Rig {
        client,
        member,
        copy,
    }
}

/// A stream of `len` bytes whose period (1 MiB + 7) never lines up with a pipe or buffer.
fn pattern(seed: u8) -> Vec<u8> {
    (0..(1usize << 20) + 7)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

async fn send(mut w: impl AsyncWriteExt + Unpin, p: &[u8], len: usize) {
    let mut sent = 0;
    while sent < len {
        let n = (len - sent).min(p.len());
        w.write_all(&p[..n]).await.unwrap();
        sent += n;
    }
}

/// Reads to end of stream and checks every byte against `p` repeated.
async fn receive(mut r: impl AsyncReadExt + Unpin, p: &[u8]) -> usize {
    let mut buf = vec![0u8; 300_007];
    let mut got = 0usize;
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            return got;
        }
        let mut at = 0;
        while at < n {
            let off = (got + at) % p.len();
            let k = (n - at).min(p.len() - off);
            assert!(
                buf[at..at + k] == p[off..off + k],
                "bytes differ near offset {}",
                got + at
            );
            at += k;
        }
        got += n;
    }
}

/// `len_up` client → member then the client's half-close, while `len_down` member → client
/// starts only once the member saw that end of stream: both arrive intact.
async fn both_ways(len_up: usize, len_down: usize) -> Copied {
    let r = rig(CancellationToken::new()).await;
    let (up, down) = (pattern(1), pattern(2));
    let (cr, mut cw) = r.client.into_split();
    let (mr, mut mw) = r.member.into_split();
    let client = async {
        send(&mut cw, &up, len_up).await;
        cw.shutdown().await.unwrap();
        receive(cr, &down).await
    };
    let member = async {
        let got = receive(mr, &up).await;
        send(&mut mw, &down, len_down).await;
        mw.shutdown().await.unwrap();
        got
    };
    let (got_down, got_up) = tokio::time::timeout(WAIT, async { tokio::join!(client, member) })
        .await
        .expect("the transfer ends");
    assert_eq!((got_up, got_down), (len_up, len_down));
    let copied = tokio::time::timeout(WAIT, r.copy).await.unwrap().unwrap();
    assert_eq!(
        (copied.up, copied.down, &copied.end),
        (len_up as u64, len_down as u64, &End::Closed)
    );
    copied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_are_intact_both_ways_and_a_half_close_is_carried_through() {
    let _turn = TURN.lock().await;
    both_ways(3_000_001, 2_000_003).await;
    both_ways(1, 0).await;
    both_ways(0, 5).await;
    assert_eq!(PIPES.out(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transfer_creates_no_pipe_and_takes_no_buffer_per_chunk() {
    let _turn = TURN.lock().await;
    both_ways(1000, 1000).await;
    let (made, bufs) = (PIPES.made(), COPY.allocated());
    let size = 512usize << 20;
    both_ways(size, size / 2).await;
    let made = PIPES.made() - made;
    // One pipe per busy direction, a few more for one taken while the other was still out;
    // per chunk would be thousands.
    assert!(made <= 4, "{made} pipes made for {size} bytes");
    assert_eq!(COPY.allocated(), bufs, "the buffer path was not used");
    assert_eq!(PIPES.out(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_hold_no_pipe() {
    let _turn = TURN.lock().await;
    let mut rigs = Vec::new();
    for _ in 0..50 {
        let mut r = rig(CancellationToken::new()).await;
        r.client.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        r.member.read_exact(&mut b).await.unwrap();
        r.member.write_all(b"pong").await.unwrap();
        r.client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        rigs.push(r);
    }
    // The copies are parked on readiness now; give the last one a moment to put its pipe back.
    let t0 = Instant::now();
    while PIPES.out() != 0 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(PIPES.out(), 0, "50 idle tunnels hold no pipe");
    assert!(rigs.iter().all(|r| !r.copy.is_finished()), "all still open");
}

/// A tunnel whose member does not read: the client's bytes fill the member's socket, and the
/// upward direction holds a pipe with bytes in it.
async fn stuck(cut: CancellationToken) -> (TcpStream, JoinHandle<Copied>, JoinHandle<()>) {
    let r = rig(cut).await;
    let (cr, mut cw) = r.client.into_split();
    let writer = tokio::spawn(async move {
        let _keep = cr;
        let p = pattern(3);
        send(&mut cw, &p, 256 << 20).await;
    });
    let t0 = Instant::now();
    while PIPES.out() != 1 && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Steady: the pipe stays on loan (its splice out waits for room).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(PIPES.out(), 1, "the stuck direction holds its pipe");
    (r.member, r.copy, writer)
}

/// A fresh tunnel carries exactly its own bytes (a reused pipe with old bytes would not).
async fn clean_exchange() {
    let mut r = rig(CancellationToken::new()).await;
    tokio::time::timeout(Duration::from_secs(10), async {
        r.client.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        r.member.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello", "the member got exactly the client's bytes");
        r.member.write_all(b"world").await.unwrap();
        r.client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"world");
    })
    .await
    .expect("the exchange ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_ends_a_tunnel_with_bytes_in_flight_at_once_and_its_pipe_is_not_reused() {
    let _turn = TURN.lock().await;
    let cut = CancellationToken::new();
    let (_member, copy, writer) = stuck(cut.clone()).await;
    let t0 = Instant::now();
    cut.cancel();
    let copied = tokio::time::timeout(WAIT, copy).await.unwrap().unwrap();
    assert_eq!(copied.end, End::Cut);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "cut after {:?}",
        t0.elapsed()
    );
    assert_eq!(PIPES.out(), 0);
    writer.abort();
    clean_exchange().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_copy_closes_its_pipe_with_bytes_in_it_never_reusing_it() {
    let _turn = TURN.lock().await;
    let (_member, copy, writer) = stuck(CancellationToken::new()).await;
    copy.abort();
    let _ = copy.await;
    assert_eq!(PIPES.out(), 0, "the dropped copy gave its pipe up");
    writer.abort();
    clean_exchange().await;
}
