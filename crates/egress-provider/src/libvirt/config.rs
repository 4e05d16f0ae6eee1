//! The settings of one libvirt provider entry, as read from the provider config file.
//! Loading and validation with field-path errors belong to the config module of the operator;
//! these types only describe the shape and its defaults.
//!
//! One piece (about 700 lines before its tests, 470 of them code): every field of an entry, its
//! hosts and their address pools, with its default and the comment that sizes it, is one schema
//! that users read from top to bottom; split, the defaults would drift from the fields they
//! belong to.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use super::namespaces::{LabelSelector, Namespaces};
use serde::Deserialize;

/// The libvirt socket path on hosts by default.
pub const DEFAULT_SOCKET: &str = "/run/libvirt/libvirt-sock";
/// SSH port by default.
pub const DEFAULT_SSH_PORT: u16 = 22;

/// One provider entry of type `libvirt`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LibvirtEntry {
    /// Entry name: a safe identifier; part of every domain and volume name.
    pub name: String,
    /// Hosts of this entry.
    pub hosts: Vec<HostConfig>,
    /// Image catalogue: key → source.
    #[serde(default)]
    pub images: BTreeMap<String, ImageSpec>,
    /// Whether and where `image` may be a URL.
    #[serde(default)]
    pub url_images: UrlImagePolicy,
    /// Largest image accepted, in bytes (enforced while streaming).
    #[serde(default = "default_max_image_bytes")]
    pub max_image_bytes: u64,
    /// Guest settings.
    #[serde(default)]
    pub guest: GuestSettings,
    /// Timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Sizes a Proxy gets when its spec names none.
    #[serde(default)]
    pub defaults: SizeDefaults,
    /// Largest sizes a Proxy may ask for (finding L20: bounds checked at load).
    #[serde(default)]
    pub limits: SizeLimits,
    /// Who may use the entry's proxies and where they may connect (`policy:`).
    #[serde(default)]
    pub policy: ProxyPolicy,
    /// Which namespaces (tenants) may use the entry, and which of its features (`access:`);
    /// not set: every namespace, every feature.
    #[serde(default)]
    pub access: Option<EntryAccess>,
    /// Per-tenant bounds (`quotas:`).
    #[serde(default)]
    pub quotas: EntryQuotas,
}

/// `quotas:` of an entry.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryQuotas {
    /// Most instances of this entry one namespace may have (a new one beyond it waits with
    /// reason QuotaExceeded; replacing an existing one is never refused). Not set: no bound.
    #[serde(default)]
    pub max_proxies_per_namespace: Option<u32>,
    /// Most replicas a ProxyPool on this entry may ask for (its members, quarantined ones
    /// included, never exceed it). Default [`DEFAULT_MAX_POOL_REPLICAS`].
    #[serde(default = "default_max_pool_replicas")]
    pub max_pool_replicas: u32,
}

/// Default [`EntryQuotas::max_pool_replicas`].
// NB: a pool is a set of egress addresses for one purpose; a hundred is far more than one
// needs, and bounds what one `replicas:` typo creates on an entry's hosts.
pub const DEFAULT_MAX_POOL_REPLICAS: u32 = 100;

fn default_max_pool_replicas() -> u32 {
    DEFAULT_MAX_POOL_REPLICAS
}

impl Default for EntryQuotas {
    fn default() -> Self {
        Self {
            max_proxies_per_namespace: None,
            max_pool_replicas: DEFAULT_MAX_POOL_REPLICAS,
        }
    }
}

/// `access:` of an entry: who may use it, and who may use each of its features (a feature
/// not listed is granted to every namespace that may use the entry).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryAccess {
    /// Namespace names that may use the entry.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces whose labels match may use the entry (Kubernetes only).
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    /// Who may boot URL images (when `urlImages.enabled`).
    #[serde(default)]
    pub url_images: Option<Namespaces>,
    /// Whose proxies may reach `policy.allowedInternalCidrs` (for the others those networks
    /// stay denied).
    #[serde(default)]
    pub internal_cidrs: Option<Namespaces>,
    /// Who may get declared egress addresses from the hosts' address pools (allocated or
    /// pinned); the others are never placed on a host with a pool.
    #[serde(default)]
    pub address_pools: Option<Namespaces>,
}

