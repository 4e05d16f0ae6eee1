//! Collecting unused base images: what a caller asks for ([`BaseGcSettings`]) and what it
//! gets back, one [`BaseVerdict`] per base (or per host that could not be read).
//!
//! Guarantees: plain data, no I/O; rule labels are stable (JSON, reports).

use std::time::{Duration, SystemTime};

/// Where the time a base has been unused is counted from. Either way it is never earlier
/// than the base's upload, so a base imported (or prefetched) less than the grace ago is
/// kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnusedClock {
    /// From the first pass of this process that found the base unused, for a process that
    /// runs passes periodically (the operator's GC). A pass that finds the base in use
    /// starts the count again; so does a restart of the process.
    FirstSeen,
    /// From the base's upload, for a one-shot command, which has seen no earlier pass.
    Upload,
}

/// One collection pass over an entry's bases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseGcSettings {
    /// Report what would be removed; remove nothing.
    pub dry_run: bool,
    /// How the unused time is counted.
    pub clock: UnusedClock,
    /// The grace period; `None` takes the entry's own (`limits.unusedBaseGraceMinutes`).
    pub grace: Option<Duration>,
    /// The time the pass runs at (the wall clock, except in tests).
    pub now: SystemTime,
}

/// What a pass did with one base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseAction {
    /// Removed (base, marker, data volume).
    Removed,
    /// Would be removed (dry run).
    WouldRemove,
    /// Left alone.
    Kept,
    /// Could not be read or removed; nothing is reported removed that was not.
    Failed,
}

/// One line of a pass's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseVerdict {
    /// Provider entry.
    pub entry: String,
    /// Host.
    pub host: String,
    /// The base volume's name (`*` when the host as a whole could not be read).
    pub name: String,
    /// What happened.
    pub action: BaseAction,
    /// A stable label of the rule that decided: `base-in-use`, `base-in-grace`,
    /// `base-unused`, `base-unpublished`, `base-age-unknown`, `base-importing`,
    /// `base-chain-unseen`, `base-host-failed`.
    pub rule: &'static str,
    /// Why, for humans.
    pub reason: String,
}
