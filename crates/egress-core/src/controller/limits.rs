//! Per-host limits on concurrent work (finding H1's blast radius).
//!
//! Each (entry, host) has two pools of `maxConcurrent` slots: one for work (creates,
//! replaces, deletes) and one for reads (`get`). Both are taken with a try-acquire that never
//! waits, so a frozen host holds at most its own slots — its creates stuck until their
//! deadline, its reads until theirs — and never blocks a caller that works on another host.
//!
//! Guarantees: acquiring never awaits; a slot is released when its [`Slot`] drops (including
//! when the task holding it is aborted); a host whose `maxConcurrent` changes on a config
//! reload gets fresh pools of the new size (old slots drain on their own).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use egress_provider::sync::lock;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One taken slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Work,
    Read,
}

type Key = (String, String, u32, Kind);

/// The slot pools of every host seen so far.
#[derive(Debug, Default)]
pub struct HostLimits {
    pools: Mutex<HashMap<Key, Arc<Semaphore>>>,
}

impl HostLimits {
    fn try_take(&self, entry: &str, host: &str, max: u32, kind: Kind) -> Option<Slot> {
        // NB: a `maxConcurrent` of 0 would make a host unusable forever; config validation
        // rejects it, and here it is read as 1.
        let max = max.max(1);
        let sem = {
            let mut pools = lock(&self.pools);
            pools
                .entry((entry.to_owned(), host.to_owned(), max, kind))
                .or_insert_with(|| Arc::new(Semaphore::new(max as usize)))
                .clone()
        };
        sem.try_acquire_owned().ok().map(Slot)
    }

    /// A work slot on `host` of `entry`, if one is free now.
    pub fn try_work(&self, entry: &str, host: &str, max: u32) -> Option<Slot> {
        self.try_take(entry, host, max, Kind::Work)
    }

    /// A read slot on `host` of `entry`, if one is free now.
    pub fn try_read(&self, entry: &str, host: &str, max: u32) -> Option<Slot> {
        self.try_take(entry, host, max, Kind::Read)
    }

    /// How many work slots on `host` of `entry` are free now: a snapshot for placement (no
    /// slot is taken, so the answer may be stale by the time a caller acts on it).
    pub fn work_available(&self, entry: &str, host: &str, max: u32) -> usize {
        let max = max.max(1);
        let pools = lock(&self.pools);
        pools
            .get(&(entry.to_owned(), host.to_owned(), max, Kind::Work))
            .map_or(max as usize, |s| s.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_host_refuses_at_once_and_other_hosts_stay_free() {
        // finding: H1
        let l = HostLimits::default();
        let a1 = l.try_work("e", "a", 2).unwrap();
        let _a2 = l.try_work("e", "a", 2).unwrap();
        assert!(l.try_work("e", "a", 2).is_none(), "host a is full");
        assert!(l.try_work("e", "b", 2).is_some(), "host b is not affected");
        assert!(
            l.try_read("e", "a", 2).is_some(),
            "reads have their own slots"
        );
        assert_eq!(l.work_available("e", "a", 2), 0);
        assert_eq!(
            l.work_available("e", "c", 2),
            2,
            "an unused host has every slot"
        );
        drop(a1);
        assert_eq!(l.work_available("e", "a", 2), 1);
        assert!(
            l.try_work("e", "a", 2).is_some(),
            "a dropped slot is free again"
        );
    }
}
