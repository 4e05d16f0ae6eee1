//! The fake daemon's objects (domains, pools, volumes, networks) and every operation on them,
//! with libvirt's semantics and error codes. Pure: no I/O, no async, no locks.
//!
//! Guarantees:
//! - handles are resolved like libvirt resolves them: domains, pools and networks by UUID
//!   (a stale handle after undefine + redefine is "no domain"), volumes by pool and volume
//!   name;
//! - metadata is stored and looked up per namespace URI only (finding M18);
//! - a pool's `STORAGE_POOL_GET_INFO` figures are a snapshot taken at creation and at each
//!   `STORAGE_POOL_REFRESH`, while volume changes move the live figures (finding M4);
//! - an operation either succeeds completely or changes nothing.

use std::collections::BTreeMap;

use libvirt_remote::client::domain_state;
use libvirt_remote::proto::{self, RemoteErrorWire, Uuid};

use crate::errors::{self, domains};
use crate::spec::{
    DomainInfo, DomainSpec, Interface, Lease, NetworkSpec, PoolInfo, PoolSpec, VolumeInfo,
    VolumeSpec,
};
use crate::xml;

/// Result of an operation: a value or the `remote_error` libvirtd would send.
pub(crate) type OpResult<T> = Result<T, Box<RemoteErrorWire>>;

/// Largest content one volume may hold in memory. Tests upload kilobytes to a few MiB; the
/// cap only stops a runaway source from exhausting the test machine's memory (it is reported
/// as ENOSPC, like a full disk).
pub const VOLUME_CONTENT_LIMIT: u64 = 512 << 20;

/// Allocation `qemu-img create -f qcow2` leaves for an empty image with 64 KiB clusters
/// (header, L1 table and refcount block), used when a qcow2 volume gives no allocation.
const QCOW2_EMPTY_ALLOCATION: u64 = 196_608;

