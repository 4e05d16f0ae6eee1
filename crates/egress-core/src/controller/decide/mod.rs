//! The reconcile decision: a pure function of (Proxy, current status, what is known about its
//! instance, host loads and health, the in-flight op, the clock, settings, config digest) →
//! (action, new status, requeue, events). No I/O, no clock reads, no randomness: every rule
//! is a table-driven unit test below.
//!
//! Guarantees (each closed by a tagged test):
//! - A provisioning attempt that outlives `provisioning_deadline` gets a condition naming
//!   what is missing (no address / not running / create still in progress) and is replaced
//!   or reported Failed per `replace_on_deadline` (finding APX-1).
//! - Transient failures set `Ready=False` with a reason and the redacted message, keep the
//!   phase and the IP, never latch, and requeue with per-object exponential backoff capped at
//!   `backoff_max` (finding APX-2).
//! - Permanent failures latch (no action, no requeue) until the generation or the entry's
//!   config digest changes.
//! - A Stopped instance is replaced only when its verified UID is this Proxy's (finding M2);
//!   a Paused one is never destroyed (finding M1); a vanished one is recreated.
//! - Deletion deletes by UID even with no providerID: on the known host, or on every host of
//!   the entry when none is known (finding M3).
//! - The last known IP survives a Provisioning gap shorter than `ip_grace` (finding H3).
//! - Spec errors, an unknown entry, an unknown host pin, an image outside the catalogue and
//!   sizes over the entry's limits are Permanent conditions naming the field path and value;
//!   sizes come from the entry's `defaults` with checked arithmetic (finding L20).
//!
//! The pipeline of one decision: a deletion goes to `finalize`; otherwise a latched failure
//! holds, then the spec is checked against the entry (`spec`), then work in flight is
//! reported (`provision`), then what the provider observed decides: nothing known or a lost
//! instance starts a create on a host chosen by [`place`], a found instance is judged by
//! `instance`. `ctx` holds the working state and its failure rules (latch, retry);
//! `executor_status` builds the statuses the executor reports when it cannot act. The input
//! and output types are in `inputs` and `decision`, the reasons in [`reason`]; everything
//! public is re-exported here.

mod ctx;
mod decision;
mod entitlement;
mod executor_status;
mod finalize;
mod inputs;
mod instance;
mod placement;
mod provision;
pub mod reason;
mod spec;

use egress_provider::model::HostState;

use crate::model::{ConditionStatus, Phase, condition};

use self::ctx::Ctx;
pub use self::ctx::fmt_time;
pub use self::decision::{Action, Decision};
pub use self::entitlement::{eligible, entitlement_errors, lifts_internal};
pub use self::executor_status::{
    address_reserved, host_busy, quota_exceeded, reconcile_timed_out, shutting_down,
};
use self::finalize::finalize;
pub use self::inputs::{
    AddressRoom, EVERY_FAMILY, EntryView, FAMILY_V4, FAMILY_V6, HostInfo, HostView, Inputs, Latch,
    Memory, Observed, OpView, families_needed,
};
use self::instance::found;
pub use self::placement::place;
use self::provision::{creating, start_create};
pub use self::spec::{sizes, spec_errors};
use super::EventKind;

