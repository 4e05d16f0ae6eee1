//! What the controller asks a provider for and what it gets back. No Kubernetes types.
//!
//! Guarantees: a [`ProviderId`] always names the provider entry, the host and the instance,
//! and round-trips through its string form; UIDs are canonical lowercase UUIDs.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::error::ProviderError;

/// A Proxy's UID in canonical form (lowercase, hyphenated UUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyUid(pub uuid::Uuid);

impl ProxyUid {
    /// Parses strictly: exactly the canonical 36-character lowercase hyphenated form, with no
    /// padding (finding E2: a padded or re-cased UID is not a UID of ours).
    pub fn parse_strict(s: &str) -> Option<Self> {
        if s.len() != 36 {
            return None;
        }
        let u = uuid::Uuid::try_parse(s).ok()?;
        // Round-trip check: only the canonical form is accepted.
        if u.hyphenated().to_string() != s {
            return None;
        }
        Some(Self(u))
    }

    /// The canonical lowercase form.
    pub fn canonical(&self) -> String {
        self.0.hyphenated().to_string()
    }

    /// The UID without hyphens (32 lowercase hex digits), used in names.
    pub fn simple(&self) -> String {
        self.0.simple().to_string()
    }
}

impl fmt::Display for ProxyUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// Identifies an instance: `libvirt://<entry>/<host>/<domain name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderId {
    /// Provider entry name.
    pub entry: String,
    /// Host name (as configured in the entry).
    pub host: String,
    /// Domain name on that host.
    pub name: String,
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "libvirt://{}/{}/{}", self.entry, self.host, self.name)
    }
}

impl FromStr for ProviderId {
    type Err = ProviderError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ProviderError::permanent(format!(
                "invalid providerID {s:?}: expected libvirt://ENTRY/HOST/NAME"
            ))
        };
        let rest = s.strip_prefix("libvirt://").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let (Some(entry), Some(host), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if entry.is_empty() || host.is_empty() || name.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            entry: entry.into(),
            host: host.into(),
            name: name.into(),
        })
    }
}

/// What the controller asks the provider to create. `Debug` shows the user-data's size
/// only: it carries the proxy's credentials in plain text.
#[derive(Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The Proxy's UID.
    pub uid: ProxyUid,
    /// The Proxy's namespace/name, for descriptions only.
    pub display_name: String,
    /// Host to place on (the controller has already chosen it).
    pub host: String,
    /// Catalogue key, or an `http(s)://` URL when URL images are enabled.
    pub image: String,
    /// Root disk size in GiB.
    pub disk_gib: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// cloud-init user-data (already rendered by the caller; carries the proxy config).
    pub user_data: String,
    /// Egress addresses the Proxy pins (`spec.egress.address`), at most one per family. A
    /// provider with an address pool for the host gives exactly these or fails Permanent;
    /// empty means "allocate from the host's pool when it has one".
    pub pinned_egress: Vec<IpAddr>,
    /// Addresses of the host's pool an allocation for this Proxy (when it pins none) must
    /// not take: pinned by other Proxies, or held for another namespace after their
    /// instance went away.
    pub reserved: Vec<IpAddr>,
    /// The addresses the Proxy's previous instance held, when its instance is re-created in
    /// place (same host, a stopped instance replaced) and it pins none: a provider with an
    /// address pool for the host gives these again when they are still free for this Proxy
    /// (not held by another, not reserved, not retired, inside the pool, one per family of
    /// the pool), and otherwise allocates as if this were empty. Never a reason to fail.
    pub prefer_egress: Vec<IpAddr>,
    /// Whether the guest may reach the entry's `policy.allowedInternalCidrs` (its namespace
    /// is granted them): the host's filter lifts them only then.
    pub lift_internal: bool,
    /// The Proxy this one replaces, when its driver vouches that both belong to one pool of
    /// one namespace and the replaced one was lost with its host (`rotation.egressAddress:
    /// Keep`): an instance of the replaced Proxy holding a pinned address on another host
    /// of the segment counts as a copy of this one, so that host may be fenced to free it.
    pub replaces: Option<ProxyUid>,
}

