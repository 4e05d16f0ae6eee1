//! Orphan garbage collection (issue 4, item 4): instances and volumes of our naming scheme
//! that no live Proxy owns any more, found by listing every provider entry and removed
//! through the provider's own UID-checked paths.
//!
//! The pipeline: list (network, bounded by [`LIST_BUDGET`]) → [`plan`] (pure, no I/O) →
//! execute (network, each deletion bounded by [`DELETE_BUDGET`]) → [`GcReport`].
//!
//! Guarantees:
//! - an entry's instances are swept only from a complete list: if `list_owned` fails or
//!   times out, nothing of that entry is deleted and the report says why (finding M15); its
//!   volumes are swept only when both its instance list and its volume list are complete;
//! - an instance is deleted only when its mark parsed strictly (the provider lists nothing
//!   else), its UID is not in the live set, its domain name equals the name derived from the
//!   UID (finding E2), and it is at least [`GcSettings::min_age`] old (a creation time in the
//!   future counts as age zero); the deletion is `provider.delete(host, uid)`, which
//!   re-verifies the mark (M2) and takes the instance's overlay and seed with it;
//! - an overlay or seed is deleted only when its UID is not live, no listed domain of the
//!   entry on that host carries its UID or is named for it, its name is not also of another
//!   configured entry's scheme, and (when its age is known) it is old enough; the provider
//!   re-checks right before deleting that no domain named for its UID exists (M3, M2);
//! - a temporary image upload is deleted only when older than the entry's import deadline
//!   plus the minimum age, so a running import never loses its part;
//! - with [`GcSettings::dry_run`] nothing is deleted; the report says what would go and why;
//! - the live set is taken by the caller before listing: a Proxy created after that is
//!   protected by the minimum age.

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::names;
use egress_provider::libvirt::ops::orphans::parse_volume_name;
use egress_provider::model::{OwnedInstance, OwnedVolume, VolumeKind};
use serde::Serialize;

use crate::providers::Providers;

/// Default [`GcSettings::min_age`].
// NB: an instance becomes visible to the driver's live set within one watch event (seconds),
// and a create that raced a GC pass needs at most the reconcile deadline plus the start wait
// (minutes) to be seen; 10 minutes covers both with margin, and an orphan that lingers 10
// minutes longer costs only its disk and memory.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(600);

/// Longest one entry's listing (instances, then volumes, each) may take.
// NB: a listing is one domain list plus one pipelined mark read per domain per host, every
// call under the entry's call deadline (60 s by default); 1000 domains over an SSH link at
// 4 calls in flight and ~5 ms a call take ~1.5 s. 180 s is a backstop above three call
// deadlines, so a frozen host ends the listing as a failure, never a hang.
pub const LIST_BUDGET: Duration = Duration::from_secs(180);

/// Longest one deletion may take.
// NB: `delete` may wait up to NAME_LOCK_WAIT (120 s) for a create of the same name, then
// makes 4-6 calls under the call deadline; 240 s covers the lock wait plus two slow calls. A
// deletion that runs out is reported failed and retried on the next pass.
pub const DELETE_BUDGET: Duration = Duration::from_secs(240);

/// How a GC pass behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSettings {
    /// Instances and volumes younger than this are kept.
    pub min_age: Duration,
    /// Delete nothing; report what would go.
    pub dry_run: bool,
}

impl Default for GcSettings {
    /// [`DEFAULT_MIN_AGE`], not a dry run.
    fn default() -> Self {
        Self {
            min_age: DEFAULT_MIN_AGE,
            dry_run: false,
        }
    }
}

/// What one entry's listing returned, the input of [`plan`].
#[derive(Debug, Clone)]
pub struct EntryListing {
    /// Provider entry name.
    pub entry: String,
    /// Minimum age of a temporary image upload before it is stale (the entry's import
    /// deadline; [`plan`] adds [`GcSettings::min_age`]).
    pub import_deadline: Duration,
    /// The complete owned-instance list, or why it could not be had.
    pub instances: Result<Vec<OwnedInstance>, String>,
    /// The complete owned-volume list, or why it could not be had.
    pub volumes: Result<Vec<OwnedVolume>, String>,
}

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

