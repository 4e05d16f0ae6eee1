//! ProxyPools in standalone mode: each `kind: ProxyPool` manifest keeps `replicas` member
//! Proxies, decided by the core's pool round ([`egress_core::pool::round`]) and reconciled
//! by the ordinary Proxy controller like any manifest's Proxy.
//!
//! - **Members** are ordinary objects in the shared store, tagged with their pool, named by
//!   the decision (`POOL-xxxxxx`) and given a UID derived from the pool and the member name
//!   ([`member_uid`]), so their instances are found by UID like any Proxy's.
//! - **The member list survives restarts**: it is kept in a hidden file beside the manifests
//!   (`.NAMESPACE.NAME.pool-members.json`, [`state_path`]), written (atomically: a temporary
//!   file renamed over it) *before* a member is created or marked for deletion, so a restart
//!   re-derives every member's UID from it and adopts the existing instances instead of
//!   creating new ones. A member leaves the file only once its deletion finalized.
//! - **Rounds**: the pool loop (`reconcile::run`) decides a pool again when it is marked
//!   dirty (its manifest changed; one of its members' phase, readiness or health changed in
//!   a reconcile or a health round, or its deletion finalized) and every pool on every tick
//!   ([`crate::settings::POLL_INTERVAL`]), which picks up what no event announces: host
//!   checks, the end of an age, an unhealthy period or a backoff, the quarantine and
//!   credentials files. A round reads only the pool's own members (indexed by pool), never
//!   every Proxy.
//! - **Safety gates**: no round acts before the pool's provider entry was adopted from a
//!   complete listing, nor while one of its live members was never reconciled (a restarted
//!   process must not mistake a healthy member it has not looked at yet for an unavailable
//!   one).
//! - **Quarantine**: a line `MEMBER REASON` in `NAMESPACE.NAME.quarantine` beside the
//!   manifest holds the member out of the pool (not published, replaced, its VM kept);
//!   removing the line deletes it.
//! - **Generated credentials**: `NAMESPACE.NAME.credentials` beside the manifest
//!   (`credentials.rs`), created once (0600), never overwritten; deleting or editing it
//!   rolls the members.
//! - **Removal**: a pool whose manifest is gone deletes every member, then forgets itself
//!   (its metrics, its member file); its credentials file is left for the user.
//!
//! Locks: `pools` and `objects` are never held together; nothing is held across an `.await`.
//!
//! Where things are: `members.rs` the member file, the quarantine file and every pool's
//! runtime state; `credentials.rs` the generated-credentials file; `reconcile.rs` the pool
//! loop, one round and this driver's side of the core's `PoolDriver`.

pub(crate) mod credentials;
pub(crate) mod members;
pub(crate) mod reconcile;

pub use self::members::{QUARANTINE_SUFFIX, member_uid, quarantine_path, state_path};
