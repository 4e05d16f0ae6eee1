//! One client identity's live state: open connections, bytes in the current budget period,
//! and its metric series; the per-identity limits are checked here.
//!
//! Guarantees: counters are atomics (no lock on the data path); an admitted connection holds
//! an [`Admission`] that gives its slot back on drop, whatever ends the connection; a byte
//! budget is a fixed window aligned to the Unix epoch (`floor(unix_time / period)`), so every
//! replica's windows start together; limits are per gateway replica.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::model::Limits;

/// An identity's metric series (unregistered ones in tests).
#[derive(Debug, Clone, Default)]
pub struct IdentityMetrics {
    /// Connections admitted.
    pub connections: Counter,
    /// Connections open.
    pub active: Gauge,
    /// Bytes client → target.
    pub bytes_up: Counter,
    /// Bytes target → client.
    pub bytes_down: Counter,
}

/// One identity.
#[derive(Debug)]
pub struct IdentityRt {
    name: String,
    active: AtomicU32,
    period: AtomicU64,
    period_bytes: AtomicU64,
    metrics: IdentityMetrics,
}

/// Which limit refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// Open connections.
    Connections(u32),
    /// The byte budget of the period.
    Bytes {
        /// The budget.
        budget: u64,
        /// The period.
        period: Duration,
    },
}

impl LimitHit {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connections(_) => "connections",
            Self::Bytes { .. } => "bytes",
        }
    }
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connections(n) => {
                write!(f, "this client already has {n} open connections, its limit")
            }
            Self::Bytes { budget, period } => write!(
                f,
                "this client used its budget of {budget} bytes per {}s; it renews at the next period",
                period.as_secs()
            ),
        }
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl IdentityRt {
    /// An identity without registered metrics.
    pub fn new(name: &str) -> Self {
        Self::with_metrics(name, IdentityMetrics::default())
    }

    /// An identity counting into `metrics`.
    pub fn with_metrics(name: &str, metrics: IdentityMetrics) -> Self {
        Self {
            name: name.to_owned(),
            active: AtomicU32::new(0),
            period: AtomicU64::new(0),
            period_bytes: AtomicU64::new(0),
            metrics,
        }
    }

    /// The identity's name (its username).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Open connections now.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    /// Bytes counted in the current period.
    pub fn period_bytes(&self) -> u64 {
        self.period_bytes.load(Ordering::Relaxed)
    }

    fn roll(&self, period: Duration) {
        let idx = unix_secs() / period.as_secs().max(1);
        if self.period.load(Ordering::Relaxed) != idx
            && self.period.swap(idx, Ordering::Relaxed) != idx
        {
            self.period_bytes.store(0, Ordering::Relaxed);
        }
    }

    /// Admits a connection within `limits`, or says which limit refuses it.
    pub fn admit(self: &Arc<Self>, limits: &Limits) -> Result<Admission, LimitHit> {
        if let Some(b) = limits.bytes {
            self.roll(b.period);
            if self.period_bytes.load(Ordering::Relaxed) >= b.bytes {
                return Err(LimitHit::Bytes {
                    budget: b.bytes,
                    period: b.period,
                });
            }
        }
        let before = self.active.fetch_add(1, Ordering::AcqRel);
        if let Some(max) = limits.max_connections
            && before >= max
        {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return Err(LimitHit::Connections(max));
        }
        self.metrics.connections.inc();
        self.metrics.active.inc();
        Ok(Admission {
            rt: Arc::clone(self),
            budget_period: limits.bytes.map(|b| b.period),
        })
    }
}

/// An admitted connection's slot: counts its bytes, frees the slot on drop.
#[derive(Debug)]
pub struct Admission {
    rt: Arc<IdentityRt>,
    budget_period: Option<Duration>,
}

impl Admission {
    /// The identity.
    pub fn identity(&self) -> &IdentityRt {
        &self.rt
    }

    /// Counts `n` bytes client → target (`up`) or back.
    pub fn add_bytes(&self, n: u64, up: bool) {
        if let Some(p) = self.budget_period {
            self.rt.roll(p);
            self.rt.period_bytes.fetch_add(n, Ordering::Relaxed);
        }
        if up {
            self.rt.metrics.bytes_up.inc_by(n);
        } else {
            self.rt.metrics.bytes_down.inc_by(n);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.rt.active.fetch_sub(1, Ordering::AcqRel);
        self.rt.metrics.active.dec();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::ByteBudget;

    #[test]
    fn connection_and_byte_limits_refuse_new_connections_and_slots_come_back() {
        let id = Arc::new(IdentityRt::new("alice"));
        let limits = Limits {
            max_connections: Some(2),
            bytes: Some(ByteBudget {
                bytes: 100,
                period: Duration::from_secs(3600),
            }),
        };
        let a = id.admit(&limits).unwrap();
        let b = id.admit(&limits).unwrap();
        assert_eq!(id.admit(&limits).unwrap_err(), LimitHit::Connections(2));
        drop(b);
        let c = id.admit(&limits).unwrap();
        a.add_bytes(60, true);
        c.add_bytes(40, false);
        drop((a, c));
        assert_eq!(id.active(), 0);
        assert!(matches!(
            id.admit(&limits).unwrap_err(),
            LimitHit::Bytes { budget: 100, .. }
        ));
        assert!(id.admit(&Limits::default()).is_ok());
    }
}
