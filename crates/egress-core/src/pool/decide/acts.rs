//! What a round does to one member (delete it, unpublish it, record its host's failure) and
//! the order removals take.
//!
//! Guarantees: pure; each event message names the member and the cause; a host's failure
//! message is redacted and bounded.

use std::time::SystemTime;

use crate::controller::decide::fmt_time;
use crate::controller::{Event, EventKind};
use crate::model::{MAX_MESSAGE_CHARS, truncate};
use crate::pool::member::{Drain, Member};
use crate::pool::spec::ScaleInOrder;
use crate::pool::status::{HostFailures, reason};

use super::io::{DeleteCause, DeleteMember, PoolDecision, UnpublishMember};

/// 0: unhealthy, 1: not available yet, 2: available.
pub(super) fn tier(m: &Member) -> u8 {
    if m.unhealthy_since.is_some() || m.phase == crate::model::Phase::Failed {
        0
    } else if !m.available {
        1
    } else {
        2
    }
}

/// Scale-in order: unhealthy, then not available, then by age per `order` (name last, so
/// the order is total).
pub(super) fn removal_order(a: &Member, b: &Member, order: ScaleInOrder) -> std::cmp::Ordering {
    let age = match order {
        ScaleInOrder::OldestFirst => a.created.cmp(&b.created),
        ScaleInOrder::NewestFirst => b.created.cmp(&a.created),
    };
    tier(a)
        .cmp(&tier(b))
        .then(age)
        .then_with(|| a.name.cmp(&b.name))
}

pub(super) fn delete(d: &mut PoolDecision, m: &Member, cause: DeleteCause) {
    let kind = match cause {
        DeleteCause::Failed | DeleteCause::Unhealthy => EventKind::Warning,
        _ => EventKind::Normal,
    };
    d.events.push(Event::new(
        kind,
        reason::MEMBER_DELETED,
        &format!("deleted member {} (cause: {})", m.name, cause.as_str()),
    ));
    d.deletes.push(DeleteMember {
        name: m.name.clone(),
        cause,
    });
}

pub(super) fn unpublish(d: &mut PoolDecision, m: &Member, drain: Drain, due: SystemTime) {
    d.events.push(Event::new(
        EventKind::Normal,
        reason::MEMBER_DRAINING,
        &format!(
            "unpublished member {} (cause: {}); deleting it at {} (drain grace)",
            m.name,
            drain.cause.as_str(),
            fmt_time(due)
        ),
    ));
    d.unpublishes.push(UnpublishMember {
        name: m.name.clone(),
        cause: drain.cause,
        marker: drain.marker(),
    });
}

pub(super) fn record_failure(list: &mut Vec<HostFailures>, host: &str, why: &str, now: SystemTime) {
    let message = truncate(&egress_provider::error::redact(why), MAX_MESSAGE_CHARS);
    match list.iter_mut().find(|f| f.host == host) {
        Some(f) => {
            f.count = f.count.saturating_add(1);
            f.last_failure = fmt_time(now);
            f.message = message;
        }
        None => list.push(HostFailures {
            host: host.to_owned(),
            count: 1,
            last_failure: fmt_time(now),
            message,
        }),
    }
}
