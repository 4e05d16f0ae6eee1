//! Second copies of an instance: the hosts, other than its location, where a copy of a
//! Proxy's instance may remain, and their removal (a *sweep*).
//!
//! How a second copy comes to be: a create whose outcome is not known (its answer was lost
//! to a timeout or a dropped connection, or it was aborted) may have defined the domain all
//! the same; the next attempt goes to another host when that one looks unhealthy, and the
//! Proxy then runs there. Its UID is live, so orphan GC never touches the first copy: without
//! a sweep it would hold the host's capacity (and a declared address) for the Proxy's whole
//! life. A complete listing can also show one UID on two hosts (after a restart or a
//! leadership hand-over); the copy its Proxy's status names is then kept (see `adopt`).
//!
//! Guarantees:
//! - a host is noted for a UID when a create of it starts there (until one succeeds there),
//!   when its location moves away from that host, and when a complete listing shows the UID
//!   there while it is located (or being created) elsewhere; the location's own host is never
//!   noted;
//! - a sweep is a UID-checked [`Provider::delete`](egress_provider::provider::Provider) of each
//!   noted host, each under [`DELETE_DEADLINE`], taking the host's work slot with a
//!   try-acquire (a busy host waits for a later reconcile); it starts only right after a `get`
//!   found the instance running or provisioning at its location with no work in flight, and
//!   never addresses the location's host;
//! - while a UID's sweep runs, no create of it starts and no listing moves its location to a
//!   host being swept, so a sweep never removes the copy the Proxy uses;
//! - a failed sweep keeps its hosts and is retried after the controller's backoff; hosts the
//!   entry no longer has are dropped (nothing can reach them);
//! - a deleted Proxy's delete covers the noted hosts too (see `decide`'s finalize);
//! - every step costs O(hosts noted for that UID): nothing walks the fleet.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_provider::error::ProviderError;
use egress_provider::model::ProxyUid;

use super::backoff::backoff;
use super::executor::Controller;
use super::settings::DELETE_DEADLINE;
use super::state::State;
use crate::providers::ProviderHandle;
use egress_provider::sync::lock;

impl Controller {
    /// Starts a sweep of the hosts noted for `uid`, when there are some and no earlier sweep
    /// runs or failed too recently. Call it only right after a `get` found the instance at its
    /// location (running or provisioning) with no work in flight. No network here: the
    /// deletes are spawned.
    pub(super) fn start_sweep(
        &self,
        st: &mut State,
        h: &ProviderHandle,
        uid: ProxyUid,
        now: SystemTime,
    ) {
        let entry = h.config.name.as_str();
        let Some(location) = st.locations.get(&uid).cloned() else {
            return;
        };
        let Some(s) = st.strays.get_mut(&uid) else {
            return;
        };
        if s.sweeping || s.not_before.is_some_and(|t| now < t) {
            return;
        }
        if s.entry != entry || location.entry != entry {
            st.strays.remove(&uid);
            return;
        }
        s.hosts
            .retain(|x| *x != location.host && h.host(x).is_some());
        let mut work = Vec::new();
        for host in &s.hosts {
            let max = h.host(host).map_or(1, |c| c.max_concurrent);
            if let Some(permit) = self.inner.limits.try_work(entry, host, max) {
                work.push((host.clone(), permit));
            }
        }
        if s.hosts.is_empty() {
            st.strays.remove(&uid);
            return;
        }
        if work.is_empty() {
            // Every noted host is busy: a later reconcile tries again.
            return;
        }
        s.sweeping = true;
        let inner = self.inner.clone();
        let provider = h.provider.clone();
        let (entry, runs_on) = (entry.to_owned(), location.host);
        self.inner.tracker.spawn(async move {
            let calls = work.iter().map(|(host, _)| {
                let provider = provider.clone();
                async move {
                    let r = match tokio::time::timeout(DELETE_DEADLINE, provider.delete(host, &uid))
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => Err(ProviderError::transient(format!(
                            "delete on host {host} did not finish within {}s",
                            DELETE_DEADLINE.as_secs()
                        ))),
                    };
                    (host.clone(), r)
                }
            });
            let results = futures_util::future::join_all(calls).await;
            let settings = &inner.settings;
            let mut st = lock(&inner.state);
            let mut failed = false;
            for (host, r) in &results {
                match r {
                    Ok(()) => {
                        inner
                            .counters
                            .duplicate_deletes_ok
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            proxy_uid = %uid, host = %host, runs_on = %runs_on,
                            "no second copy of the instance is left on this host (a create \
                             there had no known outcome; the Proxy runs elsewhere)"
                        );
                        if let Some(s) = st.strays.get_mut(&uid) {
                            s.hosts.remove(host);
                        }
                    }
                    Err(e) => {
                        failed = true;
                        inner
                            .counters
                            .duplicate_deletes_failed
                            .fetch_add(1, Ordering::Relaxed);
                        inner.counters.count_error(e.class);
                        tracing::warn!(
                            proxy_uid = %uid, host = %host, runs_on = %runs_on, error = %e.message,
                            "removing a possible second copy of the instance failed; retrying later"
                        );
                    }
                }
            }
            if let Some(s) = st.strays.get_mut(&uid) {
                s.sweeping = false;
                if failed {
                    s.failures = s.failures.saturating_add(1);
                    let wait = backoff(settings.backoff_base, settings.backoff_max, s.failures);
                    // NB: on the reconciles' clock (`now` of the reconcile that started it).
                    s.not_before = now.checked_add(wait);
                } else {
                    s.failures = 0;
                    s.not_before = None;
                }
                if s.hosts.is_empty() {
                    st.strays.remove(&uid);
                }
            }
            // Free the slots first, then pick their next users (see `act`).
            drop(work);
            let mut wake = vec![uid];
            for (host, _) in &results {
                wake.extend(st.take_waiter(&entry, host));
            }
            drop(st);
            inner.wake(wake);
        });
    }
}
