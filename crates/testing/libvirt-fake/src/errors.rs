//! The errors the fake returns, built exactly as libvirtd 11.3 builds them: the same
//! `virErrorNumber`, the same `virErrorDomain` and the same message text.
//!
//! Guarantees: every code, domain and message here was observed on the real daemon (raw probe
//! of libvirtd 11.3 on 2026-11-29) unless its doc comment says "approximated".

use libvirt_remote::proto::{RemoteErrorWire, format_uuid};

/// `virErrorNumber` values the fake returns.
pub mod codes {
    /// `VIR_ERR_INTERNAL_ERROR`.
    pub const INTERNAL_ERROR: i32 = 1;
    /// `VIR_ERR_NO_SUPPORT`.
    pub const NO_SUPPORT: i32 = 3;
    /// `VIR_ERR_INVALID_ARG`.
    pub const INVALID_ARG: i32 = 8;
    /// `VIR_ERR_OPERATION_FAILED`.
    pub const OPERATION_FAILED: i32 = 9;
    /// `VIR_ERR_NO_NAME`.
    pub const NO_NAME: i32 = 21;
    /// `VIR_ERR_XML_ERROR`.
    pub const XML_ERROR: i32 = 27;
    /// `VIR_ERR_SYSTEM_ERROR`.
    pub const SYSTEM_ERROR: i32 = 38;
    /// `VIR_ERR_RPC`.
    pub const RPC: i32 = 39;
    /// `VIR_ERR_NO_DOMAIN`.
    pub const NO_DOMAIN: i32 = 42;
    /// `VIR_ERR_NO_NETWORK`.
    pub const NO_NETWORK: i32 = 43;
    /// `VIR_ERR_AUTH_FAILED`.
    pub const AUTH_FAILED: i32 = 45;
    /// `VIR_ERR_NO_STORAGE_POOL`.
    pub const NO_STORAGE_POOL: i32 = 49;
    /// `VIR_ERR_NO_STORAGE_VOL`.
    pub const NO_STORAGE_VOL: i32 = 50;
    /// `VIR_ERR_OPERATION_INVALID`.
    pub const OPERATION_INVALID: i32 = 55;
    /// `VIR_ERR_CONFIG_UNSUPPORTED`.
    pub const CONFIG_UNSUPPORTED: i32 = 67;
    /// `VIR_ERR_ARGUMENT_UNSUPPORTED`.
    pub const ARGUMENT_UNSUPPORTED: i32 = 74;
    /// `VIR_ERR_NO_DOMAIN_METADATA`.
    pub const NO_DOMAIN_METADATA: i32 = 80;
    /// `VIR_ERR_AGENT_UNRESPONSIVE`.
    pub const AGENT_UNRESPONSIVE: i32 = 86;
    /// `VIR_ERR_STORAGE_VOL_EXIST`.
    pub const STORAGE_VOL_EXIST: i32 = 90;
}

/// `virErrorDomain` values the fake returns (the subsystem that raised the error).
pub mod domains {
    /// `VIR_FROM_NONE`.
    pub const NONE: i32 = 0;
    /// `VIR_FROM_RPC`.
    pub const RPC: i32 = 7;
    /// `VIR_FROM_QEMU`.
    pub const QEMU: i32 = 10;
    /// `VIR_FROM_STORAGE`.
    pub const STORAGE: i32 = 18;
    /// `VIR_FROM_NETWORK`.
    pub const NETWORK: i32 = 19;
    /// `VIR_FROM_DOMAIN`.
    pub const DOMAIN: i32 = 20;
    /// `VIR_FROM_STREAMS`.
    pub const STREAMS: i32 = 38;
}

/// `VIR_ERR_ERROR`: every error libvirtd sends has this level.
const LEVEL_ERROR: i32 = 2;
/// `ENOENT`, carried in `int1` of system errors as libvirt does.
const ENOENT: i32 = 2;
/// `ENOSPC`, carried in `int1` of system errors as libvirt does.
const ENOSPC: i32 = 28;

/// Builds a `remote_error` (boxed: it is 200-odd bytes and travels in `Result`s) the way
/// libvirtd fills it (`int1`/`int2` are -1 unless an errno
/// is carried).
pub(crate) fn remote_error(
    code: i32,
    domain: i32,
    message: impl Into<String>,
) -> Box<RemoteErrorWire> {
    Box::new(RemoteErrorWire {
        code,
        domain,
        message: Some(message.into()),
        level: LEVEL_ERROR,
        dom: None,
        str1: None,
        str2: None,
        str3: None,
        int1: -1,
        int2: -1,
        net: None,
    })
}

