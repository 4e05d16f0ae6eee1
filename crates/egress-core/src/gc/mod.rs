//! Orphan garbage collection: instances and volumes of our naming scheme
//! that no live Proxy owns any more, found by listing every provider entry and removed
//! through the provider's own UID-checked paths.
//!
//! The pipeline: list (network, bounded by [`LIST_BUDGET`]) → [`plan()`] (pure, no I/O) →
//! execute (network, each deletion bounded by [`DELETE_BUDGET`]) → [`GcReport`].
//!
//! Guarantees:
//! - an entry's instances are swept only from a complete list: if `list_owned` fails or
//!   times out, nothing of that entry is deleted and the report says why (finding M15); its
//!   volumes are swept only when both its instance list and its volume list are complete;
//! - an instance is deleted only when its mark parsed strictly (the provider lists nothing
//!   else), its UID is not in the live set, its domain name equals the name derived from the
//!   UID (finding E2), and it is at least [`GcSettings::min_age`] old (a creation time in the
//!   future counts as age zero; the provider's listing restamps a mark dated further ahead
//!   than its skew tolerance with the time it first saw it, so such an orphan's age grows
//!   from then, across restarts and one-shot runs: finding L9); the deletion is
//!   `provider.delete(host, uid)`, which
//!   re-verifies the mark (M2) and takes the instance's overlay and seed with it;
//! - an overlay or seed is deleted only when its UID is not live, no listed domain of the
//!   entry on that host carries its UID or is named for it, its name is not also of another
//!   configured entry's scheme, and (when its age is known) it is old enough; the provider
//!   re-checks right before deleting that no domain named for its UID exists (M3, M2);
//! - a temporary image upload is deleted only when older than the entry's import deadline
//!   plus the minimum age, so a running import never loses its part;
//! - a cached base image is removed (with [`GcSettings::bases`]) only when nothing on its
//!   host uses it — read on the host, any domain's disks or any volume backed by it — and it
//!   has been unused for its entry's grace (`limits.unusedBaseGraceMinutes`), by the
//!   provider's own re-checked path ([`Provider::collect_bases`](egress_provider::Provider::collect_bases)),
//!   and only for an entry whose instances and volumes were both listed in this pass;
//! - with [`GcSettings::dry_run`] nothing is deleted; the report says what would go and why;
//! - the live set is taken by the caller before listing: a Proxy created after that is
//!   protected by the minimum age.
//!
//! Where each step lives: `settings` (budgets and [`GcSettings`]), `planned` (the plan's
//! vocabulary: items, reasons, targets), `plan` (the pure decision), `execute` (listing and
//! deleting: the only network), `report` (what a pass returns); all re-exported here.

mod execute;
mod plan;
mod planned;
mod report;
mod settings;
#[cfg(test)]
mod tests;

pub use self::execute::{base_item, collect};
pub use self::plan::{EntryListing, plan};
pub use self::planned::{ItemKind, Planned, Reason, Target};
pub use self::report::{Action, EntryReport, GcItem, GcReport};
pub use self::settings::{DEFAULT_MIN_AGE, DELETE_BUDGET, GcSettings, LIST_BUDGET};
