//! The operator core of egress-proxies: the provider configuration loader ([`config`]) and
//! the Proxy model shared by both drivers ([`model`]).

pub mod config;
pub mod model;
pub mod providers;