impl std::fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateRequest")
            .field("uid", &self.uid)
            .field("display_name", &self.display_name)
            .field("host", &self.host)
            .field("image", &self.image)
            .field("disk_gib", &self.disk_gib)
            .field("memory_mib", &self.memory_mib)
            .field("vcpus", &self.vcpus)
            .field("pinned_egress", &self.pinned_egress)
            .field("prefer_egress", &self.prefer_egress)
            .field("replaces", &self.replaces)
            .field(
                "user_data",
                &format_args!("<{} bytes, redacted>", self.user_data.len()),
            )
            .finish()
    }
}

/// An instance's lifecycle state as the provider observes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    /// Defined/started but not yet reporting an address.
    Provisioning,
    /// Running with a known address.
    Running,
    /// Paused or suspended; never destroyed for it (finding M1). The libvirt reason is kept.
    Paused {
        /// Why (e.g. "I/O error: host storage full").
        reason: String,
    },
    /// Shut off or crashed.
    Stopped {
        /// Why.
        reason: String,
    },
}

/// An instance as observed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Where it lives.
    pub id: ProviderId,
    /// The Proxy UID from its verified mark.
    pub uid: ProxyUid,
    /// State.
    pub state: InstanceState,
    /// The address of our NIC, when known.
    pub ip: Option<IpAddr>,
    /// The NIC's MAC address.
    pub mac: String,
    /// The declared egress addresses allocated to this instance from its host's address
    /// pool (at most one per family, as its mark records them); empty when the host has no
    /// pool. The health check expects exactly these as the observed egress.
    pub egress: Vec<IpAddr>,
    /// When no address is known and a source of it failed: each failed source with its
    /// error (and each source not consulted with why), for the Proxy's condition; `None`
    /// otherwise.
    pub address_note: Option<String>,
}

/// An instance found by listing, with its verified mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedInstance {
    /// Where it lives.
    pub id: ProviderId,
    /// The UID from the mark.
    pub uid: ProxyUid,
    /// Creation time from the mark, clamped to now (finding L9).
    pub created_at: SystemTime,
    /// Whether the domain name equals the name derived from the mark's UID (GC requires it).
    pub name_matches_uid: bool,
}

/// One host's health as a provider sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostReport {
    /// Host name from the entry.
    pub host: String,
    /// Overall state.
    pub state: HostState,
    /// Latency of the probe call only (finding L15).
    pub latency: Option<Duration>,
    /// The host's hostname (truncated).
    pub hostname: Option<String>,
    /// libvirt version as "major.minor.micro".
    pub libvirt_version: Option<String>,
    /// Virt types that were found usable.
    pub virt_types: Vec<String>,
    /// Whether a UEFI loader is available.
    pub uefi: bool,
    /// Free pool space after the reserve, in bytes.
    pub pool_free_bytes: Option<u64>,
    /// Missing capabilities (bridge, network, firmware...), named.
    pub missing: Vec<String>,
    /// Last error (redacted, truncated).
    pub error: Option<String>,
    /// Usage of the host's declared-address pool, one per family it has; empty without a pool.
    pub addresses: Vec<AddressUsage>,
}

impl HostReport {
    /// Why the host takes no new proxies, in a few words, when it is not Ready: what is
    /// missing (`; `-joined), else its error (without a leading `host NAME: `), else its
    /// state. `None` for a Ready host.
    pub fn reason(&self) -> Option<String> {
        if self.state == HostState::Ready {
            return None;
        }
        if !self.missing.is_empty() {
            return Some(format!("missing {}", self.missing.join("; ")));
        }
        let own = format!("host {}: ", self.host);
        Some(match &self.error {
            Some(e) => e.strip_prefix(&own).unwrap_or(e).to_owned(),
            None => format!("{:?}", self.state),
        })
    }
}

/// How much of one family of a host's address pool is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressUsage {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// Allocatable addresses in the pool's ranges.
    pub size: u128,
    /// Addresses held by instances (as far as this process knows).
    pub held: u64,
    /// Addresses not held but retired (after a blocklist listing): not handed out either.
    pub retired: u64,
}

/// A host's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// Reachable and usable.
    Ready,
    /// Could not connect.
    Unreachable,
    /// The host's own call hit its deadline (finding L16).
    Timeout,
    /// Reachable but something required is missing or low.
    Degraded,
}

