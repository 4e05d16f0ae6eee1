//! Typed async methods for every procedure this project uses, over one [`Connection`].
//!
//! Guarantees: each method is one call with the connection's deadline (uploads have their
//! own, see [`UploadOptions`]); every result is either the decoded reply or a classified
//! [`Error`].
//!
//! One piece: it is a flat list of thin typed wrappers, one per remote procedure, with no logic
//! between them; splitting it would only scatter the list.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::conn::{Connection, ConnectionConfig};
use crate::error::{Error, Result};
use crate::proto::{self, procs::*, *};
use crate::transport::Transport;
use crate::upload::{FileSource, UploadOptions};
use crate::xdr;

/// The URI opened on the daemon by default.
pub const DEFAULT_URI: &str = "qemu:///system";
/// Default deadline for the whole handshake (auth list, polkit, open, keepalive feature).
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// `VIR_DOMAIN_METADATA_ELEMENT`: custom XML under a namespace URI.
pub const METADATA_ELEMENT: i32 = 2;
/// `VIR_DOMAIN_AFFECT_CONFIG`.
pub const AFFECT_CONFIG: u32 = 2;
/// `VIR_DOMAIN_AFFECT_LIVE`.
pub const AFFECT_LIVE: u32 = 1;

/// `virDomainUndefineFlagsValues` we always pass (finding L5): managed save, snapshot and
/// checkpoint metadata, NVRAM.
pub mod undefine {
    /// `VIR_DOMAIN_UNDEFINE_MANAGED_SAVE`.
    pub const MANAGED_SAVE: u32 = 1;
    /// `VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA`.
    pub const SNAPSHOTS_METADATA: u32 = 2;
    /// `VIR_DOMAIN_UNDEFINE_NVRAM`.
    pub const NVRAM: u32 = 4;
    /// `VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA`.
    pub const CHECKPOINTS_METADATA: u32 = 16;
    /// Everything a managed domain may carry.
    pub const ALL_METADATA: u32 = MANAGED_SAVE | SNAPSHOTS_METADATA | NVRAM | CHECKPOINTS_METADATA;
}

/// `virDomainState` values.
pub mod domain_state {
    /// No state.
    pub const NOSTATE: i32 = 0;
    /// Running.
    pub const RUNNING: i32 = 1;
    /// Blocked on a resource.
    pub const BLOCKED: i32 = 2;
    /// Paused by the user or by an error.
    pub const PAUSED: i32 = 3;
    /// Being shut down.
    pub const SHUTDOWN: i32 = 4;
    /// Shut off.
    pub const SHUTOFF: i32 = 5;
    /// Crashed.
    pub const CRASHED: i32 = 6;
    /// Suspended by guest power management.
    pub const PMSUSPENDED: i32 = 7;
}

/// `virDomainInterfaceAddressesSource` values.
pub mod addr_source {
    /// DHCP leases of the libvirt network.
    pub const LEASE: u32 = 0;
    /// The guest agent.
    pub const AGENT: u32 = 1;
    /// The host's ARP table.
    pub const ARP: u32 = 2;
}

/// `VIR_CONNECT_LIST_DOMAINS_*` flags (0 means all).
pub mod list_domains {
    /// Active domains.
    pub const ACTIVE: u32 = 1;
    /// Inactive domains.
    pub const INACTIVE: u32 = 2;
    /// Persistent domains.
    pub const PERSISTENT: u32 = 4;
}

/// `virDomainEventID` for lifecycle events.
pub const DOMAIN_EVENT_ID_LIFECYCLE: i32 = 0;

/// A typed libvirt client over one connection. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    conn: Connection,
}

/// Options for [`Client::open`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// URI to open on the daemon.
    pub uri: String,
    /// Deadline for the whole handshake.
    pub open_timeout: Duration,
    /// Connection settings.
    pub connection: ConnectionConfig,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            uri: DEFAULT_URI.into(),
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            connection: ConnectionConfig::default(),
        }
    }
}

/// A lifecycle event (`VIR_DOMAIN_EVENT_ID_LIFECYCLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// The callback id returned at registration.
    pub callback_id: i32,
    /// The domain concerned.
    pub domain: Domain,
    /// `virDomainEventType`.
    pub event: i32,
    /// Event-specific detail.
    pub detail: i32,
}

