//! Test support shared by the workspace's integration tests: a real OpenSSH `sshd` on
//! 127.0.0.1 ([`sshd`]) and a TCP relay that can freeze ([`relay`]).
//!
//! Everything cleans up on Drop: sshd is killed and its temporary directory removed; relay
//! tasks are aborted and their sockets closed. Test-only code: it panics on setup failures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod relay;
pub mod sshd;
