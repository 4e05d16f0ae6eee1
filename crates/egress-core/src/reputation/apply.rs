//! What the reputation results do to a Proxy's status: `status.reputation`, the `Listed`
//! condition, and the Event that announces a change.
//!
//! The condition:
//! - `True` / `Listed` while any of the Proxy's addresses is listed in a zone (the message
//!   names each address, zone, meaning and start);
//! - `False` / `NotListed` when every address was checked in every zone and none is listed;
//! - `Unknown` / `CheckFailed` when none is listed but some check failed (the blocklist
//!   refused, the resolver did not answer): nothing is known of those;
//! - `Unknown` / `NotChecked` before the first check of the Proxy's addresses;
//! - absent while no blocklist zone is configured.
//!
//! Guarantees: pure; one Event per change: `Listed` (Warning) when the set of (address,
//! zone) listings grows, `Delisted` (Normal) when the last listing ends, `ReputationCheckFailed`
//! (Warning) when the checks start failing with nothing listed; none for a first clean
//! result, none while nothing changes.

use std::collections::BTreeSet;
use std::time::SystemTime;

use egress_reputation::ProxyReputation;
use egress_reputation::status::Summary;

use crate::controller::{Event, EventKind};
use crate::model::{Condition, ConditionStatus, ProxyStatus, condition};

/// Condition reasons (and Event reasons) of the `Listed` condition.
pub mod reason {
    /// An address is listed.
    pub const LISTED: &str = "Listed";
    /// No address is listed anywhere.
    pub const NOT_LISTED: &str = "NotListed";
    /// Some checks failed, none listed.
    pub const CHECK_FAILED: &str = "CheckFailed";
    /// Not checked yet.
    pub const NOT_CHECKED: &str = "NotChecked";
    /// Event: the last listing ended.
    pub const DELISTED: &str = "Delisted";
    /// Event: the checks started failing.
    pub const REPUTATION_CHECK_FAILED: &str = "ReputationCheckFailed";
}

fn listings(r: Option<&ProxyReputation>) -> BTreeSet<(String, String)> {
    r.map(|r| {
        r.listed
            .iter()
            .map(|l| (l.address.clone(), l.zone.clone()))
            .collect()
    })
    .unwrap_or_default()
}

/// Sets `status.reputation` to `view` and the `Listed` condition from it (`enabled`: whether
/// any zone is configured); returns the Event announcing the change, if any.
pub fn apply_to_status(
    status: &mut ProxyStatus,
    view: Option<ProxyReputation>,
    enabled: bool,
    now: SystemTime,
    generation: i64,
) -> Option<Event> {
    let before = listings(status.reputation.as_ref());
    let before_reason = status
        .condition(condition::LISTED)
        .map(|c| c.reason.clone());
    status.reputation = view;
    if !enabled {
        status.conditions.retain(|c| c.type_ != condition::LISTED);
        return None;
    }
    let now_s = humantime::format_rfc3339_seconds(now).to_string();
    let r = status.reputation.as_ref();
    let (st, why, message) = match r.map_or(Summary::Unchecked, ProxyReputation::summary) {
        Summary::Unchecked => (
            ConditionStatus::Unknown,
            reason::NOT_CHECKED,
            "the egress addresses have not been checked yet".to_owned(),
        ),
        Summary::Listed(_) => (ConditionStatus::True, reason::LISTED, listed_message(r)),
        Summary::Clean => (
            ConditionStatus::False,
            reason::NOT_LISTED,
            format!(
                "{} not listed in any configured blocklist (last check {})",
                r.map(|r| r.addresses.join(", ")).unwrap_or_default(),
                r.and_then(|r| r.last_check.clone()).unwrap_or_default()
            ),
        ),
        Summary::Failing => (
            ConditionStatus::Unknown,
            reason::CHECK_FAILED,
            failed_message(r),
        ),
    };
    status.set_condition(Condition::new(
        condition::LISTED,
        st,
        why,
        &message,
        &now_s,
        generation,
    ));
    let after = listings(status.reputation.as_ref());
    if !after.is_subset(&before) {
        return Some(Event::new(EventKind::Warning, reason::LISTED, &message));
    }
    if after.is_empty() && !before.is_empty() && why == reason::NOT_LISTED {
        return Some(Event::new(
            EventKind::Normal,
            reason::DELISTED,
            &format!("no longer listed: {message}"),
        ));
    }
    if why == reason::CHECK_FAILED && before_reason.as_deref() != Some(reason::CHECK_FAILED) {
        return Some(Event::new(
            EventKind::Warning,
            reason::REPUTATION_CHECK_FAILED,
            &message,
        ));
    }
    None
}

fn listed_message(r: Option<&ProxyReputation>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    r.listed
        .iter()
        .map(|l| {
            let codes = if l.codes.is_empty() {
                String::new()
            } else {
                format!(" ({})", l.codes.join(", "))
            };
            format!(
                "{} is listed in {}{codes} since {}",
                l.address, l.zone, l.since
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn failed_message(r: Option<&ProxyReputation>) -> String {
    let Some(r) = r else {
        return String::new();
    };
    r.failed
        .iter()
        .map(|f| {
            format!(
                "the check of {} in {} fails since {} ({}): {}",
                f.address, f.zone, f.since, f.reason, f.message
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
