//! Provisioning: start a create on a placed host, replace an instance, report a create in
//! flight with its import progress, and enforce the provisioning deadline.
//!
//! Guarantees: pure; a retry stays on the host of the last attempt unless the pin or health
//! says otherwise; an expired deadline names what is missing and replaces or fails per
//! `replace_on_deadline` (finding APX-1), and never destroys a paused instance (finding M1).

use std::time::{Duration, SystemTime};

use crate::controller::EventKind;
use crate::model::{ConditionStatus, Phase, condition};

use super::ctx::{Ctx, fmt_time, human, parse_time};
use super::decision::{Action, Decision};
use super::inputs::EntryView;
use super::placement::{host_holding, no_usable_host, place};
use super::spec::{MIB, request};
use super::{cancel_if_creating, reason};

/// Starts a create (or a replace, when `replace_on` names the host to clear first).
pub(super) fn start_create(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    prefer: Option<&str>,
    why: &str,
) -> Decision {
    let i = cx.i;
    let pinned_egress = i.obj.spec.egress.pinned();
    // Only hosts the Proxy's namespace may use (the entry's and the hosts' access).
    let open = entry.config.access.is_none()
        && entry.config.hosts.iter().all(|h| {
            h.access.is_none() && h.address_pool.as_ref().is_none_or(|p| p.access.is_none())
        });
    // What it needs on a host (its own instance there, when it has one, is not counted
    // twice), and the hosts with room for it by their configured capacity.
    let size = super::sizes(i.obj, entry.config)
        .map(|(_, m, v)| (m, u64::from(v)))
        .unwrap_or_default();
    let own = |h: &str| {
        if i.location.is_some_and(|l| l.host == h) {
            size
        } else {
            (0, 0)
        }
    };
    let bounded = entry
        .config
        .hosts
        .iter()
        .any(|h| h.capacity.memory_mib.is_some() || h.capacity.vcpus.is_some());
    // Cordoned and draining hosts take no new instance (few at a time: a list).
    let out_of_service: Vec<&str> = entry
        .config
        .hosts
        .iter()
        .filter(|h| !h.maintenance.accepts_placements())
        .map(|h| h.name.as_str())
        .collect();
    let entitled = |h: &str| {
        (open
            || entry
                .config
                .hosts
                .iter()
                .find(|c| c.name == h)
                .is_some_and(|c| super::eligible(i.obj, entry.config, c)))
            && (!bounded
                || super::placement::capacity_short(
                    entry.config,
                    h,
                    &i.hosts.info(h),
                    size,
                    own(h),
                )
                .is_none())
    };
    let eligible = |h: &str| !out_of_service.contains(&h) && entitled(h);
    // Pinned addresses come from one host's pool: that host, as if `spec.host` named it.
    let holder = i
        .obj
        .spec
        .host
        .is_none()
        .then(|| {
            let usable = |h: &str| place(entry.config, Some(h), i.hosts, 0, &eligible).is_some();
            host_holding(entry.config, &pinned_egress, &entitled, &usable)
        })
        .flatten();
    let pin = i.obj.spec.host.as_deref().or(holder.as_deref());
    let need = super::families_needed(&pinned_egress);
    // A preferred (sticky) host whose address pool is known exhausted for what this Proxy
    // needs yields at once: the last attempt there may have failed for exactly that.
    let prefer = prefer.filter(|h| !i.hosts.info(h).addresses.blocks(need));
    let pinned = pin.or(prefer);
    if entry.config.hosts.is_empty() {
        let msg = format!("provider entry {:?} has no hosts", entry.config.name);
        return cx.latch(reason::INVALID_SPEC, &msg, Action::None);
    }
    // A preferred (sticky) host that stopped accepting placements yields to the others.
    let chosen = place(entry.config, pinned, i.hosts, need, &eligible).or_else(|| {
        pin.is_none()
            .then(|| place(entry.config, None, i.hosts, need, &eligible))
            .flatten()
    });
    let Some(host) = chosen else {
        let mut msg = no_usable_host(entry.config, pin, i.hosts, size, &own);
        if i.obj.spec.host.is_none() && holder.is_some() {
            msg = msg.replacen(
                "(spec.host)",
                "(its address pool holds spec.egress.address)",
                1,
            );
        }
        return cx.retry(reason::NO_USABLE_HOST, &msg, Action::None);
    };
    let req = match request(i.obj, entry.config, &host, &i.settings.connect_ports) {
        Ok(r) => r,
        Err((true, msg)) => return cx.latch(reason::INVALID_SPEC, &msg, Action::None),
        Err((false, msg)) => return cx.retry(reason::CREDENTIALS_MISSING, &msg, Action::None),
    };
    let msg = if why.is_empty() {
        format!("creating the instance on host {host}")
    } else {
        format!("{why}: creating the instance on host {host}")
    };
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.clone());
    cx.status.ip = None;
    cx.status.ip_seen_at = None;
    cx.status.egress_address.clear();
    cx.status.provisioning_since = Some(cx.now_s.clone());
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.event(EventKind::Normal, reason::CREATING, &msg);
    cx.done(
        Action::Create {
            req: Box::new(req),
            replace: false,
        },
        Some(i.settings.poll_provisioning),
    )
}