fn system_error(domain: i32, errno: i32, message: String) -> Box<RemoteErrorWire> {
    Box::new(RemoteErrorWire {
        int1: errno,
        ..*remote_error(codes::SYSTEM_ERROR, domain, message)
    })
}

pub(crate) fn auth_required() -> Box<RemoteErrorWire> {
    remote_error(codes::RPC, domains::RPC, "authentication required")
}

/// Approximated: libvirtd's wording for a polkit denial varies with the polkit agent.
pub(crate) fn auth_denied() -> Box<RemoteErrorWire> {
    remote_error(
        codes::AUTH_FAILED,
        domains::RPC,
        "authentication failed: access denied by policy",
    )
}

/// Approximated: libvirtd answers an unneeded AUTH_POLKIT with an internal error.
pub(crate) fn polkit_not_offered() -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::RPC,
        "internal error: polkit authentication was not offered",
    )
}

/// An internal error with `detail` (libvirt prefixes "internal error: ").
pub(crate) fn internal(detail: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::QEMU,
        format!("internal error: {detail}"),
    )
}

pub(crate) fn not_open() -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::RPC,
        "internal error: hypervisor connection not open",
    )
}

pub(crate) fn already_open() -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::RPC,
        "internal error: connection already open",
    )
}

pub(crate) fn unknown_procedure(proc_: i32) -> Box<RemoteErrorWire> {
    remote_error(
        codes::RPC,
        domains::RPC,
        format!("unknown procedure: {proc_}"),
    )
}

/// Approximated: a procedure libvirt has but the fake does not implement is reported the way
/// a driver without that API reports it.
pub(crate) fn not_implemented(proc_: i32) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_SUPPORT,
        domains::NONE,
        format!(
            "this function is not supported by the connection driver: remote procedure {proc_}"
        ),
    )
}

/// Approximated wording (libvirtd: "Cannot find program ...").
pub(crate) fn unknown_program(prog: u32, vers: u32) -> Box<RemoteErrorWire> {
    remote_error(
        codes::RPC,
        domains::RPC,
        format!("Cannot find program {prog} version {vers}"),
    )
}

/// Approximated wording (libvirtd fails to decode the arguments with an RPC error).
pub(crate) fn bad_payload(proc_: i32, detail: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::RPC,
        domains::RPC,
        format!("Unable to decode message payload of procedure {proc_}: {detail}"),
    )
}

pub(crate) fn no_domain_name(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_DOMAIN,
        domains::QEMU,
        format!("Domain not found: no domain with matching name '{name}'"),
    )
}

pub(crate) fn no_domain_uuid(uuid: &[u8; 16], name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_DOMAIN,
        domains::QEMU,
        format!(
            "Domain not found: no domain with matching uuid '{}' ({name})",
            format_uuid(uuid)
        ),
    )
}

pub(crate) fn domain_not_running() -> Box<RemoteErrorWire> {
    remote_error(
        codes::OPERATION_INVALID,
        domains::DOMAIN,
        "Requested operation is not valid: domain is not running",
    )
}

pub(crate) fn domain_already_running() -> Box<RemoteErrorWire> {
    remote_error(
        codes::OPERATION_INVALID,
        domains::QEMU,
        "Requested operation is not valid: domain is already running",
    )
}

pub(crate) fn undefine_transient() -> Box<RemoteErrorWire> {
    remote_error(
        codes::OPERATION_INVALID,
        domains::QEMU,
        "Requested operation is not valid: cannot undefine transient domain",
    )
}

pub(crate) fn domain_exists_with_uuid(name: &str, uuid: &[u8; 16]) -> Box<RemoteErrorWire> {
    remote_error(
        codes::OPERATION_FAILED,
        domains::DOMAIN,
        format!(
            "operation failed: domain '{name}' already exists with uuid {}",
            format_uuid(uuid)
        ),
    )
}

pub(crate) fn uuid_taken(other: &str, uuid: &[u8; 16]) -> Box<RemoteErrorWire> {
    remote_error(
        codes::OPERATION_FAILED,
        domains::DOMAIN,
        format!(
            "operation failed: domain '{other}' is already defined with uuid {}",
            format_uuid(uuid)
        ),
    )
}

pub(crate) fn no_metadata() -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_DOMAIN_METADATA,
        domains::DOMAIN,
        "metadata not found: Requested metadata element is not present",
    )
}

pub(crate) fn metadata_key_required() -> Box<RemoteErrorWire> {
    remote_error(
        codes::INVALID_ARG,
        domains::DOMAIN,
        "key in virDomainSetMetadata must not be NULL",
    )
}

