//! The libvirt provider: proxies as VMs on libvirt hosts reached over SSH.
//!
//! Modules: [`config`] (one provider entry), [`names`] (every name derived from entry + UID),
//! [`mark`] (the ownership mark, strictly parsed).

pub mod address_alloc;
pub mod address_book;
pub mod address_pool;
pub mod caps;
pub mod check;
pub mod classify;
pub mod config;
pub mod domain_xml;
pub mod fence;
pub mod hostpool;
pub mod image;
pub mod mark;
pub mod names;
pub mod namespaces;
pub mod network_config;
pub mod nwfilter;
pub mod ops;
pub mod provider_impl;
pub mod retired;
pub(crate) mod secs;
pub mod seed;
pub mod volumes;
