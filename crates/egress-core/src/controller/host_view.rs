//! The placement's view of an entry's hosts ([`LiveHosts`]): each host's load (instances
//! known plus creates in flight, each UID counted once: on its create's host while one is in
//! flight, else where its instance is) and last health report, read from the executor's
//! state when the decision asks.
//!
//! Guarantees: no I/O; a question costs O(1) ([`HostView::info`]) or O(log hosts) plus the
//! hosts skipped ([`HostView::least_loaded`]) whatever the number of Proxies and hosts (the
//! loads are counts [`State`] keeps incrementally, each entry's hosts ordered by them); a
//! host whose work slots are all taken sorts after every host that can start work now
//! ([`FULL_HOST_LOAD`]). [`host_view`] is the same view by a scan, for the tests that pin the
//! two together.

use std::fmt;

use egress_provider::libvirt::config::LibvirtEntry;

use crate::providers::ProviderHandle;

use super::decide::{HostInfo, HostView};
use super::executor::Inner;
#[cfg(test)]
use super::state::State;
use egress_provider::sync::lock;

/// Load added, in the placement's view, to a host whose work slots are all taken.
// NB: placement picks the least loaded host; without this a Proxy refused on a full host is
// placed there again while another host has a free slot, and waits for its next poll. 2^20 is
// above any real number of proxies on one host, so every host that can start work now sorts
// first, and full hosts keep their order by real load among themselves.
pub(super) const FULL_HOST_LOAD: usize = 1 << 20;

/// The executor's view of one entry's hosts, answering from its state when asked (each
/// answer under the state lock, which is not held between two questions).
pub(super) struct LiveHosts<'a> {
    pub(super) inner: &'a Inner,
    pub(super) handle: &'a ProviderHandle,
}

impl fmt::Debug for LiveHosts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveHosts")
            .field("entry", &self.handle.config.name)
            .finish_non_exhaustive()
    }
}

impl HostView for LiveHosts<'_> {
    fn info(&self, host: &str) -> HostInfo {
        let (name, digest) = (&self.handle.config.name, &self.handle.config_digest);
        let mut st = lock(&self.inner.state);
        let Some(max) = st.max_concurrent(&self.handle.config, digest, host) else {
            return HostInfo::default();
        };
        let mut load = st.load(name, host);
        let health = st.health.get(name).and_then(|m| m.get(host)).copied();
        let addresses = st.address_room(name, host);
        let (used_memory_mib, used_vcpus) = st.usage(name, host);
        drop(st);
        if self.inner.limits.work_available(name, host, max) == 0 {
            load = load.saturating_add(FULL_HOST_LOAD);
        }
        HostInfo {
            load,
            health,
            addresses,
            used_memory_mib,
            used_vcpus,
        }
    }

    fn reason(&self, host: &str) -> Option<String> {
        let name = &self.handle.config.name;
        lock(&self.inner.state)
            .host_reasons
            .get(name)
            .and_then(|m| m.get(host))
            .cloned()
    }

    fn dead_since(&self, host: &str) -> Option<std::time::SystemTime> {
        let name = &self.handle.config.name;
        lock(&self.inner.state)
            .dead_since
            .get(name)
            .and_then(|m| m.get(host))
            .copied()
    }

    fn least_loaded(
        &self,
        _entry: &LibvirtEntry,
        need: u8,
        eligible: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        let name = &self.handle.config.name;
        lock(&self.inner.state).least_loaded(
            &self.handle.config,
            &self.handle.config_digest,
            need,
            |host, max| self.inner.limits.work_available(name, host, max) > 0,
            eligible,
        )
    }
}