impl EntryAccess {
    /// The namespaces that may use the entry.
    pub fn tenants(&self) -> Namespaces {
        Namespaces {
            namespaces: self.namespaces.clone(),
            namespace_selector: self.namespace_selector.clone(),
        }
    }
}

/// A feature of an entry granted per namespace ([`EntryAccess`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// URL images.
    UrlImages,
    /// `policy.allowedInternalCidrs`.
    InternalCidrs,
    /// Declared addresses from address pools.
    AddressPools,
}

impl LibvirtEntry {
    /// Whether namespace `ns` (labels `labels`, when known) may use this entry.
    pub fn admits(&self, ns: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.access
            .as_ref()
            .is_none_or(|a| a.tenants().admits(ns, labels))
    }

    /// Whether namespace `ns` may use `feature` of this entry (it must also be admitted).
    pub fn grants(
        &self,
        ns: &str,
        labels: Option<&BTreeMap<String, String>>,
        feature: Feature,
    ) -> bool {
        let Some(a) = &self.access else { return true };
        let g = match feature {
            Feature::UrlImages => &a.url_images,
            Feature::InternalCidrs => &a.internal_cidrs,
            Feature::AddressPools => &a.address_pools,
        };
        a.tenants().admits(ns, labels) && g.as_ref().is_none_or(|g| g.admits(ns, labels))
    }
}

impl HostConfig {
    /// Whether namespace `ns` may have proxies on this host: its `access` admits it (or it
    /// has none), and, when the host has an address pool, the pool's `namespaces` do (or it
    /// has none).
    pub fn admits(&self, ns: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.access.as_ref().is_none_or(|a| a.admits(ns, labels))
            && self
                .address_pool
                .as_ref()
                .and_then(|p| p.access.as_ref())
                .is_none_or(|a| a.admits(ns, labels))
    }
}

/// Default [`ProxyPolicy::min_client_prefix_v4`]: a /8 is the widest IPv4 client network.
pub const DEFAULT_MIN_CLIENT_PREFIX_V4: u8 = 8;
/// Default [`ProxyPolicy::min_client_prefix_v6`]: a /32 (an ISP allocation) is the widest
/// IPv6 client network.
pub const DEFAULT_MIN_CLIENT_PREFIX_V6: u8 = 32;
/// Default [`ProxyPolicy::min_password_length`] for every proxy with credentials.
// NB: 16 characters of the 65-character set are ~96 bits, beyond online guessing.
pub const DEFAULT_MIN_PASSWORD_LENGTH: u32 = 16;
/// Default (and widest allowed) [`ProxyPolicy::max_client_span_v4`]: a Proxy's client
/// networks admit at most as many IPv4 addresses as one /8, all entries together.
pub const DEFAULT_MAX_CLIENT_SPAN_V4: u8 = 8;
/// Default (and widest allowed) [`ProxyPolicy::max_client_span_v6`]: a Proxy's client
/// networks admit at most as many IPv6 /64s as one /32, all entries together.
pub const DEFAULT_MAX_CLIENT_SPAN_V6: u8 = 32;