/// Why [`plan`] decided what it did.
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

/// One decision of [`plan`].
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

/// Age of `t` at `now`; a time in the future is age zero.
fn age(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or(Duration::ZERO)
}

fn young(now: SystemTime, t: SystemTime, min: Duration) -> Option<Reason> {
    let a = age(now, t);
    (a < min).then_some(Reason::Young {
        age_secs: a.as_secs(),
        min_secs: min.as_secs(),
    })
}

/// Decides, without I/O, what a GC pass deletes and keeps (see the module guarantees).
/// `live` is every Proxy UID the driver knows; `now` is the time the ages are measured at.
pub fn plan(
    listings: &[EntryListing],
    live: &HashSet<ProxyUid>,
    settings: &GcSettings,
    now: SystemTime,
) -> Vec<Planned> {
    let mut out = Vec::new();
    for l in listings {
        let entry_item = |reason: Reason| Planned {
            entry: l.entry.clone(),
            host: "*".into(),
            name: "*".into(),
            kind: ItemKind::Entry,
            uid: None,
            delete: None,
            reason,
        };
        // finding: M15 — a failed list sweeps nothing.
        let instances = match &l.instances {
            Ok(i) => i,
            Err(m) => {
                out.push(entry_item(Reason::InstanceListFailed(m.clone())));
                continue;
            }
        };
        // (host, uid) and (host, name) of every listed domain, collected or not.
        let domains: HashSet<(&str, ProxyUid)> = instances
            .iter()
            .map(|i| (i.id.host.as_str(), i.uid))
            .collect();
        let domain_names: HashSet<(&str, &str)> = instances
            .iter()
            .map(|i| (i.id.host.as_str(), i.id.name.as_str()))
            .collect();
        for i in instances {
            let expected = names::domain(&l.entry, &i.uid);
            let (delete, reason) = if live.contains(&i.uid) {
                (false, Reason::Live)
            } else if !i.name_matches_uid || i.id.name != expected {
                // finding: E2
                (false, Reason::NameMismatch { expected })
            } else if let Some(r) = young(now, i.created_at, settings.min_age) {
                (false, r)
            } else {
                (true, Reason::OrphanInstance)
            };
            out.push(Planned {
                entry: l.entry.clone(),
                host: i.id.host.clone(),
                name: i.id.name.clone(),
                kind: ItemKind::Instance,
                uid: Some(i.uid),
                delete: delete.then(|| Target::Instance {
                    host: i.id.host.clone(),
                    uid: i.uid,
                }),
                reason,
            });
        }
        let volumes = match &l.volumes {
            Ok(v) => v,
            Err(m) => {
                out.push(entry_item(Reason::VolumeListFailed(m.clone())));
                continue;
            }
        };
        let part_min = l.import_deadline.saturating_add(settings.min_age);
        for v in volumes {
            let ambiguous = listings
                .iter()
                .map(|o| o.entry.as_str())
                .find(|o| *o != l.entry && parse_volume_name(o, &v.name).is_some());
            let reason = match (v.kind, v.uid) {
                (VolumeKind::Overlay | VolumeKind::Seed, Some(uid)) => {
                    let named = names::domain(&l.entry, &uid);
                    if domains.contains(&(v.host.as_str(), uid))
                        || domain_names.contains(&(v.host.as_str(), named.as_str()))
                    {
                        // A listed domain carries this UID or this UID's name: its own line
                        // covers its disks.
                        continue;
                    }
                    if live.contains(&uid) {
                        Reason::Live
                    } else if let Some(other) = ambiguous {
                        Reason::Ambiguous {
                            other: other.to_owned(),
                        }
                    } else if let Some(r) =
                        v.age_since.and_then(|t| young(now, t, settings.min_age))
                    {
                        r
                    } else {
                        // finding: M3 — orphan volumes of our scheme are collected.
                        Reason::OrphanVolume
                    }
                }
                (VolumeKind::Part, _) => match (v.age_since, ambiguous) {
                    (_, Some(other)) => Reason::Ambiguous {
                        other: other.to_owned(),
                    },
                    (Some(t), None) => match young(now, t, part_min) {
                        Some(r) => r,
                        None => Reason::StalePart,
                    },
                    (None, None) => Reason::Young {
                        age_secs: 0,
                        min_secs: part_min.as_secs(),
                    },
                },
                // An overlay or seed without a UID is not something the provider lists.
                (_, None) => continue,
            };
            let delete = matches!(reason, Reason::OrphanVolume | Reason::StalePart)
                .then(|| Target::Volume(v.clone()));
            out.push(Planned {
                entry: l.entry.clone(),
                host: v.host.clone(),
                name: v.name.clone(),
                kind: v.kind.into(),
                uid: v.uid,
                delete,
                reason,
            });
        }
    }
    out
}

