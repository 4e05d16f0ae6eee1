//! The plan's vocabulary: what an item is ([`ItemKind`]), why it is kept or deleted
//! ([`Reason`], each with a stable rule label), what a deletion calls ([`Target`]), and one
//! decision ([`Planned`]).
//!
//! Guarantees: plain data, no I/O; rule labels and kind labels are stable (JSON, metrics).

use std::fmt;

use egress_provider::ProxyUid;
use egress_provider::model::{OwnedVolume, VolumeKind};
use serde::Serialize;

/// What an item of the report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemKind {
    /// A domain.
    Instance,
    /// A Proxy's root overlay volume.
    Overlay,
    /// A Proxy's seed volume.
    Seed,
    /// A temporary image upload volume.
    Part,
    /// A cached base image (with its marker and data volume).
    Base,
    /// The entry as a whole (a listing failed).
    Entry,
}

impl ItemKind {
    /// A stable lowercase label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Instance => "instance",
            Self::Overlay => "overlay",
            Self::Seed => "seed",
            Self::Part => "part",
            Self::Base => "base",
            Self::Entry => "entry",
        }
    }
}

impl From<VolumeKind> for ItemKind {
    fn from(k: VolumeKind) -> Self {
        match k {
            VolumeKind::Overlay => Self::Overlay,
            VolumeKind::Seed => Self::Seed,
            VolumeKind::Part => Self::Part,
        }
    }
}

/// Why [`plan`](super::plan()) decided what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The UID belongs to a live Proxy.
    Live,
    /// The domain's name is not the one derived from its mark's UID (finding E2).
    NameMismatch {
        /// The name the UID derives.
        expected: String,
    },
    /// Younger than the minimum age (a future creation time counts as zero).
    Young {
        /// Age, whole seconds.
        age_secs: u64,
        /// The minimum, whole seconds.
        min_secs: u64,
    },
    /// An instance of no live Proxy, old enough.
    OrphanInstance,
    /// An overlay or seed of no listed domain, while a domain with the name its UID derives
    /// exists on the host (one whose mark is not valid for us, e.g. malformed): it may be
    /// that domain's disk, and the provider's last check refuses it, so it is kept.
    DomainExists {
        /// The domain's name.
        domain: String,
    },
    /// An overlay or seed of no live Proxy and no domain.
    OrphanVolume,
    /// A temporary upload older than the import deadline plus the minimum age.
    StalePart,
    /// The name is also of another configured entry's scheme, so whose it is is unclear.
    Ambiguous {
        /// The other entry.
        other: String,
    },
    /// The instance list failed: nothing of the entry is deleted (finding M15).
    InstanceListFailed(String),
    /// The volume list failed: no volume of the entry is deleted (finding M15).
    VolumeListFailed(String),
}

impl Reason {
    /// A stable label (JSON, metrics).
    pub fn rule(&self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::NameMismatch { .. } => "name-mismatch",
            Self::Young { .. } => "young",
            Self::OrphanInstance => "orphan-instance",
            Self::DomainExists { .. } => "domain-exists",
            Self::OrphanVolume => "orphan-volume",
            Self::StalePart => "stale-part",
            Self::Ambiguous { .. } => "ambiguous",
            Self::InstanceListFailed(_) => "instance-list-failed",
            Self::VolumeListFailed(_) => "volume-list-failed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Live => f.write_str("a live Proxy has this UID"),
            Self::NameMismatch { expected } => write!(
                f,
                "the domain name is not {expected}, the name derived from its mark's UID; never \
                 collected"
            ),
            Self::Young { age_secs, min_secs } => {
                write!(
                    f,
                    "younger than the minimum age ({age_secs}s < {min_secs}s)"
                )
            }
            Self::OrphanInstance => f.write_str(
                "no live Proxy has this UID and it is older than the minimum age; its overlay \
                 and seed go with it",
            ),
            Self::DomainExists { domain } => write!(
                f,
                "domain {domain} exists on the host (its mark is not a valid one of ours), so \
                 this may be its disk; kept while it exists"
            ),
            Self::OrphanVolume => {
                f.write_str("no live Proxy has this UID and no domain of ours carries it")
            }
            Self::StalePart => f.write_str(
                "temporary image upload older than the import deadline plus the minimum age",
            ),
            Self::Ambiguous { other } => {
                write!(f, "the name is also of entry {other}'s naming scheme")
            }
            Self::InstanceListFailed(m) => write!(
                f,
                "listing instances failed, so nothing of this entry is collected: {m}"
            ),
            Self::VolumeListFailed(m) => write!(
                f,
                "listing volumes failed, so no volume of this entry is collected: {m}"
            ),
        }
    }
}

/// What a planned deletion calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `provider.delete(host, uid)`.
    Instance {
        /// Host.
        host: String,
        /// The UID from the instance's mark.
        uid: ProxyUid,
    },
    /// `provider.delete_orphan_volume(volume)`.
    Volume(OwnedVolume),
}

/// One decision of [`plan`](super::plan()).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Provider entry.
    pub entry: String,
    /// Host (`*` for an entry-wide item).
    pub host: String,
    /// Domain or volume name (`*` for an entry-wide item).
    pub name: String,
    /// What it is.
    pub kind: ItemKind,
    /// The UID, when the item has one.
    pub uid: Option<ProxyUid>,
    /// What to delete; `None` means keep.
    pub delete: Option<Target>,
    /// Why.
    pub reason: Reason,
}
