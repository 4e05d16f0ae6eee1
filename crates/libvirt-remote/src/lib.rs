//! A pure-Rust, async client for libvirt's remote RPC protocol, built so that it cannot wedge.
//!
//! Layers, each its own module: [`xdr`] (values) → [`frame`] (length-checked packets) →
//! [`conn`] (one task owns the stream; calls multiplexed by serial; keepalive; events) →
//! [`client`] (typed procedures) → [`upload`] (streams) → [`transport`] (unix, TCP, SSH).
//!
//! Guarantees: every call has a deadline; dropping a call's future abandons only that call;
//! any transport failure kills the connection and fails every pending call at once; killing
//! never waits on the peer; frames are bounded before anything is allocated.

pub mod client;
pub mod conn;
pub mod error;
pub mod frame;
pub mod proto;
pub mod transport;
pub mod upload;
pub mod xdr;

pub use client::{Client, LifecycleEvent, OpenOptions};
pub use conn::{ConnStats, Connection, ConnectionConfig, Event};
pub use error::{DeathReason, Error, RemoteError, Result};
pub use transport::{KillSwitch, Transport};
pub use upload::UploadOptions;

/// The crate's README, so its example is compiled with the doc tests (`cargo test --doc`).
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