/// What happened to an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Deleted in this pass.
    Deleted,
    /// Would be deleted (dry run).
    WouldDelete,
    /// Left alone.
    Kept,
    /// The deletion was attempted and failed (or was refused by the provider's re-check);
    /// nothing is reported removed that was not.
    Failed,
}

impl Action {
    /// The label printed in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::WouldDelete => "would delete",
            Self::Kept => "kept",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of a [`GcReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcItem {
    /// Provider entry.
    pub entry: String,
    /// Host (`*` for an entry-wide item).
    pub host: String,
    /// Domain or volume name (`*` for an entry-wide item).
    pub name: String,
    /// What it is.
    pub kind: ItemKind,
    /// The UID, canonical, when the item has one.
    pub uid: Option<String>,
    /// What happened.
    pub action: Action,
    /// The rule that decided ([`Reason::rule`]).
    pub rule: &'static str,
    /// Why, for humans (for [`Action::Failed`], the provider's redacted error).
    pub reason: String,
}

/// One entry's listing outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryReport {
    /// Provider entry.
    pub entry: String,
    /// Why the instance list failed; `None` when [`listed`](Self::listed) is complete.
    pub instances_error: Option<String>,
    /// Why the volume list failed (or was not attempted).
    pub volumes_error: Option<String>,
    /// The entry's complete owned-instance list as listed before any deletion (empty when
    /// `instances_error` is set), so a driver can adopt from it without listing twice.
    #[serde(skip)]
    pub listed: Vec<OwnedInstance>,
}

/// The outcome of a GC pass: one item per decision, and each entry's listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Each entry's listing.
    pub entries: Vec<EntryReport>,
    /// Every decision, in entry order.
    pub items: Vec<GcItem>,
}

impl GcReport {
    /// Items with `action`.
    pub fn with_action(&self, action: Action) -> impl Iterator<Item = &GcItem> {
        self.items.iter().filter(move |i| i.action == action)
    }

    /// Whether every entry was listed completely and no deletion failed.
    pub fn is_clean(&self) -> bool {
        self.entries
            .iter()
            .all(|e| e.instances_error.is_none() && e.volumes_error.is_none())
            && self.with_action(Action::Failed).next().is_none()
    }
}

impl fmt::Display for GcReport {
    /// One line per item: `entry host name kind: action — reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in &self.items {
            writeln!(
                f,
                "{} {} {} {}: {} ({})",
                i.entry,
                i.host,
                i.name,
                i.kind.as_str(),
                i.action,
                i.reason
            )?;
        }
        Ok(())
    }
}

