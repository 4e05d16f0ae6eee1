//! The serving layer of egress-proxies, above the operator core (`egress_core`, which has
//! no HTTP server and no HTML): what both drivers show about the fleet, and how.
//!
//! - [`server`]: the status listener — `/status`, `/proxies`, `/hosts`, `/healthy.txt`,
//!   `/pools/…/healthy.txt`, `/metrics`, `/healthz`, `/readyz` — over the [`Endpoints`] a
//!   driver implements; a listener may answer a subset ([`Routes`]).
//! - [`status`]: the status document (`/status`) and its rows, which the CLI's `status`
//!   command reads back; [`stream`]: `/status` and `/proxies` built and sent a chunk at a
//!   time.
//! - [`page`]: the fleet page (`/`), its filters and `/fleet.json` (routes in `fleet`),
//!   with sparklines of the last hour kept by [`history`].
//! - [`exposition`]: the `/metrics` text from the core's registry.
//! - [`echo`]: the health checks' target (`egress-proxies echo`), which answers with the
//!   caller's address.
//!
//! Guarantees: everything served is read from what a driver hands in ([`Endpoints`]); no
//! request ever waits on a host or the Kubernetes API; every server here is bounded
//! (connections, header time, connection lifetime) and stops on its shutdown token.

pub mod echo;
pub mod exposition;
mod filters;
mod fleet;
pub mod history;
pub mod page;
#[cfg(test)]
mod page_tests;
pub mod server;
mod sparkline;
pub mod status;
pub mod stream;

pub use self::server::{
    CONNECTION_DEADLINE, Endpoints, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, Routes, handle,
    handle_request, handle_routes, handle_shared, healthy_list, healthy_list_of, metrics, serve,
    serve_routes,
};
pub(crate) use self::server::{json, respond};
