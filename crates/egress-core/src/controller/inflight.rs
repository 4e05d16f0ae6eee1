//! The work in flight for one UID: the create, replace or delete the executor spawned
//! ([`RunningOp`]), its progress while it runs and the result it leaves for the next
//! reconcile, which takes it once ([`take_op_view`]). Spawning it is `ops`'s job.
//!
//! Guarantees: an op aborted (or panicked) without a result is reported as a transient
//! failure; progress is readable without a lock; image bytes are counted as progress arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use egress_provider::error::ProviderError;
use egress_provider::model::{Instance, Progress};
use egress_provider::sync::lock;
use tokio::task::AbortHandle;

use super::decide::OpView;

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

pub(super) fn op_finished(op: Option<&RunningOp>) -> bool {
    op.is_some_and(|op| op.abort.is_finished() || lock(&op.result).is_some())
}

/// The in-flight op as the decision sees it; a finished op's result is taken (once).
pub(super) fn take_op_view(slot: &mut Option<RunningOp>) -> OpView {
    let Some(op) = &*slot else {
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
            *slot = None;
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
