//! The working state of one decision ([`Ctx`]) and the rules every step shares: set a
//! condition, add an event, latch a Permanent failure, retry a transient one with backoff,
//! classify a provider failure; plus the time formats of a status.
//!
//! Guarantees: no I/O and no clock reads (the time is the input's `now`); a retry never
//! latches, keeps phase and IP, and requeues with capped exponential backoff (finding
//! APX-2); a latch records the generation and config digest that release it.

use std::time::{Duration, SystemTime};

use egress_provider::error::{ErrorClass, ProviderError};

use crate::controller::backoff::backoff;
use crate::controller::{Event, EventKind};
use crate::model::{Condition, ConditionStatus, Phase, ProxyStatus, condition};

use super::decision::{Action, Decision};
use super::inputs::{Inputs, Latch, Memory};
use super::reason;

/// RFC 3339 (seconds) form of `t`.
pub fn fmt_time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

pub(super) fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}

pub(super) fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// The working state of one decision.
#[derive(Clone)]
pub(super) struct Ctx<'a> {
    pub(super) i: &'a Inputs<'a>,
    pub(super) status: ProxyStatus,
    pub(super) events: Vec<Event>,
    pub(super) memory: Memory,
    pub(super) now_s: String,
}

impl Ctx<'_> {
    pub(super) fn cond(&mut self, type_: &str, st: ConditionStatus, reason: &str, msg: &str) {
        let c = Condition::new(type_, st, reason, msg, &self.now_s, self.i.obj.generation);
        self.status.set_condition(c);
    }
    pub(super) fn event(&mut self, kind: EventKind, reason: &str, msg: &str) {
        self.events.push(Event::new(kind, reason, msg));
    }
    pub(super) fn done(self, action: Action, requeue_after: Option<Duration>) -> Decision {
        Decision {
            action,
            status: self.status,
            requeue_after,
            events: self.events,
            memory: self.memory,
            finalized: false,
        }
    }
    pub(super) fn digest(&self) -> String {
        self.i
            .entry
            .map(|e| e.config_digest.to_owned())
            .unwrap_or_default()
    }
    /// Latches a Permanent failure: phase Failed, Ready=False, no requeue. A Proxy that was
    /// not yet Running (or whose `Provisioned` condition still says a create is under way)
    /// gets the same reason and message on `Provisioned`, so no condition says "Creating"
    /// while the phase is Failed and the first False condition carries the cause.
    pub(super) fn latch(mut self, reason: &str, msg: &str, action: Action) -> Decision {
        let was = self.status.phase;
        let provisioning_claimed = self
            .status
            .condition(condition::PROVISIONED)
            .is_some_and(|c| c.status != ConditionStatus::True);
        self.status.phase = Phase::Failed;
        if matches!(was, Phase::Pending | Phase::Provisioning | Phase::Failed)
            || provisioning_claimed
        {
            self.cond(condition::PROVISIONED, ConditionStatus::False, reason, msg);
        }
        self.cond(condition::READY, ConditionStatus::False, reason, msg);
        self.event(EventKind::Warning, reason, msg);
        self.memory.latch = Some(Latch {
            generation: self.i.obj.generation,
            config_digest: self.digest(),
        });
        self.done(action, None)
    }
    /// A retryable failure: Ready=False with reason and message, phase and IP unchanged,
    /// backoff requeue (finding APX-2).
    pub(super) fn retry(mut self, reason: &str, msg: &str, action: Action) -> Decision {
        self.memory.failures = self.memory.failures.saturating_add(1);
        self.cond(condition::READY, ConditionStatus::False, reason, msg);
        if self.status.phase == Phase::Pending || self.status.phase == Phase::Provisioning {
            self.cond(condition::PROVISIONED, ConditionStatus::False, reason, msg);
        }
        self.event(EventKind::Warning, reason, msg);
        let s = self.i.settings;
        let d = backoff(s.backoff_base, s.backoff_max, self.memory.failures);
        self.done(action, Some(d))
    }
    /// A provider failure, by class.
    pub(super) fn failure(self, e: &ProviderError, what: &str) -> Decision {
        let msg = format!("{what}: {}", e.message);
        match e.class {
            ErrorClass::Permanent => self.latch(reason::PERMANENT_ERROR, &msg, Action::None),
            ErrorClass::QuotaExceeded => self.retry(reason::QUOTA_EXCEEDED, &msg, Action::None),
            ErrorClass::Transient | ErrorClass::NotFound => {
                self.retry(reason::TRANSIENT_ERROR, &msg, Action::None)
            }
        }
    }
}
