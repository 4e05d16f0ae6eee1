//! Routes one remote-program CALL to the daemon state: decodes the arguments with
//! `libvirt_remote::proto`, applies libvirtd's gates (unknown procedure, authentication,
//! connection open) in libvirtd's order, runs the procedure and encodes the reply.
//!
//! Guarantees: synchronous and lock-free itself (the caller holds the locks for the duration
//! of one call, never across an `.await`); every failure is the `remote_error` libvirtd would
//! send; undecodable arguments fail that call only.

use bytes::Bytes;
use libvirt_remote::proto::{self, procs::*, *};
use libvirt_remote::xdr::{self, Xdr};

use crate::errors;
use crate::faults::FaultScope;
use crate::spec::AuthMode;
use crate::state::{DomainEvent, OpResult, State, UploadTarget};

/// `REMOTE_AUTH_NONE`.
const AUTH_NONE: i32 = 0;
/// Highest procedure number in libvirt 11.3's `remote_protocol.x`; numbers above it are
/// "unknown procedure" (code 39), numbers at or below it that the fake does not implement
/// are "not supported" (code 3).
pub const REMOTE_PROC_MAX: i32 = 453;
/// `virDrvFeature`s answered 1 besides keepalive: FD passing (8), typed string parameters
/// (9), remote close callback (14) and remote event callback (15), which every libvirtd
/// 11.x daemon supports.
const SUPPORTED_FEATURES: [i32; 4] = [8, 9, 14, 15];
/// `VIR_DOMAIN_EVENT_ID_LIFECYCLE`.
const EVENT_ID_LIFECYCLE: i32 = 0;

/// Daemon-wide settings the procedures report.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub hostname: String,
    pub lib_version: u64,
    pub hv_version: u64,
    pub capabilities: String,
    pub domain_capabilities: String,
    pub auth: AuthMode,
}

/// A registered event callback of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Callback {
    pub id: i32,
    pub event_id: i32,
    pub dom: Option<Uuid>,
}

/// Per-connection protocol state.
#[derive(Debug, Default)]
pub(crate) struct Session {
    pub authed: bool,
    pub opened: bool,
    pub callbacks: Vec<Callback>,
    pub next_callback: i32,
}

impl Session {
    /// The callback ids of this connection that want `ev`.
    pub fn wants(&self, ev: &DomainEvent) -> Vec<i32> {
        self.callbacks
            .iter()
            .filter(|c| c.event_id == EVENT_ID_LIFECYCLE && c.dom.is_none_or(|u| u == ev.dom.uuid))
            .map(|c| c.id)
            .collect()
    }
}

/// What the connection must do after sending the reply.
#[derive(Debug)]
pub(crate) enum After {
    Nothing,
    /// `CONNECT_OPEN` succeeded.
    Opened,
    /// `CONNECT_CLOSE`: close the connection after the reply.
    Close,
    /// The keepalive feature was asked for: start sending PINGs.
    StartKeepalive,
    /// An upload stream was accepted.
    Upload(UploadTarget),
}

/// The result of one call.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub reply: Result<Bytes, Box<RemoteErrorWire>>,
    pub events: Vec<DomainEvent>,
    pub after: After,
}

impl Outcome {
    fn err(e: Box<RemoteErrorWire>) -> Self {
        Self {
            reply: Err(e),
            events: Vec::new(),
            after: After::Nothing,
        }
    }
}

/// Procedures the fake implements.
const IMPLEMENTED: &[i32] = &[
    CONNECT_OPEN,
    CONNECT_CLOSE,
    CONNECT_GET_VERSION,
    CONNECT_GET_CAPABILITIES,
    DOMAIN_CREATE,
    DOMAIN_GET_XML_DESC,
    DOMAIN_GET_INFO,
    DOMAIN_LOOKUP_BY_NAME,
    NETWORK_GET_XML_DESC,
    NETWORK_LOOKUP_BY_NAME,
    CONNECT_GET_HOSTNAME,
    CONNECT_SUPPORTS_FEATURE,
    AUTH_LIST,
    procs::AUTH_POLKIT,
    STORAGE_POOL_REFRESH,
    STORAGE_POOL_LOOKUP_BY_NAME,
    STORAGE_POOL_GET_INFO,
    STORAGE_VOL_CREATE_XML,
    STORAGE_VOL_CREATE_XML_FROM,
    STORAGE_VOL_DELETE,
    STORAGE_VOL_LOOKUP_BY_NAME,
    STORAGE_VOL_GET_INFO,
    STORAGE_VOL_GET_PATH,
    procs::STORAGE_VOL_GET_XML_DESC,
    CONNECT_GET_LIB_VERSION,
    DOMAIN_CREATE_WITH_FLAGS,
    STORAGE_VOL_UPLOAD,
    DOMAIN_GET_STATE,
    DOMAIN_UNDEFINE_FLAGS,
    DOMAIN_DESTROY_FLAGS,
    DOMAIN_SET_METADATA,
    DOMAIN_GET_METADATA,
    CONNECT_LIST_ALL_DOMAINS,
    STORAGE_POOL_LIST_ALL_VOLUMES,
    CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY,
    CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY,
    NETWORK_GET_DHCP_LEASES,
    CONNECT_GET_DOMAIN_CAPABILITIES,
    DOMAIN_DEFINE_XML_FLAGS,
    DOMAIN_INTERFACE_ADDRESSES,
    NWFILTER_LOOKUP_BY_NAME,
    NWFILTER_GET_XML_DESC,
    NWFILTER_DEFINE_XML,
    NWFILTER_UNDEFINE,
];

