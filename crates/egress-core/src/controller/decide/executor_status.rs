//! Statuses the executor reports without a decision: a host with no free work slot, a
//! controller shutting down, a reconcile that hit its deadline (finding APX-3).
//!
//! Guarantees: pure; none of them latches; each is a Ready=False condition with a stable
//! reason and a redacted message.

use std::time::SystemTime;

use crate::controller::backoff::backoff;
use crate::controller::{ControllerSettings, Event, EventKind, Outcome, ProxyObject};
use crate::model::{Condition, ConditionStatus, Phase, ProxyStatus, condition};

use super::ctx::{fmt_time, human};
use super::reason;

/// Status while the host has no free work slot (called by the executor when its
/// try-acquire fails): Ready/Provisioned False with reason HostBusy; nothing else changes.
pub fn host_busy(
    mut status: ProxyStatus,
    obj: &ProxyObject,
    host: &str,
    now: SystemTime,
) -> ProxyStatus {
    let now_s = fmt_time(now);
    let msg = format!(
        "host {host} is busy with other creates and deletes (its maxConcurrent slots are \
         taken); waiting for a slot"
    );
    if status.phase == Phase::Pending || status.phase == Phase::Provisioning {
        status.set_condition(Condition::new(
            condition::PROVISIONED,
            ConditionStatus::False,
            reason::HOST_BUSY,
            &msg,
            &now_s,
            obj.generation,
        ));
    }
    if status.phase != Phase::Terminating {
        // The create did not start: no attempt is in progress.
        if status.phase == Phase::Provisioning && status.provider_id.is_none() {
            status.phase = Phase::Pending;
            status.provisioning_since = None;
            // Nothing was started there: the next attempt places afresh.
            status.host = None;
        }
    }
    status.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::HOST_BUSY,
        &msg,
        &now_s,
        obj.generation,
    ));
    status
}

/// Status while a pinned egress address is reserved (pinned by another Proxy, or held for
/// another namespace after its instance went away; called by the executor, which knows the
/// reservations): Ready/Provisioned False with reason AddressReserved and `msg`, which names
/// no other Proxy or namespace; nothing is started.
pub fn address_reserved(
    mut status: ProxyStatus,
    obj: &ProxyObject,
    msg: &str,
    now: SystemTime,
) -> ProxyStatus {
    let now_s = fmt_time(now);
    for c in [condition::PROVISIONED, condition::READY] {
        status.set_condition(Condition::new(
            c,
            ConditionStatus::False,
            reason::ADDRESS_RESERVED,
            msg,
            &now_s,
            obj.generation,
        ));
    }
    if status.phase == Phase::Provisioning && status.provider_id.is_none() {
        status.phase = Phase::Pending;
        status.provisioning_since = None;
        status.host = None;
    }
    status
}

/// Status while a new instance would take its namespace past the entry's quota (called by
/// the executor, which counts the namespace's instances): Ready/Provisioned False with
/// reason QuotaExceeded and `msg`; nothing is started.
pub fn quota_exceeded(
    status: ProxyStatus,
    obj: &ProxyObject,
    msg: &str,
    now: SystemTime,
) -> ProxyStatus {
    let mut status = address_reserved(status, obj, msg, now);
    for c in &mut status.conditions {
        if c.reason == reason::ADDRESS_RESERVED {
            c.reason = reason::QUOTA_EXCEEDED.into();
        }
    }
    status
}

/// Status when the controller is shutting down and started nothing.
pub fn shutting_down(mut status: ProxyStatus, obj: &ProxyObject, now: SystemTime) -> ProxyStatus {
    status.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::SHUTTING_DOWN,
        "the operator is shutting down; no new work is started",
        &fmt_time(now),
        obj.generation,
    ));
    status
}

/// The outcome of a reconcile that hit its deadline (finding APX-3): the input status with a
/// visible, non-latching condition and a backoff requeue.
pub fn reconcile_timed_out(
    obj: &ProxyObject,
    status: &ProxyStatus,
    now: SystemTime,
    settings: &ControllerSettings,
    failures: u32,
) -> Outcome {
    let mut st = status.clone();
    let msg = format!(
        "one reconcile did not finish within {}; will retry",
        human(settings.reconcile_deadline)
    );
    st.set_condition(Condition::new(
        condition::READY,
        ConditionStatus::False,
        reason::RECONCILE_TIMEOUT,
        &msg,
        &fmt_time(now),
        obj.generation,
    ));
    Outcome {
        status: st,
        requeue_after: Some(backoff(
            settings.backoff_base,
            settings.backoff_max,
            failures,
        )),
        events: vec![Event::new(
            EventKind::Warning,
            reason::RECONCILE_TIMEOUT,
            &msg,
        )],
        finalized: false,
        instance_started: false,
    }
}
