//! Acting on a decision, in one place: cancel, or spawn a create/replace/delete after taking
//! its host's work slots, or, when a host is full, register the Proxy as waiting for a slot.
//!
//! Guarantees: no network in the call (work is spawned and tracked per UID); a work slot is
//! taken with a try-acquire, never awaited (finding H1); the state lock is held from the
//! try-acquire to the waiting registration, so a freed slot never misses its waiter; nothing
//! new starts while the controller is shutting down.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::decide::{self, Action, Decision};
use super::executor::Controller;
use super::outcome::{EventKind, Outcome};
use super::proxy::ProxyObject;
use super::settings::create_deadline;
use super::state::Size;
use egress_provider::sync::lock;

impl Controller {
    /// Performs the decision's action (no network here: work is spawned) and builds the
    /// outcome. `found_at_location`: this reconcile's `get` found the instance running or
    /// provisioning at its location with no work in flight, so second copies elsewhere may be
    /// swept (see [`strays`](super::strays)).
    pub(super) fn act(
        &self,
        obj: &ProxyObject,
        handle: Option<&crate::providers::ProviderHandle>,
        d: Decision,
        found_at_location: bool,
        now: SystemTime,
    ) -> Outcome {
        let Decision {
            action,
            mut status,
            mut requeue_after,
            mut events,
            memory,
            finalized,
        } = d;
        let settings = &self.inner.settings;
        let mut st = lock(&self.inner.state);
        let mut action = action;
        if let Some(h) = handle {
            let entry = h.config.name.as_str();
            if finalized {
                // Its instance is gone: its addresses are held for its namespace a while.
                st.reservations.release(&obj.uid, now);
            } else {
                let pins = obj.spec.egress.pinned();
                st.reservations
                    .register(entry, obj.uid, &obj.namespace, &pins);
                // What its instance holds, for the hold after it goes.
                let hold = status
                    .host
                    .as_deref()
                    .and_then(|host| h.host(host))
                    .and_then(|c| c.address_pool.as_ref())
                    .map(|p| p.hold_released);
                let holds: Vec<std::net::IpAddr> = status
                    .egress_address
                    .iter()
                    .filter_map(|a| a.parse().ok())
                    .collect();
                if let Some(hold) = hold {
                    st.reservations
                        .note_held(entry, obj.uid, &obj.namespace, &holds, hold);
                }
                // Its size counts on its host's usage, and it counts in its namespace.
                let size = decide::sizes(obj, &h.config).ok().map(|(_, m, v)| Size {
                    memory_mib: m,
                    vcpus: u64::from(v),
                    namespace: obj.namespace.clone(),
                });
                st.set_size(obj.uid, size);
                // A new instance (not a replacement) beyond the namespace's quota waits.
                if let Action::Create { .. } = &action
                    && let Some(max) = h.config.quotas.max_proxies_per_namespace
                    && !st.counts_on(&obj.uid, entry)
                    && st.namespace_count(entry, &obj.namespace) >= max as usize
                {
                    let msg = format!(
                        "namespace {:?} has {max} Proxies on provider entry {entry:?}, its \
                         quota (quotas.maxProxiesPerNamespace); waiting for one to go",
                        obj.namespace
                    );
                    status = decide::quota_exceeded(status, obj, &msg, now);
                    requeue_after = Some(settings.poll_provisioning);
                    events.retain(|e| e.kind == EventKind::Warning);
                    action = Action::None;
                }
                if let Action::Create { req, .. } = &mut action {
                    if let Some(msg) = st.reservations.conflict(
                        entry,
                        &obj.uid,
                        obj.replaces.as_ref(),
                        &obj.namespace,
                        &req.pinned_egress,
                        now,
                    ) {
                        status = decide::address_reserved(status, obj, &msg, now);
                        requeue_after = Some(settings.poll_provisioning);
                        events.retain(|e| e.kind == EventKind::Warning);
                        action = Action::None;
                    } else if req.pinned_egress.is_empty()
                        && !self.inner.pins_known.load(Ordering::SeqCst)
                    {
                        // Some Proxy's pins are not known yet (the driver is listing): an
                        // address chosen now might be one of them.
                        requeue_after = Some(settings.poll_provisioning);
                        events.retain(|e| e.kind == EventKind::Warning);
                        action = Action::None;
                    } else if req.pinned_egress.is_empty() {
                        req.reserved =
                            st.reservations
                                .reserved_for(entry, &obj.uid, &obj.namespace, now);
                    }
                }
            }
        } else if finalized {
            st.reservations.forget_all(&obj.uid);
        }
        if finalized {
            st.set_size(obj.uid, None);
        }
        if finalized {
            if let Some(o) = st.objects.remove(&obj.uid)
                && let Some(op) = o.op
            {
                op.abort.abort();
            }
            st.clear_location(&obj.uid);
            st.created.remove(&obj.uid);
            st.forget_waiter(&obj.uid);
            st.strays.remove(&obj.uid);
            return Outcome {
                status,
                requeue_after,
                events,
                finalized,
                instance_started: false,
            };
        }
        // A sweep of this UID's second copies is running: no create may start until it is
        // done (it wakes the UID when it ends), so it never removes a copy being made.
        let sweeping = st.sweeping(&obj.uid);
        let mut created_on: Option<(String, String)> = None;
        let mut instance_started = false;
        let o = st.objects.entry(obj.uid).or_default();
        o.memory = memory;
        let stopping = self.inner.stopping.load(Ordering::SeqCst);
        // A host whose work slots were all taken: this UID waits for one to free up. (The
        // state lock is held from the try-acquire to the registration, and a finishing op
        // frees its slot before taking waiters under the same lock, so no wake-up is lost.)
        let mut wait_on: Option<(String, String, bool)> = None;
        match action {
            Action::None => {}
            Action::Cancel => {
                if let Some(op) = o.op.take() {
                    op.abort.abort();
                }
            }
            Action::Create { req, replace } => {
                if let Some(h) = handle {
                    if stopping {
                        status = decide::shutting_down(status, obj, now);
                        requeue_after = Some(settings.poll_provisioning);
                    } else if sweeping {
                        requeue_after = Some(settings.poll_provisioning);
                    } else {
                        let max = h.host(&req.host).map_or(1, |c| c.max_concurrent);
                        match self.inner.limits.try_work(&h.config.name, &req.host, max) {
                            None => {
                                self.inner
                                    .counters
                                    .host_busy
                                    .fetch_add(1, Ordering::Relaxed);
                                status = decide::host_busy(status, obj, &req.host, now);
                                requeue_after = Some(settings.poll_provisioning);
                                events.retain(|e| e.kind == EventKind::Warning);
                                wait_on = Some((
                                    h.config.name.clone(),
                                    req.host.clone(),
                                    obj.spec.host.is_some(),
                                ));
                            }
                            Some(permit) => {
                                if let Some(old) = o.op.take() {
                                    old.abort.abort();
                                }
                                instance_started = true;
                                let deadline = create_deadline(&h.config.timeouts);
                                // Until it succeeds there, a copy may be left on this host.
                                created_on = Some((h.config.name.clone(), req.host.clone()));
                                o.op = Some(self.spawn_create(
                                    h.provider.clone(),
                                    h.config.name.clone(),
                                    *req,
                                    replace,
                                    permit,
                                    deadline,
                                    now,
                                ));
                            }
                        }
                    }
                }
            }
            Action::Delete { .. } if stopping => {
                status = decide::shutting_down(status, obj, now);
                requeue_after = Some(settings.poll_provisioning);
            }
            Action::Delete { hosts } => {
                if let Some(old) = o.op.take() {
                    old.abort.abort();
                }
                if let Some(h) = handle {
                    let mut permits = Vec::new();
                    let mut busy = None;
                    for host in &hosts {
                        let max = h.host(host).map_or(1, |c| c.max_concurrent);
                        match self.inner.limits.try_work(&h.config.name, host, max) {
                            Some(p) => permits.push(p),
                            None => {
                                busy = Some(host.clone());
                                break;
                            }
                        }
                    }
                    if let Some(host) = busy {
                        self.inner
                            .counters
                            .host_busy
                            .fetch_add(1, Ordering::Relaxed);
                        status = decide::host_busy(status, obj, &host, now);
                        requeue_after = Some(settings.poll_provisioning);
                        // A delete must run where the instance is: treat it as pinned.
                        wait_on = Some((h.config.name.clone(), host, true));
                    } else {
                        o.op = Some(self.spawn_delete(
                            h.provider.clone(),
                            h.config.name.clone(),
                            obj.uid,
                            hosts,
                            permits,
                            now,
                        ));
                    }
                }
            }
        }
        let idle = o.op.is_none();
        if let Some((entry, host, pinned)) = wait_on {
            st.wait_for_slot(&entry, &host, obj.uid, pinned);
        }
        if let Some((entry, host)) = created_on {
            st.note_stray(obj.uid, &entry, &host);
        }
        if found_at_location
            && idle
            && !stopping
            && !obj.deleting
            && let Some(h) = handle
        {
            self.start_sweep(&mut st, h, obj.uid, now);
        }
        // The work in flight may have changed: the host loads follow.
        st.refresh_load(&obj.uid);
        Outcome {
            status,
            requeue_after,
            events,
            finalized,
            instance_started,
        }
    }
}
