//! Feeding the core's address reservations from the Proxy watch, so a Proxy that pins no
//! address never takes one another Proxy pins, even one the controller has not reconciled
//! yet (after a start or a relist the reconciles come in no particular order).
//!
//! Guarantees: every applied Proxy's pins are recorded in O(its pins)
//! ([`Core::note_pins_of`]); while the watch (re)lists, the core starts no create that pins
//! nothing ([`Core::set_pins_known`]), and it does again once the list is complete.

use std::sync::Arc;

use egress_core::controller::Controller as Core;
use egress_provider::ProxyUid;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::Proxy;

/// What one watch tells the core about pins.
#[derive(Debug)]
pub(super) struct PinFeed {
    core: Arc<Core>,
}

impl PinFeed {
    /// A feed into `core`, which starts no unpinned create until the first complete list.
    pub(super) fn new(core: Arc<Core>) -> Self {
        core.set_pins_known(false);
        Self { core }
    }

    /// Applies one watch event.
    pub(super) fn observe(&self, ev: &Event<Proxy>) {
        match ev {
            Event::Apply(p) | Event::InitApply(p) => {
                let Some(uid) = ProxyUid::parse_strict(p.uid().as_deref().unwrap_or_default())
                else {
                    return;
                };
                self.core.note_pins_of(
                    &p.spec.0.provider,
                    uid,
                    &p.namespace().unwrap_or_default(),
                    &p.spec.0.egress.pinned(),
                );
            }
            // NB: a deleted Proxy's pins go when the core finalizes it.
            Event::Delete(_) => {}
            Event::Init => self.core.set_pins_known(false),
            Event::InitDone => self.core.set_pins_known(true),
        }
    }
}
