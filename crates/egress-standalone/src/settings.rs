//! The standalone driver's defaults and fixed timings, each with how it was sized. Every
//! job reads them from here; the options a user sets ([`crate::StandaloneOptions`]) start
//! from the defaults.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// The provider config used without `--config`: this machine's libvirtd through its local
/// unix socket (`address: local`), pool `egress-proxies`, network `default`, TCG guests.
pub const DEFAULT_CONFIG: &str = include_str!("default_config.yaml");

/// Default listen address of the status endpoint.
// NB: 9464 is the port OpenTelemetry's Prometheus exporter made conventional for a process's
// own metrics; loopback only, since /status shows hosts and addresses.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9464));
/// Default number of reconcile workers.
// NB: a reconcile is bounded and mostly waits on one `get`; creates run as spawned tasks in
// the controller. Four workers keep 1000 proxies moving on 2 cores, and the per-host limits
// (not the worker count) bound the load on each host.
pub const DEFAULT_WORKERS: usize = 4;
/// Default interval between GC passes.
// NB: orphans only appear after crashes or manual edits; every 10 minutes bounds how long one
// lingers (plus GC's minimum age) at the cost of one listing per entry.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(600);
/// Default interval between host checks.
// NB: placement skips hosts that are not Ready; 30 s notices a host going away well before a
// user does, for one cheap probe per host.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Default time given to work in flight at shutdown.
// NB: a create that is uploading a base may need minutes, but a service manager's stop
// timeout is typically 90 s; 60 s finishes most creates and stays within it. What is cut is
// converged by the next start (creates are idempotent, bases are published only verified).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(60);
/// How often the manifest directory (and the config file) is polled for changes.
// NB: polling rather than inotify (`notify`): a directory of small files is listed and
// stat()ed in microseconds, polling sees changes inotify misses (NFS, bind mounts, editors
// that replace files), and it adds no dependency. Two seconds feels immediate to a user.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// Longest one entry's adoption listing may take.
// NB: the same as GC's listing budget: a listing of 1000 domains takes seconds; a frozen host
// ends it as a failure (retried after [`ADOPT_RETRY`]), never a hang.
pub const ADOPT_DEADLINE: Duration = egress_core::gc::LIST_BUDGET;
/// Delay before retrying an entry whose adoption listing failed, and before re-queuing an
/// object whose entry is not adopted yet.
// NB: long enough not to hammer a down host, short enough that a host that comes back is
// serving within seconds.
pub const ADOPT_RETRY: Duration = Duration::from_secs(10);
/// Longest one entry's host check may take.
// NB: `check` bounds each host by the entry's dial and call timeouts (70 s by default); this
// is a backstop above them.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(120);
/// Every known Proxy is reconciled at least this often, whatever its requeue said.
// NB: catches drift nobody announced (an instance deleted by hand); 5 minutes costs 1000
// proxies ~3 gets/s.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(300);
