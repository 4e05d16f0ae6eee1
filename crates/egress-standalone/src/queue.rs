//! The de-duplicating queues of the standalone driver: the work queue that feeds the
//! reconcile workers ([`WorkQueue`], by Proxy UID) and the pools to decide again
//! ([`PoolQueue`], by pool key).
//!
//! Guarantees: a UID is queued at most once and handed to one worker at a time; an `add`
//! while it is being worked on queues it once more after [`WorkQueue::done`]; a waiting
//! worker returns `None` as soon as the stop token is cancelled. A pool is marked dirty at
//! most once until the pool loop takes the set. No lock is held across an `.await`.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Mutex;

use egress_provider::ProxyUid;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use egress_provider::sync::lock;

/// A de-duplicating work queue: a UID is queued at most once, and handed to one worker at a
/// time; an `add` while it is being worked on queues it again after [`WorkQueue::done`].
#[derive(Default)]
pub(crate) struct WorkQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<ProxyUid>,
    queued: HashSet<ProxyUid>,
    active: HashSet<ProxyUid>,
    dirty: HashSet<ProxyUid>,
}

impl WorkQueue {
    /// Queues `uid` unless it is queued already; while a worker has it, marks it to be
    /// queued once more when that worker calls [`WorkQueue::done`].
    pub(crate) fn add(&self, uid: ProxyUid) {
        {
            let mut s = lock(&self.state);
            if s.active.contains(&uid) {
                s.dirty.insert(uid);
                return;
            }
            if !s.queued.insert(uid) {
                return;
            }
            s.order.push_back(uid);
        }
        self.notify.notify_one();
    }

    /// The first queued UID, now held by the caller, if any (no wait).
    fn try_pop(&self) -> Option<ProxyUid> {
        let mut s = lock(&self.state);
        let uid = s.order.pop_front()?;
        s.queued.remove(&uid);
        s.active.insert(uid);
        Some(uid)
    }

    /// The next UID, or `None` once `stop` is cancelled.
    pub(crate) async fn next(&self, stop: &CancellationToken) -> Option<ProxyUid> {
        loop {
            if stop.is_cancelled() {
                return None;
            }
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(u) = self.try_pop() {
                // Pass the wake-up on: more may be queued than workers woken.
                if !lock(&self.state).order.is_empty() {
                    self.notify.notify_one();
                }
                return Some(u);
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = &mut notified => {}
            }
        }
    }

    /// The worker holding `uid` finished; queues it again if it changed meanwhile.
    pub(crate) fn done(&self, uid: ProxyUid) {
        let again = {
            let mut s = lock(&self.state);
            s.active.remove(&uid);
            s.dirty.remove(&uid)
        };
        if again {
            self.add(uid);
        }
    }
}

/// Pools to decide again soon (de-duplicated), by `namespace/name`.
#[derive(Debug, Default)]
pub(crate) struct PoolQueue {
    dirty: Mutex<BTreeSet<String>>,
    notify: Notify,
    /// Wakes the gateway feed ([`crate::gateway_feed`]) on the same changes.
    pub(crate) gateway_wake: Notify,
}

impl PoolQueue {
    /// Marks `key` to be decided again (and wakes the gateway feed).
    pub(crate) fn add(&self, key: &str) {
        if lock(&self.dirty).insert(key.to_owned()) {
            self.notify.notify_one();
        }
        self.gateway_wake.notify_one();
    }

    /// Every pool marked since the last take.
    pub(crate) fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut *lock(&self.dirty))
    }

    /// Waits until a pool is marked (a mark made meanwhile is not lost: `Notify` keeps a
    /// permit).
    pub(crate) async fn marked(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn u(n: u8) -> ProxyUid {
        ProxyUid(uuid::Uuid::from_bytes([n; 16]))
    }

    #[tokio::test]
    async fn the_queue_hands_a_uid_to_one_worker_and_requeues_changes_after_it() {
        let q = WorkQueue::default();
        let stop = CancellationToken::new();
        q.add(u(1));
        q.add(u(1));
        q.add(u(2));
        assert_eq!(q.next(&stop).await, Some(u(1)));
        q.add(u(1)); // while active: once more after done
        assert_eq!(q.next(&stop).await, Some(u(2)));
        q.done(u(2));
        assert!(q.try_pop().is_none(), "u1 is active, not queued twice");
        q.done(u(1));
        assert_eq!(q.next(&stop).await, Some(u(1)));
        q.done(u(1));
        stop.cancel();
        assert_eq!(q.next(&stop).await, None);
    }
}
