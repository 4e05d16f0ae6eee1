//! The pool's conditions from one round: `Available`, `Progressing` and `ReplicaFailure`,
//! each with a stable reason and a message that names hosts and causes.
//!
//! Guarantees: pure; messages go through [`Condition::new`] (redacted, bounded); a
//! condition's transition time moves only when its status value changes.

use crate::controller::decide::fmt_time;
use crate::model::{Condition, ConditionStatus};
use crate::pool::status::{condition, reason};

use super::{PoolDecision, PoolInputs, Round};

/// Sets the three conditions on `d.status`.
pub(super) fn set(d: &mut PoolDecision, i: &PoolInputs<'_>, r: &Round) {
    let p = i.policy;
    let now = fmt_time(i.now);
    let cond = |d: &mut PoolDecision, t: &str, ok: bool, why: &str, msg: &str| {
        let st = if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        d.status
            .set_condition(Condition::new(t, st, why, msg, &now, i.generation));
    };

    let min = p.min_available();
    let enough = r.available >= min;
    cond(
        d,
        condition::AVAILABLE,
        enough,
        if enough {
            reason::MINIMUM_REPLICAS_AVAILABLE
        } else {
            reason::MINIMUM_REPLICAS_UNAVAILABLE
        },
        &format!(
            "{} of {} members available (at least {min} required)",
            r.available, p.replicas
        ),
    );

    let blocked = r.unplaced > 0;
    let block_reason = if r.backing_off {
        reason::BACKING_OFF
    } else {
        reason::NO_HOST_AVAILABLE
    };
    let lost_msg = (!r.lost.is_empty()).then(|| {
        format!(
            "{} member(s) lost with a dead host, replaced elsewhere, each deleted once its host \
             answers again: {}",
            r.lost.len(),
            super::lost::summary(&r.lost)
        )
    });
    let mut block_msg = format!(
        "{} member(s) could not be placed: {}",
        r.unplaced,
        r.refused.join(", ")
    );
    if let Some(l) = &lost_msg {
        block_msg.push_str("; ");
        block_msg.push_str(l);
    }
    let failures: Vec<String> = d
        .status
        .host_failures
        .iter()
        .map(|f| {
            format!(
                "host {} ({} consecutive, last {}: {})",
                f.host, f.count, f.last_failure, f.message
            )
        })
        .collect();
    if blocked {
        cond(
            d,
            condition::REPLICA_FAILURE,
            true,
            block_reason,
            &block_msg,
        );
    } else if let Some(l) = &lost_msg {
        cond(d, condition::REPLICA_FAILURE, true, reason::HOST_LOST, l);
    } else if !r.broken.is_empty() {
        let msg = format!("replaced {}", r.broken.join("; "));
        cond(
            d,
            condition::REPLICA_FAILURE,
            true,
            reason::MEMBER_FAILED,
            &msg,
        );
    } else if !failures.is_empty() {
        let msg = format!("members failed recently on {}", failures.join("; "));
        cond(
            d,
            condition::REPLICA_FAILURE,
            true,
            reason::MEMBER_FAILED,
            &msg,
        );
    } else {
        cond(
            d,
            condition::REPLICA_FAILURE,
            false,
            reason::NO_FAILURE,
            "no member failed",
        );
    }

    let acted = !d.creates.is_empty() || !d.deletes.is_empty() || !d.unpublishes.is_empty();
    // A cause of this round's removals (deleted or unpublished).
    let removing = |c: super::DeleteCause| {
        d.deletes.iter().any(|x| x.cause == c) || d.unpublishes.iter().any(|x| x.cause == c)
    };
    let done = !acted
        && !blocked
        && r.outdated + r.aged + r.listed + r.surplus + r.draining + r.rebalancing == 0
        && r.counted == p.replicas
        && r.available == p.replicas;
    if done {
        let mut msg = format!(
            "{} of {} members current and available",
            r.available, p.replicas
        );
        if r.unpublished > 0 {
            msg.push_str(&format!(
                "; {} removed member(s) unpublished, deleted after the drain grace",
                r.unpublished
            ));
        }
        if let Some(note) = &r.unspread {
            msg.push_str("; ");
            msg.push_str(note);
        }
        cond(d, condition::PROGRESSING, true, reason::COMPLETE, &msg);
    } else if blocked && !acted {
        cond(d, condition::PROGRESSING, false, block_reason, &block_msg);
    } else {
        let why = if !r.broken.is_empty()
            || r.released > 0
            || !d.newly_quarantined.is_empty()
            || !r.lost.is_empty()
        {
            reason::REPLACING
        } else if r.draining > 0 || removing(super::DeleteCause::Drain) {
            reason::DRAINING
        } else if r.outdated > 0 || removing(super::DeleteCause::Template) {
            reason::ROLLING_UPDATE
        } else if r.listed > 0 || removing(super::DeleteCause::Listed) {
            reason::REPLACING_LISTED
        } else if r.aged > 0 || removing(super::DeleteCause::Age) {
            reason::ROTATING
        } else if r.rebalancing > 0
            || removing(super::DeleteCause::Rebalance)
            || d.status.rebalancing.is_some()
        {
            reason::REBALANCING
        } else if r.counted < p.replicas {
            reason::SCALING_UP
        } else if r.counted > p.replicas {
            reason::SCALING_DOWN
        } else {
            reason::WAITING_FOR_MEMBERS
        };
        let mut msg = format!(
            "{} members, {} available, {} current of {} wanted; creating {}, deleting {}",
            r.counted,
            r.available,
            r.updated,
            p.replicas,
            d.creates.len(),
            d.deletes.len()
        );
        if r.unpublished > 0 {
            msg.push_str(&format!(
                "; {} removed member(s) unpublished, deleted after the drain grace ({} now)",
                r.unpublished,
                d.unpublishes.len()
            ));
        }
        cond(d, condition::PROGRESSING, true, why, &msg);
    }
}
