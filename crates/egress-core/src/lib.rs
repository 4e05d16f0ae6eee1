//! The operator core of egress-proxies: everything both drivers (standalone and Kubernetes)
//! share, with no driver in it.
//!
//! - [`model`]: the Proxy manifest, spec validation and status (conditions redacted, bounded).
//! - [`proxy_policy`]: who may use a guest's proxy and where it may connect;
//!   [`client_span`]: what a list of client networks admits, and its caps.
//! - [`pool`]: ProxyPools: the pool spec, its validation and the pure pool decision.
//! - [`config`]: the provider configuration: load, validate, every error with its field path.
//! - [`providers`]: the registry of configured provider entries and their hosts.
//! - [`controller`]: pure reconcile decisions and the executor that carries them out.
//! - [`gc`]: the orphan garbage collector (a pure plan, then checked deletions).
//! - [`health`]: proxy health checked through each proxy; [`host_health`]: per-host checks.
//! - [`reputation`]: the egress addresses checked in DNS blocklists, the results in status.
//! - [`metrics`]: the Prometheus registry of the operator (served by `egress-web`).
//! - [`background`]: the background tasks both drivers run (GC, host checks, proxy health,
//!   reputation checks, config watch) and the process's stop signal.
//!
//! What the operator serves (the status listener, the fleet page, `/status` streaming, the
//! metrics exposition) is the `egress-web` crate above this one: the core has no HTTP server
//! and no HTML dependency (a test, `tests/no_web_dependency.rs`, holds it to that).

pub mod background;
pub mod client_span;
pub mod config;
pub mod controller;
pub mod gc;
pub mod health;
pub mod host_health;
pub mod metrics;
pub mod model;
pub mod pool;
pub mod providers;
pub mod proxy_policy;
pub mod reputation;
