//! The pool gateway's data path: one front proxy per ProxyPool that clients use instead of a
//! list of members. Clients speak HTTP (`CONNECT host:port`, absolute-URI requests) or
//! SOCKS5 (username/password); the gateway authenticates them with the pool's client
//! credentials (each an accounting identity), picks a member — round robin or least
//! connections per connection, or a sticky session from the username by rendezvous hashing —
//! dials it with the member's own protocol and credentials, fails over before the client's
//! first byte, copies the bytes through pooled buffers, drains members that leave, and writes
//! one access-log line and the metrics per connection.
//!
//! The crate knows nothing of Kubernetes, manifests or providers: a driver hands it
//! [`PoolView`]s (settings, client credentials, published members) and it follows them
//! ([`GatewaySet::apply`], [`GatewaySet::follow`]). It never writes pool state.
//!
//! The pipeline of one connection ([`conn`]): handshake ([`http`], [`socks`], check then parse,
//! bounded buffers from [`bufpool`], the request deadline) → [`auth`] with the [`username`]
//! syntax → destination rules ([`destinations`]) and limits ([`identity`]) → choice
//! ([`select`], [`pool`]) → [`dial`] with failover → [`copy`] → [`access_log`] and
//! [`metrics`].
//!
//! docs/gateway.md is the user's documentation of every setting, the username syntax, the
//! failover and drain rules, the access-log format and the metrics.

pub mod access_log;
pub mod auth;
pub mod bufpool;
pub mod conn;
pub mod copy;
pub mod destinations;
pub mod dial;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod model;
pub mod pipes;
pub mod pool;
pub mod select;
pub mod set;
pub mod socks;
pub mod target;
mod text;
pub mod username;
pub mod workers;

pub use access_log::{AccessLog, LogTarget, Record};
pub use destinations::{Destinations, Net};
pub use metrics::{GatewayMetrics, Outcome};
pub use model::{
    Balance, ByteBudget, Credential, Limits, Listener, ListenerProtocol, Member, MemberProtocol,
    PoolSettings, PoolView, Sessions, Timeouts,
};
pub use set::{GatewaySet, Listening, Views};
pub use workers::Workers;
