//! The operator core of egress-proxies. For now: the provider configuration loader
//! ([`config`]); the Proxy model, the reconciler, orphan GC and standalone mode follow.

pub mod config;