impl LifecycleEvent {
    /// Decodes a lifecycle event, or `None` for other events or undecodable payloads.
    pub fn from_event(ev: &crate::conn::Event) -> Option<Self> {
        if ev.procedure != DOMAIN_EVENT_CALLBACK_LIFECYCLE {
            return None;
        }
        let m: DomainEventCallbackLifecycleMsg = xdr::from_bytes(&ev.payload).ok()?;
        Some(Self {
            callback_id: m.callback_id,
            domain: m.msg.dom,
            event: m.msg.event,
            detail: m.msg.detail,
        })
    }
}

impl Client {
    /// Starts a connection on `transport` and performs libvirt's handshake: `AUTH_LIST`,
    /// `AUTH_POLKIT` when offered, `CONNECT_OPEN`, and asks for the keepalive feature so the
    /// daemon watches us too. On any failure the connection is killed.
    pub async fn open(transport: Transport, opts: OpenOptions) -> Result<Self> {
        let conn = Connection::start(transport, opts.connection.clone())?;
        let client = Self { conn };
        let handshake = async {
            let auth: AuthListRet = client.conn.call(AUTH_LIST, &()).await?;
            if auth.types.contains(&proto::AUTH_POLKIT) {
                let r: AuthPolkitRet = client.conn.call(procs::AUTH_POLKIT, &()).await?;
                if r.complete == 0 {
                    return Err(Error::setup("polkit authentication did not complete", true));
                }
            }
            client
                .conn
                .call::<_, ()>(
                    CONNECT_OPEN,
                    &ConnectOpenArgs {
                        name: Some(opts.uri.clone()),
                        flags: 0,
                    },
                )
                .await?;
            // NB: an old daemon may not know the feature; keepalive from our side still runs.
            let _ = client
                .supports_feature(proto::FEATURE_PROGRAM_KEEPALIVE)
                .await;
            Ok(())
        };
        match tokio::time::timeout(opts.open_timeout, handshake).await {
            Ok(Ok(())) => Ok(client),
            Ok(Err(e)) => {
                client.conn.kill();
                Err(e)
            }
            Err(_) => {
                client.conn.kill();
                Err(Error::timeout("connection handshake"))
            }
        }
    }

    /// Wraps an already started connection (no handshake).
    pub fn from_connection(conn: Connection) -> Self {
        Self { conn }
    }

    /// The underlying connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Closes the connection. With time left before `deadline`, first asks the daemon to close
    /// (`CONNECT_CLOSE`) for at most that long; past the deadline nothing is sent (finding
    /// L14). The socket is shut in every case.
    pub async fn close_by(&self, deadline: tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        if now < deadline && self.conn.is_alive() {
            let budget = deadline - now;
            let _ = self
                .conn
                .call_raw_with_timeout(CONNECT_CLOSE, Bytes::new(), budget)
                .await;
        }
        self.conn.kill();
    }

    /// Kills the connection immediately; sends nothing.
    pub fn close(&self) {
        self.conn.kill();
    }

    // ---- connection-level ----

    /// `CONNECT_GET_HOSTNAME`.
    pub async fn hostname(&self) -> Result<String> {
        Ok(self
            .conn
            .call::<_, StringRet>(CONNECT_GET_HOSTNAME, &())
            .await?
            .value)
    }

    /// `CONNECT_GET_LIB_VERSION`: libvirt's version as major × 1,000,000 + minor × 1,000 + micro.
    pub async fn lib_version(&self) -> Result<u64> {
        Ok(self
            .conn
            .call::<_, U64Ret>(CONNECT_GET_LIB_VERSION, &())
            .await?
            .value)
    }

    /// `CONNECT_GET_VERSION`: the hypervisor's version.
    pub async fn hypervisor_version(&self) -> Result<u64> {
        Ok(self
            .conn
            .call::<_, U64Ret>(CONNECT_GET_VERSION, &())
            .await?
            .value)
    }

    /// `CONNECT_GET_CAPABILITIES`: the host capabilities XML.
    pub async fn capabilities(&self) -> Result<String> {
        Ok(self
            .conn
            .call::<_, StringRet>(CONNECT_GET_CAPABILITIES, &())
            .await?
            .value)
    }