/// Loads (instances known + creates in flight) and health of `entry`'s hosts, by a scan:
/// the definition [`LiveHosts`] and [`State::least_loaded`] are tested against.
#[cfg(test)]
pub(super) fn host_view<'a>(
    st: &State,
    entry: &str,
    hosts: impl Iterator<Item = &'a str>,
) -> std::collections::BTreeMap<String, HostInfo> {
    let health = st.health.get(entry);
    hosts
        .map(|h| {
            (
                h.to_owned(),
                HostInfo {
                    load: st.load(entry, h),
                    health: health.and_then(|m| m.get(h)).copied(),
                    addresses: st.address_room(entry, h),
                    used_memory_mib: st.usage(entry, h).0,
                    used_vcpus: st.usage(entry, h).1,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};
    use std::time::SystemTime;

    use egress_provider::model::{ProviderId, ProxyUid};

    use super::super::decide::{AddressRoom, EVERY_FAMILY, FAMILY_V4, FAMILY_V6, HostView};
    use super::super::inflight::{OpKind, ProgressCell, RunningOp};
    use super::*;

    const ENTRIES: [&str; 2] = ["a", "b"];
    const HOSTS: [&str; 3] = ["h0", "h1", "h2"];

    /// The definition, by a full scan: on each (entry, host), the UIDs with a create in
    /// flight there, plus the UIDs located there that have no create in flight.
    fn scanned(st: &State) -> HashMap<(String, String), usize> {
        let mut out: HashMap<(String, String), usize> = HashMap::new();
        let mut creating = HashSet::new();
        for (uid, o) in &st.objects {
            if let Some(RunningOp {
                kind: OpKind::Create { entry, host, .. },
                ..
            }) = &o.op
            {
                *out.entry((entry.clone(), host.clone())).or_default() += 1;
                creating.insert(*uid);
            }
        }
        for (uid, id) in &st.locations {
            if !creating.contains(uid) {
                *out.entry((id.entry.clone(), id.host.clone())).or_default() += 1;
            }
        }
        out
    }

    fn op(kind: OpKind) -> RunningOp {
        let task = tokio::spawn(async {});
        RunningOp {
            kind,
            started: SystemTime::UNIX_EPOCH,
            progress: Arc::new(ProgressCell::default()),
            result: Arc::new(Mutex::new(None)),
            abort: task.abort_handle(),
        }
    }

    #[tokio::test]
    async fn host_loads_kept_incrementally_equal_a_full_recount_after_random_changes() {
        let mut st = State::default();
        // A fixed-seed LCG: the same 5000 steps every run.
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for step in 0..5000 {
            let uid = ProxyUid(uuid::Uuid::from_u128(u128::from(next(40))));
            let entry = ENTRIES[next(2) as usize];
            let host = HOSTS[next(3) as usize];
            match next(6) {
                0 => st.set_location(
                    uid,
                    ProviderId {
                        entry: entry.into(),
                        host: host.into(),
                        name: format!("ep-{entry}-x"),
                    },
                ),
                1 => st.clear_location(&uid),
                2 => {
                    st.objects.entry(uid).or_default().op = Some(op(OpKind::Create {
                        entry: entry.into(),
                        host: host.into(),
                        image: "img".into(),
                    }));
                    st.refresh_load(&uid);
                }
                3 => {
                    st.objects.entry(uid).or_default().op = Some(op(OpKind::Delete {
                        hosts: vec![host.into()],
                    }));
                    st.refresh_load(&uid);
                }
                4 => {
                    if let Some(o) = st.objects.get_mut(&uid) {
                        o.op = None;
                    }
                    st.refresh_load(&uid);
                }
                _ => {
                    st.objects.remove(&uid);
                    st.clear_location(&uid);
                }
            }
            let want = scanned(&st);
            for e in ENTRIES {
                let view = host_view(&st, e, HOSTS.into_iter());
                for h in HOSTS {
                    let w = want
                        .get(&(e.to_owned(), h.to_owned()))
                        .copied()
                        .unwrap_or(0);
                    assert_eq!(view[h].load, w, "step {step}: load of {e}/{h}");
                }
            }
            assert_eq!(st.loads(), &st.recount_loads(), "step {step}");
        }
    }

    /// Entry `name` with hosts `hosts` (each with its own `maxConcurrent`).
    fn entry_of(name: &str, hosts: &[&str]) -> egress_provider::libvirt::config::LibvirtEntry {
        let mut e = super::super::test_fixtures::entry(1);
        e.name = name.into();
        e.hosts = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| super::super::test_fixtures::host(h, 1 + i as u32))
            .collect();
        e
    }

    #[tokio::test]
    async fn ordered_placement_equals_the_scan_of_every_host_after_random_changes() {
        use egress_provider::model::HostState;

        let mut st = State::default();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        const ALL: [&str; 5] = ["h0", "h1", "h2", "h3", "h4"];
        let configs = [
            entry_of("a", &["h0", "h1", "h2", "h3"]),
            entry_of("a", &["h1", "h2", "h3", "h4"]),
            entry_of("a", &["h3"]),
        ];
        let states = [
            None,
            Some(HostState::Ready),
            Some(HostState::Degraded),
            Some(HostState::Unreachable),
        ];
        let mut config = 0;
        let mut full: HashSet<&str> = HashSet::new();
        for step in 0..5000 {
            let uid = ProxyUid(uuid::Uuid::from_u128(u128::from(next(60))));
            let host = ALL[next(5) as usize];
            match next(9) {
                0 | 1 => st.set_location(
                    uid,
                    ProviderId {
                        entry: "a".into(),
                        host: host.into(),
                        name: "ep-a-x".into(),
                    },
                ),
                8 => {
                    // A host's address pool: none, with room, or exhausted in some family.
                    let bits = [0, FAMILY_V4, FAMILY_V6, EVERY_FAMILY];
                    let pool = bits[next(4) as usize];
                    let room = AddressRoom {
                        pool,
                        full: pool & bits[next(4) as usize],
                    };
                    st.set_address_room("a", host, room);
                }
                2 => st.clear_location(&uid),
                3 => {
                    st.objects.entry(uid).or_default().op = Some(op(OpKind::Create {
                        entry: "a".into(),
                        host: host.into(),
                        image: "img".into(),
                    }));
                    st.refresh_load(&uid);
                }
                4 => {
                    if let Some(o) = st.objects.get_mut(&uid) {
                        o.op = None;
                    }
                    st.refresh_load(&uid);
                }
                5 => {
                    let s = states[next(4) as usize];
                    let m = st.health.entry("a".into()).or_default();
                    match s {
                        Some(s) => m.insert(host.into(), s),
                        None => m.remove(host),
                    };
                }
                6 => {
                    if !full.remove(host) {
                        full.insert(host);
                    }
                }
                _ => {
                    if next(10) == 0 {
                        config = next(3) as usize;
                    }
                }
            }
            let e = &configs[config];
            let digest = format!("d{config}");
            // The definition: every host of the entry scanned, a full host's load raised.
            let mut view = host_view(&st, "a", e.hosts.iter().map(|h| h.name.as_str()));
            for h in &full {
                if let Some(i) = view.get_mut(*h) {
                    i.load += FULL_HOST_LOAD;
                }
            }
            let need = [FAMILY_V4, FAMILY_V6, EVERY_FAMILY][next(3) as usize];
            // A host the Proxy's namespace may not use, sometimes.
            let barred = format!("h{}", next(8));
            let eligible = |h: &str| h != barred;
            let want = HostView::least_loaded(&view, e, need, &eligible);
            let got = st.least_loaded(
                e,
                &digest,
                need,
                |h, max| {
                    assert_eq!(
                        Some(max),
                        e.hosts
                            .iter()
                            .find(|c| c.name == h)
                            .map(|c| c.max_concurrent),
                        "step {step}: maxConcurrent of {h}"
                    );
                    !full.contains(h)
                },
                &eligible,
            );
            assert_ne!(got.as_deref(), Some(barred.as_str()), "step {step}");
            assert_eq!(got, want, "step {step}: config {config}, full {full:?}");
        }
    }
}
