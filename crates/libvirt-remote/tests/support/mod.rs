//! Test support shared by integration-test targets: a real OpenSSH `sshd` on 127.0.0.1
//! ([`sshd`]) and a TCP relay that can freeze ([`relay`]).
//!
//! Use from a test target with `mod support;`. Everything cleans up on Drop: sshd is killed
//! and its temporary directory removed; relay tasks are aborted and their sockets closed.
// NB: each test target uses a different subset of this module.
#![allow(dead_code)]

pub mod relay;
pub mod sshd;