/// Decides one reconcile. Pure.
pub fn decide(i: &Inputs<'_>) -> Decision {
    let mut cx = Ctx {
        i,
        status: i.status.clone(),
        events: Vec::new(),
        memory: i.memory.clone(),
        now_s: fmt_time(i.now),
    };
    cx.status.observed_generation = i.obj.generation;
    if i.obj.deleting {
        return finalize(cx);
    }

    // A latched Permanent failure holds until the generation or the config changes.
    if let Some(l) = &i.memory.latch {
        if l.generation == i.obj.generation && l.config_digest == cx.digest() {
            return Decision {
                action: Action::None,
                status: i.status.clone(),
                requeue_after: None,
                events: Vec::new(),
                memory: i.memory.clone(),
                finalized: false,
            };
        }
        cx.memory = Memory::default();
        cx.event(
            EventKind::Normal,
            reason::RETRYING,
            "the spec or the provider configuration changed; retrying",
        );
        if cx.status.phase == Phase::Failed {
            cx.status.phase = Phase::Pending;
        }
    }

    // Spec and entry checks (Permanent, naming the field path and value).
    let Some(entry) = i.entry else {
        let msg = format!(
            "spec.provider: {:?} is not a provider entry of the loaded configuration",
            i.obj.spec.provider
        );
        let action = cancel_if_creating(i.op);
        return cx.latch(reason::INVALID_SPEC, &msg, action);
    };
    // What the Proxy's namespace may use (the entry's access), before anything else about
    // the entry: a refusal names no other tenant, and nothing is placed or created.
    let errs = entitlement_errors(i.obj, entry.config);
    if !errs.is_empty() {
        let action = cancel_if_creating(i.op);
        return cx.latch(reason::NOT_ENTITLED, &errs.join("; "), action);
    }
    let errs = spec_errors(i.obj, entry.config);
    if !errs.is_empty() {
        let action = cancel_if_creating(i.op);
        return cx.latch(reason::INVALID_SPEC, &errs.join("; "), action);
    }
    // The entry of a placed Proxy is immutable (as the Kubernetes CEL rule says): acting on a
    // changed entry would create a second instance and leave the first running, out of GC's
    // reach because its UID is live (finding M2: nothing is touched on the old entry either).
    if let Some(loc) = i.location
        && loc.entry != entry.config.name
    {
        let msg = format!(
            "spec.provider: changed to {:?}, but this Proxy's instance lives in entry {:?} on              host {}; the provider of a Proxy cannot change: set spec.provider back to {:?},              or delete this Proxy (its instance is then deleted there) and create a new one",
            entry.config.name, loc.entry, loc.host, loc.entry
        );
        return cx.latch(reason::INVALID_SPEC, &msg, Action::None);
    }

    // Work in flight.
    let mut observed = i.observed.clone();
    let mut location = i.location.cloned();
    match i.op {
        OpView::Creating {
            host,
            image,
            started,
            progress,
        } => return creating(cx, entry, host, image, *started, *progress),
        OpView::Deleting { .. } => {
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::DELETING,
                "a delete is still in progress",
            );
            return cx.done(Action::None, Some(i.settings.poll_provisioning));
        }
        OpView::CreateFinished { host, result } => match result {
            Ok(inst) => {
                location = Some(inst.id.clone());
                observed = Observed::Found(inst.clone());
            }
            Err(e) => {
                cx.status.host = Some(host.clone());
                return cx.failure(e, &format!("creating the instance on host {host}"));
            }
        },
        OpView::DeleteFinished { .. } | OpView::Idle => {}
    }

    match observed {
        // The host's read slots are taken (H1): keep the status, look again soon.
        Observed::HostBusy(_) => cx.done(Action::None, Some(i.settings.poll_provisioning)),
        Observed::Unknown => {
            // Sticky: retry where the last attempt was (a create converges from its own
            // partial state there) unless that host is gone or unhealthy.
            let prev = i.status.host.as_deref().filter(|h| {
                entry.config.hosts.iter().any(|c| c.name == *h)
                    && matches!(i.hosts.info(h).health, None | Some(HostState::Ready))
            });
            start_create(cx, entry, prev, "")
        }
        Observed::NotFound(why) => {
            let prev = location.as_ref().map(|l| l.host.clone());
            // The provider's words say what is true: the domain is gone, or it is still there
            // but carries no valid mark for this Proxy (then it is left alone, not "gone").
            let msg = match &location {
                Some(l) => {
                    format!("instance {l} is not found as this Proxy's: {why}; creating it again")
                }
                None => {
                    format!("the instance is not found as this Proxy's: {why}; creating it again")
                }
            };
            cx.event(EventKind::Warning, reason::INSTANCE_LOST, &msg);
            cx.status.provider_id = None;
            start_create(cx, entry, prev.as_deref(), &msg)
        }
        Observed::GetFailed(e) => {
            let what = match &location {
                Some(l) => format!("reading instance {l}"),
                None => "reading the instance".into(),
            };
            // Like a Pod on a NotReady node: a read that failed on a host the checks find
            // dead is said to be the host's, naming it, since when, and its last error.
            if e.class != egress_provider::error::ErrorClass::Permanent
                && let Some(l) = &location
                && let Some(since) = i.hosts.dead_since(&l.host)
            {
                let state = match i.hosts.info(&l.host).health {
                    Some(HostState::Timeout) => "Timeout",
                    _ => "Unreachable",
                };
                let why = i.hosts.reason(&l.host).unwrap_or_else(|| e.message.clone());
                let msg = format!(
                    "host {} {state} since {}: {why}; {what} failed, its last status is kept \
                     until the host answers",
                    l.host,
                    fmt_time(since)
                );
                return cx.retry(reason::HOST_UNREACHABLE, &msg, Action::None);
            }
            cx.failure(&e, &what)
        }
        Observed::Found(inst) => found(cx, entry, inst),
    }
}

pub(super) fn cancel_if_creating(op: &OpView) -> Action {
    if matches!(op, OpView::Creating { .. }) {
        Action::Cancel
    } else {
        Action::None
    }
}
