//! Spawning work: the creates, replaces and deletes the executor starts, one at most per
//! UID, each bounded by its own deadline; what runs and what it leaves behind is
//! `inflight`'s.
//!
//! Guarantees: a create runs under the entry's create deadline and a delete under
//! [`DELETE_DEADLINE`] per host (hosts concurrently); a finished op frees its host slots
//! before waking the next waiter under the state lock, so no wake-up is lost.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_provider::error::ProviderError;
use egress_provider::model::{CreateRequest, ProxyUid};
use egress_provider::provider::Provider;
use egress_provider::sync::lock;

use super::executor::Controller;
use super::inflight::{OpKind, OpResult, ProgressCell, RunningOp};
use super::limits;
use super::settings::DELETE_DEADLINE;

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spawn_create(
        &self,
        provider: Arc<dyn Provider>,
        entry: String,
        req: CreateRequest,
        replace: bool,
        permit: limits::Slot,
        deadline: Duration,
        now: SystemTime,
    ) -> RunningOp {
        let progress = Arc::new(ProgressCell {
            image_bytes: Some(Arc::clone(&self.inner.image_bytes)),
            ..ProgressCell::default()
        });
        let result = Arc::new(Mutex::new(None));
        let kind = OpKind::Create {
            entry: entry.clone(),
            host: req.host.clone(),
            image: req.image.clone(),
        };
        let inner = self.inner.clone();
        let (p, r) = (progress.clone(), result.clone());
        inner
            .counters
            .creates_started
            .fetch_add(1, Ordering::Relaxed);
        if replace {
            inner.counters.replacements.fetch_add(1, Ordering::Relaxed);
        }
        let task = self.inner.tracker.spawn(async move {
            let work = async {
                if replace {
                    provider.delete(&req.host, &req.uid).await?;
                }
                provider.create(&req, &*p).await
            };
            let res = match tokio::time::timeout(deadline, work).await {
                Ok(r) => r,
                Err(_) => Err(ProviderError::transient(format!(
                    "create on host {} did not finish within {}s",
                    req.host,
                    deadline.as_secs()
                ))),
            };
            match &res {
                Ok(inst) => {
                    inner
                        .counters
                        .creates_succeeded
                        .fetch_add(1, Ordering::Relaxed);
                    let mut st = lock(&inner.state);
                    st.set_location(req.uid, inst.id.clone());
                    st.created.insert(req.uid, SystemTime::now());
                    drop(st);
                    // A new instance: the previous one's address is no longer its.
                    inner.note_observed(&req.uid, None);
                    inner.note_observed(&req.uid, Some(inst));
                }
                Err(e) => {
                    inner
                        .counters
                        .creates_failed
                        .fetch_add(1, Ordering::Relaxed);
                    inner.counters.count_error(e.class);
                }
            }
            *lock(&r) = Some(OpResult::Created(res));
            // Free the slot first, then pick its next user (see `act`).
            drop(permit);
            let waiter = lock(&inner.state).take_waiter(&entry, &req.host);
            inner.wake(std::iter::once(req.uid).chain(waiter));
        });
        RunningOp {
            kind,
            started: now,
            progress,
            result,
            abort: task.abort_handle(),
        }
    }

    pub(super) fn spawn_delete(
        &self,
        provider: Arc<dyn Provider>,
        entry: String,
        uid: ProxyUid,
        hosts: Vec<String>,
        permits: Vec<limits::Slot>,
        now: SystemTime,
    ) -> RunningOp {
        let result = Arc::new(Mutex::new(None));
        let inner = self.inner.clone();
        let r = result.clone();
        inner
            .counters
            .deletes_started
            .fetch_add(1, Ordering::Relaxed);
        let hs = hosts.clone();
        let task = self.inner.tracker.spawn(async move {
            // NB: hosts are deleted concurrently so one frozen host delays the result by one
            // DELETE_DEADLINE, not one per host.
            let calls = hs.iter().map(|h| {
                let provider = provider.clone();
                async move {
                    match tokio::time::timeout(DELETE_DEADLINE, provider.delete(h, &uid)).await {
                        Ok(r) => r,
                        Err(_) => Err(ProviderError::transient(format!(
                            "delete on host {h} did not finish within {}s",
                            DELETE_DEADLINE.as_secs()
                        ))),
                    }
                }
            });
            let results = futures_util::future::join_all(calls).await;
            let res = results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err);
            match &res {
                Ok(()) => {
                    let mut st = lock(&inner.state);
                    st.clear_location(&uid);
                    st.created.remove(&uid);
                    drop(st);
                    inner.note_observed(&uid, None);
                }
                Err(e) => inner.counters.count_error(e.class),
            }
            *lock(&r) = Some(OpResult::Deleted(res));
            // Free the slots first, then pick their next users (see `act`).
            drop(permits);
            let mut wake = vec![uid];
            {
                let mut st = lock(&inner.state);
                for h in &hs {
                    wake.extend(st.take_waiter(&entry, h));
                }
            }
            inner.wake(wake);
        });
        RunningOp {
            kind: OpKind::Delete { hosts },
            started: now,
            progress: Arc::new(ProgressCell::default()),
            result,
            abort: task.abort_handle(),
        }
    }
}