/// The admin's policy for the proxies of an entry (`policy:` in the file). The operator
/// renders it into every guest's proxy configuration and firewall.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyPolicy {
    /// Shortest IPv4 prefix a Proxy may list in `allowedClientCidrs` (`/0` is never allowed).
    #[serde(rename = "minClientPrefixV4", default = "default_min_v4")]
    pub min_client_prefix_v4: u8,
    /// Shortest IPv6 prefix a Proxy may list in `allowedClientCidrs` (`/0` is never allowed).
    #[serde(rename = "minClientPrefixV6", default = "default_min_v6")]
    pub min_client_prefix_v6: u8,
    /// The most IPv4 client addresses a Proxy's `allowedClientCidrs` may admit together,
    /// as a prefix length: at most as many as one `/N` (8 to 32; default and widest 8). IPv6
    /// entries in the IPv4-mapped or -compatible ranges count as IPv4, and an IPv6 network
    /// containing those ranges admits every IPv4 client.
    #[serde(rename = "maxClientSpanV4", default = "default_span_v4")]
    pub max_client_span_v4: u8,
    /// The most IPv6 client networks a Proxy's `allowedClientCidrs` may admit together, in
    /// /64s, as a prefix length: at most as many as one `/N` (32 to 64; default and widest
    /// 32).
    #[serde(rename = "maxClientSpanV6", default = "default_span_v6")]
    pub max_client_span_v6: u8,
    /// Shortest password a Proxy with credentials may use (with or without client CIDRs).
    #[serde(default = "default_min_password")]
    pub min_password_length: u32,
    /// Destinations the entry's proxies may reach; empty lists restrict nothing.
    #[serde(default)]
    pub allowed_destinations: DestinationAllowlist,
    /// Internal networks (private, loopback, link-local, ..., and the host's own addresses;
    /// denied by default) the entry's proxies may reach nevertheless, e.g. an internal
    /// service. CIDR notation.
    #[serde(default)]
    pub allowed_internal_cidrs: Vec<String>,
    /// Whether each guest's NIC carries the entry's libvirt network filter, which rejects
    /// new connections from the guest to internal networks and the host (all but
    /// `allowedInternalCidrs`) even when the guest is compromised. On by default; the
    /// host needs libvirt's nwfilter driver and bridge netfilter
    /// (`net.bridge.bridge-nf-call-iptables=1`).
    #[serde(default = "default_true")]
    pub network_filter: bool,
}

fn default_true() -> bool {
    true
}

fn default_min_v4() -> u8 {
    DEFAULT_MIN_CLIENT_PREFIX_V4
}
fn default_min_v6() -> u8 {
    DEFAULT_MIN_CLIENT_PREFIX_V6
}
fn default_min_password() -> u32 {
    DEFAULT_MIN_PASSWORD_LENGTH
}
fn default_span_v4() -> u8 {
    DEFAULT_MAX_CLIENT_SPAN_V4
}
fn default_span_v6() -> u8 {
    DEFAULT_MAX_CLIENT_SPAN_V6
}

impl Default for ProxyPolicy {
    fn default() -> Self {
        Self {
            min_client_prefix_v4: DEFAULT_MIN_CLIENT_PREFIX_V4,
            min_client_prefix_v6: DEFAULT_MIN_CLIENT_PREFIX_V6,
            max_client_span_v4: DEFAULT_MAX_CLIENT_SPAN_V4,
            max_client_span_v6: DEFAULT_MAX_CLIENT_SPAN_V6,
            min_password_length: DEFAULT_MIN_PASSWORD_LENGTH,
            allowed_destinations: DestinationAllowlist::default(),
            allowed_internal_cidrs: Vec::new(),
            network_filter: true,
        }
    }
}

/// An allowlist of destinations: each non-empty list must match (the requested domain, the
/// address connected to, the port).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationAllowlist {
    /// Domains: `example.com` (exactly) or `*.example.com` (any subdomain).
    #[serde(default)]
    pub domains: Vec<String>,
    /// Networks (CIDR notation) of the addresses connected to.
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// TCP ports.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// Default instance sizes of an entry (`defaults:` in the file).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SizeDefaults {
    /// Root disk, GiB.
    #[serde(rename = "diskGiB", default = "default_disk_gib")]
    pub disk_gib: u64,
    /// Memory, MiB.
    #[serde(rename = "memoryMiB", default = "default_memory_mib")]
    pub memory_mib: u64,
    /// Virtual CPUs.
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
}

// NB: a forward proxy needs little: 10 GiB holds a cloud image plus logs, 512 MiB and one vCPU
// run tinyproxy/squid for a handful of clients.
fn default_disk_gib() -> u64 {
    10
}
fn default_memory_mib() -> u64 {
    512
}
fn default_vcpus() -> u32 {
    1
}

impl Default for SizeDefaults {
    fn default() -> Self {
        Self {
            disk_gib: default_disk_gib(),
            memory_mib: default_memory_mib(),
            vcpus: default_vcpus(),
        }
    }
}

