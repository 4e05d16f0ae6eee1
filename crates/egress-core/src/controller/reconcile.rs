//! The reconcile pipeline of one Proxy: read what is known (executor state; no network) →
//! observe the instance (network: one bounded `Provider::get`, only when nothing is in
//! flight) → [`decide`](super::decide::decide) (pure) → [act](super::act) (spawns work; no
//! network in the call itself) → the [`Outcome`].
//!
//! Guarantees: one [`Controller::reconcile`] never takes longer than
//! [`ControllerSettings::reconcile_deadline`](super::ControllerSettings::reconcile_deadline)
//! (finding APX-3); the get takes a read slot of its host with a try-acquire and uses at most
//! [`GET_SHARE`] of that deadline (finding H1); dropping the future is safe.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use egress_provider::error::ProviderError;
use egress_provider::model::{InstanceState, ProviderId, ProxyUid};
use egress_provider::provider::Provider;

use crate::model::ProxyStatus;

use super::decide::{self, Inputs, Observed, OpView};
use super::executor::Controller;
use super::host_view::LiveHosts;
use super::inflight::take_op_view;
use super::outcome::Outcome;
use super::proxy::ProxyObject;
use egress_provider::sync::lock;

/// Share of the reconcile deadline a provider `get` may use (numerator / denominator).
// NB: three quarters leaves the rest for deciding and reporting; the outer deadline still
// bounds the whole call.
pub(super) const GET_SHARE: (u32, u32) = (3, 4);

impl Controller {
    /// One reconcile of `obj`, never longer than `settings.reconcile_deadline` (finding
    /// APX-3). `status` is the Proxy's current status; `now` is the wall clock (tests pass a
    /// fixed one).
    pub async fn reconcile(
        &self,
        obj: &ProxyObject,
        status: &ProxyStatus,
        now: SystemTime,
    ) -> Outcome {
        let deadline = self.inner.settings.reconcile_deadline;
        self.inner
            .counters
            .reconciles
            .fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(deadline, self.reconcile_inner(obj, status, now)).await {
            Ok(o) => o,
            Err(_) => {
                self.inner
                    .counters
                    .reconcile_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                let failures = {
                    let mut st = lock(&self.inner.state);
                    let o = st.objects.entry(obj.uid).or_default();
                    o.memory.failures = o.memory.failures.saturating_add(1);
                    o.memory.failures
                };
                decide::reconcile_timed_out(obj, status, now, &self.inner.settings, failures)
            }
        }
    }

    async fn reconcile_inner(
        &self,
        obj: &ProxyObject,
        status: &ProxyStatus,
        now: SystemTime,
    ) -> Outcome {
        let settings = &self.inner.settings;
        let providers = self.providers();
        // A Proxy being deleted is deleted where its instance is, even if spec.provider was
        // edited since (the edit itself is refused by `decide`).
        let known_entry = if obj.deleting {
            lock(&self.inner.state)
                .locations
                .get(&obj.uid)
                .map(|l| l.entry.clone())
                .or_else(|| {
                    status
                        .provider_id
                        .as_deref()
                        .and_then(|s| s.parse::<ProviderId>().ok())
                        .map(|id| id.entry)
                })
        } else {
            None
        };
        let handle = known_entry
            .and_then(|e| providers.get(&e).cloned())
            .or_else(|| providers.get(&obj.spec.provider).cloned());

        // Read what is known (no network).
        let (memory, op_view, location, strays) = {
            let mut st = lock(&self.inner.state);
            st.prefer_recorded_copy(&obj.uid, status.provider_id.as_deref());
            let location = st.locations.get(&obj.uid).cloned().or_else(|| {
                status
                    .provider_id
                    .as_deref()
                    .and_then(|s| s.parse::<ProviderId>().ok())
            });
            let o = st.objects.entry(obj.uid).or_default();
            let op_view = take_op_view(&mut o.op);
            let memory = o.memory.clone();
            // A finished op's result was just taken: the UID's load moves to its location.
            st.refresh_load(&obj.uid);
            let strays = st.stray_hosts(&obj.uid);
            (memory, op_view, location, strays)
        };

        // Observe (network: one bounded get), only when nothing is in flight.
        let observed = match (&handle, &location, &op_view) {
            (Some(h), Some(id), OpView::Idle) if !obj.deleting && id.entry == h.config.name => {
                self.observe(h.provider.clone(), &h.config, id, &obj.uid)
                    .await
            }
            _ => Observed::Unknown,
        };
        if let Observed::GetFailed(e) = &observed {
            self.inner.counters.count_error(e.class);
        }

        // The hosts' view (no network): answers from the executor's state when the decision
        // asks (only the paths that may place a new instance do), O(log hosts) per placement.
        let no_hosts = std::collections::BTreeMap::new();
        let live = handle.as_ref().map(|h| LiveHosts {
            inner: &self.inner,
            handle: h,
        });
        let hosts: &dyn decide::HostView = match &live {
            Some(l) => l,
            None => &no_hosts,
        };

        let entry = handle.as_ref().map(|h| decide::EntryView {
            config: &h.config,
            config_digest: &h.config_digest,
        });
        // NB: after the observation, so a fresh answer is what counts.
        let status = &*self.trusted_status(&obj.uid, status);
        let d = decide::decide(&Inputs {
            obj,
            status,
            entry: entry.as_ref(),
            location: location.as_ref(),
            strays: &strays,
            observed: &observed,
            op: &op_view,
            hosts,
            memory: &memory,
            now,
            settings,
        });
        let found_at_location = matches!(op_view, OpView::Idle)
            && matches!(
                &observed,
                Observed::Found(i)
                    if matches!(i.state, InstanceState::Running | InstanceState::Provisioning)
            );
        self.act(obj, handle.as_ref(), d, found_at_location, now)
    }

    async fn observe(
        &self,
        provider: Arc<dyn Provider>,
        entry: &egress_provider::libvirt::config::LibvirtEntry,
        id: &ProviderId,
        uid: &ProxyUid,
    ) -> Observed {
        let max = entry
            .hosts
            .iter()
            .find(|h| h.name == id.host)
            .map_or(1, |h| h.max_concurrent);
        let Some(_permit) = self.inner.limits.try_read(&id.entry, &id.host, max) else {
            self.inner
                .counters
                .host_busy
                .fetch_add(1, Ordering::Relaxed);
            return Observed::HostBusy(id.host.clone());
        };
        let (num, den) = GET_SHARE;
        let budget = self.inner.settings.reconcile_deadline * num / den;
        match tokio::time::timeout(budget, provider.get(id, uid)).await {
            Ok(Ok(inst)) => {
                lock(&self.inner.state).set_location(*uid, inst.id.clone());
                self.note_observed(uid, Some(&inst));
                Observed::Found(inst)
            }
            Ok(Err(e)) if e.is_not_found() => {
                self.note_observed(uid, None);
                let mut st = lock(&self.inner.state);
                st.clear_location(uid);
                st.created.remove(uid);
                drop(st);
                Observed::NotFound(e.message)
            }
            Ok(Err(e)) => Observed::GetFailed(e),
            Err(_) => Observed::GetFailed(ProviderError::transient(format!(
                "reading instance {id} did not finish within {}s (host {} may be unreachable)",
                budget.as_secs(),
                id.host
            ))),
        }
    }
}
