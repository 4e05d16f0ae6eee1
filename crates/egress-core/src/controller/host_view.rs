//! The placement's view of an entry's hosts: each host's load (instances known plus creates
//! in flight, each UID counted once) and last health report, read from the executor's state.
//!
//! Guarantees: no I/O; a host whose work slots are all taken sorts after every host that can
//! start work now ([`FULL_HOST_LOAD`]).

use std::collections::BTreeMap;

use egress_provider::model::ProxyUid;

use super::decide::HostInfo;
use super::ops::{OpKind, RunningOp};
use super::state::State;

/// Load added, in the placement's view, to a host whose work slots are all taken.
// NB: placement picks the least loaded host; without this a Proxy refused on a full host is
// placed there again while another host has a free slot, and waits for its next poll. 2^20 is
// above any real number of proxies on one host, so every host that can start work now sorts
// first, and full hosts keep their order by real load among themselves.
pub(super) const FULL_HOST_LOAD: usize = 1 << 20;

/// Loads (instances known + creates in flight) and health of `entry`'s hosts.
pub(super) fn host_view<'a>(
    st: &State,
    entry: &str,
    hosts: impl Iterator<Item = &'a str>,
) -> BTreeMap<String, HostInfo> {
    let mut view: BTreeMap<String, HostInfo> = hosts
        .map(|h| {
            (
                h.to_owned(),
                HostInfo {
                    load: 0,
                    health: st.health.get(&(entry.to_owned(), h.to_owned())).copied(),
                },
            )
        })
        .collect();
    let mut counted: std::collections::HashSet<ProxyUid> = std::collections::HashSet::new();
    for (uid, o) in &st.objects {
        if let Some(RunningOp {
            kind: OpKind::Create { host, .. },
            ..
        }) = &o.op
            && let Some(hi) = view.get_mut(host)
        {
            hi.load += 1;
            counted.insert(*uid);
        }
    }
    for (uid, id) in &st.locations {
        if id.entry == entry
            && !counted.contains(uid)
            && let Some(hi) = view.get_mut(&id.host)
        {
            hi.load += 1;
        }
    }
    view
}
