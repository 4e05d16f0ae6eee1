//! How the controller behaves: [`ControllerSettings`] and the documented default constants
//! behind it, plus the deadline of a whole create derived from an entry's own timeouts.
//!
//! Guarantees: every timeout is a named constant with a comment on how it was sized; no I/O.

use std::time::Duration;

/// Default provisioning deadline (finding APX-1).
// NB: a TCG guest (no KVM) boots a cloud image and runs cloud-init in 1–3 minutes; package
// installs on first boot can add several more. 15 minutes is well past a slow first boot and
// short enough that a stuck VM is noticed within one coffee break.
pub const DEFAULT_PROVISIONING_DEADLINE: Duration = Duration::from_secs(15 * 60);
/// Default bound on one reconcile call (finding APX-3).
// NB: one reconcile makes at most one provider `get` (a handful of libvirt calls, normally
// < 100 ms over SSH); creates and deletes are spawned. 30 s leaves room for a slow SSH dial
// (the entry's dial timeout defaults to 10 s) and still frees a worker quickly.
pub const DEFAULT_RECONCILE_DEADLINE: Duration = Duration::from_secs(30);
/// Default first retry delay after a failure (finding APX-2).
// NB: most transient libvirt failures (a dropped SSH link, a busy daemon) clear within seconds.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Default longest retry delay (finding APX-2).
// NB: 5 minutes keeps a host that is down for hours from being hammered while a fix is still
// picked up within minutes; 5 s doubling reaches it after 7 failures.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// Default time the last known IP is kept while an instance reports no address (finding H3).
// NB: a guest agent restart or a DHCP renewal hides the address for a few seconds; a minute
// covers those without hiding a real loss for long.
pub const DEFAULT_IP_GRACE: Duration = Duration::from_secs(60);
/// Default poll interval of a Running proxy.
// NB: state changes also arrive with the driver's own resyncs; one get per proxy per minute is
// cheap (1000 proxies: ~17 gets/s across all hosts).
pub const DEFAULT_POLL_RUNNING: Duration = Duration::from_secs(60);
/// Default poll interval while provisioning (create running, or waiting for an address).
// NB: cloud-init reports an address ~40 s after start on TCG; 5 s polls see it promptly.
pub const DEFAULT_POLL_PROVISIONING: Duration = Duration::from_secs(5);
/// Longest a delete of one instance on one host may take before it is reported failed.
// NB: destroy + undefine + two volume deletes are a handful of calls; 2 minutes covers a
// slow host, and a frozen one is given up on (and retried with backoff) after that.
pub const DELETE_DEADLINE: Duration = Duration::from_secs(120);
/// Slack added to an entry's own timeouts to bound a whole create.
// NB: a create is an import (bounded by `timeouts.imageImport`), a start (`timeouts.start`)
// and a few dozen calls (each bounded by `timeouts.call`); this covers the calls in between.
pub const CREATE_SLACK: Duration = Duration::from_secs(120);
/// Number of `timeouts.call` budgets a create's own calls may take beside import and start.
// NB: lock, capability probe, pool refresh, volume creates, seed upload, define, start: ~10
// sequential calls, each bounded by `timeouts.call`.
pub const CREATE_CALL_BUDGETS: u32 = 10;

/// How the controller behaves; [`Default`] gives the documented constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSettings {
    /// How long an instance may take from the start of a create to reporting an address
    /// (finding APX-1).
    pub provisioning_deadline: Duration,
    /// Bound on one [`Controller::reconcile`](super::Controller::reconcile) call (finding
    /// APX-3).
    pub reconcile_deadline: Duration,
    /// First retry delay after a failure (finding APX-2).
    pub backoff_base: Duration,
    /// Longest retry delay (finding APX-2).
    pub backoff_max: Duration,
    /// How long the last known IP is kept through a Provisioning gap (finding H3).
    pub ip_grace: Duration,
    /// Poll interval of a Running proxy.
    pub poll_running: Duration,
    /// Poll interval while provisioning.
    pub poll_provisioning: Duration,
    /// On an expired provisioning deadline: replace the instance (true) or report the Proxy
    /// Failed and wait for a spec or config change (false).
    pub replace_on_deadline: bool,
    /// Ports HTTP CONNECT may reach through a proxy whose policy lists no ports: by default
    /// [`DEFAULT_CONNECT_PORTS`](crate::proxy_policy::DEFAULT_CONNECT_PORTS); the drivers
    /// add their health check targets' ports (the probes CONNECT through the proxy).
    pub connect_ports: Vec<u16>,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            provisioning_deadline: DEFAULT_PROVISIONING_DEADLINE,
            reconcile_deadline: DEFAULT_RECONCILE_DEADLINE,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            ip_grace: DEFAULT_IP_GRACE,
            poll_running: DEFAULT_POLL_RUNNING,
            poll_provisioning: DEFAULT_POLL_PROVISIONING,
            // NB: replacing is what a user of an egress pool wants (a new VM usually boots);
            // Failed is for debugging a bad image.
            replace_on_deadline: true,
            connect_ports: crate::proxy_policy::DEFAULT_CONNECT_PORTS.to_vec(),
        }
    }
}

impl ControllerSettings {
    /// Adds `port` to [`Self::connect_ports`] (once).
    pub fn allow_connect_port(&mut self, port: u16) {
        if !self.connect_ports.contains(&port) {
            self.connect_ports.push(port);
        }
    }
}

/// Bound on a whole create from the entry's own timeouts.
pub(super) fn create_deadline(t: &egress_provider::libvirt::config::Timeouts) -> Duration {
    t.image_import
        .saturating_add(t.start)
        .saturating_add(t.call.saturating_mul(CREATE_CALL_BUDGETS))
        .saturating_add(CREATE_SLACK)
}