/// Runs one GC pass over every entry of `providers`: lists, [`plan`]s against `live` (every
/// Proxy UID the driver knows, taken before this call) at `now`, and deletes what the plan
/// says unless `settings.dry_run`. Never fails as a whole: every failure is in the report.
pub async fn collect(
    providers: &Providers,
    live: &HashSet<ProxyUid>,
    settings: &GcSettings,
    now: SystemTime,
) -> GcReport {
    let mut listings = Vec::new();
    for h in providers.iter() {
        let p = &h.provider;
        let instances = bounded(LIST_BUDGET, "listing instances", p.list_owned()).await;
        let volumes = match &instances {
            Ok(_) => bounded(LIST_BUDGET, "listing volumes", p.list_owned_volumes()).await,
            Err(_) => Err("not listed, since the instance list failed".to_owned()),
        };
        listings.push(EntryListing {
            entry: h.config.name.clone(),
            import_deadline: h.config.timeouts.image_import,
            instances,
            volumes,
        });
    }
    let planned = plan(&listings, live, settings, now);
    let mut items = Vec::with_capacity(planned.len());
    for p in planned {
        let (action, reason) = match (&p.delete, settings.dry_run) {
            (None, _) => (Action::Kept, p.reason.to_string()),
            (Some(_), true) => (Action::WouldDelete, p.reason.to_string()),
            (Some(t), false) => match providers.get(&p.entry) {
                None => (Action::Failed, format!("entry {} is gone", p.entry)),
                Some(h) => {
                    let r = match t {
                        Target::Instance { host, uid } => {
                            bounded(DELETE_BUDGET, "deleting", h.provider.delete(host, uid)).await
                        }
                        Target::Volume(v) => {
                            bounded(
                                DELETE_BUDGET,
                                "deleting",
                                h.provider.delete_orphan_volume(v),
                            )
                            .await
                        }
                    };
                    match r {
                        Ok(()) => (Action::Deleted, p.reason.to_string()),
                        Err(m) => (Action::Failed, m),
                    }
                }
            },
        };
        items.push(GcItem {
            entry: p.entry,
            host: p.host,
            name: p.name,
            kind: p.kind,
            uid: p.uid.map(|u| u.canonical()),
            action,
            rule: p.reason.rule(),
            reason,
        });
    }
    let entries = listings
        .into_iter()
        .map(|l| {
            let (listed, instances_error) = match l.instances {
                Ok(v) => (v, None),
                Err(e) => (Vec::new(), Some(e)),
            };
            EntryReport {
                entry: l.entry,
                instances_error,
                volumes_error: l.volumes.err(),
                listed,
            }
        })
        .collect();
    GcReport {
        dry_run: settings.dry_run,
        entries,
        items,
    }
}

