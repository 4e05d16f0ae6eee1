//! Task tracking: the creates, replaces and deletes the executor spawns, one at most per
//! UID, each bounded by its own deadline, with progress readable while it runs and a result
//! the next reconcile takes (once).
//!
//! Guarantees: a create runs under the entry's create deadline and a delete under
//! [`DELETE_DEADLINE`] per host (hosts concurrently); a finished op frees its host slots
//! before waking the next waiter under the state lock, so no wake-up is lost; an op aborted
//! without a result is reported as a transient failure; image bytes are counted as progress
//! arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use egress_provider::error::ProviderError;
use egress_provider::model::{CreateRequest, Instance, Progress, ProxyUid};
use egress_provider::provider::Provider;
use tokio::task::AbortHandle;

use super::decide::OpView;
use super::executor::Controller;
use super::limits;
use super::settings::DELETE_DEADLINE;
use super::state::{ObjState, lock};

/// Progress of one create, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct ProgressCell {
    pub(super) done: AtomicU64,
    /// `u64::MAX` = unknown.
    pub(super) total: AtomicU64,
    pub(super) seen: AtomicBool,
    /// The controller's running total of image bytes, fed with each update's increase.
    pub(super) image_bytes: Option<Arc<AtomicU64>>,
}

impl Progress for ProgressCell {
    fn update(&self, done: u64, total: Option<u64>) {
        let before = self.done.swap(done, Ordering::Relaxed);
        if let Some(sum) = &self.image_bytes {
            // `done` is cumulative per transfer; a smaller value is a new transfer from 0.
            let added = if done >= before { done - before } else { done };
            sum.fetch_add(added, Ordering::Relaxed);
        }
        self.total
            .store(total.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.seen.store(true, Ordering::Relaxed);
    }
}

impl ProgressCell {
    pub(super) fn snapshot(&self) -> Option<(u64, Option<u64>)> {
        if !self.seen.load(Ordering::Relaxed) {
            return None;
        }
        let total = self.total.load(Ordering::Relaxed);
        Some((
            self.done.load(Ordering::Relaxed),
            (total != u64::MAX).then_some(total),
        ))
    }
}

/// What a finished op left for the next reconcile.
#[derive(Debug)]
pub(super) enum OpResult {
    Created(Result<Instance, ProviderError>),
    Deleted(Result<(), ProviderError>),
}

#[derive(Debug, Clone)]
pub(super) enum OpKind {
    /// A create (or replace) of an instance on `entry`'s `host`.
    Create {
        entry: String,
        host: String,
        image: String,
    },
    Delete {
        hosts: Vec<String>,
    },
}

/// One spawned create/replace/delete of a UID.
pub(super) struct RunningOp {
    pub(super) kind: OpKind,
    pub(super) started: SystemTime,
    pub(super) progress: Arc<ProgressCell>,
    pub(super) result: Arc<Mutex<Option<OpResult>>>,
    pub(super) abort: AbortHandle,
}

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

pub(super) fn op_finished(op: Option<&RunningOp>) -> bool {
    op.is_some_and(|op| op.abort.is_finished() || lock(&op.result).is_some())
}

/// The in-flight op as the decision sees it; a finished op's result is taken (once).
pub(super) fn take_op_view(o: &mut ObjState) -> OpView {
    let Some(op) = &o.op else {
        return OpView::Idle;
    };
    let mut finished = lock(&op.result).take();
    if finished.is_none() && op.abort.is_finished() {
        // Aborted (or panicked) without a result: report it like a failure.
        let e = ProviderError::transient("the operation was interrupted before it finished");
        finished = Some(match op.kind {
            OpKind::Create { .. } => OpResult::Created(Err(e)),
            OpKind::Delete { .. } => OpResult::Deleted(Err(e)),
        });
    }
    match finished {
        Some(res) => {
            let kind = op.kind.clone();
            o.op = None;
            match (res, kind) {
                (OpResult::Created(result), OpKind::Create { host, .. }) => {
                    OpView::CreateFinished { host, result }
                }
                (OpResult::Deleted(result), _) => OpView::DeleteFinished { result },
                (OpResult::Created(result), OpKind::Delete { hosts }) => OpView::CreateFinished {
                    host: hosts.first().cloned().unwrap_or_default(),
                    result,
                },
            }
        }
        None => match &op.kind {
            OpKind::Create { host, image, .. } => OpView::Creating {
                host: host.clone(),
                image: image.clone(),
                started: op.started,
                progress: op.progress.snapshot(),
            },
            OpKind::Delete { hosts } => OpView::Deleting {
                hosts: hosts.clone(),
            },
        },
    }
}
