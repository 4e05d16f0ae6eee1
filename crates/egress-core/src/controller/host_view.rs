//! The placement's view of an entry's hosts: each host's load (instances known plus creates
//! in flight, each UID counted once: on its create's host while one is in flight, else where
//! its instance is) and last health report, read from the executor's state.
//!
//! Guarantees: no I/O; O(hosts of the entry) whatever the number of Proxies (the loads are
//! counts [`State`] keeps incrementally); a host whose work slots are all taken sorts after
//! every host that can start work now ([`FULL_HOST_LOAD`]).

use std::collections::BTreeMap;

use super::decide::HostInfo;
use super::state::State;

/// Load added, in the placement's view, to a host whose work slots are all taken.
// NB: placement picks the least loaded host; without this a Proxy refused on a full host is
// placed there again while another host has a free slot, and waits for its next poll. 2^20 is
// above any real number of proxies on one host, so every host that can start work now sorts
// first, and full hosts keep their order by real load among themselves.
pub(super) const FULL_HOST_LOAD: usize = 1 << 20;

/// Loads (instances known + creates in flight) and health of `entry`'s hosts: O(1) per host,
/// read from the counts [`State`] keeps up to date on every change.
pub(super) fn host_view<'a>(
    st: &State,
    entry: &str,
    hosts: impl Iterator<Item = &'a str>,
) -> BTreeMap<String, HostInfo> {
    let health = st.health.get(entry);
    hosts
        .map(|h| {
            (
                h.to_owned(),
                HostInfo {
                    load: st.load(entry, h),
                    health: health.and_then(|m| m.get(h)).copied(),
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

    use super::super::ops::{OpKind, ProgressCell, RunningOp};
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
}