/// Maximum instance sizes of an entry (`limits:` in the file).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SizeLimits {
    /// Root disk, GiB.
    #[serde(rename = "diskGiB", default = "limit_disk_gib")]
    pub disk_gib: u64,
    /// Memory, MiB.
    #[serde(rename = "memoryMiB", default = "limit_memory_mib")]
    pub memory_mib: u64,
    /// Virtual CPUs.
    #[serde(default = "limit_vcpus")]
    pub vcpus: u32,
    /// Most published bases of the entry in one host's pool; a new image (or a new digest)
    /// beyond it is refused, QuotaExceeded, before anything is downloaded.
    #[serde(rename = "maxBases", default = "limit_max_bases")]
    pub max_bases: u32,
    /// Most of those bases that come from URL images (each distinct URL or digest is one).
    #[serde(rename = "maxUrlImages", default = "limit_max_url_images")]
    pub max_url_images: u32,
    /// Minutes a base must have been unused (no domain or volume on its host uses it)
    /// before the operator's GC removes it; 0 removes it at the first pass that finds it
    /// unused.
    #[serde(
        rename = "unusedBaseGraceMinutes",
        default = "limit_unused_base_grace_minutes"
    )]
    pub unused_base_grace_minutes: u64,
}

impl SizeLimits {
    /// [`unused_base_grace_minutes`](Self::unused_base_grace_minutes) as a duration.
    pub fn unused_base_grace(&self) -> Duration {
        Duration::from_secs(self.unused_base_grace_minutes.saturating_mul(60))
    }
}

// NB: generous for a proxy yet small enough that one bad spec cannot take a whole host.
fn limit_disk_gib() -> u64 {
    100
}
fn limit_memory_mib() -> u64 {
    8192
}
fn limit_vcpus() -> u32 {
    8
}
// NB: a catalogue holds a handful of images, each kept under one or two digests while a
// new release rolls out; 16 bases of a few GiB each bound the pool space one entry can
// take. URL images are tenant-chosen: 4 leaves room for a test image and its updates.
fn limit_max_bases() -> u32 {
    16
}
fn limit_max_url_images() -> u32 {
    4
}
/// [`SizeLimits::unused_base_grace_minutes`] when not set.
// NB: a base goes unused when the last Proxy on it is replaced (a new image digest, a rolling
// template change) or deleted; an hour covers a rollout and a quick rollback to the old
// image without a second download, and frees the space the same day.
pub const DEFAULT_UNUSED_BASE_GRACE_MINUTES: u64 = 60;
fn limit_unused_base_grace_minutes() -> u64 {
    DEFAULT_UNUSED_BASE_GRACE_MINUTES
}

impl Default for SizeLimits {
    fn default() -> Self {
        Self {
            disk_gib: limit_disk_gib(),
            memory_mib: limit_memory_mib(),
            vcpus: limit_vcpus(),
            max_bases: limit_max_bases(),
            max_url_images: limit_max_url_images(),
            unused_base_grace_minutes: limit_unused_base_grace_minutes(),
        }
    }
}

fn default_max_image_bytes() -> u64 {
    // NB: cloud images are 300 MiB–2 GiB; 8 GiB bounds a runaway download.
    8 << 30
}

/// `virtType` per host.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum VirtType {
    /// Use KVM only if the host's capabilities say it works, else TCG.
    #[default]
    Auto,
    /// KVM only.
    Kvm,
    /// TCG (software emulation).
    Qemu,
}

