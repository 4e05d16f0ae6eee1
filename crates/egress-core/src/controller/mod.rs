//! The Proxy reconciler, shared by the Kubernetes and standalone drivers: a pure decision
//! function ([`decide`]) plus this thin executor ([`Controller`]).
//!
//! Pipeline of one [`Controller::reconcile`] call: read what is known (the in-memory state of
//! the Proxy's in-flight work, where its instance is, host loads and health; no network) →
//! observe the instance with one bounded `Provider::get` (network) → [`decide::decide`] (pure)
//! → act (spawn a create/replace/delete task; no network in the call itself) → report.
//!
//! Guarantees:
//! - One reconcile never takes longer than [`ControllerSettings::reconcile_deadline`]
//!   (finding APX-3); creates (which may import a 1 GiB image for many minutes) and deletes run
//!   as spawned tasks tracked per UID, each bounded by its own deadline; reconcile reports
//!   their progress and picks their result up later.
//! - Work on a host takes a slot of that host's `maxConcurrent` with a try-acquire, and reads
//!   of a host take a slot of a separate pool of the same size, so one frozen host holds at most
//!   its own slots and never a caller's worker beyond one reconcile deadline (finding H1).
//! - No lock is held across an `.await`; dropping a reconcile future is safe (spawned work
//!   continues and is picked up by the next reconcile).
//! - Every message put in a status or an event is redacted ([`crate::model::Condition`] does
//!   it; finding D5).
//! - Image bytes a create transfers are counted as its progress arrives
//!   ([`Controller::image_bytes`], a monotonic total a driver exports as a metric), so a long
//!   import shows as progress.
//! - A Proxy never keeps a second copy of its instance on another host: a create with no
//!   known outcome, or a listing showing the UID elsewhere, notes that host, and once the
//!   instance is found at its location the copy there is deleted (`strays`).
//!
//! Where each step lives: `reconcile` (the pipeline: read → observe → decide → act),
//! [`decide`] (pure decisions), `act` (acting in one place), `ops` (spawning work) and
//! `inflight` (the work in flight and its results), `state`, `host_order` and `host_view`
//! (what the executor knows), `strays` (sweeping second copies), `executor` (the
//! [`Controller`] handle and its non-reconcile calls), `settings`, `proxy` and `outcome`
//! (the types a driver exchanges with it; all re-exported here).

mod act;
pub mod backoff;
pub mod decide;
#[cfg(test)]
mod decide_tests;
mod executor;
#[cfg(test)]
mod executor_tests;
mod host_order;
mod host_view;
mod inflight;
pub mod limits;
pub mod metrics;
mod ops;
mod outcome;
mod proxy;
mod reconcile;
mod reservations;
mod settings;
mod state;
mod strays;
#[cfg(test)]
mod strays_tests;
#[cfg(test)]
mod test_fixtures;
pub mod userdata;

pub use self::executor::{Controller, Waker};
pub use self::metrics::ControllerCounters;
pub use self::outcome::{Event, EventKind, Outcome};
pub use self::proxy::{ProxyCredentials, ProxyObject};
pub use self::settings::{
    CREATE_CALL_BUDGETS, CREATE_SLACK, ControllerSettings, DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_MAX, DEFAULT_IP_GRACE, DEFAULT_POLL_PROVISIONING, DEFAULT_POLL_RUNNING,
    DEFAULT_PROVISIONING_DEADLINE, DEFAULT_RECONCILE_DEADLINE, DELETE_DEADLINE,
};