/// Replaces the instance on `host` (delete by UID, then create there).
pub(super) fn replace(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    reason_: &str,
    msg: &str,
) -> Decision {
    let i = cx.i;
    let req = match request(i.obj, entry.config, host, &i.settings.connect_ports) {
        Ok(r) => r,
        Err((true, m)) => return cx.latch(reason::INVALID_SPEC, &m, Action::None),
        Err((false, m)) => return cx.retry(reason::CREDENTIALS_MISSING, &m, Action::None),
    };
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.to_owned());
    cx.status.ip = None;
    cx.status.ip_seen_at = None;
    cx.status.egress_address.clear();
    cx.status.provisioning_since = Some(cx.now_s.clone());
    cx.cond(condition::PROVISIONED, ConditionStatus::False, reason_, msg);
    cx.cond(condition::READY, ConditionStatus::False, reason_, msg);
    cx.event(EventKind::Warning, reason_, msg);
    cx.done(
        Action::Create {
            req: Box::new(req),
            replace: true,
        },
        Some(i.settings.poll_provisioning),
    )
}

/// Elapsed provisioning time, when the deadline has passed.
pub(super) fn deadline_passed(cx: &Ctx<'_>, fallback: SystemTime) -> Option<Duration> {
    let since = cx
        .status
        .provisioning_since
        .as_deref()
        .and_then(parse_time)
        .unwrap_or(fallback);
    let elapsed = cx.i.now.duration_since(since).unwrap_or_default();
    (elapsed >= cx.i.settings.provisioning_deadline).then_some(elapsed)
}

/// The provisioning deadline passed (finding APX-1): say what is missing; replace or fail.
pub(super) fn deadline_expired(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    elapsed: Duration,
    missing: &str,
    may_replace: bool,
) -> Decision {
    let s = cx.i.settings;
    let msg = format!(
        "provisioning deadline of {} passed after {}: {missing}",
        human(s.provisioning_deadline),
        human(elapsed)
    );
    if s.replace_on_deadline && may_replace {
        let m = format!("{msg}; replacing the instance");
        return replace(cx, entry, host, reason::PROVISIONING_TIMEOUT, &m);
    }
    let action = cancel_if_creating(cx.i.op);
    if !may_replace {
        // Paused instances are never destroyed (M1): report, keep polling.
        cx.cond(
            condition::READY,
            ConditionStatus::False,
            reason::PROVISIONING_TIMEOUT,
            &msg,
        );
        return cx.done(action, Some(s.poll_running));
    }
    cx.latch(reason::PROVISIONING_TIMEOUT, &msg, action)
}

pub(super) fn creating(
    mut cx: Ctx<'_>,
    entry: &EntryView<'_>,
    host: &str,
    image: &str,
    started: SystemTime,
    progress: Option<(u64, Option<u64>)>,
) -> Decision {
    let mut what = format!("create still in progress on host {host}");
    if let Some((done, total)) = progress {
        let total = total.map_or("?".to_owned(), |t| (t / MIB).to_string());
        what.push_str(&format!(
            " (importing image {image}: {}/{total} MiB)",
            done / MIB
        ));
    }
    if let Some(elapsed) = deadline_passed(&cx, started) {
        return deadline_expired(cx, entry, host, elapsed, &what, true);
    }
    cx.status.phase = Phase::Provisioning;
    cx.status.host = Some(host.to_owned());
    if cx.status.provisioning_since.is_none() {
        cx.status.provisioning_since = Some(fmt_time(started));
    }
    let msg = match progress {
        Some(_) => what.replace("create still in progress on", "creating on"),
        None => format!("creating the instance on host {host}"),
    };
    cx.cond(
        condition::PROVISIONED,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    cx.cond(
        condition::READY,
        ConditionStatus::False,
        reason::CREATING,
        &msg,
    );
    let poll = cx.i.settings.poll_provisioning;
    cx.done(Action::None, Some(poll))
}