/// One libvirt host.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostConfig {
    /// Host name within the entry (used in providerIDs).
    pub name: String,
    /// `host[:port]` of its sshd.
    pub address: String,
    /// SSH user.
    #[serde(default = "default_user")]
    pub user: String,
    /// libvirt socket path on the host.
    #[serde(default = "default_socket")]
    pub socket: String,
    /// Storage pool for bases, overlays and seeds.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Bridge to attach NICs to (exclusive with `network`).
    #[serde(default)]
    pub bridge: Option<String>,
    /// libvirt network to attach NICs to (exclusive with `bridge`).
    #[serde(default)]
    pub network: Option<String>,
    /// Virtualisation type.
    #[serde(default)]
    pub virt_type: VirtType,
    /// Space kept free in the pool, GiB ([`DEFAULT_POOL_RESERVE_GIB`] when not set).
    #[serde(default = "default_pool_reserve_gib", alias = "poolReserveGiB")]
    pub pool_reserve_gib: u64,
    /// SSH private key file.
    #[serde(default)]
    pub ssh_key_file: Option<PathBuf>,
    /// known_hosts file.
    #[serde(default)]
    pub known_hosts_file: Option<PathBuf>,
    /// Concurrent operations allowed on this host.
    #[serde(default = "default_host_concurrency")]
    pub max_concurrent: u32,
    /// Networks (CIDR notation) the guests' addresses on this host lie in: one string or a
    /// list. A guest address outside them is never used (nor probed). With `network`, it
    /// narrows the network's own subnets; on a bridge or direct-attach host it is the only
    /// bound (without it only the host's ARP answers for the guest's MAC are used).
    #[serde(default, deserialize_with = "one_or_many")]
    pub guest_cidr: Vec<String>,
    /// The host's own addresses besides the one in `address` (e.g. its public address, or
    /// every address of a host reached as `local`): guests may never connect to them. The
    /// address in `address` and what its name resolves to are denied without being listed.
    #[serde(default)]
    pub host_addresses: Vec<String>,
    /// What the host may give this entry's guests (`capacity:`): memory and vCPUs, summed
    /// over the entry's proxies placed on it; a host that a new proxy would take past either
    /// is skipped by placement. Not set: the memory and CPUs its last check reported (vCPUs
    /// counted up to [`DEFAULT_VCPU_OVERCOMMIT`] per CPU), or no bound before its first check.
    #[serde(default)]
    pub capacity: HostCapacity,
    /// Which namespaces may have proxies on this host (`access:`, within the entry's);
    /// not set: every namespace the entry admits.
    #[serde(default)]
    pub access: Option<Namespaces>,
    /// Declared egress addresses this host's guests may be given (`addressPool:`): the
    /// guest-side prefix, gateway and ranges per family, and DNS. Validated at load; not set
    /// means the guests take what the bridge or network hands out.
    #[serde(default)]
    pub address_pool: Option<super::address_pool::AddressPool>,
    /// Host maintenance (`maintenance:`): `None` (the default) takes new proxies as its health
    /// allows; `Cordon` takes no new proxies and leaves the ones there alone; `Drain` takes no
    /// new proxies and moves the ones there elsewhere (pool members within their pool's
    /// budget, unpinned Proxies re-placed; Proxies pinned to it stay and are reported).
    #[serde(default)]
    pub maintenance: Maintenance,
    /// The L2 segment the host's guests sit on (`segment:`): hosts of one entry naming the same
    /// segment share one address pool (their `addressPool`s must be identical), so a proxy
    /// replaced on another host of the segment can keep its address. Not set: the host is a
    /// segment of its own.
    #[serde(default)]
    pub segment: Option<String>,
    /// How to power the host off when it is dead (`fence:`), so that the addresses its guests
    /// held may move to another host of its segment. Not set: only the host answering again
    /// (its guests gone) frees them.
    #[serde(default)]
    pub fence: Option<Fence>,
}

/// `fence:` of a host: a command that powers it off (e.g. through its BMC).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Fence {
    /// The program and its arguments (no shell); exit status 0 means the host is off.
    pub command: Vec<String>,
    /// How long the command may run; it is killed after that, and the host is not fenced.
    #[serde(default = "default_fence_timeout", with = "super::secs")]
    pub timeout: Duration,
}

/// How long a fence command may run when `fence.timeout` is not set.
pub const DEFAULT_FENCE_TIMEOUT: Duration = Duration::from_secs(30);
/// Shortest `fence.timeout` accepted.
pub const MIN_FENCE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest `fence.timeout` accepted.
pub const MAX_FENCE_TIMEOUT: Duration = Duration::from_secs(600);

fn default_fence_timeout() -> Duration {
    DEFAULT_FENCE_TIMEOUT
}

impl HostConfig {
    /// The segment the host belongs to: its `segment`, else its own name (a segment of one).
    pub fn segment_key(&self) -> String {
        match &self.segment {
            Some(s) => format!("segment:{s}"),
            None => format!("host:{}", self.name),
        }
    }
}