/// Approximated wording for a malformed metadata call (missing URI, unknown type).
pub(crate) fn metadata_invalid(detail: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::INVALID_ARG,
        domains::DOMAIN,
        format!("invalid argument: {detail}"),
    )
}

pub(crate) fn agent_not_configured() -> Box<RemoteErrorWire> {
    remote_error(
        codes::ARGUMENT_UNSUPPORTED,
        domains::QEMU,
        "argument unsupported: QEMU guest agent is not configured",
    )
}

/// Wording from libvirt's `qemuDomainAgentAvailable` for an agent that does not answer.
pub(crate) fn agent_unresponsive() -> Box<RemoteErrorWire> {
    remote_error(
        codes::AGENT_UNRESPONSIVE,
        domains::QEMU,
        "Guest agent is not responding: QEMU guest agent is not connected",
    )
}

/// Approximated wording (libvirt: "Unknown IP address data source").
pub(crate) fn bad_address_source(source: u32) -> Box<RemoteErrorWire> {
    remote_error(
        codes::ARGUMENT_UNSUPPORTED,
        domains::QEMU,
        format!("argument unsupported: Unknown IP address data source {source}"),
    )
}

/// Approximated: libvirt's XML parse errors carry the parser's position; ours the reason.
pub(crate) fn xml_error(domain: i32, detail: &str) -> Box<RemoteErrorWire> {
    remote_error(codes::XML_ERROR, domain, format!("XML error: {detail}"))
}

pub(crate) fn callback_already_tracked() -> Box<RemoteErrorWire> {
    remote_error(
        codes::INVALID_ARG,
        domains::NONE,
        "invalid argument: event callback already tracked",
    )
}

pub(crate) fn callback_not_registered(id: i32) -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::RPC,
        format!("internal error: domain event callback {id} not registered"),
    )
}

pub(crate) fn no_network_name(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_NETWORK,
        domains::NETWORK,
        format!("Network not found: no network with matching name '{name}'"),
    )
}

pub(crate) fn no_network_uuid(uuid: &[u8; 16], name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_NETWORK,
        domains::NETWORK,
        format!(
            "Network not found: no network with matching uuid '{}' ({name})",
            format_uuid(uuid)
        ),
    )
}

pub(crate) fn no_pool_name(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_STORAGE_POOL,
        domains::STORAGE,
        format!("Storage pool not found: no storage pool with matching name '{name}'"),
    )
}

pub(crate) fn no_pool_uuid(uuid: &[u8; 16], name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_STORAGE_POOL,
        domains::STORAGE,
        format!(
            "Storage pool not found: no storage pool with matching uuid '{}' ({name})",
            format_uuid(uuid)
        ),
    )
}

pub(crate) fn no_vol(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::NO_STORAGE_VOL,
        domains::STORAGE,
        format!("Storage volume not found: no storage vol with matching name '{name}'"),
    )
}

pub(crate) fn vol_exists(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::STORAGE_VOL_EXIST,
        domains::STORAGE,
        format!("storage volume '{name}' exists already"),
    )
}

/// `STORAGE_VOL_CREATE_XML_FROM` onto a taken name: libvirtd 11.3 reports an internal error
/// (code 1), not code 90 as `STORAGE_VOL_CREATE_XML` does (observed with `vol-create-from`).
pub(crate) fn clone_name_in_use(name: &str) -> Box<RemoteErrorWire> {
    remote_error(
        codes::INTERNAL_ERROR,
        domains::STORAGE,
        format!("internal error: storage volume name '{name}' already in use."),
    )
}

pub(crate) fn backing_missing(path: &str) -> Box<RemoteErrorWire> {
    system_error(
        domains::STORAGE,
        ENOENT,
        format!("inaccessible backing store volume {path}: No such file or directory"),
    )
}

/// Approximated wording (libvirt: "missing capacity element").
pub(crate) fn vol_missing_capacity() -> Box<RemoteErrorWire> {
    xml_error(domains::STORAGE, "missing capacity element")
}

/// Wording from libvirt's storage backend when `fallocate` runs out of space.
pub(crate) fn vol_no_space(bytes: u64, path: &str) -> Box<RemoteErrorWire> {
    system_error(
        domains::STORAGE,
        ENOSPC,
        format!("cannot allocate {bytes} bytes in file '{path}': No space left on device"),
    )
}

/// The error libvirt's fd stream raises when a write cannot be stored (disk full, or more
/// bytes than the upload's declared length).
pub(crate) fn stream_no_space() -> Box<RemoteErrorWire> {
    system_error(
        domains::STREAMS,
        ENOSPC,
        "cannot write to stream: No space left on device".to_string(),
    )
}
