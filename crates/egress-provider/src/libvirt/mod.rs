//! The libvirt provider: proxies as VMs on libvirt hosts reached over SSH.
//!
//! Modules: [`config`] (one provider entry), [`names`] (every name derived from entry + UID),
//! [`mark`] (the ownership mark, strictly parsed).

pub mod config;
pub mod mark;
pub mod names;
