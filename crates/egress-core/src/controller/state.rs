//! The executor's in-memory state: per-Proxy memory and work in flight, where each
//! instance is, host health, creation times, and the queues of Proxies waiting for a host's
//! work slot.
//!
//! Guarantees: plain data behind one mutex ([`lock`] recovers it from poisoning, since every
//! update leaves it consistent); each UID waits at most once per host, so the queues are
//! bounded by the number of Proxies; no I/O.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use egress_provider::model::{HostState, ProviderId, ProxyUid};

use super::decide::Memory;
use super::ops::RunningOp;

#[derive(Default)]
pub(super) struct ObjState {
    pub(super) memory: Memory,
    pub(super) op: Option<RunningOp>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) objects: HashMap<ProxyUid, ObjState>,
    /// Where each UID's instance is, from adoption, creates and gets.
    pub(super) locations: HashMap<ProxyUid, ProviderId>,
    /// Last reported health per (entry, host).
    pub(super) health: HashMap<(String, String), HostState>,
    /// When each UID's instance was created: its mark's time from a listing, or when a
    /// create of it succeeded in this process.
    pub(super) created: HashMap<ProxyUid, SystemTime>,
    /// UIDs refused a work slot, per (entry, host), oldest first, with whether the Proxy is
    /// pinned to that host; each UID at most once per host (bounded by the number of
    /// Proxies). A freed slot wakes a waiter (see [`State::take_waiter`]).
    pub(super) waiting: HashMap<(String, String), VecDeque<(ProxyUid, bool)>>,
}

impl State {
    pub(super) fn wait_for_slot(&mut self, entry: &str, host: &str, uid: ProxyUid, pinned: bool) {
        let q = self
            .waiting
            .entry((entry.to_owned(), host.to_owned()))
            .or_default();
        if !q.iter().any(|(u, _)| *u == uid) {
            q.push_back((uid, pinned));
        }
    }

    /// The waiter to wake for a freed slot on `host`: the oldest refused on that host, else
    /// the oldest unpinned one refused on another host of the entry (placement sends it to a
    /// host with a free slot, see
    /// [`FULL_HOST_LOAD`](super::host_view::FULL_HOST_LOAD)); a pinned Proxy is only woken for its
    /// own host, where it can use the slot.
    pub(super) fn take_waiter(&mut self, entry: &str, host: &str) -> Option<ProxyUid> {
        let key = (entry.to_owned(), host.to_owned());
        let own = self.waiting.get_mut(&key).and_then(VecDeque::pop_front);
        let found = own.map(|(u, _)| u).or_else(|| {
            self.waiting
                .iter_mut()
                .filter(|((e, _), _)| e == entry)
                .find_map(|(_, q)| {
                    let i = q.iter().position(|(_, pinned)| !pinned)?;
                    q.remove(i).map(|(u, _)| u)
                })
        });
        self.waiting.retain(|_, q| !q.is_empty());
        found
    }

    pub(super) fn forget_waiter(&mut self, uid: &ProxyUid) {
        self.waiting.retain(|_, q| {
            q.retain(|(u, _)| u != uid);
            !q.is_empty()
        });
    }
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it (the state is
/// plain data and every update leaves it consistent).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
