//! The read and remove operations of the libvirt provider, each a function over an already
//! open [`libvirt_remote::Client`] (the host pool hands it in), the provider entry's name and
//! the host's [`HostConfig`](super::config::HostConfig):
//!
//! - [`get::get`]: observe one instance — verified mark, state and reason, our NIC's address;
//! - [`delete::delete`]: remove one instance and its overlay and seed by derived name;
//! - [`list::list_owned`]: every domain on a host carrying a valid mark of the entry
//!   ([`list::list_host`]: and every mark's declared egress addresses, from the same reads);
//! - [`state`]: libvirt state + reason → [`InstanceState`](crate::model::InstanceState) (pure);
//! - [`mac::mac_user`]: the other domain on a host already using a MAC (checked before a
//!   create defines its domain);
//! - [`address`]: the address of the NIC whose MAC is ours, from lease, ARP or agent, inside
//!   the host's guest subnets ([`trust`]).
//!
//! Guarantees shared by all of them: a domain is "ours" only when its mark, read under
//! [`mark::NAMESPACE`](super::mark::NAMESPACE), parses strictly for this entry and the expected
//! UID (findings M2, E2, M18); a connection-class or timeout failure is never turned into an
//! answer ("no address", "no domain", a shorter list) but fails the operation Transient
//! (findings H3, M15); every libvirt call carries the connection's call deadline; nothing is
//! held locked across an `.await`, and dropping any of these futures abandons only its calls.

pub mod address;
pub mod delete;
pub mod get;
pub mod list;
pub mod mac;
pub mod orphans;
pub mod state;
pub mod trust;

use libvirt_remote::Error as LvError;

pub(crate) use crate::libvirt::classify::classify;

/// `VIR_ERR_INTERNAL_ERROR`: the daemon's catch-all (its message says what went wrong).
pub(crate) const CODE_INTERNAL_ERROR: i32 = 1;
/// `VIR_ERR_NO_SUPPORT`: the daemon or hypervisor does not implement the request.
pub(crate) const CODE_NO_SUPPORT: i32 = 3;
/// `VIR_ERR_NO_DOMAIN`: the domain does not exist (or vanished since we looked it up).
pub(crate) const CODE_NO_DOMAIN: i32 = 42;
/// `VIR_ERR_NO_NETWORK`.
pub(crate) const CODE_NO_NETWORK: i32 = 43;
/// `VIR_ERR_NO_STORAGE_POOL`.
pub(crate) const CODE_NO_STORAGE_POOL: i32 = 49;
/// `VIR_ERR_NO_STORAGE_VOL`.
pub(crate) const CODE_NO_STORAGE_VOL: i32 = 50;
/// `VIR_ERR_OPERATION_INVALID`: e.g. "domain is not running" on destroy.
pub(crate) const CODE_OPERATION_INVALID: i32 = 55;
/// `VIR_ERR_ARGUMENT_UNSUPPORTED`: e.g. "QEMU guest agent is not configured".
pub(crate) const CODE_ARGUMENT_UNSUPPORTED: i32 = 74;
/// `VIR_ERR_NO_DOMAIN_METADATA`: no metadata under the namespace asked for.
pub(crate) const CODE_NO_DOMAIN_METADATA: i32 = 80;
/// `VIR_ERR_AGENT_UNRESPONSIVE`: "Guest agent is not responding: QEMU guest agent is not
/// connected" (observed on libvirt 11.3 for a running domain whose agent never started).
pub(crate) const CODE_AGENT_UNRESPONSIVE: i32 = 86;

/// Whether `e` is the daemon saying `code`.
pub(crate) fn is_code(e: &LvError, code: i32) -> bool {
    e.libvirt_code() == Some(code)
}

/// A failure the caller must never read as an answer: the connection died or the call's
/// deadline passed. Always Transient, whatever the classification table says.
pub(crate) fn is_connection_class(e: &LvError) -> bool {
    e.is_connection() || e.is_timeout() || e.is_protocol()
}
