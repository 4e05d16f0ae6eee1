//! Fixtures for the suites that run against the real libvirtd on this machine.
//!
//! - [`Dialer`]: how a test obtains a [`Client`]. Test bodies (see [`bodies`]) are generic over
//!   it, so the same body runs over the unix socket ([`Unix`]) and through a real sshd
//!   ([`ssh::Ssh`]).
//! - [`cleanup`]: unique `eptest-` names (printed before anything is created), Drop guards that
//!   remove domains and pools with `virsh` on every exit path, and the sweep of leftovers.
//! - [`sources`]: deterministic upload sources (hashing, failing, trickling).
//! - [`tap`]: a copy of what the daemon sent, to report what it answered.
//! - [`Baseline`] and [`in_own_process`]: open FD and tokio task counts, measured in a process
//!   of their own so that tests running in parallel cannot disturb them (finding H2).
//!
//! Every fixture fails loudly: when libvirtd is unreachable the tests FAIL with a message
//! saying so (CI guarantees the daemon), they never skip.

pub mod bodies;
pub use ep_test_support::cleanup;
pub mod sources;
pub mod ssh;
pub mod tap;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use libvirt_remote::transport::{self, KillSwitch, Transport};
use libvirt_remote::{Client, OpenOptions};
use tokio::net::UnixStream;

use tap::{Tap, TapReader};

/// How long any single test body may run before it fails (its guards then clean up).
// NB: the slowest body is the keepalive one (65 s of idleness); the 256 MiB upload takes
// ~15 s in a debug build here. Three minutes leaves room on a loaded 2-core box.
pub const TEST_BUDGET: Duration = Duration::from_secs(180);

/// How long a test run in its own process may take, child start-up included.
pub const ISOLATED_BUDGET: Duration = Duration::from_secs(240);

/// How long FD and task counts may take to return to their baseline after a failure.
// NB: everything is released within milliseconds of the call returning; an abort task that
// waits for the daemon's confirmation is bounded by the abort budget (5 s by default). 10 s
// covers that on a loaded box; a leak never settles.
pub const SETTLE_BUDGET: Duration = Duration::from_secs(10);

/// How often [`Baseline::settle`] re-reads the counts.
pub const SETTLE_POLL: Duration = Duration::from_millis(50);

/// Where the system libvirtd listens (overridable with `EPTEST_LIBVIRT_SOCKET`).
pub fn socket_path() -> PathBuf {
    std::env::var_os("EPTEST_LIBVIRT_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(transport::DEFAULT_SOCKET))
}

/// How a test obtains a freshly opened, handshaken [`Client`]. Each call is a new connection
/// (uploads want a dedicated one). Implementations panic with a clear message when the daemon
/// cannot be reached: these suites must fail, not skip, without it.
pub trait Dialer: Sync {
    /// The transport, for messages ("unix:/run/libvirt/libvirt-sock", "ssh:…").
    fn describe(&self) -> String;

    /// Opens a new connection.
    fn open(&self) -> impl Future<Output = Client> + Send;

    /// Opens a new connection that keeps a copy of what the daemon sends. Every transport
    /// provides it, so no check that reads the tap can be skipped on one of them.
    fn open_tapped(&self) -> impl Future<Output = (Client, Tap)> + Send;
}

/// The local daemon over its unix socket.
pub struct Unix;

impl Unix {
    fn unreachable(e: impl std::fmt::Display) -> ! {
        panic!(
            "libvirtd is not reachable at {}: {e}. These tests need the real daemon \
             (start it with `bash .ci/setup-host`); they fail rather than skip.",
            socket_path().display()
        )
    }
}

impl Dialer for Unix {
    fn describe(&self) -> String {
        format!("unix:{}", socket_path().display())
    }

    async fn open(&self) -> Client {
        let t = transport::unix::connect(socket_path(), transport::DEFAULT_DIAL_TIMEOUT)
            .await
            .unwrap_or_else(|e| Self::unreachable(e));
        Client::open(t, OpenOptions::default())
            .await
            .unwrap_or_else(|e| Self::unreachable(e))
    }

    async fn open_tapped(&self) -> (Client, Tap) {
        let path = socket_path();
        let stream =
            tokio::time::timeout(transport::DEFAULT_DIAL_TIMEOUT, UnixStream::connect(&path))
                .await
                .unwrap_or_else(|e| Self::unreachable(e))
                .unwrap_or_else(|e| Self::unreachable(e));
        let kill = KillSwitch::noop();
        kill.push_socket(&stream)
            .expect("dup the socket for the kill switch");
        let (r, w) = stream.into_split();
        let tap = Tap::default();
        let t = Transport::new(
            TapReader::new(r, tap.clone()),
            w,
            kill,
            format!("unix-tapped:{}", path.display()),
        );
        let c = Client::open(t, OpenOptions::default())
            .await
            .unwrap_or_else(|e| Self::unreachable(e));
        (c, tap)
    }
}

/// Runs a test body: sweeps old leftovers once per process, prints the transport, and fails
/// the test if the body outlives `budget` (dropping it, so its guards clean up).
pub async fn run<F: Future<Output = ()>>(what: &str, d: &impl Dialer, budget: Duration, body: F) {
    cleanup::sweep_once();
    println!("eptest: {what} over {}", d.describe());
    if tokio::time::timeout(budget, body).await.is_err() {
        panic!("{what} did not finish within {budget:?}; its resources were cleaned up on drop");
    }
}

/// Runs `body` in a child process of its own (this test binary, filtered to `test` exactly),
/// so the process-wide counts it asserts (open FDs) see nothing from tests running in
/// parallel. In the child (`EPTEST_ISOLATED` = `test`) it just runs the body.
pub async fn in_own_process<F: Future<Output = ()>>(test: &str, body: F) {
    ep_test_support::isolate::in_own_process(test, ISOLATED_BUDGET, body).await;
}

/// Open file descriptors of this process (the count includes the directory handle used to
/// count, consistently).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Tasks alive on the current tokio runtime.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Open FD and alive task counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Baseline {
    /// Open file descriptors.
    pub fds: usize,
    /// Alive tokio tasks.
    pub tasks: usize,
}

impl Baseline {
    /// The counts now.
    pub fn take() -> Self {
        Self {
            fds: open_fds(),
            tasks: alive_tasks(),
        }
    }

    /// Waits (bounded by [`SETTLE_BUDGET`]) until both counts are back to this baseline;
    /// fails the test naming `after` and the counts otherwise.
    pub async fn settle(&self, after: &str) {
        let start = tokio::time::Instant::now();
        loop {
            let now = Self::take();
            if now.fds <= self.fds && now.tasks <= self.tasks {
                println!(
                    "eptest: {after}: back to baseline {self:?} after {:?}",
                    start.elapsed()
                );
                return;
            }
            if start.elapsed() > SETTLE_BUDGET {
                panic!(
                    "{after}: counts did not return to baseline {self:?} within \
                     {SETTLE_BUDGET:?}: now {now:?}"
                );
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }
}
