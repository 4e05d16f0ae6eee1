//! Judging the instance a `get` found: record where it is, then by state: running with an
//! address is Ready, running without one waits (keeping the last IP through a short gap),
//! paused is reported, stopped is replaced; a running one on a draining host is re-placed
//! (or, pinned there, reported).
//!
//! Guarantees: pure; nothing is done to an instance whose verified UID is another Proxy's
//! (finding M2); a paused instance is never destroyed (finding M1); the last IP survives a
//! gap shorter than `ip_grace` (finding H3).

use egress_provider::libvirt::config::Maintenance;
use egress_provider::model::{Instance, InstanceState};

use crate::controller::EventKind;
use crate::model::{ConditionStatus, Phase, condition};

use super::ctx::{Ctx, human, parse_time};
use super::decision::{Action, Decision};
use super::inputs::EntryView;
use super::provision::{deadline_expired, deadline_passed, replace, start_create};
use super::reason;

pub(super) fn found(mut cx: Ctx<'_>, entry: &EntryView<'_>, inst: Instance) -> Decision {
    let i = cx.i;
    let s = i.settings;
    let host = inst.id.host.clone();
    if inst.uid != i.obj.uid {
        // finding M2: never act on an instance whose verified UID is another Proxy's.
        let msg = format!(
            "instance {} carries the mark of Proxy UID {}, not {}: it is left untouched",
            inst.id, inst.uid, i.obj.uid
        );
        return cx.latch(reason::FOREIGN_INSTANCE, &msg, Action::None);
    }
    cx.status.host = Some(host.clone());
    cx.status.provider_id = Some(inst.id.to_string());
    cx.status.egress_address = inst.egress.iter().map(ToString::to_string).collect();
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::True,
        reason::CREATED,
        &format!("instance {} exists", inst.id),
    );
    match (&inst.state, inst.ip) {
        (InstanceState::Running, Some(ip)) => {
            let was_running = i.status.phase == Phase::Running;
            cx.memory.failures = 0;
            cx.status.phase = Phase::Running;
            cx.status.ip = Some(ip.to_string());
            cx.status.ip_seen_at = Some(cx.now_s.clone());
            cx.status.provisioning_since = None;
            let msg = format!("running on host {host} at {ip}");
            cx.cond(
                condition::READY,
                ConditionStatus::True,
                reason::RUNNING,
                &msg,
            );
            if !was_running {
                cx.event(EventKind::Normal, reason::RUNNING, &msg);
            }
            if draining(entry, &host) {
                return drain(cx, entry, &host, &msg);
            }
            cx.done(Action::None, Some(s.poll_running))
        }
        (InstanceState::Running | InstanceState::Provisioning, _) => {
            // finding H3: keep the last IP through a short gap.
            let seen = i.status.ip_seen_at.as_deref().and_then(parse_time);
            let in_grace = i.status.phase == Phase::Running
                && i.status.ip.is_some()
                && seen.is_some_and(|t| i.now.duration_since(t).unwrap_or_default() < s.ip_grace);
            if in_grace {
                cx.memory.failures = 0;
                let msg = format!(
                    "instance {} reports no address right now; keeping the last one for up to {}",
                    inst.id,
                    human(s.ip_grace)
                );
                cx.cond(
                    condition::READY,
                    ConditionStatus::True,
                    reason::ADDRESS_GAP,
                    &msg,
                );
                return cx.done(Action::None, Some(s.poll_provisioning));
            }
            if cx.status.phase != Phase::Provisioning || cx.status.provisioning_since.is_none() {
                cx.status.provisioning_since = Some(cx.now_s.clone());
            }
            cx.status.phase = Phase::Provisioning;
            cx.status.ip = None;
            cx.status.ip_seen_at = None;
            // A source of addresses that failed is said, with its error (the others were
            // still asked).
            let note = inst
                .address_note
                .as_deref()
                .map_or_else(String::new, |n| format!("; {n}"));
            if let Some(elapsed) = deadline_passed(&cx, i.now) {
                let missing = format!(
                    "instance {} is running but no address was reported{note}",
                    inst.id
                );
                return deadline_expired(cx, entry, &host, elapsed, &missing, true);
            }
            let msg = format!(
                "instance {} is running; waiting for it to report an address{note}",
                inst.id
            );
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::WAITING_FOR_ADDRESS,
                &msg,
            );
            cx.done(Action::None, Some(s.poll_provisioning))
        }
        (InstanceState::Paused { reason: why }, _) => {
            // finding M1: a paused instance is reported, never destroyed.
            let msg = format!("instance {} is paused by the hypervisor: {why}", inst.id);
            let was_provisioning = cx.status.phase == Phase::Provisioning;
            cx.status.phase = Phase::Paused;
            if was_provisioning && let Some(elapsed) = deadline_passed(&cx, i.now) {
                let missing = format!("instance {} is not running (paused: {why})", inst.id);
                return deadline_expired(cx, entry, &host, elapsed, &missing, false);
            }
            cx.cond(
                condition::READY,
                ConditionStatus::False,
                reason::PAUSED,
                &msg,
            );
            cx.done(Action::None, Some(s.poll_running))
        }
        (InstanceState::Stopped { reason: why }, _) => {
            // finding M2: the UID was verified above (the provider's get verified the mark
            // too) before this destructive path.
            let msg = format!("instance {} stopped ({why}); replacing it", inst.id);
            let mut d = replace(cx, entry, &host, reason::REPLACING, &msg);
            // Re-created in place, it asks for the addresses it held again (given when still
            // free for it): a crashed guest keeps its egress address.
            if let Action::Create { req, .. } = &mut d.action
                && req.pinned_egress.is_empty()
            {
                req.prefer_egress = inst.egress.clone();
            }
            d
        }
    }
}

/// Whether `host` of `entry` is draining (`maintenance: Drain`).
fn draining(entry: &EntryView<'_>, host: &str) -> bool {
    entry
        .config
        .hosts
        .iter()
        .any(|h| h.name == host && h.maintenance == Maintenance::Drain)
}

/// A running instance on a draining host: a Proxy pinned there (`spec.host`, or egress
/// addresses only that host's pool holds) stays and says so in its `Ready` condition; any
/// other is re-placed: a create starts on another host that takes new proxies, its status
/// moves there, and the copy on the draining host is deleted by the second-copy sweep once
/// the new instance is found at its location. With no host to go to, it stays and says why.
fn drain(cx: Ctx<'_>, entry: &EntryView<'_>, host: &str, running: &str) -> Decision {
    let s = cx.i.settings;
    let pinned = if cx.i.obj.spec.host.is_some() {
        Some("spec.host")
    } else if !cx.i.obj.spec.egress.pinned().is_empty() {
        Some("spec.egress.address")
    } else {
        None
    };
    if pinned.is_none() {
        let why = format!("host {host} is draining");
        let moved = start_create(cx.clone(), entry, None, &why);
        if matches!(moved.action, Action::Create { .. }) {
            return moved;
        }
    }
    let mut cx = cx;
    let msg = match pinned {
        Some(field) => format!(
            "{running}; host {host} is draining but this Proxy is pinned to it ({field}): it \
             stays (a pool replaces its members elsewhere; any other pinned Proxy stays until \
             its pin changes, it is deleted, or the host's maintenance ends)"
        ),
        None => format!(
            "{running}; host {host} is draining but no other host takes new proxies: it stays \
             until one does"
        ),
    };
    cx.cond(
        condition::READY,
        ConditionStatus::True,
        reason::ON_DRAINING_HOST,
        &msg,
    );
    cx.done(Action::None, Some(s.poll_running))
}
