//! One round of a ProxyPool, written once for both drivers: what the round does is a pure
//! function of the pool, its members and the hosts ([`plan`]); carrying it out
//! ([`carry_out`]) goes through the small [`PoolDriver`] trait, which is all a driver writes:
//! creating and deleting a member Proxy, publishing an event, recording the pool's status
//! and letting a deleted pool go.
//!
//! One round, in order ([`plan`]):
//! 1. **Removal**: a pool being deleted (Kubernetes: its deletion timestamp; standalone: its
//!    manifest is gone) deletes every member not deleting yet, and is finished once it has no
//!    member left ([`Round::Remove`]).
//! 2. **Validation**: the pool's name and spec; a pool at fault is refused with `InvalidSpec`
//!    naming every field at fault ([`Round::Refused`]), and gets no member.
//! 3. **Credentials**: generated credentials that cannot be used refuse the pool
//!    (`CredentialsUnusable`); ones being made elsewhere make it wait ([`Round::Wait`]).
//! 4. **Decision**: [`decide`] over the members the driver observed and the entry's hosts.
//! 5. **Status**: the decision's, with the pool's label selector and one row per member
//!    (at most [`MAX_STATUS_MEMBERS`]).
//! 6. **Metrics**: members by state, each member's create-to-available time once
//!    ([`AvailabilityMemory`]), replacements by cause, desired and available replicas.
//!
//! [`carry_out`] acts in this order: retirements (when they changed), creates, unpublishes
//! (a member's drain marker recorded: it leaves publication at once, and a later round
//! deletes it once the drain grace has passed), deletes, events, then the status; a create,
//! unpublish or delete that fails does not stop the others, the status is still recorded, and the first
//! failure is returned (the driver retries the round).
//!
//! Guarantees: [`plan`] is pure (the clock is an input) and costs O(members · log members +
//! hosts · creates); a member's replacement is counted once, when the driver reports that
//! this round's delete started it; a pool's metric series go when its removal finishes.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::controller::decide::fmt_time;
use crate::controller::{Event, EventKind};
use crate::metrics::{Metrics, PoolReplicas};
use crate::model::{Condition, ConditionStatus};
use crate::pool::decide::{
    CreateMember, PoolDecision, PoolHost, PoolInputs, UnpublishMember, decide,
};
use crate::pool::member::{LABEL_POOL, Member, template_hash};
use crate::pool::spec::ProxyPoolSpec;
use crate::pool::status::{
    MAX_STATUS_MEMBERS, PoolMemberStatus, ProxyPoolStatus, condition, reason,
};
use crate::pool::validate::{PoolPolicy, validate_pool_name};

/// Condition reason and event reason: the pool's generated credentials exist but cannot be
/// used.
pub const REASON_CREDENTIALS_UNUSABLE: &str = "CredentialsUnusable";

/// How soon a pool waits to look again for credentials someone else is making.
// NB: the other writer (a second replica, a user) finishes within a second; a missed one is
// seen on the next try.
pub const CREDENTIALS_RETRY: Duration = Duration::from_secs(1);

/// The pool's generated credentials as the driver found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolCredentials<'a> {
    /// Usable, with the digest members' template hash includes ("" when the pool has none of
    /// its own).
    Ready {
        /// [`crate::pool::credentials::digest`] of them, or "".
        digest: &'a str,
    },
    /// They exist but cannot be used; why (shown on the pool).
    Unusable(&'a str),
    /// Someone else is making them: look again soon.
    Pending,
}

/// Everything one round looks at.
#[derive(Debug, Clone, Copy)]
pub struct RoundInputs<'a> {
    /// The pool's namespace.
    pub namespace: &'a str,
    /// The pool's name.
    pub name: &'a str,
    /// The pool's spec generation.
    pub generation: i64,
    /// The pool's spec.
    pub spec: &'a ProxyPoolSpec,
    /// The pool is being deleted: its members go, then the pool.
    pub deleting: bool,
    /// Its provider entry's `quotas.maxPoolReplicas`, and what a pool asking for more gets.
    pub quota: Quota,
    /// The pool's status as last recorded (its memory between rounds).
    pub status: &'a ProxyPoolStatus,
    /// Its generated credentials (`Ready { digest: "" }` when it generates none).
    pub credentials: PoolCredentials<'a>,
    /// Its members as the driver observed them (its own creates not seen yet included).
    pub members: &'a [Member],
    /// The hosts of its provider entry with their last health report.
    pub hosts: &'a [PoolHost],
    /// How long an address a member is replaced for (`reputation.onListed: Replace`) stays
    /// retired: the operator's `reputation.retireFor`.
    pub retire_for: Duration,
    /// The clock.
    pub now: SystemTime,
}