/// Procedures that work before authentication completes.
fn needs_auth(proc_: i32) -> bool {
    !matches!(proc_, AUTH_LIST | procs::AUTH_POLKIT)
}

/// Procedures that work before `CONNECT_OPEN` (the keepalive feature question is checked
/// inside `CONNECT_SUPPORTS_FEATURE`).
fn needs_open(proc_: i32) -> bool {
    !matches!(
        proc_,
        AUTH_LIST | procs::AUTH_POLKIT | CONNECT_OPEN | CONNECT_CLOSE | CONNECT_SUPPORTS_FEATURE
    )
}

fn decode<A: Xdr>(proc_: i32, payload: &[u8]) -> OpResult<A> {
    xdr::from_bytes::<A>(payload).map_err(|e| errors::bad_payload(proc_, &e.to_string()))
}

fn ok<R: Xdr>(r: R) -> Result<Bytes, Box<RemoteErrorWire>> {
    Ok(xdr::to_bytes(&r))
}

/// Runs one call.
pub(crate) fn dispatch(
    state: &mut State,
    config: &Config,
    session: &mut Session,
    faults: &FaultScope,
    proc_: i32,
    payload: &[u8],
) -> Outcome {
    if !(1..=REMOTE_PROC_MAX).contains(&proc_) {
        return Outcome::err(errors::unknown_procedure(proc_));
    }
    if needs_auth(proc_) && !session.authed {
        return Outcome::err(errors::auth_required());
    }
    if needs_open(proc_) && !session.opened {
        return Outcome::err(errors::not_open());
    }
    if !IMPLEMENTED.contains(&proc_) {
        return Outcome::err(errors::not_implemented(proc_));
    }
    if let Some(f) = faults.take_fail(proc_) {
        return Outcome::err(errors::remote_error(f.code, f.domain, f.message));
    }
    let mut out = Outcome {
        reply: Ok(Bytes::new()),
        events: Vec::new(),
        after: After::Nothing,
    };
    out.reply = run(
        state,
        config,
        session,
        faults,
        proc_,
        payload,
        &mut out.events,
        &mut out.after,
    );
    if out.reply.is_err() {
        out.events.clear();
        out.after = After::Nothing;
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run(
    state: &mut State,
    config: &Config,
    session: &mut Session,
    faults: &FaultScope,
    proc_: i32,
    payload: &[u8],
    events: &mut Vec<DomainEvent>,
    after: &mut After,
) -> Result<Bytes, Box<RemoteErrorWire>> {
    match proc_ {
        // ---- authentication and connection ----
        AUTH_LIST => {
            decode::<()>(proc_, payload)?;
            let types = match config.auth {
                AuthMode::Root => {
                    session.authed = true;
                    vec![AUTH_NONE]
                }
                AuthMode::Polkit | AuthMode::PolkitDenied => vec![proto::AUTH_POLKIT],
            };
            ok(AuthListRet { types })
        }
        procs::AUTH_POLKIT => {
            decode::<()>(proc_, payload)?;
            match config.auth {
                AuthMode::Root => Err(errors::polkit_not_offered()),
                AuthMode::PolkitDenied => Err(errors::auth_denied()),
                AuthMode::Polkit => {
                    session.authed = true;
                    ok(AuthPolkitRet { complete: 1 })
                }
            }
        }
        CONNECT_OPEN => {
            decode::<ConnectOpenArgs>(proc_, payload)?;
            if session.opened {
                return Err(errors::already_open());
            }
            session.opened = true;
            *after = After::Opened;
            ok(())
        }
        CONNECT_CLOSE => {
            decode::<()>(proc_, payload)?;
            *after = After::Close;
            ok(())
        }
        CONNECT_SUPPORTS_FEATURE => {
            let a: SupportsFeatureArgs = decode(proc_, payload)?;
            if a.feature == proto::FEATURE_PROGRAM_KEEPALIVE {
                *after = After::StartKeepalive;
                return ok(SupportsFeatureRet { supported: 1 });
            }
            if !session.opened {
                return Err(errors::not_open());
            }
            let supported = i32::from(SUPPORTED_FEATURES.contains(&a.feature));
            ok(SupportsFeatureRet { supported })
        }
        CONNECT_GET_HOSTNAME => {
            decode::<()>(proc_, payload)?;
            ok(StringRet {
                value: config.hostname.clone(),
            })
        }
        CONNECT_GET_LIB_VERSION => {
            decode::<()>(proc_, payload)?;
            ok(U64Ret {
                value: config.lib_version,
            })
        }
        CONNECT_GET_VERSION => {
            decode::<()>(proc_, payload)?;
            ok(U64Ret {
                value: config.hv_version,
            })
        }
        CONNECT_GET_CAPABILITIES => {
            decode::<()>(proc_, payload)?;
            ok(StringRet {
                value: config.capabilities.clone(),
            })
        }
        CONNECT_GET_DOMAIN_CAPABILITIES => {
            decode::<GetDomainCapabilitiesArgs>(proc_, payload)?;
            ok(StringRet {
                value: config.domain_capabilities.clone(),
            })
        }
        CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY => {
            let a: DomainEventCallbackRegisterAnyArgs = decode(proc_, payload)?;
            let dom = a.dom.map(|d| d.uuid);
            if session
                .callbacks
                .iter()
                .any(|c| c.event_id == a.event_id && c.dom == dom)
            {
                return Err(errors::callback_already_tracked());
            }
            let id = session.next_callback;
            session.next_callback = session.next_callback.wrapping_add(1);
            session.callbacks.push(Callback {
                id,
                event_id: a.event_id,
                dom,
            });
            ok(DomainEventCallbackRegisterAnyRet { callback_id: id })
        }
        CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY => {
            let a: DomainEventCallbackDeregisterAnyArgs = decode(proc_, payload)?;
            let before = session.callbacks.len();
            session.callbacks.retain(|c| c.id != a.callback_id);
            if session.callbacks.len() == before {
                return Err(errors::callback_not_registered(a.callback_id));
            }
            ok(())
        }

        // ---- domains ----
        CONNECT_LIST_ALL_DOMAINS => {
            let a: ListAllDomainsArgs = decode(proc_, payload)?;
            let doms = state.list_domains(a.flags);
            let ret = u32::try_from(doms.len()).unwrap_or(u32::MAX);
            let domains = if a.need_results != 0 {
                doms
            } else {
                Vec::new()
            };
            ok(ListAllDomainsRet { domains, ret })
        }
        DOMAIN_LOOKUP_BY_NAME => {
            let a: NameArgs = decode(proc_, payload)?;
            ok(DomainRet {
                dom: state.lookup_domain(&a.name)?,
            })
        }
        DOMAIN_DEFINE_XML_FLAGS => {
            let a: DomainDefineXmlFlagsArgs = decode(proc_, payload)?;
            let (dom, evs) = state.define_xml(&a.xml)?;
            events.extend(evs);
            ok(DomainRet { dom })
        }
        DOMAIN_CREATE => {
            let a: DomainArgs = decode(proc_, payload)?;
            let (_, evs) = state.create(&a.dom)?;
            events.extend(evs);
            ok(())
        }
        DOMAIN_CREATE_WITH_FLAGS => {
            let a: DomainFlagsArgs = decode(proc_, payload)?;
            let (dom, evs) = state.create(&a.dom)?;
            events.extend(evs);
            ok(DomainRet { dom })
        }
        DOMAIN_GET_STATE => {
            let a: DomainFlagsArgs = decode(proc_, payload)?;
            let (st, reason) = state.state_of(&a.dom)?;
            ok(DomainGetStateRet { state: st, reason })
        }
        DOMAIN_GET_INFO => {
            let a: DomainArgs = decode(proc_, payload)?;
            ok(state.info_of(&a.dom)?)
        }
        DOMAIN_GET_XML_DESC => {
            let a: DomainFlagsArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.xml_of(&a.dom)?,
            })
        }
        DOMAIN_DESTROY_FLAGS => {
            let a: DomainFlagsArgs = decode(proc_, payload)?;
            events.extend(state.destroy(&a.dom)?);
            ok(())
        }
        DOMAIN_UNDEFINE_FLAGS => {
            let a: DomainFlagsArgs = decode(proc_, payload)?;
            events.extend(state.undefine(&a.dom)?);
            ok(())
        }
        DOMAIN_GET_METADATA => {
            let a: DomainGetMetadataArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.get_metadata(&a.dom, a.kind, a.uri.as_deref())?,
            })
        }
        DOMAIN_SET_METADATA => {
            let a: DomainSetMetadataArgs = decode(proc_, payload)?;
            state.set_metadata(
                &a.dom,
                a.kind,
                a.metadata.as_deref(),
                a.key.as_deref(),
                a.uri.as_deref(),
            )?;
            ok(())
        }
        DOMAIN_INTERFACE_ADDRESSES => {
            let a: DomainInterfaceAddressesArgs = decode(proc_, payload)?;
            let ifaces = state.interface_addresses(
                &a.dom,
                a.source,
                faults.agent_unresponsive(),
                faults.arp_error().as_deref(),
            )?;
            ok(DomainInterfaceAddressesRet { ifaces })
        }

        // ---- network filters ----
        NWFILTER_LOOKUP_BY_NAME => {
            let a: NameArgs = decode(proc_, payload)?;
            ok(NwFilterRet {
                filter: state.nwfilters.lookup(&a.name)?,
            })
        }
        NWFILTER_GET_XML_DESC => {
            let a: NwFilterGetXmlDescArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.nwfilters.xml(&a.filter)?,
            })
        }
        NWFILTER_DEFINE_XML => {
            let a: NwFilterDefineXmlArgs = decode(proc_, payload)?;
            let fresh = state.new_uuid();
            ok(NwFilterRet {
                filter: state.nwfilters.define(&a.xml, || fresh)?,
            })
        }
        NWFILTER_UNDEFINE => {
            let a: NwFilterArgs = decode(proc_, payload)?;
            let in_use = state.nwfilter_in_use(&a.filter.name);
            state.nwfilters.undefine(&a.filter, in_use)?;
            ok(())
        }

        // ---- networks ----
        NETWORK_LOOKUP_BY_NAME => {
            let a: NameArgs = decode(proc_, payload)?;
            ok(NetworkRet {
                net: state.lookup_network(&a.name)?,
            })
        }
        NETWORK_GET_XML_DESC => {
            let a: NetworkFlagsArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.network_xml(&a.net)?,
            })
        }
        NETWORK_GET_DHCP_LEASES => {
            let a: NetworkGetDhcpLeasesArgs = decode(proc_, payload)?;
            let leases = state.leases(&a.net, a.mac.as_deref())?;
            let ret = u32::try_from(leases.len()).unwrap_or(u32::MAX);
            let leases = if a.need_results != 0 {
                leases
            } else {
                Vec::new()
            };
            ok(NetworkGetDhcpLeasesRet { leases, ret })
        }

        // ---- storage ----
        STORAGE_POOL_LOOKUP_BY_NAME => {
            let a: NameArgs = decode(proc_, payload)?;
            ok(StoragePoolRet {
                pool: state.lookup_pool(&a.name)?,
            })
        }
        STORAGE_POOL_REFRESH => {
            let a: StoragePoolFlagsArgs = decode(proc_, payload)?;
            state.refresh_pool(&a.pool)?;
            ok(())
        }
        STORAGE_POOL_GET_INFO => {
            let a: StoragePoolArgs = decode(proc_, payload)?;
            ok(state.pool_info(&a.pool)?)
        }
        STORAGE_POOL_LIST_ALL_VOLUMES => {
            let a: StoragePoolListAllVolumesArgs = decode(proc_, payload)?;
            let vols = state.list_volumes(&a.pool)?;
            let ret = u32::try_from(vols.len()).unwrap_or(u32::MAX);
            let vols = if a.need_results != 0 {
                vols
            } else {
                Vec::new()
            };
            ok(StoragePoolListAllVolumesRet { vols, ret })
        }
        STORAGE_VOL_CREATE_XML => {
            let a: StorageVolCreateXmlArgs = decode(proc_, payload)?;
            ok(StorageVolRet {
                vol: state.create_volume(&a.pool, &a.xml)?,
            })
        }
        STORAGE_VOL_CREATE_XML_FROM => {
            let a: StorageVolCreateXmlFromArgs = decode(proc_, payload)?;
            ok(StorageVolRet {
                vol: state.create_volume_from(&a.pool, &a.xml, &a.clonevol)?,
            })
        }
        STORAGE_VOL_LOOKUP_BY_NAME => {
            let a: StorageVolLookupByNameArgs = decode(proc_, payload)?;
            ok(StorageVolRet {
                vol: state.lookup_volume(&a.pool, &a.name)?,
            })
        }
        STORAGE_VOL_GET_INFO => {
            let a: StorageVolArgs = decode(proc_, payload)?;
            ok(state.volume_get_info(&a.vol)?)
        }
        STORAGE_VOL_GET_PATH => {
            let a: StorageVolArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.volume_path(&a.vol)?,
            })
        }
        procs::STORAGE_VOL_GET_XML_DESC => {
            let a: StorageVolFlagsArgs = decode(proc_, payload)?;
            ok(StringRet {
                value: state.volume_xml(&a.vol)?,
            })
        }
        STORAGE_VOL_DELETE => {
            let a: StorageVolFlagsArgs = decode(proc_, payload)?;
            state.delete_volume(&a.vol)?;
            ok(())
        }
        STORAGE_VOL_UPLOAD => {
            let a: StorageVolUploadArgs = decode(proc_, payload)?;
            *after = After::Upload(state.begin_upload(&a.vol, a.offset, a.length)?);
            ok(())
        }
        other => Err(errors::not_implemented(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::codes;
    use crate::faults::Faults;

    fn config(auth: AuthMode) -> Config {
        Config {
            hostname: "h".into(),
            lib_version: 1,
            hv_version: 2,
            capabilities: String::new(),
            domain_capabilities: String::new(),
            auth,
        }
    }

    fn scope() -> FaultScope {
        FaultScope {
            conn: Faults::new(),
            global: Faults::new(),
        }
    }

    fn code(o: &Outcome) -> Option<i32> {
        o.reply.as_ref().err().map(|e| e.code)
    }

    #[test]
    fn gates_apply_in_libvirtds_order() {
        let mut st = State::new();
        let cfg = config(AuthMode::Root);
        let f = scope();
        let mut s = Session::default();
        let open = xdr::to_bytes(&ConnectOpenArgs {
            name: Some("qemu:///system".into()),
            flags: 0,
        });
        let mut call = |s: &mut Session, p: i32, a: &[u8]| dispatch(&mut st, &cfg, s, &f, p, a);
        assert_eq!(code(&call(&mut s, 9999, &[])), Some(codes::RPC));
        assert_eq!(
            code(&call(&mut s, CONNECT_GET_HOSTNAME, &[])),
            Some(codes::RPC)
        );
        assert!(call(&mut s, AUTH_LIST, &[]).reply.is_ok());
        assert_eq!(
            code(&call(&mut s, CONNECT_GET_HOSTNAME, &[])),
            Some(codes::INTERNAL_ERROR)
        );
        assert!(call(&mut s, CONNECT_OPEN, &open).reply.is_ok());
        assert!(call(&mut s, CONNECT_GET_HOSTNAME, &[]).reply.is_ok());
        assert_eq!(
            code(&call(&mut s, CONNECT_OPEN, &open)),
            Some(codes::INTERNAL_ERROR)
        );
        // A real procedure the fake does not implement (DOMAIN_SUSPEND = 12).
        assert_eq!(code(&call(&mut s, 12, &[])), Some(codes::NO_SUPPORT));
        // Undecodable arguments fail that call only.
        assert_eq!(
            code(&call(&mut s, DOMAIN_LOOKUP_BY_NAME, &[0, 0])),
            Some(codes::RPC)
        );
        assert!(call(&mut s, CONNECT_GET_HOSTNAME, &[]).reply.is_ok());
    }

    #[test]
    fn polkit_mode_requires_the_polkit_step() {
        let mut st = State::new();
        let cfg = config(AuthMode::Polkit);
        let f = scope();
        let mut s = Session::default();
        let r = dispatch(&mut st, &cfg, &mut s, &f, AUTH_LIST, &[]);
        let types: AuthListRet = xdr::from_bytes(&r.reply.unwrap()).unwrap();
        assert_eq!(types.types, vec![proto::AUTH_POLKIT]);
        let r = dispatch(&mut st, &cfg, &mut s, &f, CONNECT_OPEN, &[]);
        assert_eq!(code(&r), Some(codes::RPC));
        let r = dispatch(&mut st, &cfg, &mut s, &f, procs::AUTH_POLKIT, &[]);
        assert!(r.reply.is_ok());
        assert!(s.authed);
    }
}