    /// `CONNECT_GET_DOMAIN_CAPABILITIES` for the given arch, machine and virt type.
    pub async fn domain_capabilities(
        &self,
        emulator: Option<&str>,
        arch: Option<&str>,
        machine: Option<&str>,
        virttype: Option<&str>,
    ) -> Result<String> {
        let args = GetDomainCapabilitiesArgs {
            emulatorbin: emulator.map(str::to_owned),
            arch: arch.map(str::to_owned),
            machine: machine.map(str::to_owned),
            virttype: virttype.map(str::to_owned),
            flags: 0,
        };
        Ok(self
            .conn
            .call::<_, StringRet>(CONNECT_GET_DOMAIN_CAPABILITIES, &args)
            .await?
            .value)
    }

    /// `CONNECT_SUPPORTS_FEATURE`.
    pub async fn supports_feature(&self, feature: i32) -> Result<bool> {
        let r: SupportsFeatureRet = self
            .conn
            .call(CONNECT_SUPPORTS_FEATURE, &SupportsFeatureArgs { feature })
            .await?;
        Ok(r.supported != 0)
    }

    // ---- domains ----

    /// `CONNECT_LIST_ALL_DOMAINS` with `flags` (0: all).
    pub async fn list_all_domains(&self, flags: u32) -> Result<Vec<Domain>> {
        let r: ListAllDomainsRet = self
            .conn
            .call(
                CONNECT_LIST_ALL_DOMAINS,
                &ListAllDomainsArgs {
                    need_results: 1,
                    flags,
                },
            )
            .await?;
        Ok(r.domains)
    }

    /// `DOMAIN_LOOKUP_BY_NAME`.
    pub async fn domain_lookup_by_name(&self, name: &str) -> Result<Domain> {
        let r: DomainRet = self
            .conn
            .call(DOMAIN_LOOKUP_BY_NAME, &NameArgs { name: name.into() })
            .await?;
        Ok(r.dom)
    }

    /// `DOMAIN_DEFINE_XML_FLAGS`.
    pub async fn domain_define_xml(&self, xml: &str, flags: u32) -> Result<Domain> {
        let r: DomainRet = self
            .conn
            .call(
                DOMAIN_DEFINE_XML_FLAGS,
                &DomainDefineXmlFlagsArgs {
                    xml: xml.into(),
                    flags,
                },
            )
            .await?;
        Ok(r.dom)
    }

    /// `DOMAIN_CREATE`: starts a defined domain.
    pub async fn domain_create(&self, dom: &Domain) -> Result<()> {
        self.conn
            .call(DOMAIN_CREATE, &DomainArgs { dom: dom.clone() })
            .await
    }

    /// `DOMAIN_CREATE_WITH_FLAGS`: starts a defined domain; returns it with its new id.
    pub async fn domain_create_with_flags(&self, dom: &Domain, flags: u32) -> Result<Domain> {
        let r: DomainRet = self
            .conn
            .call(
                DOMAIN_CREATE_WITH_FLAGS,
                &DomainFlagsArgs {
                    dom: dom.clone(),
                    flags,
                },
            )
            .await?;
        Ok(r.dom)
    }

