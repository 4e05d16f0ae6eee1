//! The gateway's Prometheus families, under `egress_proxies_gateway_` (docs/metrics.md lists
//! them): per pool, and per client identity where accounting is the point.
//!
//! Guarantees:
//! - **Bounded labels**: `pool` (the pools declaring a gateway), `outcome`, `direction`,
//!   `reason`, `result` and `limit` from closed sets, `identity` from the pool's configured
//!   client credentials, at most [`MAX_IDENTITY_SERIES`] per pool (further identities are
//!   counted under `identity="other"`). Nothing from a request reaches a label.
//! - **Present from start**: a pool's series exist (at zero) from the moment it is served,
//!   every outcome included; a pool's and an identity's series go when they go.
//! - The data path holds cloned handles (atomics), so counting costs no label lookup.
//! - [`GatewayMetrics`] is a prometheus-client `Collector`, so a driver adds it to the
//!   registry it already exposes (standalone's `/metrics`) or to its own (the gateway
//!   process).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::identity::IdentityMetrics;

/// Identities with their own series per pool.
// NB: the spec allows 64 client credentials per pool; the cap holds for any driver.
pub const MAX_IDENTITY_SERIES: usize = 64;

/// How a connection ended (the `outcome` label and the access log's `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Tunnelled and closed by a peer.
    Ok,
    /// A malformed or unsupported request.
    BadRequest,
    /// No or wrong credentials.
    AuthFailed,
    /// The destination is refused (the pool's rules or a member's policy).
    Denied,
    /// A per-identity limit refused it.
    Limited,
    /// No published member (with the asked egress address).
    NoMember,
    /// Every member tried failed.
    MemberFailed,
    /// The client did not send its request in time.
    RequestTimeout,
    /// The client went away before its request was complete.
    ClientGone,
    /// The tunnel was silent for the idle timeout.
    IdleTimeout,
    /// Cut at the end of its member's drain grace.
    Drained,
    /// Cut at the gateway's shutdown.
    Shutdown,
}

impl Outcome {
    /// Every outcome (series present from start).
    pub const ALL: [Outcome; 12] = [
        Self::Ok,
        Self::BadRequest,
        Self::AuthFailed,
        Self::Denied,
        Self::Limited,
        Self::NoMember,
        Self::MemberFailed,
        Self::RequestTimeout,
        Self::ClientGone,
        Self::IdleTimeout,
        Self::Drained,
        Self::Shutdown,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::BadRequest => "bad_request",
            Self::AuthFailed => "auth_failed",
            Self::Denied => "denied",
            Self::Limited => "limited",
            Self::NoMember => "no_member",
            Self::MemberFailed => "member_failed",
            Self::RequestTimeout => "request_timeout",
            Self::ClientGone => "client_gone",
            Self::IdleTimeout => "idle_timeout",
            Self::Drained => "drained",
            Self::Shutdown => "shutdown",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|o| *o == self).unwrap_or(0)
    }
}

