//! The copy allocates nothing and opens nothing per chunk: 256 MiB through one tunnel (a real
//! tinyproxy member, the blob target) creates pipes a bounded number of times, however many
//! chunks it moves, and takes no copy buffer (the buffer path is only for when no pipe can be
//! made). Its own test binary, so no other test shares the pools' counters.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use egress_gateway::bufpool::COPY;
use egress_gateway::pipes::{PIPE_SIZE, PIPES};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_transfer_allocates_no_buffer_per_chunk() {
    let b = blob().await;
    let m = tinyproxy(0, "m0", "member-password-0000").await;
    let gw = Gateway::start(
        settings(),
        vec![client("alice", "pw-pw-pw-1")],
        vec![member(&m)],
    )
    .await;
    // Warm up: one small exchange.
    let t = http_tunnel(gw.http, "alice", "pw-pw-pw-1", &b.addr.to_string())
        .await
        .unwrap();
    blob_exchange(t, 1000, 1000).await;
    let (before, bufs) = (PIPES.made(), COPY.allocated());
    let size = 256u64 << 20;
    let t = http_tunnel(gw.http, "alice", "pw-pw-pw-1", &b.addr.to_string())
        .await
        .unwrap();
    blob_exchange(t, size, size).await;
    let made = PIPES.made() - before;
    let chunks = size / PIPE_SIZE as u64;
    // Two directions busy at once need two pipes; a few more cover a pipe taken on a wake-up
    // while the other was still out. Per chunk would be thousands.
    assert!(made <= 4, "{made} pipes made for at least {chunks} chunks");
    assert_eq!(COPY.allocated(), bufs, "no copy buffer was taken");
    let lines = gw.log_lines(2).await;
    assert_eq!(lines[1]["bytes_up"], size + 16);
    assert_eq!(lines[1]["bytes_down"], size);
    assert_eq!(PIPES.out(), 0, "an ended tunnel holds no pipe");
}
