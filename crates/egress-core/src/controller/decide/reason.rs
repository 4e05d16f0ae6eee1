//! Stable condition and event reasons: the CamelCase words a status condition or an event
//! carries, which users and alerts match on. Changing one is a breaking change.

/// A create is running.
pub const CREATING: &str = "Creating";
/// The instance exists.
pub const CREATED: &str = "Created";
/// Running with an address.
pub const RUNNING: &str = "Running";
/// Running, no address yet.
pub const WAITING_FOR_ADDRESS: &str = "WaitingForAddress";
/// Address briefly missing; last one kept (H3).
pub const ADDRESS_GAP: &str = "AddressGap";
/// The host has no free work slot.
pub const HOST_BUSY: &str = "HostBusy";
/// The spec is invalid for this provider entry.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// The Proxy's namespace may not use the provider entry, host or feature its spec asks for
/// (the entry's `access`); nothing is created.
pub const NOT_ENTITLED: &str = "NotEntitled";
/// A pinned egress address belongs to no pool this namespace may use, or is reserved.
pub const ADDRESS_RESERVED: &str = "AddressReserved";
/// The credentials the spec references are not available (yet).
pub const CREDENTIALS_MISSING: &str = "CredentialsMissing";
/// A transient provider failure.
pub const TRANSIENT_ERROR: &str = "TransientError";
/// A permanent provider failure.
pub const PERMANENT_ERROR: &str = "PermanentError";
/// The host lacks capacity.
pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
/// No host of the entry accepts new proxies (unhealthy, or its pool below the reserve).
pub const NO_USABLE_HOST: &str = "NoUsableHost";
/// The provisioning deadline passed (APX-1).
pub const PROVISIONING_TIMEOUT: &str = "ProvisioningTimeout";
/// The hypervisor paused the instance (M1).
pub const PAUSED: &str = "Paused";
/// The instance stopped and is being replaced.
pub const REPLACING: &str = "Replacing";
/// Running on a draining host and staying there: pinned to it, or no other host takes it.
pub const ON_DRAINING_HOST: &str = "OnDrainingHost";
/// The instance's host is dead (its checks find it `Unreachable` or `Timeout`): the
/// instance could not be read, and its last status is kept until the host answers.
pub const HOST_UNREACHABLE: &str = "HostUnreachable";
/// The instance vanished and is being recreated.
pub const INSTANCE_LOST: &str = "InstanceLost";
/// The instance's verified UID is not this Proxy's (M2).
pub const FOREIGN_INSTANCE: &str = "ForeignInstance";
/// Deleting the instance.
pub const DELETING: &str = "Deleting";
/// Nothing is left on any host.
pub const DELETED: &str = "Deleted";
/// One reconcile hit its deadline (APX-3).
pub const RECONCILE_TIMEOUT: &str = "ReconcileTimeout";
/// The controller is shutting down and starts no new work.
pub const SHUTTING_DOWN: &str = "ShuttingDown";
/// A latched failure was released by a spec or config change.
pub const RETRYING: &str = "Retrying";
