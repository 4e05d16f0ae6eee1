//! The public descriptions used to seed the fake (builders) and to inspect it (snapshots).
//!
//! Guarantees: plain data, no I/O; every builder method only sets a field, so a spec can be
//! built in any order and reused.

use libvirt_remote::proto::Uuid;

/// `virDomainState` values, re-exported for building domains in a given state.
pub use libvirt_remote::client::domain_state;

/// How the fake authenticates clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Like a root client on libvirtd's polkit socket: `AUTH_LIST` answers `[NONE]` and
    /// completes authentication; any other call before it fails with "authentication
    /// required" (code 39).
    #[default]
    Root,
    /// `AUTH_LIST` answers `[POLKIT]`; calls other than `AUTH_POLKIT` fail until it is done.
    Polkit,
    /// Like [`AuthMode::Polkit`], but `AUTH_POLKIT` is denied (code 45).
    PolkitDenied,
}

/// A storage pool to add. `available` defaults to `capacity - allocation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub(crate) name: String,
    pub(crate) path: Option<String>,
    pub(crate) capacity: u64,
    pub(crate) allocation: u64,
    pub(crate) available: Option<u64>,
}

impl PoolSpec {
    /// A pool named `name` with 100 GiB capacity, nothing allocated.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            path: None,
            capacity: 100 << 30,
            allocation: 0,
            available: None,
        }
    }

    /// Target directory (volume paths are `PATH/NAME`); default `/var/lib/libvirt/NAME`.
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// Capacity in bytes.
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// Allocation in bytes (space used by things other than the volumes added later).
    pub fn allocation(mut self, bytes: u64) -> Self {
        self.allocation = bytes;
        self
    }

    /// Available bytes, when it differs from `capacity - allocation` (libvirt reports
    /// `f_bavail`, which excludes root-reserved blocks).
    pub fn available(mut self, bytes: u64) -> Self {
        self.available = Some(bytes);
        self
    }
}

/// A storage volume to add to a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub(crate) name: String,
    pub(crate) capacity: u64,
    pub(crate) allocation: Option<u64>,
    pub(crate) format: String,
    pub(crate) backing: Option<String>,
    pub(crate) content: Vec<u8>,
}

impl VolumeSpec {
    /// A raw volume named `name` of `capacity` bytes.
    pub fn new(name: impl Into<String>, capacity: u64) -> Self {
        Self {
            name: name.into(),
            capacity,
            allocation: None,
            format: "raw".into(),
            backing: None,
            content: Vec::new(),
        }
    }

    /// Allocation in bytes (default: the content's length).
    pub fn allocation(mut self, bytes: u64) -> Self {
        self.allocation = Some(bytes);
        self
    }

    /// Format type (`raw`, `qcow2`, ...).
    pub fn format(mut self, format: impl Into<String>) -> Self {
        self.format = format.into();
        self
    }

    /// Backing store path.
    pub fn backing(mut self, path: impl Into<String>) -> Self {
        self.backing = Some(path.into());
        self
    }

    /// Initial content bytes.
    pub fn content(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.content = bytes.into();
        self
    }
}

/// One DHCP lease of a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// MAC address of the client.
    pub mac: String,
    /// Leased address (IPv4 or IPv6 literal).
    pub ip: String,
    /// Prefix length.
    pub prefix: u32,
    /// Hostname the client sent, if any.
    pub hostname: Option<String>,
    /// Expiry time (seconds since the epoch).
    pub expiry: i64,
}

impl Lease {
    /// A lease of `ip/prefix` to `mac`, expiring far in the future.
    pub fn new(mac: impl Into<String>, ip: impl Into<String>, prefix: u32) -> Self {
        Self {
            mac: mac.into(),
            ip: ip.into(),
            prefix,
            hostname: None,
            expiry: 4_102_444_800,
        }
    }

    /// Sets the client's hostname.
    pub fn hostname(mut self, h: impl Into<String>) -> Self {
        self.hostname = Some(h.into());
        self
    }
}

/// A virtual network to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSpec {
    pub(crate) name: String,
    pub(crate) bridge: String,
    pub(crate) xml: Option<String>,
    pub(crate) leases: Vec<Lease>,
}

impl NetworkSpec {
    /// A network named `name` on bridge `virbr0`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            bridge: "virbr0".into(),
            xml: None,
            leases: Vec::new(),
        }
    }

    /// Bridge name (reported as each lease's interface).
    pub fn bridge(mut self, b: impl Into<String>) -> Self {
        self.bridge = b.into();
        self
    }

    /// The XML `NETWORK_GET_XML_DESC` returns (default: a minimal NAT network).
    pub fn xml(mut self, xml: impl Into<String>) -> Self {
        self.xml = Some(xml.into());
        self
    }

    /// Adds a DHCP lease.
    pub fn lease(mut self, l: Lease) -> Self {
        self.leases.push(l);
        self
    }
}

