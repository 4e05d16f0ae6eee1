//! The serving layer of egress-proxies, above the operator core (`egress_core`, which has
//! no HTTP server and no HTML): what both drivers show about the fleet, and how.
//!
//! - [`server`]: the status listener — `/status`, `/proxies`, `/hosts`, `/healthy.txt`,
//!   `/pools/…/healthy.txt`, `/metrics`, `/healthz`, `/readyz` — over the [`Endpoints`] a
//!   driver implements; a listener may answer a subset ([`Routes`]), and answers only the
//!   `Host` names [`HostCheck`] admits (DNS rebinding).
//! - [`status`]: the status document (`/status`) and its rows, which the CLI's `status`
//!   command reads back; [`stream`]: `/status` and `/proxies` built and sent a chunk at a
//!   time.
//! - [`page`]: the fleet page (`/`) and `/fleet.json` (routes in `fleet`), with sparklines
//!   of the last hour kept by [`history`]; [`filters`]: the one filter of `/status`,
//!   `/proxies`, the page and the CLI's `status`.
//! - [`exposition`]: the `/metrics` text from the core's registry.
//! - [`echo`]: the health checks' target (`egress-proxies echo`), which answers with the
//!   caller's address.
//!
//! Guarantees: everything served is read from what a driver hands in ([`Endpoints`]); no
//! request ever waits on a host or the Kubernetes API; every server here is bounded
//! (connections, header time, connection lifetime) and stops on its shutdown token.

pub mod echo;
mod endpoints;
pub mod exposition;
pub mod filters;
mod fleet;
pub mod history;
pub mod host_check;
pub mod page;
#[cfg(test)]
mod page_tests;
mod reply;
pub mod server;
mod sparkline;
pub mod status;
pub mod stream;

pub use self::endpoints::Endpoints;
pub use self::host_check::HostCheck;
pub use self::server::{
    CONNECTION_DEADLINE, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, Routes, handle, handle_request,
    handle_routes, handle_shared, healthy_list, healthy_list_of, metrics, serve, serve_checked,
    serve_routes,
};
