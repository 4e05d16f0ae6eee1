//! The GC decision, without I/O: from each entry's listing, the live UIDs, the settings and
//! the clock, what is deleted and what is kept, and why.
//!
//! Guarantees: those of the module [`gc`](super): a failed list sweeps nothing of its entry
//! (finding M15); an instance is deleted only with a strictly parsed mark whose UID derives
//! its name (finding E2) and is old enough; a volume only when no listed domain and no live
//! Proxy has its UID, no domain at all bears its UID's name (the provider's last check before
//! deleting, applied here too, so a dry run and a real run decide the same), and no other
//! entry's scheme also reads its name.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::names;
use egress_provider::libvirt::ops::orphans::parse_volume_name;
use egress_provider::model::{OwnedInstance, OwnedVolume, VolumeKind};

use super::planned::{ItemKind, Planned, Reason, Target};
use super::settings::GcSettings;

/// What one entry's listing returned, the input of [`plan()`].
#[derive(Debug, Clone)]
pub struct EntryListing {
    /// Provider entry name.
    pub entry: String,
    /// Minimum age of a temporary image upload before it is stale (the entry's import
    /// deadline; [`plan()`] adds [`GcSettings::min_age`]).
    pub import_deadline: Duration,
    /// The complete owned-instance list, or why it could not be had.
    pub instances: Result<Vec<OwnedInstance>, String>,
    /// The complete owned-volume list, or why it could not be had.
    pub volumes: Result<Vec<OwnedVolume>, String>,
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
                    } else if v.domain_exists {
                        // The same rule as the provider's last check before deleting: a
                        // domain with this UID's name exists (not listed, so its mark is not
                        // a valid one of ours); the dry run and the real run both keep it.
                        Reason::DomainExists { domain: named }
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
