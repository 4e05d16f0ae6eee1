//! ProxyPools: fleets of member Proxies made from one template, kept at `replicas`, spread
//! over the entry's hosts, replaced when they age, break, or their template changes, with
//! credentials the operator may generate.
//!
//! - [`spec`]: the manifest and its spec (defaults as named constants);
//!   [`validate`]: its values checked and resolved into a [`PoolPolicy`];
//!   [`quantity`] and [`duration`]: the counts-or-percentages and durations it is written in.
//! - [`member`]: a member as the decision sees it, and how members are named, hashed and
//!   specified.
//! - [`decide`]: the pure pool decision (creates, deletes with their cause, status).
//! - [`round`]: one whole round (removal, validation, credentials, the decision, status and
//!   metrics) as a pure plan, carried out through the small driver trait both drivers
//!   implement.
//! - [`status`]: the pool's status, conditions and reasons.
//! - [`credentials`]: generated credentials (a driver keeps them: a Secret in Kubernetes, a
//!   0600 file beside a standalone manifest).
//! - [`gateway`]: `spec.gateway`, the pool's front proxy, and the membership a driver
//!   publishes to it.
//!
//! Members are ordinary Proxies reconciled by the Proxy controller, so every guarantee a
//! Proxy has holds for a member; the pool only decides which members exist.

pub mod credentials;
pub mod decide;
pub mod duration;
pub mod gateway;
pub mod gateway_source;
pub mod member;
#[cfg(test)]
mod member_tests;
pub mod quantity;
pub mod round;
pub mod spec;
pub mod status;
pub mod validate;
#[cfg(test)]
mod validate_tests;

pub use self::decide::{
    CreateMember, DeleteCause, DeleteMember, PoolDecision, PoolHost, PoolInputs, UnpublishMember,
    decide,
};
pub use self::member::{Drain, Member, MemberMeta};
pub use self::quantity::IntOrPercent;
pub use self::round::{
    AvailabilityMemory, Done, Plan, PoolCredentials, PoolDriver, Round, RoundInputs, carry_out,
    plan,
};
pub use self::spec::{ProxyPoolManifest, ProxyPoolSpec, ProxyTemplate, TemplateMetadata};
pub use self::status::{PoolMemberStatus, ProxyPoolStatus};
pub use self::validate::PoolPolicy;