/// Runs `fut` under `budget`; a provider error or the deadline becomes a message.
async fn bounded<T>(
    budget: Duration,
    what: &str,
    fut: impl std::future::Future<Output = egress_provider::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(budget, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("{what} did not finish within {budget:?}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use egress_provider::ProviderId;

    use super::*;

    const T0: u64 = 1_790_000_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn uid(n: u8) -> ProxyUid {
        ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
    }

    fn inst(u: ProxyUid, created: u64) -> OwnedInstance {
        OwnedInstance {
            id: ProviderId {
                entry: "home".into(),
                host: "h1".into(),
                name: names::domain("home", &u),
            },
            uid: u,
            created_at: at(created),
            name_matches_uid: true,
        }
    }

    fn vol(
        kind: VolumeKind,
        name: String,
        uid: Option<ProxyUid>,
        created: Option<u64>,
    ) -> OwnedVolume {
        OwnedVolume {
            entry: "home".into(),
            host: "h1".into(),
            name,
            kind,
            uid,
            age_since: created.map(at),
        }
    }

    fn listing(instances: Vec<OwnedInstance>, volumes: Vec<OwnedVolume>) -> EntryListing {
        EntryListing {
            entry: "home".into(),
            import_deadline: Duration::from_secs(1800),
            instances: Ok(instances),
            volumes: Ok(volumes),
        }
    }

    fn settings() -> GcSettings {
        GcSettings::default()
    }

    /// The plan for one instance, old enough, with nothing live.
    fn one(i: OwnedInstance, live: &[ProxyUid], now: u64) -> Planned {
        let live: HashSet<_> = live.iter().copied().collect();
        let p = plan(&[listing(vec![i], vec![])], &live, &settings(), at(now));
        assert_eq!(p.len(), 1, "{p:?}");
        p.into_iter().next().unwrap()
    }

    #[test]
    fn an_old_instance_of_no_live_proxy_is_deleted_through_its_uid() {
        let u = uid(1);
        let p = one(inst(u, T0), &[], T0 + 3600);
        assert_eq!(p.reason, Reason::OrphanInstance);
        assert_eq!(
            p.delete,
            Some(Target::Instance {
                host: "h1".into(),
                uid: u
            })
        );
    }

    #[test]
    fn an_instance_of_a_live_proxy_is_kept() {
        let u = uid(1);
        let p = one(inst(u, T0), &[u], T0 + 3600);
        assert_eq!((p.delete, p.reason), (None, Reason::Live));
    }

    #[test]
    fn an_instance_younger_than_the_minimum_age_is_kept_and_a_future_mark_counts_as_young() {
        let u = uid(1);
        let p = one(inst(u, T0), &[], T0 + 599);
        assert!(
            p.delete.is_none()
                && matches!(
                    p.reason,
                    Reason::Young {
                        age_secs: 599,
                        min_secs: 600
                    }
                ),
            "{p:?}"
        );
        // finding: L9 — clamping is the provider's; the plan reads a future time as age zero.
        let p = one(inst(u, T0 + 10_000), &[], T0);
        assert!(
            p.delete.is_none() && matches!(p.reason, Reason::Young { age_secs: 0, .. }),
            "{p:?}"
        );
        let p = one(inst(u, T0), &[], T0 + 600);
        assert!(
            p.delete.is_some(),
            "exactly the minimum age is old enough: {p:?}"
        );
    }

    #[test]
    fn an_instance_whose_name_is_not_derived_from_its_uid_is_never_deleted() {
        // finding: E2
        let u = uid(1);
        let canonical = names::domain("home", &u);
        let other = names::domain("home", &uid(2));
        for (name, flag) in [
            (canonical.to_uppercase(), false),
            (format!(" {canonical}"), false),
            (format!("{canonical}\n"), false),
            (other.clone(), false),
            // Even if a provider got the flag wrong, the plan re-derives the name.
            (other, true),
            (canonical.replace("ep-home-", "ep-lab-"), true),
        ] {
            let mut i = inst(u, T0);
            i.id.name = name.clone();
            i.name_matches_uid = flag;
            let p = one(i, &[], T0 + 86_400);
            assert!(p.delete.is_none(), "{name:?}: {p:?}");
            assert_eq!(
                p.reason,
                Reason::NameMismatch {
                    expected: canonical.clone()
                },
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_failed_instance_list_deletes_nothing_of_that_entry_but_other_entries_proceed() {
        // finding: M15
        let u = uid(1);
        let mut broken = listing(
            vec![],
            vec![vol(
                VolumeKind::Overlay,
                names::overlay("home", &u),
                Some(u),
                None,
            )],
        );
        broken.instances = Err("Transient: link died while listing".into());
        let mut ok = listing(vec![], vec![]);
        ok.entry = "lab".into();
        let mut i = inst(uid(3), T0);
        i.id.entry = "lab".into();
        i.id.name = names::domain("lab", &uid(3));
        ok.instances = Ok(vec![i]);
        let p = plan(&[broken, ok], &HashSet::new(), &settings(), at(T0 + 86_400));
        let home: Vec<_> = p.iter().filter(|x| x.entry == "home").collect();
        assert_eq!(home.len(), 1, "{home:?}");
        assert_eq!(home[0].kind, ItemKind::Entry);
        assert!(home[0].delete.is_none());
        assert!(matches!(home[0].reason, Reason::InstanceListFailed(_)));
        assert!(p.iter().any(|x| x.entry == "lab" && x.delete.is_some()));
    }

    #[test]
    fn a_failed_volume_list_deletes_no_volume_but_instances_are_still_swept() {
        // finding: M15
        let mut l = listing(vec![inst(uid(1), T0)], vec![]);
        l.volumes = Err("Transient: pool listing timed out".into());
        let p = plan(&[l], &HashSet::new(), &settings(), at(T0 + 86_400));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].delete.is_some());
        assert!(p[1].delete.is_none() && matches!(p[1].reason, Reason::VolumeListFailed(_)));
    }

    #[test]
    fn orphan_overlays_and_seeds_are_collected_unless_live_or_carried_by_a_listed_domain() {
        // finding: M3
        let (orphan, live_u, with_dom) = (uid(1), uid(2), uid(3));
        let mut vols = vec![];
        for u in [orphan, live_u, with_dom] {
            vols.push(vol(
                VolumeKind::Overlay,
                names::overlay("home", &u),
                Some(u),
                None,
            ));
            vols.push(vol(
                VolumeKind::Seed,
                names::seed("home", &u),
                Some(u),
                None,
            ));
        }
        // The domain of `with_dom` is kept (young), and its disks with it.
        let l = listing(vec![inst(with_dom, T0 + 86_000)], vols);
        let live: HashSet<_> = [live_u].into_iter().collect();
        let p = plan(&[l], &live, &settings(), at(T0 + 86_400));
        let deleted: Vec<_> = p
            .iter()
            .filter(|x| x.delete.is_some())
            .map(|x| x.name.clone())
            .collect();
        assert_eq!(
            deleted,
            vec![
                names::overlay("home", &orphan),
                names::seed("home", &orphan)
            ]
        );
        assert!(
            p.iter()
                .filter(|x| x.uid == Some(live_u))
                .all(|x| x.reason == Reason::Live)
        );
        assert!(
            !p.iter()
                .any(|x| x.uid == Some(with_dom) && x.kind != ItemKind::Instance)
        );
    }

    #[test]
    fn an_orphan_volume_changed_within_the_minimum_age_is_kept() {
        let u = uid(1);
        let now = T0 + 86_400;
        let fresh = vol(
            VolumeKind::Overlay,
            names::overlay("home", &u),
            Some(u),
            Some(now - 60),
        );
        let p = plan(
            &[listing(vec![], vec![fresh])],
            &HashSet::new(),
            &settings(),
            at(now),
        );
        assert!(p[0].delete.is_none(), "{p:?}");
        assert!(matches!(p[0].reason, Reason::Young { age_secs: 60, .. }));
    }

    #[test]
    fn a_volume_whose_uid_is_on_another_hosts_domain_is_still_an_orphan_on_this_host() {
        let u = uid(1);
        let mut i = inst(u, T0 + 86_000);
        i.id.host = "h2".into();
        let l = listing(
            vec![i],
            vec![vol(
                VolumeKind::Overlay,
                names::overlay("home", &u),
                Some(u),
                None,
            )],
        );
        let p = plan(&[l], &HashSet::new(), &settings(), at(T0 + 86_400));
        assert!(
            p.iter()
                .any(|x| x.kind == ItemKind::Overlay && x.delete.is_some()),
            "{p:?}"
        );
    }

    #[test]
    fn parts_are_collected_only_after_the_import_deadline_plus_the_minimum_age() {
        let name = |s: u64| format!("ep-home-base-img-deb-unverified.part-{s}-0123456789abcdef");
        let now = T0 + 100_000;
        let stale = vol(VolumeKind::Part, name(now - 2400), None, Some(now - 2400));
        let running = vol(VolumeKind::Part, name(now - 2399), None, Some(now - 2399));
        let p = plan(
            &[listing(vec![], vec![stale, running])],
            &HashSet::new(),
            &settings(),
            at(now),
        );
        assert_eq!(p[0].reason, Reason::StalePart);
        assert!(p[0].delete.is_some());
        assert!(
            p[1].delete.is_none() && matches!(p[1].reason, Reason::Young { .. }),
            "{:?}",
            p[1]
        );
    }

    #[test]
    fn a_volume_name_that_is_also_of_another_entrys_scheme_is_kept() {
        // Entry "home" and entry "home-base-img" share a pool: a part of the latter also
        // reads as a part of "home".
        let name = "ep-home-base-img-base-img-k-unverified.part-100-0123456789abcdef".to_owned();
        let l = listing(vec![], vec![vol(VolumeKind::Part, name, None, Some(100))]);
        let mut other = listing(vec![], vec![]);
        other.entry = "home-base-img".into();
        let p = plan(&[l, other], &HashSet::new(), &settings(), at(T0));
        assert!(p[0].delete.is_none());
        assert_eq!(
            p[0].reason,
            Reason::Ambiguous {
                other: "home-base-img".into()
            }
        );
    }
}