/// One address of a guest interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpAddress {
    /// Address literal; IPv6 when it contains a `:`.
    pub addr: String,
    /// Prefix length.
    pub prefix: u32,
}

/// A guest network interface, as the guest agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Name inside the guest (`eth0`, `lo`, `docker0`).
    pub name: String,
    /// MAC address.
    pub mac: String,
    /// The libvirt network the NIC is attached to; its leases answer source LEASE.
    pub network: Option<String>,
    /// Addresses the guest agent reports.
    pub addrs: Vec<IpAddress>,
}

impl Interface {
    /// An interface with no addresses.
    pub fn new(name: impl Into<String>, mac: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            mac: mac.into(),
            network: None,
            addrs: Vec::new(),
        }
    }

    /// Attaches the NIC to a libvirt network.
    pub fn network(mut self, n: impl Into<String>) -> Self {
        self.network = Some(n.into());
        self
    }

    /// Adds an address the agent reports.
    pub fn addr(mut self, addr: impl Into<String>, prefix: u32) -> Self {
        self.addrs.push(IpAddress {
            addr: addr.into(),
            prefix,
        });
        self
    }
}

/// A domain to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec {
    pub(crate) name: String,
    pub(crate) uuid: Option<Uuid>,
    pub(crate) state: i32,
    pub(crate) reason: i32,
    pub(crate) xml: Option<String>,
    pub(crate) metadata: Vec<(String, String)>,
    pub(crate) interfaces: Vec<Interface>,
    pub(crate) guest_agent: bool,
    pub(crate) persistent: bool,
}

impl DomainSpec {
    /// A persistent, shut-off domain named `name` with a guest agent channel.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            uuid: None,
            state: domain_state::SHUTOFF,
            reason: 0,
            xml: None,
            metadata: Vec::new(),
            interfaces: Vec::new(),
            guest_agent: true,
            persistent: true,
        }
    }

    /// Sets the UUID (default: generated).
    pub fn uuid(mut self, u: Uuid) -> Self {
        self.uuid = Some(u);
        self
    }

    /// Sets state and reason (see [`domain_state`]); a running-like state assigns an id.
    pub fn state(mut self, state: i32, reason: i32) -> Self {
        self.state = state;
        self.reason = reason;
        self
    }

    /// Running, booted.
    pub fn running(self) -> Self {
        self.state(domain_state::RUNNING, 1)
    }

    /// The XML returned by `DOMAIN_GET_XML_DESC`, kept as given (default: a minimal one).
    /// Its `<metadata>` children are *not* read; use [`metadata`](Self::metadata).
    pub fn xml(mut self, xml: impl Into<String>) -> Self {
        self.xml = Some(xml.into());
        self
    }

    /// Metadata element `xml` under namespace `uri` (as `DOMAIN_GET_METADATA` returns it).
    pub fn metadata(mut self, uri: impl Into<String>, xml: impl Into<String>) -> Self {
        self.metadata.push((uri.into(), xml.into()));
        self
    }

    /// Adds a guest interface.
    pub fn interface(mut self, i: Interface) -> Self {
        self.interfaces.push(i);
        self
    }

    /// Whether a guest agent channel is configured (default true; false answers source
    /// AGENT with code 74).
    pub fn guest_agent(mut self, on: bool) -> Self {
        self.guest_agent = on;
        self
    }

    /// Makes the domain transient (it vanishes when stopped).
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }
}

/// A snapshot of one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    /// Name.
    pub name: String,
    /// UUID.
    pub uuid: Uuid,
    /// Running id, or -1.
    pub id: i32,
    /// `virDomainState`.
    pub state: i32,
    /// State reason.
    pub reason: i32,
    /// Whether it has a persistent definition.
    pub persistent: bool,
    /// The XML as last defined.
    pub xml: String,
}

/// A snapshot of one storage pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Name.
    pub name: String,
    /// UUID.
    pub uuid: Uuid,
    /// Target directory.
    pub path: String,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Live allocation in bytes.
    pub allocation: u64,
    /// Live available bytes.
    pub available: u64,
    /// Allocation as `STORAGE_POOL_GET_INFO` reports it (as of the last refresh).
    pub cached_allocation: u64,
    /// Available bytes as `STORAGE_POOL_GET_INFO` reports it (as of the last refresh).
    pub cached_available: u64,
}

/// A snapshot of one storage volume (without its content; see
/// [`FakeLibvirt::volume_content`](crate::FakeLibvirt::volume_content)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Pool name.
    pub pool: String,
    /// Volume name.
    pub name: String,
    /// Path (also its key).
    pub path: String,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Allocation in bytes.
    pub allocation: u64,
    /// Format type.
    pub format: String,
    /// Backing store path.
    pub backing: Option<String>,
    /// Content length in bytes.
    pub content_len: u64,
}