    /// `DOMAIN_GET_XML_DESC`.
    pub async fn domain_xml(&self, dom: &Domain, flags: u32) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(
                DOMAIN_GET_XML_DESC,
                &DomainFlagsArgs {
                    dom: dom.clone(),
                    flags,
                },
            )
            .await?;
        Ok(r.value)
    }

    /// `DOMAIN_GET_STATE`: `(state, reason)`; see [`domain_state`].
    pub async fn domain_state(&self, dom: &Domain) -> Result<(i32, i32)> {
        let r: DomainGetStateRet = self
            .conn
            .call(
                DOMAIN_GET_STATE,
                &DomainFlagsArgs {
                    dom: dom.clone(),
                    flags: 0,
                },
            )
            .await?;
        Ok((r.state, r.reason))
    }

    /// `DOMAIN_GET_INFO`.
    pub async fn domain_info(&self, dom: &Domain) -> Result<DomainGetInfoRet> {
        self.conn
            .call(DOMAIN_GET_INFO, &DomainArgs { dom: dom.clone() })
            .await
    }

    /// `DOMAIN_DESTROY_FLAGS`.
    pub async fn domain_destroy(&self, dom: &Domain, flags: u32) -> Result<()> {
        self.conn
            .call(
                DOMAIN_DESTROY_FLAGS,
                &DomainFlagsArgs {
                    dom: dom.clone(),
                    flags,
                },
            )
            .await
    }

    /// `DOMAIN_UNDEFINE_FLAGS`; pass [`undefine::ALL_METADATA`] for managed domains.
    pub async fn domain_undefine(&self, dom: &Domain, flags: u32) -> Result<()> {
        self.conn
            .call(
                DOMAIN_UNDEFINE_FLAGS,
                &DomainFlagsArgs {
                    dom: dom.clone(),
                    flags,
                },
            )
            .await
    }

    /// `DOMAIN_GET_METADATA` of type element under namespace `uri`. Error code 80 when the
    /// domain has none under that namespace.
    pub async fn domain_metadata(&self, dom: &Domain, uri: &str, flags: u32) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(
                DOMAIN_GET_METADATA,
                &DomainGetMetadataArgs {
                    dom: dom.clone(),
                    kind: METADATA_ELEMENT,
                    uri: Some(uri.into()),
                    flags,
                },
            )
            .await?;
        Ok(r.value)
    }

    /// `DOMAIN_SET_METADATA` of type element: `xml` (or `None` to remove) under `key:` and
    /// namespace `uri`.
    pub async fn domain_set_metadata(
        &self,
        dom: &Domain,
        xml: Option<&str>,
        key: &str,
        uri: &str,
        flags: u32,
    ) -> Result<()> {
        self.conn
            .call(
                DOMAIN_SET_METADATA,
                &DomainSetMetadataArgs {
                    dom: dom.clone(),
                    kind: METADATA_ELEMENT,
                    metadata: xml.map(str::to_owned),
                    key: Some(key.into()),
                    uri: Some(uri.into()),
                    flags,
                },
            )
            .await
    }

    /// `DOMAIN_INTERFACE_ADDRESSES` from `source` (see [`addr_source`]).
    pub async fn domain_interface_addresses(
        &self,
        dom: &Domain,
        source: u32,
    ) -> Result<Vec<DomainInterface>> {
        let r: DomainInterfaceAddressesRet = self
            .conn
            .call(
                DOMAIN_INTERFACE_ADDRESSES,
                &DomainInterfaceAddressesArgs {
                    dom: dom.clone(),
                    source,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.ifaces)
    }

    /// Registers for lifecycle events of all domains; events arrive on
    /// [`Connection::subscribe`] and decode with [`LifecycleEvent::from_event`].
    pub async fn register_lifecycle_events(&self) -> Result<i32> {
        let r: DomainEventCallbackRegisterAnyRet = self
            .conn
            .call(
                CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY,
                &DomainEventCallbackRegisterAnyArgs {
                    event_id: DOMAIN_EVENT_ID_LIFECYCLE,
                    dom: None,
                },
            )
            .await?;
        Ok(r.callback_id)
    }

    /// Deregisters an event callback.
    pub async fn deregister_events(&self, callback_id: i32) -> Result<()> {
        self.conn
            .call(
                CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY,
                &DomainEventCallbackDeregisterAnyArgs { callback_id },
            )
            .await
    }

    // ---- network filters ----

    /// `NWFILTER_LOOKUP_BY_NAME` (libvirt code 62 when there is none).
    pub async fn nwfilter_lookup_by_name(&self, name: &str) -> Result<NwFilter> {
        let r: NwFilterRet = self
            .conn
            .call(NWFILTER_LOOKUP_BY_NAME, &NameArgs { name: name.into() })
            .await?;
        Ok(r.filter)
    }

    /// `NWFILTER_GET_XML_DESC`.
    pub async fn nwfilter_xml(&self, filter: &NwFilter) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(
                NWFILTER_GET_XML_DESC,
                &NwFilterGetXmlDescArgs {
                    filter: filter.clone(),
                    flags: 0,
                },
            )
            .await?;
        Ok(r.value)
    }

    /// `NWFILTER_DEFINE_XML`: defines a filter, or replaces the one with the same name and
    /// UUID (libvirt then re-applies it to every interface that references it).
    pub async fn nwfilter_define_xml(&self, xml: &str) -> Result<NwFilter> {
        let r: NwFilterRet = self
            .conn
            .call(
                NWFILTER_DEFINE_XML,
                &NwFilterDefineXmlArgs { xml: xml.into() },
            )
            .await?;
        Ok(r.filter)
    }

    /// `NWFILTER_UNDEFINE` (refused while an interface or another filter references it).
    pub async fn nwfilter_undefine(&self, filter: &NwFilter) -> Result<()> {
        self.conn
            .call(
                NWFILTER_UNDEFINE,
                &NwFilterArgs {
                    filter: filter.clone(),
                },
            )
            .await
    }

    // ---- networks ----

    /// `NETWORK_LOOKUP_BY_NAME`.
    pub async fn network_lookup_by_name(&self, name: &str) -> Result<Network> {
        let r: NetworkRet = self
            .conn
            .call(NETWORK_LOOKUP_BY_NAME, &NameArgs { name: name.into() })
            .await?;
        Ok(r.net)
    }

    /// `NETWORK_GET_XML_DESC`.
    pub async fn network_xml(&self, net: &Network) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(
                NETWORK_GET_XML_DESC,
                &NetworkFlagsArgs {
                    net: net.clone(),
                    flags: 0,
                },
            )
            .await?;
        Ok(r.value)
    }

    /// `NETWORK_GET_DHCP_LEASES`, optionally for one MAC.
    pub async fn network_dhcp_leases(
        &self,
        net: &Network,
        mac: Option<&str>,
    ) -> Result<Vec<NetworkDhcpLease>> {
        let r: NetworkGetDhcpLeasesRet = self
            .conn
            .call(
                NETWORK_GET_DHCP_LEASES,
                &NetworkGetDhcpLeasesArgs {
                    net: net.clone(),
                    mac: mac.map(str::to_owned),
                    need_results: 1,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.leases)
    }

    // ---- storage ----

    /// `STORAGE_POOL_LOOKUP_BY_NAME`.
    pub async fn pool_lookup_by_name(&self, name: &str) -> Result<StoragePool> {
        let r: StoragePoolRet = self
            .conn
            .call(STORAGE_POOL_LOOKUP_BY_NAME, &NameArgs { name: name.into() })
            .await?;
        Ok(r.pool)
    }

    /// `STORAGE_POOL_REFRESH`: re-reads the pool's volumes and free space.
    pub async fn pool_refresh(&self, pool: &StoragePool) -> Result<()> {
        self.conn
            .call(
                STORAGE_POOL_REFRESH,
                &StoragePoolFlagsArgs {
                    pool: pool.clone(),
                    flags: 0,
                },
            )
            .await
    }

    /// `STORAGE_POOL_GET_INFO`.
    pub async fn pool_info(&self, pool: &StoragePool) -> Result<StoragePoolGetInfoRet> {
        self.conn
            .call(
                STORAGE_POOL_GET_INFO,
                &StoragePoolArgs { pool: pool.clone() },
            )
            .await
    }

    /// `STORAGE_POOL_LIST_ALL_VOLUMES`.
    pub async fn pool_list_volumes(&self, pool: &StoragePool) -> Result<Vec<StorageVol>> {
        let r: StoragePoolListAllVolumesRet = self
            .conn
            .call(
                STORAGE_POOL_LIST_ALL_VOLUMES,
                &StoragePoolListAllVolumesArgs {
                    pool: pool.clone(),
                    need_results: 1,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.vols)
    }

    /// `STORAGE_VOL_CREATE_XML`.
    pub async fn vol_create_xml(
        &self,
        pool: &StoragePool,
        xml: &str,
        flags: u32,
    ) -> Result<StorageVol> {
        let r: StorageVolRet = self
            .conn
            .call(
                STORAGE_VOL_CREATE_XML,
                &StorageVolCreateXmlArgs {
                    pool: pool.clone(),
                    xml: xml.into(),
                    flags,
                },
            )
            .await?;
        Ok(r.vol)
    }

    /// `STORAGE_VOL_CREATE_XML_FROM`: creates a volume from `xml` in `pool` with the content
    /// of `clone` (libvirt copies or converts it; the new name is visible while it copies).
    /// `timeout` bounds this call instead of the connection's call timeout, since the copy
    /// takes time proportional to the volume.
    pub async fn vol_create_xml_from(
        &self,
        pool: &StoragePool,
        xml: &str,
        clone: &StorageVol,
        flags: u32,
        timeout: Duration,
    ) -> Result<StorageVol> {
        let args = xdr::to_bytes(&StorageVolCreateXmlFromArgs {
            pool: pool.clone(),
            xml: xml.into(),
            clonevol: clone.clone(),
            flags,
        });
        let reply = self
            .conn
            .call_raw_with_timeout(STORAGE_VOL_CREATE_XML_FROM, args, timeout)
            .await?;
        // NB: as in `Connection::call`, a reply that does not decode means the peers disagree
        // on the wire: the connection goes.
        let r: StorageVolRet = xdr::from_bytes(&reply).map_err(|e| {
            self.conn.kill();
            Error::protocol(format!(
                "cannot decode reply to STORAGE_VOL_CREATE_XML_FROM: {e}"
            ))
        })?;
        Ok(r.vol)
    }

    /// `STORAGE_VOL_LOOKUP_BY_NAME`.
    pub async fn vol_lookup_by_name(&self, pool: &StoragePool, name: &str) -> Result<StorageVol> {
        let r: StorageVolRet = self
            .conn
            .call(
                STORAGE_VOL_LOOKUP_BY_NAME,
                &StorageVolLookupByNameArgs {
                    pool: pool.clone(),
                    name: name.into(),
                },
            )
            .await?;
        Ok(r.vol)
    }

    /// `STORAGE_VOL_GET_INFO`.
    pub async fn vol_info(&self, vol: &StorageVol) -> Result<StorageVolGetInfoRet> {
        self.conn
            .call(STORAGE_VOL_GET_INFO, &StorageVolArgs { vol: vol.clone() })
            .await
    }

    /// `STORAGE_VOL_GET_XML_DESC`: the volume's XML (capacity, format, backing store).
    pub async fn vol_xml(&self, vol: &StorageVol) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(
                STORAGE_VOL_GET_XML_DESC,
                &StorageVolFlagsArgs {
                    vol: vol.clone(),
                    flags: 0,
                },
            )
            .await?;
        Ok(r.value)
    }

    /// `STORAGE_VOL_GET_PATH`.
    pub async fn vol_path(&self, vol: &StorageVol) -> Result<String> {
        let r: StringRet = self
            .conn
            .call(STORAGE_VOL_GET_PATH, &StorageVolArgs { vol: vol.clone() })
            .await?;
        Ok(r.value)
    }

    /// `STORAGE_VOL_DELETE`.
    pub async fn vol_delete(&self, vol: &StorageVol, flags: u32) -> Result<()> {
        self.conn
            .call(
                STORAGE_VOL_DELETE,
                &StorageVolFlagsArgs {
                    vol: vol.clone(),
                    flags,
                },
            )
            .await
    }

    /// `STORAGE_VOL_UPLOAD`: streams `src` into `vol` at `offset`; at most `length` bytes are
    /// sent (`length` 0: to the end of the source). Returns the bytes sent. Run it on a
    /// dedicated connection.
    pub async fn vol_upload<R: AsyncRead + Unpin + Send>(
        &self,
        vol: &StorageVol,
        offset: u64,
        length: u64,
        src: R,
        opts: &UploadOptions,
    ) -> Result<u64> {
        let args = xdr::to_bytes(&StorageVolUploadArgs {
            vol: vol.clone(),
            offset,
            length,
            flags: 0,
        });
        // NB: libvirtd 11.3 was seen to crash when sent more than the declared length; never
        // send past it.
        let limit = if length == 0 { u64::MAX } else { length };
        let src = tokio::io::AsyncReadExt::take(src, limit);
        self.conn.upload(STORAGE_VOL_UPLOAD, args, src, opts).await
    }

    /// [`Client::vol_upload`] from a local file, read from its current position straight
    /// into the stream's frames on tokio's blocking pool ([`FileSource`]: no copy between
    /// the read and the send, a few frames per blocking call). At most `length` bytes are
    /// sent (`length` 0: to the end of the file). Returns the bytes sent.
    pub async fn vol_upload_file(
        &self,
        vol: &StorageVol,
        offset: u64,
        length: u64,
        file: std::fs::File,
        opts: &UploadOptions,
    ) -> Result<u64> {
        let args = xdr::to_bytes(&StorageVolUploadArgs {
            vol: vol.clone(),
            offset,
            length,
            flags: 0,
        });
        let src = FileSource::new(file, (length != 0).then_some(length));
        self.conn.upload(STORAGE_VOL_UPLOAD, args, src, opts).await
    }
}
