//! Deletion of a Proxy (finding M3): delete by UID on the known host, or on every host of
//! the entry when none is known; report progress; finalize once nothing is left.
//!
//! Guarantees: pure; a failed delete always retries (never latches, so the finalizer never
//! wedges), a Permanent failure waiting the longest backoff; only hosts the entry still has
//! are addressed.

use egress_provider::error::ErrorClass;

use crate::controller::EventKind;
use crate::model::{ConditionStatus, Phase, condition};

use super::ctx::Ctx;
use super::decision::{Action, Decision};
use super::inputs::OpView;
use super::reason;

/// Deletion (finding M3): by UID, on the known host or on every host of the entry.
pub(super) fn finalize(mut cx: Ctx<'_>) -> Decision {
    let i = cx.i;
    cx.status.phase = Phase::Terminating;
    match i.op {
        OpView::Deleting { hosts } => {
            let msg = format!("deleting the instance on {}", hosts.join(", "));
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETING,
                &msg,
            );
            return cx.done(Action::None, Some(i.settings.poll_provisioning));
        }
        OpView::DeleteFinished { result: Ok(()) } => {
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETED,
                "nothing is left on any host",
            );
            cx.event(
                EventKind::Normal,
                reason::DELETED,
                "instance and volumes deleted",
            );
            let mut d = cx.done(Action::None, None);
            d.finalized = true;
            return d;
        }
        OpView::DeleteFinished { result: Err(e) } => {
            let e = e.clone();
            // NB: deletion always retries (a latch would wedge the finalizer); a Permanent
            // error waits the longest backoff between attempts.
            if e.class == ErrorClass::Permanent {
                cx.memory.failures = u32::MAX;
            }
            let mut d = cx.retry(
                reason::TRANSIENT_ERROR,
                &format!("deleting the instance: {}", e.message),
                Action::None,
            );
            d.status.phase = Phase::Terminating;
            // The next reconcile (after the backoff) issues the delete again.
            return d;
        }
        OpView::Idle | OpView::Creating { .. } | OpView::CreateFinished { .. } => {}
    }
    let Some(_entry) = i.entry else {
        let msg = format!(
            "provider entry {:?} is not configured: nothing can be deleted; if an instance \
             was created under it, remove it by hand or restore the entry",
            i.obj.spec.provider
        );
        cx.event(EventKind::Warning, reason::DELETED, &msg);
        let mut d = cx.done(Action::None, None);
        d.finalized = true;
        return d;
    };
    let hosts = delete_hosts(&cx);
    let msg = format!("deleting the instance on {}", hosts.join(", "));
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::DELETING,
        &msg,
    );
    cx.done(Action::Delete { hosts }, Some(i.settings.poll_provisioning))
}

/// Hosts a delete must cover: where the instance is or is being created, and every other
/// host where a copy may remain; else every host.
pub(super) fn delete_hosts(cx: &Ctx<'_>) -> Vec<String> {
    let i = cx.i;
    let placed = i.location.is_some()
        || i.status.host.is_some()
        || matches!(
            i.op,
            OpView::Creating { .. } | OpView::CreateFinished { .. }
        );
    let mut hosts: Vec<String> = Vec::new();
    let mut add = |h: &str| {
        if !hosts.iter().any(|x| x == h) {
            hosts.push(h.to_owned());
        }
    };
    if let Some(l) = i.location {
        add(&l.host);
    }
    if let OpView::Creating { host, .. } | OpView::CreateFinished { host, .. } = i.op {
        add(host);
    }
    if let Some(h) = &i.status.host {
        add(h);
    }
    // NB: only besides a known place: with none, every host is addressed below anyway.
    if placed {
        for h in i.strays {
            add(h);
        }
    }
    if hosts.is_empty()
        && let Some(e) = i.entry
    {
        hosts = e.config.hosts.iter().map(|h| h.name.clone()).collect();
    }
    // Only hosts the entry still has can be reached.
    if let Some(e) = i.entry {
        let known: Vec<&str> = e.config.hosts.iter().map(|h| h.name.as_str()).collect();
        let before = hosts.clone();
        hosts.retain(|h| known.contains(&h.as_str()));
        if hosts.is_empty() && !before.is_empty() {
            hosts = known.iter().map(|h| (*h).to_owned()).collect();
        }
    }
    hosts
}