/// Why a dial to a member failed (the `reason` label).
pub const DIAL_REASONS: [&str; 6] = [
    "unreachable",
    "timeout",
    "member_auth",
    "denied",
    "target_failed",
    "protocol",
];
/// Sticky results (the `result` label): the session's member is the one this replica saw it
/// on last (`hit`), another (`moved`), or the session is new to this replica (`new`).
pub const STICKY_RESULTS: [&str; 3] = ["hit", "moved", "new"];
/// Limits (the `limit` label).
pub const LIMITS: [&str; 2] = ["connections", "bytes"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolL {
    pool: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolOutcome {
    pool: String,
    outcome: &'static str,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolDirection {
    pool: String,
    direction: &'static str,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolReason {
    pool: String,
    reason: &'static str,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResult {
    pool: String,
    result: &'static str,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLimit {
    pool: String,
    limit: &'static str,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolIdentity {
    pool: String,
    identity: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolIdentityDirection {
    pool: String,
    identity: String,
    direction: &'static str,
}

#[derive(Debug, Default)]
struct Families {
    connections: Family<PoolOutcome, Counter>,
    active: Family<PoolL, Gauge>,
    bytes: Family<PoolDirection, Counter>,
    failovers: Family<PoolL, Counter>,
    dial_failures: Family<PoolReason, Counter>,
    sticky: Family<PoolResult, Counter>,
    auth_failures: Family<PoolL, Counter>,
    members: Family<PoolL, Gauge>,
    listeners: Family<PoolL, Gauge>,
    limited: Family<PoolLimit, Counter>,
    client_connections: Family<PoolIdentity, Counter>,
    client_active: Family<PoolIdentity, Gauge>,
    client_bytes: Family<PoolIdentityDirection, Counter>,
    log_dropped: Counter,
}

/// The gateway's metrics; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct GatewayMetrics {
    f: Arc<Families>,
    identities: Arc<Mutex<BTreeSet<(String, String)>>>,
}

/// One pool's series, as handles.
#[derive(Debug, Clone, Default)]
pub struct PoolMetrics {
    connections: Vec<Counter>,
    /// Connections open now.
    pub active: Gauge,
    /// Bytes client → target.
    pub bytes_up: Counter,
    /// Bytes target → client.
    pub bytes_down: Counter,
    /// Attempts after a failed one.
    pub failovers: Counter,
    dial_failures: Vec<Counter>,
    sticky: Vec<Counter>,
    /// Authentication failures.
    pub auth_failures: Counter,
    /// Published members the gateway sees.
    pub members: Gauge,
    /// Listeners bound.
    pub listeners: Gauge,
    limited: Vec<Counter>,
}

impl PoolMetrics {
    /// Counts a finished connection.
    pub fn connection(&self, o: Outcome) {
        if let Some(c) = self.connections.get(o.index()) {
            c.inc();
        }
    }

    /// Counts a failed dial.
    pub fn dial_failure(&self, reason: &str) {
        if let Some(i) = DIAL_REASONS.iter().position(|r| *r == reason)
            && let Some(c) = self.dial_failures.get(i)
        {
            c.inc();
        }
    }

    /// Counts a sticky result (`hit`, `moved`, `new`).
    pub fn sticky(&self, result: &str) {
        if let Some(i) = STICKY_RESULTS.iter().position(|r| *r == result)
            && let Some(c) = self.sticky.get(i)
        {
            c.inc();
        }
    }

    /// Counts a limit refusal (`connections`, `bytes`).
    pub fn limited(&self, limit: &str) {
        if let Some(i) = LIMITS.iter().position(|r| *r == limit)
            && let Some(c) = self.limited.get(i)
        {
            c.inc();
        }
    }
}

fn pool(p: &str) -> String {
    p.to_owned()
}

impl GatewayMetrics {
    /// Fresh families (nothing registered anywhere until the collector is).
    pub fn new() -> Self {
        Self::default()
    }

    /// The series of pool `key`, created at zero.
    pub fn pool(&self, key: &str) -> PoolMetrics {
        // NB: `get_or_create_owned` drops its read guard before returning; two plain
        // `get_or_create` guards of one family alive in one expression deadlock.
        fn one<S: Clone + std::hash::Hash + Eq, M: Clone + Default>(f: &Family<S, M>, l: S) -> M {
            f.get_or_create_owned(&l)
        }
        let f = &self.f;
        let p = || pool(key);
        let mut connections = Vec::new();
        for o in Outcome::ALL {
            connections.push(one(
                &f.connections,
                PoolOutcome {
                    pool: p(),
                    outcome: o.as_str(),
                },
            ));
        }
        let mut dial_failures = Vec::new();
        for reason in DIAL_REASONS {
            dial_failures.push(one(&f.dial_failures, PoolReason { pool: p(), reason }));
        }
        let mut sticky = Vec::new();
        for result in STICKY_RESULTS {
            sticky.push(one(&f.sticky, PoolResult { pool: p(), result }));
        }
        let mut limited = Vec::new();
        for limit in LIMITS {
            limited.push(one(&f.limited, PoolLimit { pool: p(), limit }));
        }
        let active = one(&f.active, PoolL { pool: p() });
        let bytes_up = one(
            &f.bytes,
            PoolDirection {
                pool: p(),
                direction: "up",
            },
        );
        let bytes_down = one(
            &f.bytes,
            PoolDirection {
                pool: p(),
                direction: "down",
            },
        );
        let failovers = one(&f.failovers, PoolL { pool: p() });
        let auth_failures = one(&f.auth_failures, PoolL { pool: p() });
        let members = one(&f.members, PoolL { pool: p() });
        let listeners = one(&f.listeners, PoolL { pool: p() });
        PoolMetrics {
            connections,
            active,
            bytes_up,
            bytes_down,
            failovers,
            dial_failures,
            sticky,
            auth_failures,
            members,
            listeners,
            limited,
        }
    }

    /// The series of identity `name` of pool `key` (`identity="other"` beyond
    /// [`MAX_IDENTITY_SERIES`] identities of the pool).
    pub fn identity(&self, key: &str, name: &str) -> IdentityMetrics {
        let label = {
            let mut ids = self
                .identities
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let known = ids.contains(&(key.to_owned(), name.to_owned()));
            let count = ids.iter().filter(|(p, _)| p == key).count();
            if known || count < MAX_IDENTITY_SERIES {
                ids.insert((key.to_owned(), name.to_owned()));
                name.to_owned()
            } else {
                "other".to_owned()
            }
        };
        let f = &self.f;
        let l = PoolIdentity {
            pool: pool(key),
            identity: label.clone(),
        };
        let d = |direction| PoolIdentityDirection {
            pool: pool(key),
            identity: label.clone(),
            direction,
        };
        let connections = f.client_connections.get_or_create_owned(&l);
        let active = f.client_active.get_or_create_owned(&l);
        let bytes_up = f.client_bytes.get_or_create_owned(&d("up"));
        let bytes_down = f.client_bytes.get_or_create_owned(&d("down"));
        IdentityMetrics {
            connections,
            active,
            bytes_up,
            bytes_down,
        }
    }

    /// Removes identity `name`'s series of pool `key`.
    pub fn forget_identity(&self, key: &str, name: &str) {
        let removed = self
            .identities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(key.to_owned(), name.to_owned()));
        if !removed {
            return;
        }
        let f = &self.f;
        let l = PoolIdentity {
            pool: pool(key),
            identity: name.to_owned(),
        };
        f.client_connections.remove(&l);
        f.client_active.remove(&l);
        for direction in ["up", "down"] {
            f.client_bytes.remove(&PoolIdentityDirection {
                pool: pool(key),
                identity: name.to_owned(),
                direction,
            });
        }
    }

    /// Removes every series of pool `key`.
    pub fn forget_pool(&self, key: &str) {
        let names: Vec<String> = self
            .identities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(p, _)| p == key)
            .map(|(_, n)| n.clone())
            .collect();
        for n in names.iter().map(String::as_str).chain(["other"]) {
            self.identities
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((key.to_owned(), n.to_owned()));
            self.forget_identity(key, n);
        }
        let f = &self.f;
        let p = || pool(key);
        for o in Outcome::ALL {
            f.connections.remove(&PoolOutcome {
                pool: p(),
                outcome: o.as_str(),
            });
        }
        for direction in ["up", "down"] {
            f.bytes.remove(&PoolDirection {
                pool: p(),
                direction,
            });
        }
        for reason in DIAL_REASONS {
            f.dial_failures.remove(&PoolReason { pool: p(), reason });
        }
        for result in STICKY_RESULTS {
            f.sticky.remove(&PoolResult { pool: p(), result });
        }
        for limit in LIMITS {
            f.limited.remove(&PoolLimit { pool: p(), limit });
        }
        for fam in [&f.failovers, &f.auth_failures] {
            fam.remove(&PoolL { pool: p() });
        }
        for fam in [&f.active, &f.members, &f.listeners] {
            fam.remove(&PoolL { pool: p() });
        }
    }

    /// Counts an access-log line dropped because the writer fell behind.
    pub fn log_dropped(&self) {
        self.f.log_dropped.inc();
    }
}

