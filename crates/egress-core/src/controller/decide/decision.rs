//! What [`decide`](super::decide()) returns: the [`Action`] for the executor and the
//! [`Decision`] around it (status, requeue, events, memory, finalized).
//!
//! Guarantees: plain data, no I/O; every event in it is already redacted.

use std::time::Duration;

use egress_provider::model::CreateRequest;

use crate::controller::Event;
use crate::model::ProxyStatus;

use super::inputs::Memory;

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Abort the work in flight.
    Cancel,
    /// Create (after deleting the old instance when `replace`).
    Create {
        /// The request (user-data rendered); boxed, the other variants are small.
        req: Box<CreateRequest>,
        /// Delete the instance by UID on `req.host` first.
        replace: bool,
    },
    /// Delete by UID on these hosts (aborting any work in flight first).
    Delete {
        /// Hosts.
        hosts: Vec<String>,
    },
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// The status to report.
    pub status: ProxyStatus,
    /// When to come back.
    pub requeue_after: Option<Duration>,
    /// Events.
    pub events: Vec<Event>,
    /// Memory to keep.
    pub memory: Memory,
    /// Deleting and nothing left: forget the Proxy.
    pub finalized: bool,
}