/// Progress of a long transfer, for the CLI and metrics.
pub trait Progress: Send + Sync {
    /// Called as bytes are transferred; `total` when known.
    fn update(&self, done: u64, total: Option<u64>);
}

/// A progress sink that ignores updates.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _: u64, _: Option<u64>) {}
}

/// What kind of volume of our naming scheme an [`OwnedVolume`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumeKind {
    /// A Proxy's root overlay (`ep-<entry>-<uid>-root.qcow2`).
    Overlay,
    /// A Proxy's cloud-init seed (`ep-<entry>-<uid>-seed.iso`).
    Seed,
    /// A temporary image upload left by an import (`...part-<unix>-<random>`); never a base.
    Part,
}

impl VolumeKind {
    /// A stable lowercase label (reports, metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overlay => "overlay",
            Self::Seed => "seed",
            Self::Part => "part",
        }
    }
}

impl fmt::Display for VolumeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A volume of this entry's naming scheme found by listing a host's pool. Only overlays,
/// seeds and temporary parts are ever listed: never a base, a marker, or a foreign name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedVolume {
    /// Provider entry.
    pub entry: String,
    /// Host name (as configured in the entry).
    pub host: String,
    /// Volume name in the host's pool.
    pub name: String,
    /// What it is.
    pub kind: VolumeKind,
    /// The Proxy UID its name encodes (canonical; `Some` exactly for overlays and seeds).
    pub uid: Option<ProxyUid>,
    /// The time its age is measured from, when known, never in the future: for a part, the
    /// creation time in its name; for an overlay or seed with no domain named for its UID, its
    /// last change (the later of mtime and ctime) when the host reports timestamps; else
    /// `None`.
    pub age_since: Option<SystemTime>,
    /// For an overlay or seed: whether a domain with the name derived from its UID existed on
    /// the host when it was listed — any domain, ours or not (e.g. one whose mark is
    /// malformed). [`delete_orphan_volume`](crate::Provider::delete_orphan_volume) refuses
    /// such a volume, so a collector's plan keeps it too. `false` for a part.
    pub domain_exists: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_parse_only_in_canonical_hyphenated_form() {
        // finding: E2
        let ok = "0f8fad5b-d9cb-469f-a165-70867728950e";
        assert_eq!(ProxyUid::parse_strict(ok).unwrap().canonical(), ok);
        for bad in [
            ok.to_uppercase().as_str(),
            " 0f8fad5b-d9cb-469f-a165-70867728950e",
            "0f8fad5b-d9cb-469f-a165-70867728950e\n",
            "0f8fad5bd9cb469fa16570867728950e",
            "{0f8fad5b-d9cb-469f-a165-70867728950e}",
            "urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
            "",
        ] {
            assert!(ProxyUid::parse_strict(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn provider_ids_round_trip_and_reject_garbage() {
        let id: ProviderId = "libvirt://home/h1/ep-home-abc".parse().unwrap();
        assert_eq!(id.to_string(), "libvirt://home/h1/ep-home-abc");
        for bad in [
            "",
            "kvm://a/b/c",
            "libvirt://a/b",
            "libvirt://a//c",
            "libvirt://a/b/c/d",
        ] {
            assert!(bad.parse::<ProviderId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn create_request_debug_output_never_prints_the_user_data_and_its_password() {
        let r = CreateRequest {
            uid: ProxyUid(uuid::Uuid::nil()),
            display_name: "default/p1".into(),
            host: "h1".into(),
            image: "debian-12".into(),
            disk_gib: 4,
            memory_mib: 512,
            vcpus: 1,
            user_data: "BasicAuth alice s3cr3t-pw-16chars\n".into(),
            pinned_egress: Vec::new(),
            reserved: Vec::new(),
            prefer_egress: Vec::new(),
            lift_internal: true,
            replaces: None,
        };
        let d = format!("{r:?}");
        assert!(!d.contains("s3cr3t"), "{d}");
        assert!(d.contains("default/p1") && d.contains("34 bytes"), "{d}");
        let d = format!("{r:#?}");
        assert!(!d.contains("s3cr3t"), "{d}");
    }
}
