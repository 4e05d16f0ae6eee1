//! What one reconcile reports back to its driver: the [`Outcome`] (status, requeue, events,
//! finalized) and the [`Event`]s in it.
//!
//! Guarantees: every event message is redacted and bounded like a condition's (finding D5);
//! no I/O.

use std::time::Duration;

use crate::model::ProxyStatus;

/// What one reconcile concluded.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The status to write (redacted messages).
    pub status: ProxyStatus,
    /// When to reconcile again; `None`: only on a change (spec, config) or a resync.
    pub requeue_after: Option<Duration>,
    /// Events to publish (redacted messages).
    pub events: Vec<Event>,
    /// The Proxy was being deleted and nothing is left on any host: the driver may forget it.
    pub finalized: bool,
    /// A create of a new instance for this Proxy started in this reconcile (its first, or one
    /// re-created in place of a stopped or lost one, possibly on the same address): what the
    /// health checks knew of an older instance no longer holds, and the driver drops it.
    pub instance_started: bool,
}

/// An event's kind, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

/// An event about a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub kind: EventKind,
    /// A stable CamelCase reason.
    pub reason: String,
    /// Redacted, bounded message.
    pub message: String,
}

impl Event {
    /// An event whose message is redacted and truncated like a condition's (finding D5).
    pub fn new(kind: EventKind, reason: &str, message: &str) -> Self {
        Self {
            kind,
            reason: reason.to_owned(),
            message: crate::model::truncate(
                &egress_provider::error::redact(message),
                crate::model::MAX_MESSAGE_CHARS,
            ),
        }
    }
}