impl RoundInputs<'_> {
    /// `namespace/name`: the pool's metric label and log key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A pool's bound from its provider entry's `quotas.maxPoolReplicas` (every member counts,
/// quarantined ones included: see [`PoolPolicy::within_quota`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Quota {
    /// The entry sets none.
    #[default]
    Unbounded,
    /// A pool asking for more is refused as an invalid spec naming `spec.replicas`
    /// (Kubernetes: the refusal shows on the pool the user wrote).
    Refuse(u32),
    /// A pool asking for more is held to it, with a warning in the log (standalone: a
    /// manifest is not refused at run time for a bound of the config).
    Hold(u32),
}

/// What one round does.
// NB: one value per pool round, moved once to the driver: the size of `Refused` (a whole
// status) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Round {
    /// The pool is being deleted.
    Remove {
        /// Members to delete (the ones not deleting yet).
        delete: Vec<String>,
        /// No member is left: the pool may go.
        finished: bool,
    },
    /// The pool cannot act: its status says why (`Progressing` False, `ReplicaFailure`
    /// True), announced by `event` when that changed the status.
    Refused {
        /// The condition reason: [`reason::INVALID_SPEC`] or [`REASON_CREDENTIALS_UNUSABLE`].
        reason: &'static str,
        /// The pool's new status.
        status: ProxyPoolStatus,
        /// The Warning event, when the status changed.
        event: Option<Event>,
    },
    /// Nothing to do before the next look, after this long.
    Wait(Duration),
    /// The decision and everything that follows from it.
    Act(Box<Plan>),
}

/// A round that acts: [`decide`]'s decision, the status to record and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pool's spec, resolved.
    pub policy: PoolPolicy,
    /// The hash current members carry.
    pub template_hash: String,
    /// Creates, deletes, events, and when to decide again.
    pub decision: PoolDecision,
    /// The status to record: the decision's, with the selector and the member rows.
    pub status: ProxyPoolStatus,
    /// Members by state, in the order of [`crate::metrics::MEMBER_STATES`].
    pub member_counts: [u64; 4],
    /// Create-to-available times (seconds) of the members available for the first time.
    pub newly_available: Vec<f64>,
}

/// Which members' first availability was recorded, so each member's create-to-available time
/// is observed once; pruned to the pool's members every round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AvailabilityMemory {
    seen: HashSet<String>,
    primed: bool,
}

impl AvailabilityMemory {
    /// A memory that knows `names` were recorded already (a driver that keeps this across
    /// restarts). A [`Default`] memory instead records nothing on its first round: a new
    /// process (a new leader) only remembers the members available then, as their first
    /// availability was before it started.
    pub fn recorded(names: impl IntoIterator<Item = String>) -> Self {
        Self {
            seen: names.into_iter().collect(),
            primed: true,
        }
    }

    /// Whether member `name`'s first availability was recorded.
    pub fn contains(&self, name: &str) -> bool {
        self.seen.contains(name)
    }

    /// The create-to-available times of the members available for the first time, each
    /// member once; members gone from `members` are forgotten.
    pub fn newly_available(&mut self, members: &[Member], now: SystemTime) -> Vec<f64> {
        let names: HashSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
        self.seen.retain(|n| names.contains(n.as_str()));
        let record = std::mem::replace(&mut self.primed, true);
        let mut times = Vec::new();
        for m in members.iter().filter(|m| m.available) {
            if self.seen.insert(m.name.clone()) && record {
                times.push(
                    now.duration_since(m.created)
                        .unwrap_or_default()
                        .as_secs_f64(),
                );
            }
        }
        times
    }
}

/// The members by state, in the order of [`crate::metrics::MEMBER_STATES`] (available,
/// unavailable, quarantined, deleting); a quarantined or deleting member counts only there,
/// and an unpublished one waiting for its drain grace counts as deleting.
pub fn state_counts(members: &[Member]) -> [u64; 4] {
    let mut counts = [0u64; 4];
    for m in members {
        let i = if m.deleting || (m.draining.is_some() && m.quarantine.is_none()) {
            3
        } else if m.quarantine.is_some() {
            2
        } else if m.available {
            0
        } else {
            1
        };
        if let Some(c) = counts.get_mut(i) {
            *c = c.saturating_add(1);
        }
    }
    counts
}

/// The label selector of pool `name`'s members.
pub fn selector(name: &str) -> String {
    format!("{LABEL_POOL}={name}")
}