/// `maintenance:` of a host: whether it is taken out of service.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
pub enum Maintenance {
    /// In service.
    #[default]
    None,
    /// No new proxies; the ones there stay.
    Cordon,
    /// No new proxies; the ones there are moved elsewhere.
    Drain,
}

impl Maintenance {
    /// Whether the host takes new proxies as far as maintenance goes.
    pub fn accepts_placements(self) -> bool {
        self == Self::None
    }

    /// The config value: `None`, `Cordon` or `Drain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Cordon => "Cordon",
            Self::Drain => "Drain",
        }
    }
}

/// vCPUs placed per host CPU when a host's `capacity.vcpus` is not set.
// NB: a forward proxy idles most of the time; 4 vCPUs per CPU is the usual overcommit of a
// general-purpose hypervisor and still bounds what one tenant can pile on a host.
pub const DEFAULT_VCPU_OVERCOMMIT: u32 = 4;

/// `capacity:` of a host (each not set: from its last check, see [`HostConfig::capacity`]).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct HostCapacity {
    /// Memory for this entry's guests, MiB.
    #[serde(rename = "memoryMiB", default)]
    pub memory_mib: Option<u64>,
    /// vCPUs for this entry's guests.
    #[serde(default)]
    pub vcpus: Option<u32>,
}

/// Reads one string or a list of strings (`guestCidr: 10.0.0.0/24` or `[a, b]`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::{self, SeqAccess, Visitor};

    struct OneOrMany;

    impl<'de> Visitor<'de> for OneOrMany {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a CIDR or a list of CIDRs (e.g. 10.0.0.0/24 or [10.0.0.0/24, fd00::/64])")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(vec![v.to_owned()])
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }

    d.deserialize_any(OneOrMany)
}

/// `poolReserveGiB` of a host that sets none.
// NB: never 0. The space check runs at create, but overlays keep growing as their guests
// write, and a pool that fills pauses every guest on it with an I/O error and, mid-upload, was
// seen crashing libvirtd 11.3 (`double free or corruption` right after ENOSPC) — on every retry
// into the same nearly full pool. 2 GiB is the write slack of a few guests between checks plus
// an upload's qcow2 metadata, and a small share of any pool big enough to hold a base image
// (0.3–2 GiB) and a few 10 GiB overlays. Set 0 explicitly to use the pool to the last byte.
pub const DEFAULT_POOL_RESERVE_GIB: u64 = 2;

fn default_pool_reserve_gib() -> u64 {
    DEFAULT_POOL_RESERVE_GIB
}
fn default_user() -> String {
    "root".into()
}
fn default_socket() -> String {
    DEFAULT_SOCKET.into()
}
fn default_pool() -> String {
    "default".into()
}
fn default_host_concurrency() -> u32 {
    // NB: one image transfer plus a few control calls; a frozen host can pin at most this many
    // workers (finding H1's blast radius).
    4
}

/// Disk image format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// qcow2.
    #[default]
    Qcow2,
    /// raw.
    Raw,
}

impl ImageFormat {
    /// The libvirt/qemu format name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qcow2 => "qcow2",
            Self::Raw => "raw",
        }
    }
}

/// Firmware a guest image needs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// Legacy BIOS.
    #[default]
    Bios,
    /// UEFI.
    Uefi,
}

/// One catalogue entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSpec {
    /// Where to download it.
    pub url: String,
    /// Expected sha256 (lowercase hex); required for http:// URLs.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Declared format (verified against the bytes).
    #[serde(default)]
    pub format: ImageFormat,
    /// Firmware it boots with.
    #[serde(default)]
    pub firmware: Firmware,
    /// A PEM file of extra CA certificates trusted (besides the system's roots) for this
    /// image's https downloads and their redirects, for a mirror behind a private CA.
    /// Absolute path; read once per provider, on the first download that needs it.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// URL images policy (off unless enabled).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlImagePolicy {
    /// Whether `image` may be a URL.
    #[serde(default)]
    pub enabled: bool,
    /// Host names allowed.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// Guest settings.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GuestSettings {
    /// Install and enable qemu-guest-agent if missing.
    #[serde(default = "yes")]
    pub install_guest_agent: bool,
    /// cloud-init vendor-data (must be `#cloud-config` or a script cloud-init recognises).
    #[serde(default)]
    pub vendor_data: Option<String>,
}