/// `virDomainEventType` and details the fake emits, in the order libvirtd 11.3 emits them.
pub mod events {
    /// `VIR_DOMAIN_EVENT_DEFINED`.
    pub const DEFINED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_UNDEFINED`.
    pub const UNDEFINED: i32 = 1;
    /// `VIR_DOMAIN_EVENT_STARTED`.
    pub const STARTED: i32 = 2;
    /// `VIR_DOMAIN_EVENT_RESUMED`.
    pub const RESUMED: i32 = 4;
    /// `VIR_DOMAIN_EVENT_STOPPED`.
    pub const STOPPED: i32 = 5;
    /// `VIR_DOMAIN_EVENT_SHUTDOWN`.
    pub const SHUTDOWN: i32 = 6;
    /// `VIR_DOMAIN_EVENT_DEFINED_ADDED`.
    pub const DEFINED_ADDED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_DEFINED_UPDATED`.
    pub const DEFINED_UPDATED: i32 = 1;
    /// `VIR_DOMAIN_EVENT_UNDEFINED_REMOVED`.
    pub const UNDEFINED_REMOVED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_STARTED_BOOTED`.
    pub const STARTED_BOOTED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_RESUMED_UNPAUSED`.
    pub const RESUMED_UNPAUSED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_STOPPED_DESTROYED`.
    pub const STOPPED_DESTROYED: i32 = 1;
    /// `VIR_DOMAIN_EVENT_SHUTDOWN_HOST`.
    pub const SHUTDOWN_HOST: i32 = 2;
}

/// `VIR_DOMAIN_RUNNING_BOOTED`.
const RUNNING_BOOTED: i32 = 1;
/// `VIR_DOMAIN_SHUTOFF_DESTROYED`.
const SHUTOFF_DESTROYED: i32 = 2;
/// `VIR_STORAGE_POOL_RUNNING`.
const POOL_RUNNING: u8 = 2;
/// `VIR_STORAGE_VOL_FILE`.
const VOL_FILE: i8 = 0;
/// `VIR_IP_ADDR_TYPE_IPV4` / `IPV6`.
const IP_V4: i32 = 0;
const IP_V6: i32 = 1;
/// `VIR_DOMAIN_METADATA_DESCRIPTION` / `TITLE` / `ELEMENT`.
const META_DESCRIPTION: i32 = 0;
const META_TITLE: i32 = 1;
const META_ELEMENT: i32 = 2;
/// `VIR_CONNECT_LIST_DOMAINS_*` filters the fake honours.
const LIST_ACTIVE: u32 = 1;
const LIST_INACTIVE: u32 = 2;
const LIST_PERSISTENT: u32 = 4;
const LIST_TRANSIENT: u32 = 8;

/// A lifecycle event to deliver to registered connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DomainEvent {
    pub dom: proto::Domain,
    pub event: i32,
    pub detail: i32,
}

#[derive(Debug, Clone)]
struct MetaEntry {
    xml: String,
}

#[derive(Debug, Clone)]
struct DomainObj {
    name: String,
    uuid: Uuid,
    id: i32,
    state: i32,
    reason: i32,
    persistent: bool,
    xml: String,
    metadata: BTreeMap<String, MetaEntry>,
    title: Option<String>,
    description: Option<String>,
    interfaces: Vec<Interface>,
    guest_agent: bool,
    memory_kib: u64,
    current_memory_kib: u64,
    vcpus: u16,
}

impl DomainObj {
    fn handle(&self) -> proto::Domain {
        proto::Domain {
            name: self.name.clone(),
            uuid: self.uuid,
            id: self.id,
        }
    }

    fn is_active(&self) -> bool {
        !matches!(self.state, domain_state::SHUTOFF | domain_state::NOSTATE)
    }

    fn info(&self) -> DomainInfo {
        DomainInfo {
            name: self.name.clone(),
            uuid: self.uuid,
            id: self.id,
            state: self.state,
            reason: self.reason,
            persistent: self.persistent,
            xml: self.xml.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct VolumeObj {
    name: String,
    path: String,
    capacity: u64,
    allocation: u64,
    format: String,
    backing: Option<String>,
    content: Vec<u8>,
}

#[derive(Debug, Clone)]
struct PoolObj {
    name: String,
    uuid: Uuid,
    path: String,
    capacity: u64,
    allocation: u64,
    available: u64,
    cached_allocation: u64,
    cached_available: u64,
    volumes: BTreeMap<String, VolumeObj>,
}

impl PoolObj {
    fn handle(&self) -> proto::StoragePool {
        proto::StoragePool {
            name: self.name.clone(),
            uuid: self.uuid,
        }
    }

    fn vol_handle(&self, v: &VolumeObj) -> proto::StorageVol {
        proto::StorageVol {
            pool: self.name.clone(),
            name: v.name.clone(),
            key: v.path.clone(),
        }
    }

    /// Moves the live figures by a change in volume allocation.
    fn account(&mut self, before: u64, after: u64) {
        if after >= before {
            let grow = after - before;
            self.allocation = self.allocation.saturating_add(grow);
            self.available = self.available.saturating_sub(grow);
        } else {
            let shrink = before - after;
            self.allocation = self.allocation.saturating_sub(shrink);
            self.available = self.available.saturating_add(shrink);
        }
    }
}

#[derive(Debug, Clone)]
struct NetworkObj {
    name: String,
    uuid: Uuid,
    bridge: String,
    xml: String,
    leases: Vec<Lease>,
}

/// Why seeding the fake failed (a programming error in the test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedError {
    /// The name is already taken.
    #[error("{kind} '{name}' already exists")]
    Exists {
        /// Object kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
    /// The object the call refers to does not exist.
    #[error("no {kind} named '{name}'")]
    Missing {
        /// Object kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
}

/// An upload stream's target and progress.
#[derive(Debug, Clone)]
pub(crate) struct UploadTarget {
    pub pool: String,
    pub vol: String,
    pub offset: u64,
    /// Declared length (0: unbounded).
    pub length: u64,
    /// Bytes stored so far.
    pub written: u64,
}

/// Everything the fake daemon holds.
#[derive(Debug)]
pub(crate) struct State {
    domains: BTreeMap<String, DomainObj>,
    pools: BTreeMap<String, PoolObj>,
    networks: BTreeMap<String, NetworkObj>,
    /// Network filters (`crate::nwfilter`).
    pub(crate) nwfilters: crate::nwfilter::NwFilters,
    next_id: i32,
    next_uuid: u64,
}

/// Prefix of generated UUIDs ("fake" in ASCII, then a counter), so they are recognisable.
const UUID_PREFIX: [u8; 8] = *b"fakeuuid";

/// The virtual size in a qcow2 header (magic `QFI\xfb`, big-endian size at byte 24).
fn qcow2_virtual_size(content: &[u8]) -> Option<u64> {
    if content.get(..4)? != b"QFI\xfb" {
        return None;
    }
    let b: [u8; 8] = content.get(24..32)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// The backing file a qcow2 header names (`backing_file_offset` at byte 8, its length at
/// byte 16), as a `dir` pool's refresh reports it in the volume's `<backingStore>`.
fn qcow2_backing_file(content: &[u8]) -> Option<String> {
    if content.get(..4)? != b"QFI\xfb" {
        return None;
    }
    let off = u64::from_be_bytes(content.get(8..16)?.try_into().ok()?);
    let len = u32::from_be_bytes(content.get(16..20)?.try_into().ok()?);
    if off == 0 {
        return None;
    }
    let start = usize::try_from(off).ok()?;
    let name = content.get(start..start.checked_add(len as usize)?)?;
    Some(String::from_utf8_lossy(name).into_owned())
}

fn ip_kind(addr: &str) -> i32 {
    if addr.contains(':') { IP_V6 } else { IP_V4 }
}

fn minimal_domain_xml(name: &str, uuid: &Uuid) -> String {
    format!(
        "<domain type='qemu'>\n  <name>{}</name>\n  <uuid>{}</uuid>\n  <memory unit='KiB'>65536</memory>\n  <vcpu>1</vcpu>\n  <os>\n    <type arch='x86_64'>hvm</type>\n  </os>\n</domain>\n",
        escape(name),
        proto::format_uuid(uuid)
    )
}

fn escape(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

impl State {
    pub fn new() -> Self {
        Self {
            domains: BTreeMap::new(),
            pools: BTreeMap::new(),
            networks: BTreeMap::new(),
            nwfilters: crate::nwfilter::NwFilters::default(),
            next_id: 1,
            next_uuid: 1,
        }
    }

    /// Whether a running domain's interface references filter `name`.
    pub fn nwfilter_in_use(&self, name: &str) -> bool {
        self.domains.values().any(|d| {
            d.is_active()
                && crate::nwfilter::references(&d.xml)
                    .iter()
                    .any(|f| f == name)
        })
    }

    /// A UUID for a new object (public for the filter table).
    pub fn new_uuid(&mut self) -> Uuid {
        self.fresh_uuid()
    }

    fn fresh_uuid(&mut self) -> Uuid {
        let mut u = [0u8; 16];
        let (head, tail) = u.split_at_mut(8);
        head.copy_from_slice(&UUID_PREFIX);
        tail.copy_from_slice(&self.next_uuid.to_be_bytes());
        self.next_uuid = self.next_uuid.wrapping_add(1);
        u
    }

    fn fresh_id(&mut self) -> i32 {
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    // ---- seeding and inspection ----

    pub fn add_domain(&mut self, spec: DomainSpec) -> Result<proto::Domain, SeedError> {
        if self.domains.contains_key(&spec.name) {
            return Err(SeedError::Exists {
                kind: "domain",
                name: spec.name,
            });
        }
        let uuid = match spec.uuid {
            Some(u) => u,
            None => self.fresh_uuid(),
        };
        let xml = spec
            .xml
            .unwrap_or_else(|| minimal_domain_xml(&spec.name, &uuid));
        let parsed = xml::parse_domain(&xml).ok();
        let mut d = DomainObj {
            name: spec.name.clone(),
            uuid,
            id: -1,
            state: spec.state,
            reason: spec.reason,
            persistent: spec.persistent,
            xml,
            metadata: spec
                .metadata
                .into_iter()
                .map(|(uri, xml)| (uri, MetaEntry { xml }))
                .collect(),
            title: None,
            description: None,
            interfaces: spec.interfaces,
            guest_agent: spec.guest_agent,
            memory_kib: parsed.as_ref().map_or(65_536, |p| p.memory_kib),
            current_memory_kib: parsed.as_ref().map_or(65_536, |p| p.current_memory_kib),
            vcpus: parsed.as_ref().map_or(1, |p| p.vcpus),
        };
        if d.is_active() {
            d.id = self.fresh_id();
        }
        let handle = d.handle();
        self.domains.insert(spec.name, d);
        Ok(handle)
    }

    pub fn add_pool(&mut self, spec: PoolSpec) -> Result<proto::StoragePool, SeedError> {
        if self.pools.contains_key(&spec.name) {
            return Err(SeedError::Exists {
                kind: "pool",
                name: spec.name,
            });
        }
        let available = spec
            .available
            .unwrap_or_else(|| spec.capacity.saturating_sub(spec.allocation));
        let p = PoolObj {
            uuid: self.fresh_uuid(),
            path: spec
                .path
                .unwrap_or_else(|| format!("/var/lib/libvirt/{}", spec.name)),
            name: spec.name.clone(),
            capacity: spec.capacity,
            allocation: spec.allocation,
            available,
            cached_allocation: spec.allocation,
            cached_available: available,
            volumes: BTreeMap::new(),
        };
        let handle = p.handle();
        self.pools.insert(spec.name, p);
        Ok(handle)
    }

    pub fn add_volume(
        &mut self,
        pool: &str,
        spec: VolumeSpec,
    ) -> Result<proto::StorageVol, SeedError> {
        let p = self.pools.get_mut(pool).ok_or_else(|| SeedError::Missing {
            kind: "pool",
            name: pool.into(),
        })?;
        if p.volumes.contains_key(&spec.name) {
            return Err(SeedError::Exists {
                kind: "volume",
                name: spec.name,
            });
        }
        let allocation = spec.allocation.unwrap_or(spec.content.len() as u64);
        let v = VolumeObj {
            path: format!("{}/{}", p.path, spec.name),
            name: spec.name.clone(),
            capacity: spec.capacity,
            allocation,
            format: spec.format,
            backing: spec.backing,
            content: spec.content,
        };
        // Seeded volumes count in the live figures only: the cache waits for a refresh.
        p.account(0, allocation);
        let handle = p.vol_handle(&v);
        p.volumes.insert(spec.name, v);
        Ok(handle)
    }

    pub fn add_network(&mut self, spec: NetworkSpec) -> Result<proto::Network, SeedError> {
        if self.networks.contains_key(&spec.name) {
            return Err(SeedError::Exists {
                kind: "network",
                name: spec.name,
            });
        }
        let uuid = self.fresh_uuid();
        let xml = spec.xml.unwrap_or_else(|| {
            format!(
                "<network>\n  <name>{}</name>\n  <uuid>{}</uuid>\n  <forward mode='nat'/>\n  <bridge name='{}'/>\n  <ip address='192.168.122.1' netmask='255.255.255.0'>\n    <dhcp>\n      <range start='192.168.122.2' end='192.168.122.254'/>\n    </dhcp>\n  </ip>\n</network>\n",
                escape(&spec.name),
                proto::format_uuid(&uuid),
                escape(&spec.bridge)
            )
        });
        let n = NetworkObj {
            name: spec.name.clone(),
            uuid,
            bridge: spec.bridge,
            xml,
            leases: spec.leases,
        };
        let handle = proto::Network {
            name: n.name.clone(),
            uuid,
        };
        self.networks.insert(spec.name, n);
        Ok(handle)
    }

    pub fn set_leases(&mut self, network: &str, leases: Vec<Lease>) -> Result<(), SeedError> {
        let n = self
            .networks
            .get_mut(network)
            .ok_or_else(|| SeedError::Missing {
                kind: "network",
                name: network.into(),
            })?;
        n.leases = leases;
        Ok(())
    }

    fn domain_mut_by_name(&mut self, name: &str) -> Result<&mut DomainObj, SeedError> {
        self.domains
            .get_mut(name)
            .ok_or_else(|| SeedError::Missing {
                kind: "domain",
                name: name.into(),
            })
    }

    pub fn set_interfaces(&mut self, name: &str, ifaces: Vec<Interface>) -> Result<(), SeedError> {
        self.domain_mut_by_name(name)?.interfaces = ifaces;
        Ok(())
    }

    pub fn set_guest_agent(&mut self, name: &str, on: bool) -> Result<(), SeedError> {
        self.domain_mut_by_name(name)?.guest_agent = on;
        Ok(())
    }

    pub fn set_domain_state(
        &mut self,
        name: &str,
        state: i32,
        reason: i32,
    ) -> Result<(), SeedError> {
        let need_id = {
            let d = self.domain_mut_by_name(name)?;
            d.state = state;
            d.reason = reason;
            if !d.is_active() {
                d.id = -1;
            }
            d.is_active() && d.id < 0
        };
        if need_id {
            let id = self.fresh_id();
            self.domain_mut_by_name(name)?.id = id;
        }
        Ok(())
    }

    pub fn set_pool_usage(
        &mut self,
        pool: &str,
        allocation: u64,
        available: u64,
    ) -> Result<(), SeedError> {
        let p = self.pools.get_mut(pool).ok_or_else(|| SeedError::Missing {
            kind: "pool",
            name: pool.into(),
        })?;
        p.allocation = allocation;
        p.available = available;
        Ok(())
    }

    pub fn domain_infos(&self) -> Vec<DomainInfo> {
        self.domains.values().map(DomainObj::info).collect()
    }

    pub fn domain_info_by_name(&self, name: &str) -> Option<DomainInfo> {
        self.domains.get(name).map(DomainObj::info)
    }

    pub fn metadata_of(&self, name: &str, uri: &str) -> Option<String> {
        self.domains
            .get(name)
            .and_then(|d| d.metadata.get(uri))
            .map(|m| m.xml.clone())
    }

    pub fn pool_info_by_name(&self, name: &str) -> Option<PoolInfo> {
        self.pools.get(name).map(|p| PoolInfo {
            name: p.name.clone(),
            uuid: p.uuid,
            path: p.path.clone(),
            capacity: p.capacity,
            allocation: p.allocation,
            available: p.available,
            cached_allocation: p.cached_allocation,
            cached_available: p.cached_available,
        })
    }

    pub fn volume_info(&self, pool: &str, name: &str) -> Option<VolumeInfo> {
        let p = self.pools.get(pool)?;
        let v = p.volumes.get(name)?;
        Some(VolumeInfo {
            pool: p.name.clone(),
            name: v.name.clone(),
            path: v.path.clone(),
            capacity: v.capacity,
            allocation: v.allocation,
            format: v.format.clone(),
            backing: v.backing.clone(),
            content_len: v.content.len() as u64,
        })
    }

    pub fn volume_names(&self, pool: &str) -> Option<Vec<String>> {
        self.pools
            .get(pool)
            .map(|p| p.volumes.keys().cloned().collect())
    }

    pub fn volume_content(&self, pool: &str, name: &str) -> Option<Vec<u8>> {
        self.pools
            .get(pool)
            .and_then(|p| p.volumes.get(name))
            .map(|v| v.content.clone())
    }

    // ---- domains ----

    fn domain_by_handle(&self, h: &proto::Domain) -> OpResult<&DomainObj> {
        self.domains
            .values()
            .find(|d| d.uuid == h.uuid)
            .ok_or_else(|| errors::no_domain_uuid(&h.uuid, &h.name))
    }

    fn domain_name_by_handle(&self, h: &proto::Domain) -> OpResult<String> {
        self.domain_by_handle(h).map(|d| d.name.clone())
    }

    fn domain_mut(&mut self, h: &proto::Domain) -> OpResult<&mut DomainObj> {
        let name = self.domain_name_by_handle(h)?;
        self.domains
            .get_mut(&name)
            .ok_or_else(|| errors::no_domain_uuid(&h.uuid, &h.name))
    }

    pub fn lookup_domain(&self, name: &str) -> OpResult<proto::Domain> {
        self.domains
            .get(name)
            .map(DomainObj::handle)
            .ok_or_else(|| errors::no_domain_name(name))
    }

    pub fn list_domains(&self, flags: u32) -> Vec<proto::Domain> {
        let active = flags & (LIST_ACTIVE | LIST_INACTIVE);
        let persistence = flags & (LIST_PERSISTENT | LIST_TRANSIENT);
        self.domains
            .values()
            .filter(|d| match active {
                LIST_ACTIVE => d.is_active(),
                LIST_INACTIVE => !d.is_active(),
                _ => true,
            })
            .filter(|d| match persistence {
                LIST_PERSISTENT => d.persistent,
                LIST_TRANSIENT => !d.persistent,
                _ => true,
            })
            .map(DomainObj::handle)
            .collect()
    }

    pub fn define_xml(&mut self, xml_text: &str) -> OpResult<(proto::Domain, Vec<DomainEvent>)> {
        let parsed = xml::parse_domain(xml_text).map_err(|e| match e {
            xml::XmlError::Missing("name") => errors::remote_error(
                errors::codes::NO_NAME,
                domains::DOMAIN,
                "missing name information",
            ),
            other => errors::xml_error(domains::DOMAIN, &other.to_string()),
        })?;
        let taken = parsed.uuid.and_then(|u| {
            self.domains
                .values()
                .find(|d| d.uuid == u && d.name != parsed.name)
        });
        if let Some(other) = taken {
            return Err(errors::uuid_taken(&other.name, &other.uuid));
        }
        let metadata: BTreeMap<String, MetaEntry> = parsed
            .metadata
            .iter()
            .map(|(uri, xml)| (uri.clone(), MetaEntry { xml: xml.clone() }))
            .collect();
        let (handle, detail) = match self.domains.get_mut(&parsed.name) {
            Some(d) => {
                if parsed.uuid.is_some_and(|u| u != d.uuid) {
                    return Err(errors::domain_exists_with_uuid(&d.name, &d.uuid));
                }
                d.xml = xml_text.to_string();
                d.metadata = metadata;
                d.persistent = true;
                d.guest_agent = parsed.guest_agent;
                d.memory_kib = parsed.memory_kib;
                d.current_memory_kib = parsed.current_memory_kib;
                d.vcpus = parsed.vcpus;
                (d.handle(), events::DEFINED_UPDATED)
            }
            None => {
                let uuid = match parsed.uuid {
                    Some(u) => u,
                    None => self.fresh_uuid(),
                };
                let d = DomainObj {
                    name: parsed.name.clone(),
                    uuid,
                    id: -1,
                    state: domain_state::SHUTOFF,
                    reason: 0,
                    persistent: true,
                    xml: xml_text.to_string(),
                    metadata,
                    title: None,
                    description: None,
                    interfaces: Vec::new(),
                    guest_agent: parsed.guest_agent,
                    memory_kib: parsed.memory_kib,
                    current_memory_kib: parsed.current_memory_kib,
                    vcpus: parsed.vcpus,
                };
                let h = d.handle();
                self.domains.insert(parsed.name.clone(), d);
                (h, events::DEFINED_ADDED)
            }
        };
        let ev = DomainEvent {
            dom: handle.clone(),
            event: events::DEFINED,
            detail,
        };
        Ok((handle, vec![ev]))
    }

    pub fn create(&mut self, h: &proto::Domain) -> OpResult<(proto::Domain, Vec<DomainEvent>)> {
        let d = self.domain_by_handle(h)?;
        if d.is_active() {
            return Err(errors::domain_already_running());
        }
        // libvirtd applies the interfaces' filters at start: a missing one fails it.
        self.nwfilters.check_references(&d.xml)?;
        let id = self.fresh_id();
        let d = self.domain_mut(h)?;
        d.id = id;
        d.state = domain_state::RUNNING;
        d.reason = RUNNING_BOOTED;
        let handle = d.handle();
        let evs = vec![
            DomainEvent {
                dom: handle.clone(),
                event: events::RESUMED,
                detail: events::RESUMED_UNPAUSED,
            },
            DomainEvent {
                dom: handle.clone(),
                event: events::STARTED,
                detail: events::STARTED_BOOTED,
            },
        ];
        Ok((handle, evs))
    }

    pub fn state_of(&self, h: &proto::Domain) -> OpResult<(i32, i32)> {
        self.domain_by_handle(h).map(|d| (d.state, d.reason))
    }

    pub fn info_of(&self, h: &proto::Domain) -> OpResult<proto::DomainGetInfoRet> {
        let d = self.domain_by_handle(h)?;
        Ok(proto::DomainGetInfoRet {
            state: proto::XdrU8(u8::try_from(d.state).unwrap_or(0)),
            max_mem: d.memory_kib,
            memory: d.current_memory_kib,
            nr_virt_cpu: proto::XdrU16(d.vcpus),
            cpu_time: 0,
        })
    }

    pub fn xml_of(&self, h: &proto::Domain) -> OpResult<String> {
        self.domain_by_handle(h).map(|d| d.xml.clone())
    }

    pub fn destroy(&mut self, h: &proto::Domain) -> OpResult<Vec<DomainEvent>> {
        let d = self.domain_mut(h)?;
        if !d.is_active() {
            return Err(errors::domain_not_running());
        }
        let running = d.handle();
        d.id = -1;
        d.state = domain_state::SHUTOFF;
        d.reason = SHUTOFF_DESTROYED;
        let stopped = d.handle();
        if !d.persistent {
            let name = d.name.clone();
            self.domains.remove(&name);
        }
        Ok(vec![
            DomainEvent {
                dom: running,
                event: events::SHUTDOWN,
                detail: events::SHUTDOWN_HOST,
            },
            DomainEvent {
                dom: stopped,
                event: events::STOPPED,
                detail: events::STOPPED_DESTROYED,
            },
        ])
    }

    /// Like libvirt: an inactive domain is removed; a running persistent one becomes transient
    /// (it vanishes when stopped); a transient one cannot be undefined.
    pub fn undefine(&mut self, h: &proto::Domain) -> OpResult<Vec<DomainEvent>> {
        let d = self.domain_mut(h)?;
        if !d.persistent {
            return Err(errors::undefine_transient());
        }
        let handle = d.handle();
        if d.is_active() {
            d.persistent = false;
        } else {
            let name = d.name.clone();
            self.domains.remove(&name);
        }
        Ok(vec![DomainEvent {
            dom: handle,
            event: events::UNDEFINED,
            detail: events::UNDEFINED_REMOVED,
        }])
    }

    pub fn get_metadata(
        &self,
        h: &proto::Domain,
        kind: i32,
        uri: Option<&str>,
    ) -> OpResult<String> {
        let d = self.domain_by_handle(h)?;
        let found = match kind {
            META_DESCRIPTION => d.description.clone(),
            META_TITLE => d.title.clone(),
            META_ELEMENT => {
                let uri = uri.ok_or_else(|| errors::metadata_invalid("uri must not be NULL"))?;
                d.metadata.get(uri).map(|m| m.xml.clone())
            }
            other => {
                return Err(errors::metadata_invalid(&format!(
                    "unknown metadata type '{other}'"
                )));
            }
        };
        found.ok_or_else(errors::no_metadata)
    }

    pub fn set_metadata(
        &mut self,
        h: &proto::Domain,
        kind: i32,
        value: Option<&str>,
        key: Option<&str>,
        uri: Option<&str>,
    ) -> OpResult<()> {
        let d = self.domain_mut(h)?;
        match kind {
            META_DESCRIPTION => d.description = value.map(str::to_owned),
            META_TITLE => d.title = value.map(str::to_owned),
            META_ELEMENT => {
                let uri = uri.ok_or_else(|| errors::metadata_invalid("uri must not be NULL"))?;
                match value {
                    Some(xml) => {
                        if key.is_none() {
                            return Err(errors::metadata_key_required());
                        }
                        d.metadata
                            .insert(uri.to_string(), MetaEntry { xml: xml.into() });
                    }
                    None => {
                        d.metadata.remove(uri);
                    }
                }
            }
            other => {
                return Err(errors::metadata_invalid(&format!(
                    "unknown metadata type '{other}'"
                )));
            }
        }
        Ok(())
    }

    pub fn interface_addresses(
        &self,
        h: &proto::Domain,
        source: u32,
        agent_unresponsive: bool,
        arp_error: Option<&str>,
    ) -> OpResult<Vec<proto::DomainInterface>> {
        const LEASE: u32 = 0;
        const AGENT: u32 = 1;
        const ARP: u32 = 2;
        let d = self.domain_by_handle(h)?;
        if !d.is_active() {
            return Err(errors::domain_not_running());
        }
        if source == ARP
            && let Some(m) = arp_error
        {
            return Err(errors::internal(m));
        }
        let addr = |a: &str, prefix: u32| proto::DomainIpAddr {
            kind: ip_kind(a),
            addr: a.to_string(),
            prefix,
        };
        match source {
            AGENT => {
                if !d.guest_agent {
                    return Err(errors::agent_not_configured());
                }
                if agent_unresponsive {
                    return Err(errors::agent_unresponsive());
                }
                Ok(d.interfaces
                    .iter()
                    .map(|i| proto::DomainInterface {
                        name: i.name.clone(),
                        hwaddr: Some(i.mac.clone()),
                        addrs: i.addrs.iter().map(|a| addr(&a.addr, a.prefix)).collect(),
                    })
                    .collect())
            }
            LEASE | ARP => {
                let mut out = Vec::new();
                for (n, i) in d.interfaces.iter().enumerate() {
                    let Some(net) = i.network.as_ref().and_then(|n| self.networks.get(n)) else {
                        continue;
                    };
                    let addrs: Vec<_> = net
                        .leases
                        .iter()
                        .filter(|l| l.mac.eq_ignore_ascii_case(&i.mac))
                        .map(|l| addr(&l.ip, l.prefix))
                        .collect();
                    if !addrs.is_empty() {
                        out.push(proto::DomainInterface {
                            name: format!("vnet{n}"),
                            hwaddr: Some(i.mac.clone()),
                            addrs,
                        });
                    }
                }
                Ok(out)
            }
            other => Err(errors::bad_address_source(other)),
        }
    }

    // ---- networks ----

    fn network_by_handle(&self, h: &proto::Network) -> OpResult<&NetworkObj> {
        self.networks
            .values()
            .find(|n| n.uuid == h.uuid)
            .ok_or_else(|| errors::no_network_uuid(&h.uuid, &h.name))
    }

    pub fn lookup_network(&self, name: &str) -> OpResult<proto::Network> {
        self.networks
            .get(name)
            .map(|n| proto::Network {
                name: n.name.clone(),
                uuid: n.uuid,
            })
            .ok_or_else(|| errors::no_network_name(name))
    }

    pub fn network_xml(&self, h: &proto::Network) -> OpResult<String> {
        self.network_by_handle(h).map(|n| n.xml.clone())
    }

    pub fn leases(
        &self,
        h: &proto::Network,
        mac: Option<&str>,
    ) -> OpResult<Vec<proto::NetworkDhcpLease>> {
        let n = self.network_by_handle(h)?;
        Ok(n.leases
            .iter()
            .filter(|l| mac.is_none_or(|m| l.mac.eq_ignore_ascii_case(m)))
            .map(|l| proto::NetworkDhcpLease {
                iface: n.bridge.clone(),
                expirytime: l.expiry,
                kind: ip_kind(&l.ip),
                mac: Some(l.mac.clone()),
                iaid: None,
                ipaddr: l.ip.clone(),
                prefix: l.prefix,
                hostname: l.hostname.clone(),
                clientid: None,
            })
            .collect())
    }

    // ---- storage ----

    fn pool_name_by_handle(&self, h: &proto::StoragePool) -> OpResult<String> {
        self.pools
            .values()
            .find(|p| p.uuid == h.uuid)
            .map(|p| p.name.clone())
            .ok_or_else(|| errors::no_pool_uuid(&h.uuid, &h.name))
    }

    fn pool_by_handle(&self, h: &proto::StoragePool) -> OpResult<&PoolObj> {
        let name = self.pool_name_by_handle(h)?;
        self.pools
            .get(&name)
            .ok_or_else(|| errors::no_pool_uuid(&h.uuid, &h.name))
    }

    fn pool_mut_by_handle(&mut self, h: &proto::StoragePool) -> OpResult<&mut PoolObj> {
        let name = self.pool_name_by_handle(h)?;
        self.pools
            .get_mut(&name)
            .ok_or_else(|| errors::no_pool_uuid(&h.uuid, &h.name))
    }

    pub fn lookup_pool(&self, name: &str) -> OpResult<proto::StoragePool> {
        self.pools
            .get(name)
            .map(PoolObj::handle)
            .ok_or_else(|| errors::no_pool_name(name))
    }

    pub fn refresh_pool(&mut self, h: &proto::StoragePool) -> OpResult<()> {
        let p = self.pool_mut_by_handle(h)?;
        // NB: a `dir` pool re-probes every file on refresh: one that starts with the qcow2
        // magic reads as qcow2 with the header's virtual size (observed after `vol-upload` of
        // a qcow2 into a raw volume).
        for v in p.volumes.values_mut() {
            if let Some(size) = qcow2_virtual_size(&v.content) {
                v.format = "qcow2".into();
                v.capacity = size;
                if let Some(b) = qcow2_backing_file(&v.content) {
                    v.backing = Some(b);
                }
            } else if v.format == "raw" {
                // A raw file is as large as its last written byte.
                v.capacity = v.capacity.max(v.content.len() as u64);
            }
        }
        p.cached_allocation = p.allocation;
        p.cached_available = p.available;
        Ok(())
    }

    pub fn pool_info(&self, h: &proto::StoragePool) -> OpResult<proto::StoragePoolGetInfoRet> {
        let p = self.pool_by_handle(h)?;
        Ok(proto::StoragePoolGetInfoRet {
            state: proto::XdrU8(POOL_RUNNING),
            capacity: p.capacity,
            allocation: p.cached_allocation,
            available: p.cached_available,
        })
    }

    pub fn list_volumes(&self, h: &proto::StoragePool) -> OpResult<Vec<proto::StorageVol>> {
        let p = self.pool_by_handle(h)?;
        Ok(p.volumes.values().map(|v| p.vol_handle(v)).collect())
    }

    fn volume_path_exists(&self, path: &str) -> Option<&VolumeObj> {
        self.pools
            .values()
            .flat_map(|p| p.volumes.values())
            .find(|v| v.path == path)
    }

    pub fn create_volume(
        &mut self,
        h: &proto::StoragePool,
        xml_text: &str,
    ) -> OpResult<proto::StorageVol> {
        self.pool_name_by_handle(h)?;
        let parsed = xml::parse_volume(xml_text)
            .map_err(|e| errors::xml_error(domains::STORAGE, &e.to_string()))?;
        let backing_capacity = match &parsed.backing_path {
            Some(path) => Some(
                self.volume_path_exists(path)
                    .map(|v| v.capacity)
                    .ok_or_else(|| errors::backing_missing(path))?,
            ),
            None => None,
        };
        let p = self.pool_mut_by_handle(h)?;
        if p.volumes.contains_key(&parsed.name) {
            return Err(errors::vol_exists(&parsed.name));
        }
        let capacity = parsed
            .capacity
            .or(backing_capacity)
            .ok_or_else(errors::vol_missing_capacity)?;
        let format = parsed.format.unwrap_or_else(|| "raw".into());
        // NB: a `dir` pool allocates raw volumes fully unless told otherwise (observed:
        // a 64 KiB raw volume reports allocation 65536); qcow2 starts with its metadata.
        let allocation = parsed.allocation.unwrap_or(if format == "qcow2" {
            QCOW2_EMPTY_ALLOCATION
        } else {
            capacity
        });
        let path = format!("{}/{}", p.path, parsed.name);
        if allocation > p.available {
            return Err(errors::vol_no_space(allocation, &path));
        }
        let v = VolumeObj {
            name: parsed.name.clone(),
            path,
            capacity,
            allocation,
            format,
            backing: parsed.backing_path,
            content: Vec::new(),
        };
        p.account(0, allocation);
        let handle = p.vol_handle(&v);
        p.volumes.insert(parsed.name, v);
        Ok(handle)
    }

    /// `STORAGE_VOL_CREATE_XML_FROM`: a new volume named by `xml` with `clone`'s content and
    /// format (unless the XML names one), at least `clone`'s capacity (as libvirtd does).
    pub fn create_volume_from(
        &mut self,
        h: &proto::StoragePool,
        xml_text: &str,
        clone: &proto::StorageVol,
    ) -> OpResult<proto::StorageVol> {
        self.pool_name_by_handle(h)?;
        let src = self
            .pool_for_volume(clone)?
            .volumes
            .get(&clone.name)
            .cloned()
            .ok_or_else(|| errors::no_vol(&clone.name))?;
        let parsed = xml::parse_volume(xml_text)
            .map_err(|e| errors::xml_error(domains::STORAGE, &e.to_string()))?;
        let p = self.pool_mut_by_handle(h)?;
        if p.volumes.contains_key(&parsed.name) {
            return Err(errors::clone_name_in_use(&parsed.name));
        }
        let capacity = parsed.capacity.unwrap_or(0).max(src.capacity);
        let allocation = src.allocation;
        let path = format!("{}/{}", p.path, parsed.name);
        if allocation > p.available {
            return Err(errors::vol_no_space(allocation, &path));
        }
        let v = VolumeObj {
            name: parsed.name.clone(),
            path,
            capacity,
            allocation,
            format: parsed.format.unwrap_or(src.format),
            backing: None,
            content: src.content,
        };
        p.account(0, allocation);
        let handle = p.vol_handle(&v);
        p.volumes.insert(parsed.name, v);
        Ok(handle)
    }

    fn pool_for_volume(&self, h: &proto::StorageVol) -> OpResult<&PoolObj> {
        // NB: libvirt resolves a volume by pool name and volume name; a missing pool reads as a
        // missing volume (observed).
        self.pools
            .get(&h.pool)
            .filter(|p| p.volumes.contains_key(&h.name))
            .ok_or_else(|| errors::no_vol(&h.name))
    }

    pub fn lookup_volume(
        &self,
        pool: &proto::StoragePool,
        name: &str,
    ) -> OpResult<proto::StorageVol> {
        let p = self.pool_by_handle(pool)?;
        p.volumes
            .get(name)
            .map(|v| p.vol_handle(v))
            .ok_or_else(|| errors::no_vol(name))
    }

    pub fn volume_get_info(&self, h: &proto::StorageVol) -> OpResult<proto::StorageVolGetInfoRet> {
        let p = self.pool_for_volume(h)?;
        let v = p
            .volumes
            .get(&h.name)
            .ok_or_else(|| errors::no_vol(&h.name))?;
        Ok(proto::StorageVolGetInfoRet {
            kind: proto::XdrI8(VOL_FILE),
            capacity: v.capacity,
            allocation: v.allocation,
        })
    }

    pub fn volume_path(&self, h: &proto::StorageVol) -> OpResult<String> {
        let p = self.pool_for_volume(h)?;
        p.volumes
            .get(&h.name)
            .map(|v| v.path.clone())
            .ok_or_else(|| errors::no_vol(&h.name))
    }

    /// The volume's XML as libvirt formats the parts we model: name, key, capacity,
    /// allocation, target path and format, backing store path and format.
    pub fn volume_xml(&self, h: &proto::StorageVol) -> OpResult<String> {
        let p = self.pool_for_volume(h)?;
        let v = p
            .volumes
            .get(&h.name)
            .ok_or_else(|| errors::no_vol(&h.name))?;
        let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
        let backing = match &v.backing {
            Some(path) => {
                let fmt = self
                    .volume_path_exists(path)
                    .map(|b| b.format.clone())
                    .unwrap_or_else(|| "raw".into());
                format!(
                    "  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n",
                    esc(path),
                    esc(&fmt)
                )
            }
            None => String::new(),
        };
        Ok(format!(
            "<volume type='file'>\n  <name>{}</name>\n  <key>{}</key>\n  \
             <capacity unit='bytes'>{}</capacity>\n  <allocation unit='bytes'>{}</allocation>\n  \
             <target>\n    <path>{}</path>\n    <format type='{}'/>\n  </target>\n{}</volume>\n",
            esc(&v.name),
            esc(&v.path),
            v.capacity,
            v.allocation,
            esc(&v.path),
            esc(&v.format),
            backing
        ))
    }

    pub fn delete_volume(&mut self, h: &proto::StorageVol) -> OpResult<()> {
        self.pool_for_volume(h)?;
        let p = self
            .pools
            .get_mut(&h.pool)
            .ok_or_else(|| errors::no_vol(&h.name))?;
        let v = p
            .volumes
            .remove(&h.name)
            .ok_or_else(|| errors::no_vol(&h.name))?;
        p.account(v.allocation, 0);
        Ok(())
    }

    pub fn begin_upload(
        &self,
        h: &proto::StorageVol,
        offset: u64,
        length: u64,
    ) -> OpResult<UploadTarget> {
        self.pool_for_volume(h)?;
        Ok(UploadTarget {
            pool: h.pool.clone(),
            vol: h.name.clone(),
            offset,
            length,
            written: 0,
        })
    }

    /// Stores `data` at the stream's current position, at most `limit` bytes (the injected
    /// fault's budget). Returns an error after storing what fits when the declared length, the
    /// pool's free space, the content cap or `limit` is exceeded — like a disk filling up
    /// mid-write. A volume deleted during the upload swallows the bytes (libvirt writes to the
    /// unlinked file).
    pub fn upload_chunk(
        &mut self,
        t: &mut UploadTarget,
        data: &[u8],
        limit: Option<u64>,
    ) -> OpResult<()> {
        let want = data.len() as u64;
        let mut allowed = want;
        if t.length > 0 {
            allowed = allowed.min(t.length.saturating_sub(t.written));
        }
        if let Some(l) = limit {
            allowed = allowed.min(l.saturating_sub(t.written));
        }
        let Some(p) = self.pools.get_mut(&t.pool) else {
            t.written = t.written.saturating_add(want);
            return Ok(());
        };
        let available = p.available;
        let Some(v) = p.volumes.get_mut(&t.vol) else {
            t.written = t.written.saturating_add(want);
            return Ok(());
        };
        let start = t.offset.saturating_add(t.written);
        // Growth beyond the current allocation needs free space in the pool.
        let room = available
            .saturating_add(v.allocation)
            .min(VOLUME_CONTENT_LIMIT)
            .saturating_sub(start);
        allowed = allowed.min(room);
        let n = usize::try_from(allowed).unwrap_or(0);
        let start_idx = usize::try_from(start).unwrap_or(usize::MAX);
        let end_idx = start_idx.saturating_add(n);
        if n > 0 {
            if v.content.len() < end_idx {
                v.content.resize(end_idx, 0);
            }
            if let (Some(dst), Some(src)) = (v.content.get_mut(start_idx..end_idx), data.get(..n)) {
                dst.copy_from_slice(src);
            }
        }
        let before = v.allocation;
        v.allocation = v.allocation.max(v.content.len() as u64);
        let after = v.allocation;
        p.account(before, after);
        t.written = t.written.saturating_add(allowed);
        if allowed < want {
            return Err(errors::stream_no_space());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::codes;

    fn state_with_pool() -> (State, proto::StoragePool) {
        let mut s = State::new();
        let p = s
            .add_pool(PoolSpec::new("p").capacity(1000).allocation(100).path("/p"))
            .unwrap();
        (s, p)
    }

    #[test]
    fn pool_info_stays_cached_until_refresh() {
        // finding: M4
        let (mut s, p) = state_with_pool();
        s.create_volume(
            &p,
            "<volume><name>v</name><capacity>300</capacity></volume>",
        )
        .unwrap();
        let info = s.pool_info(&p).unwrap();
        assert_eq!((info.allocation, info.available), (100, 900));
        s.refresh_pool(&p).unwrap();
        let info = s.pool_info(&p).unwrap();
        assert_eq!((info.allocation, info.available), (400, 600));
    }

    #[test]
    fn upload_stops_at_the_fault_budget_and_keeps_only_what_fit() {
        let (mut s, p) = state_with_pool();
        let v = s
            .create_volume(&p, "<volume><name>v</name><capacity>0</capacity></volume>")
            .unwrap();
        let mut t = s.begin_upload(&v, 2, 0).unwrap();
        s.upload_chunk(&mut t, &[1, 2, 3], Some(5)).unwrap();
        let e = s.upload_chunk(&mut t, &[4, 5, 6], Some(5)).unwrap_err();
        assert_eq!(e.code, codes::SYSTEM_ERROR);
        assert_eq!(
            s.volume_content("p", "v").unwrap(),
            vec![0, 0, 1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn upload_beyond_free_space_is_enospc() {
        let (mut s, p) = state_with_pool();
        let v = s
            .create_volume(&p, "<volume><name>v</name><capacity>0</capacity></volume>")
            .unwrap();
        let mut t = s.begin_upload(&v, 0, 0).unwrap();
        let e = s.upload_chunk(&mut t, &[7u8; 1000], None).unwrap_err();
        assert_eq!(e.code, codes::SYSTEM_ERROR);
        assert_eq!(s.volume_content("p", "v").unwrap().len(), 900);
        assert_eq!(s.pool_info_by_name("p").unwrap().available, 0);
    }

    #[test]
    fn stale_domain_handle_is_no_domain_after_redefine() {
        let mut s = State::new();
        let (old, _) = s.define_xml("<domain><name>a</name></domain>").unwrap();
        s.undefine(&old).unwrap();
        let (new, _) = s.define_xml("<domain><name>a</name></domain>").unwrap();
        assert_ne!(old.uuid, new.uuid);
        assert_eq!(s.state_of(&old).unwrap_err().code, codes::NO_DOMAIN);
        assert!(s.state_of(&new).is_ok());
    }

    #[test]
    fn undefining_a_running_domain_makes_it_transient_until_destroyed() {
        let mut s = State::new();
        let (d, _) = s.define_xml("<domain><name>a</name></domain>").unwrap();
        let (d, _) = s.create(&d).unwrap();
        s.undefine(&d).unwrap();
        assert_eq!(s.undefine(&d).unwrap_err().code, codes::OPERATION_INVALID);
        assert!(s.lookup_domain("a").is_ok());
        s.destroy(&d).unwrap();
        assert_eq!(s.lookup_domain("a").unwrap_err().code, codes::NO_DOMAIN);
    }
}
