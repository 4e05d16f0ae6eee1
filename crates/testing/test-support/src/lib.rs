//! Test support shared by the workspace's integration tests: a real OpenSSH `sshd` on
//! 127.0.0.1 ([`sshd`]), a TCP relay that can freeze ([`relay`]), and unique names, Drop
//! guards and the leftover sweep for resources made on the real libvirtd ([`cleanup`]), and the
//! building blocks of the real-guest end-to-end tests ([`e2e`]), raw HTTP responses read back
//! ([`http`]), running one test in a process of its own, checked to have run ([`isolate`]),
//! a private libvirtd a test may kill and restart ([`libvirtd`]), several of them as hosts on
//! one bridge segment ([`segment`]), a real authoritative DNS server serving test blocklist
//! zones ([`nsd`]), and the harness the real-guest tests share: entry point, fixture, operator
//! process ([`real_guest`]).
//!
//! Everything cleans up on Drop: sshd is killed and its temporary directory removed; relay
//! tasks are aborted and their sockets closed. Test-only code: it panics on setup failures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod cleanup;
pub mod e2e;
pub mod http;
pub mod isolate;
pub mod libvirtd;
pub mod nsd;
pub mod real_guest;
pub mod relay;
pub mod segment;
pub mod sshd;