fn yes() -> bool {
    true
}

impl Default for GuestSettings {
    fn default() -> Self {
        Self {
            install_guest_agent: true,
            vendor_data: None,
        }
    }
}

/// Timeouts of the entry: whole seconds (`30`) or a duration string (`"30s"`, `"5m"`) in
/// the file.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    /// SSH dial.
    #[serde(default = "d10", with = "super::secs")]
    pub dial: Duration,
    /// One libvirt call.
    #[serde(default = "d60", with = "super::secs")]
    pub call: Duration,
    /// A whole image import.
    #[serde(default = "d1800", with = "super::secs")]
    pub image_import: Duration,
    /// Waiting for a started domain to be running.
    #[serde(default = "d60", with = "super::secs")]
    pub start: Duration,
    /// One call of a host check (the periodic probe of each host): how long the first check
    /// after a host froze waits before the host's row reads `Timeout`.
    #[serde(default = "d10", with = "super::secs")]
    pub check: Duration,
}

fn d10() -> Duration {
    Duration::from_secs(10)
}
fn d60() -> Duration {
    Duration::from_secs(60)
}
fn d1800() -> Duration {
    Duration::from_secs(1800)
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            dial: d10(),
            call: d60(),
            image_import: d1800(),
            start: d60(),
            check: d10(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn timeouts_accept_whole_seconds_and_duration_strings_and_refuse_anything_else() {
        let t: Timeouts = serde_json::from_str(
            r#"{"dial": 15, "call": "90s", "imageImport": "1h30m", "start": "5m", "check": "4s"}"#,
        )
        .unwrap();
        assert_eq!(t.check, Duration::from_secs(4));
        assert_eq!(t.dial, Duration::from_secs(15));
        assert_eq!(t.call, Duration::from_secs(90));
        assert_eq!(t.image_import, Duration::from_secs(5400));
        assert_eq!(t.start, Duration::from_secs(300));
        let t: Timeouts = serde_json::from_str(r#"{"dial": "20"}"#).unwrap();
        assert_eq!(t.dial, Duration::from_secs(20));
        for bad in [
            r#""""#,
            r#""5x""#,
            r#""m""#,
            r#""5m3""#,
            "-5",
            "1.5",
            r#""99999999999999999999h""#,
        ] {
            let r: Result<Timeouts, _> = serde_json::from_str(&format!(r#"{{"dial": {bad}}}"#));
            assert!(r.is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_host_that_sets_no_pool_reserve_keeps_two_gib_free() {
        let h: HostConfig =
            serde_json::from_str(r#"{"name": "h1", "address": "h1.example:22"}"#).unwrap();
        assert_eq!(h.pool_reserve_gib, 2);
        assert_eq!(DEFAULT_POOL_RESERVE_GIB, 2);
        let zero: HostConfig = serde_json::from_str(
            r#"{"name": "h1", "address": "h1.example:22", "poolReserveGiB": 0}"#,
        )
        .unwrap();
        assert_eq!(zero.pool_reserve_gib, 0, "0 stays possible when set");
    }

    #[test]
    fn guest_cidr_is_one_cidr_or_a_list_and_empty_by_default() {
        let h: HostConfig = serde_json::from_str(r#"{"name": "h", "address": "a"}"#).unwrap();
        assert!(h.guest_cidr.is_empty());
        let one: HostConfig =
            serde_json::from_str(r#"{"name": "h", "address": "a", "guestCidr": "10.0.0.0/24"}"#)
                .unwrap();
        assert_eq!(one.guest_cidr, ["10.0.0.0/24"]);
        let list: HostConfig = serde_json::from_str(
            r#"{"name": "h", "address": "a", "guestCidr": ["10.0.0.0/24", "fd00::/64"]}"#,
        )
        .unwrap();
        assert_eq!(list.guest_cidr, ["10.0.0.0/24", "fd00::/64"]);
        let bad: Result<HostConfig, _> =
            serde_json::from_str(r#"{"name": "h", "address": "a", "guestCidr": 8}"#);
        assert!(bad.is_err());
    }
}