/// Pool `name`'s `spec` checked and resolved, or every fault at once (`field: why; …`):
/// what [`plan`] refuses a pool for. A driver asks first when it must know whether the pool
/// will act (it makes no credentials for a pool that is refused).
pub fn check(name: &str, spec: &ProxyPoolSpec, quota: Quota) -> Result<PoolPolicy, String> {
    let validated = spec.validate().and_then(|p| match quota {
        Quota::Unbounded => Ok(p),
        Quota::Refuse(max) => p.within_quota(max).map_err(|e| vec![e]),
        Quota::Hold(max) => Ok(p.clone().within_quota(max).unwrap_or_else(|e| {
            tracing::warn!(pool = %name, error = %format!("{}: {}", e.path, e.message), "pool held to its entry's quota");
            let mut held = p;
            held.replicas = max;
            held.max_members = max;
            held
        })),
    });
    let errors: Vec<String> = validate_pool_name(name)
        .into_iter()
        .chain(validated.clone().err().unwrap_or_default())
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect();
    match validated {
        Ok(p) if errors.is_empty() => Ok(p),
        _ => Err(errors.join("; ")),
    }
}

/// Decides one round (see the module doc for the steps). Pure but for `memory`, which it
/// reads and updates.
pub fn plan(i: &RoundInputs<'_>, memory: &mut AvailabilityMemory) -> Round {
    if i.deleting {
        return Round::Remove {
            delete: i
                .members
                .iter()
                .filter(|m| !m.deleting)
                .map(|m| m.name.clone())
                .collect(),
            finished: i.members.is_empty(),
        };
    }
    let mut policy = match check(i.name, i.spec, i.quota) {
        Ok(p) => p,
        Err(errors) => return refuse(i, reason::INVALID_SPEC, &errors),
    };
    policy.retire_for = i.retire_for;
    let digest = match i.credentials {
        PoolCredentials::Ready { digest } => digest,
        PoolCredentials::Unusable(why) => return refuse(i, REASON_CREDENTIALS_UNUSABLE, why),
        PoolCredentials::Pending => return Round::Wait(CREDENTIALS_RETRY),
    };
    let hash = template_hash(&i.spec.template, digest);
    let decision = decide(&PoolInputs {
        name: i.name,
        generation: i.generation,
        policy: &policy,
        template_hash: &hash,
        members: i.members,
        hosts: i.hosts,
        status: i.status,
        credentials_present: true,
        now: i.now,
    });
    let mut status = decision.status.clone();
    status.selector = selector(i.name);
    // A member this round unpublishes shows as draining now, not after the driver's write
    // comes back.
    let mut rows: Vec<PoolMemberStatus> = i
        .members
        .iter()
        .filter(|m| !m.deleting)
        .map(|m| {
            let mut row = PoolMemberStatus::of_member(m);
            if row.draining_since.is_none() && decision.unpublishes.iter().any(|u| u.name == m.name)
            {
                row.available = false;
                row.draining_since = Some(fmt_time(i.now));
            }
            row
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    status.members_omitted =
        u32::try_from(rows.len().saturating_sub(MAX_STATUS_MEMBERS)).unwrap_or(u32::MAX);
    rows.truncate(MAX_STATUS_MEMBERS);
    status.members = rows;
    Round::Act(Box::new(Plan {
        member_counts: {
            // This round's unpublishes count as deleting already (as once their marker is back).
            let mut c = state_counts(i.members);
            for m in i.members.iter().filter(|m| {
                !m.deleting
                    && m.draining.is_none()
                    && m.quarantine.is_none()
                    && decision.unpublishes.iter().any(|u| u.name == m.name)
            }) {
                if let Some(n) = c.get_mut(usize::from(!m.available)) {
                    *n = n.saturating_sub(1);
                }
                if let Some(n) = c.get_mut(3) {
                    *n = n.saturating_add(1);
                }
            }
            c
        },
        newly_available: memory.newly_available(i.members, i.now),
        policy,
        template_hash: hash,
        decision,
        status,
    }))
}

/// The refusal of pool `i` for `why`: `Progressing` False and `ReplicaFailure` True with
/// `msg`, announced once per change.
fn refuse(i: &RoundInputs<'_>, why: &'static str, msg: &str) -> Round {
    let t = fmt_time(i.now);
    let mut status = i.status.clone();
    status.observed_generation = i.generation;
    status.selector = selector(i.name);
    status.set_condition(Condition::new(
        condition::PROGRESSING,
        ConditionStatus::False,
        why,
        msg,
        &t,
        i.generation,
    ));
    status.set_condition(Condition::new(
        condition::REPLICA_FAILURE,
        ConditionStatus::True,
        why,
        msg,
        &t,
        i.generation,
    ));
    let event = (status != *i.status).then(|| Event::new(EventKind::Warning, why, msg));
    Round::Refused {
        reason: why,
        status,
        event,
    }
}

/// What a driver does for a pool round: its I/O, and nothing else. Each call is bounded by
/// the driver; none may hold a lock across an `.await`.
pub trait PoolDriver: Sync {
    /// Why a call failed (the driver retries the round).
    type Error: Send;

    /// Creates member `member` (its name, host, template hash and pinned addresses); a
    /// member that already exists is no error.
    fn create(&self, member: &CreateMember)
    -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Unpublishes member `u.name` for good: records its drain marker `u.marker` on it
    /// (Kubernetes: the [`crate::pool::member::ANNOTATION_DRAIN`] annotation; standalone: its
    /// member file), so that it is no longer available, never published (healthy lists,
    /// Service endpoints, the gateway), and a later round (after a restart too) deletes it
    /// once the drain grace has passed. A member already gone is no error.
    fn unpublish(
        &self,
        u: &UnpublishMember,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Deletes member `name`: `true` when this call started its deletion (it is counted as
    /// a replacement), `false` when it was gone or already going.
    fn delete(&self, name: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Publishes one of the pool's events.
    fn event(&self, event: &Event) -> impl Future<Output = ()> + Send;

    /// Puts the pool's retired addresses (`status.retiredAddresses` of the round) in effect
    /// where addresses are handed out; called before any create or delete of a round that
    /// changed them, so an address a replaced member leaves behind is never handed out. No
    /// I/O.
    fn retire(&self, status: &ProxyPoolStatus);

    /// Records the pool's new `status` (`changed`: it differs from the status the round
    /// read). The round's last step: a driver whose creates and deletes take effect only once
    /// recorded makes them take effect here.
    fn write_status(
        &self,
        status: &ProxyPoolStatus,
        changed: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// A deleted pool's last member is gone: let the pool go.
    fn forget(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What carrying a round out came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Decide again after this long, even if nothing changes (`None`: on the next change).
    pub requeue_after: Option<Duration>,
    /// The pool's removal finished: it is gone.
    pub finished: bool,
}

/// Carries `round` of pool `key` (whose status as read was `current`) out through `driver`,
/// recording its metrics in `metrics`. See the module doc for the order.
pub async fn carry_out<D: PoolDriver>(
    driver: &D,
    metrics: &Metrics,
    key: &str,
    round: &Round,
    current: &ProxyPoolStatus,
) -> Result<Done, D::Error> {
    match round {
        Round::Remove { delete, finished } => {
            for name in delete {
                driver.delete(name).await?;
            }
            if *finished {
                driver.forget().await?;
                metrics.forget_pool(key);
            }
            Ok(Done {
                requeue_after: None,
                finished: *finished,
            })
        }
        Round::Refused { status, event, .. } => {
            driver.write_status(status, status != current).await?;
            if let Some(e) = event {
                driver.event(e).await;
            }
            Ok(Done {
                requeue_after: None,
                finished: false,
            })
        }
        Round::Wait(d) => Ok(Done {
            requeue_after: Some(*d),
            finished: false,
        }),
        Round::Act(plan) => {
            metrics.set_pool_members(key, plan.member_counts);
            for secs in &plan.newly_available {
                metrics.pool_member_ready(key, *secs);
            }
            if plan.status.retired_addresses != current.retired_addresses {
                driver.retire(&plan.status);
            }
            let mut first_error = None;
            for c in &plan.decision.creates {
                if let Err(e) = driver.create(c).await {
                    first_error.get_or_insert(e);
                }
            }
            for u in &plan.decision.unpublishes {
                if let Err(e) = driver.unpublish(u).await {
                    first_error.get_or_insert(e);
                }
            }
            for d in &plan.decision.deletes {
                match driver.delete(&d.name).await {
                    Ok(true) => metrics.pool_member_replaced(key, d.cause.as_str()),
                    Ok(false) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            for e in &plan.decision.events {
                driver.event(e).await;
            }
            driver
                .write_status(&plan.status, plan.status != *current)
                .await?;
            metrics.set_pool(
                key,
                PoolReplicas {
                    desired: u64::from(plan.policy.replicas),
                    available: u64::from(plan.status.available_replicas),
                },
            );
            match first_error {
                Some(e) => Err(e),
                None => Ok(Done {
                    requeue_after: plan.decision.requeue_after,
                    finished: false,
                }),
            }
        }
    }
}

#[cfg(test)]
#[path = "round_tests.rs"]
mod tests;