fn family<M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    m: &M,
) -> Result<(), std::fmt::Error> {
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

impl Collector for GatewayMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = &self.f;
        family(
            &mut e,
            "gateway_connections",
            "Client connections of each pool's gateway by outcome (ok: tunnelled; the others \
             refused or cut, see docs/gateway.md)",
            &f.connections,
        )?;
        family(
            &mut e,
            "gateway_active_connections",
            "Client connections open now",
            &f.active,
        )?;
        family(
            &mut e,
            "gateway_bytes",
            "Bytes tunnelled: up (client to target) and down (target to client)",
            &f.bytes,
        )?;
        family(
            &mut e,
            "gateway_failovers",
            "Member attempts made after a failed attempt, before the client got its first byte",
            &f.failovers,
        )?;
        family(
            &mut e,
            "gateway_dial_failures",
            "Failed attempts at a member by reason: unreachable, timeout, member_auth, denied, \
             target_failed, protocol",
            &f.dial_failures,
        )?;
        family(
            &mut e,
            "gateway_sticky_sessions",
            "Connections of sticky sessions: hit (the member this replica saw the session on \
             last), moved (another member), new (first seen by this replica)",
            &f.sticky,
        )?;
        family(
            &mut e,
            "gateway_auth_failures",
            "Connections refused for missing or wrong client credentials",
            &f.auth_failures,
        )?;
        family(
            &mut e,
            "gateway_members",
            "Published members the gateway chooses from",
            &f.members,
        )?;
        family(
            &mut e,
            "gateway_listeners",
            "Listeners of the pool's gateway that are bound (fewer than the spec declares: \
             see the log, e.g. a port in use)",
            &f.listeners,
        )?;
        family(
            &mut e,
            "gateway_limit_refusals",
            "Connections refused by a per-identity limit: connections or bytes",
            &f.limited,
        )?;
        family(
            &mut e,
            "gateway_client_connections",
            "Connections admitted per client identity",
            &f.client_connections,
        )?;
        family(
            &mut e,
            "gateway_client_active_connections",
            "Connections open per client identity",
            &f.client_active,
        )?;
        family(
            &mut e,
            "gateway_client_bytes",
            "Bytes tunnelled per client identity and direction",
            &f.client_bytes,
        )?;
        family(
            &mut e,
            "gateway_access_log_dropped",
            "Access-log lines dropped because the writer fell behind",
            &f.log_dropped,
        )?;
        Ok(())
    }
}
