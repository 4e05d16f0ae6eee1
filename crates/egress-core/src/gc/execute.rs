//! One GC pass with its I/O: list every entry (network, bounded by [`LIST_BUDGET`]), plan
//! (pure), then delete what the plan says (network, each deletion bounded by
//! [`DELETE_BUDGET`]) through the provider's own UID-checked paths.
//!
//! Guarantees: never fails as a whole (every failure is in the report); volumes are listed
//! only after a complete instance list; with `dry_run` nothing is deleted; every call has a
//! deadline.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::bases::{BaseAction, BaseGcSettings, BaseVerdict, UnusedClock};

use crate::providers::{ProviderHandle, Providers};

use super::plan::{EntryListing, plan};
use super::planned::{ItemKind, Target};
use super::report::{Action, EntryReport, GcItem, GcReport};
use super::settings::{DELETE_BUDGET, GcSettings, LIST_BUDGET};

/// Runs one GC pass over every entry of `providers`: lists, [`plan`](plan())s against `live` (every
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
    if let Some(clock) = settings.bases {
        // NB: an entry whose listing failed in this pass loses nothing in it, bases included
        // (its host is likely failing anyway).
        for l in listings
            .iter()
            .filter(|l| l.instances.is_ok() && l.volumes.is_ok())
        {
            if let Some(h) = providers.get(&l.entry) {
                items.extend(entry_bases(h, settings.dry_run, clock, now).await);
            }
        }
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

/// One entry's base step: its unused bases
/// ([`Provider::collect_bases`](egress_provider::Provider::collect_bases), each host bounded
/// by the provider), as report items of kind [`ItemKind::Base`].
async fn entry_bases(
    h: &ProviderHandle,
    dry_run: bool,
    clock: UnusedClock,
    now: SystemTime,
) -> Vec<GcItem> {
    let settings = BaseGcSettings {
        dry_run,
        clock,
        grace: None,
        now,
    };
    h.provider
        .collect_bases(&settings)
        .await
        .into_iter()
        .map(base_item)
        .collect()
}

/// A provider's verdict on a base as a report item.
pub fn base_item(v: BaseVerdict) -> GcItem {
    GcItem {
        entry: v.entry,
        host: v.host,
        name: v.name,
        kind: ItemKind::Base,
        uid: None,
        action: match v.action {
            BaseAction::Removed => Action::Deleted,
            BaseAction::WouldRemove => Action::WouldDelete,
            BaseAction::Kept => Action::Kept,
            BaseAction::Failed => Action::Failed,
        },
        rule: v.rule,
        reason: v.reason,
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
