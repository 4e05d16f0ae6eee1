//! What a GC pass returns: one [`GcItem`] per decision with what happened to it
//! ([`Action`]), and each entry's listing outcome ([`EntryReport`]).
//!
//! Guarantees: nothing is reported removed that was not; serializes to the JSON the CLI
//! prints; the text form is one line per item.

use std::fmt;

use egress_provider::model::OwnedInstance;
use serde::Serialize;

use super::planned::ItemKind;

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
    /// The rule that decided ([`Reason::rule`](super::Reason::rule)).
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

    /// How many items of `kind` this pass deleted.
    pub fn deleted_of(&self, kind: ItemKind) -> usize {
        self.with_action(Action::Deleted)
            .filter(|i| i.kind == kind)
            .count()
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
