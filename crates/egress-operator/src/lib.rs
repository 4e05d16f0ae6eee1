//! The operator core of egress-proxies: the provider configuration loader ([`config`]) and
//! the Proxy model shared by both drivers ([`model`]).

pub mod cli;
pub mod config;
pub mod controller;
pub mod gc;
pub mod health;
pub mod hosthealth;
pub mod metrics;
pub mod model;
pub mod providers;
pub mod standalone;
