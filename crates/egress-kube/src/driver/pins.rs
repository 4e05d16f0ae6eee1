//! Feeding the core's pinned addresses ([`PinnedAddresses`]) from the Proxy watch, so an
//! unpinned Proxy never takes an address another Proxy pins, even one the controller has not
//! reconciled yet.
//!
//! Guarantees: every watch event updates the registry in O(the Proxy's pins); while the watch
//! (re)lists, the registry is not ready (the provider then allocates no unpinned address,
//! Transient), and once the list is complete the pins of Proxies it no longer shows are
//! dropped and the registry is ready again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use egress_provider::ProxyUid;
use egress_provider::pins::PinnedAddresses;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::Proxy;

/// One watch's view of the pins.
#[derive(Debug)]
pub(super) struct PinFeed {
    pins: Arc<PinnedAddresses>,
    /// The UIDs a relist in progress has shown so far.
    relist: Mutex<Option<HashSet<ProxyUid>>>,
}

impl PinFeed {
    /// A feed into `pins`, which stays not ready until the first complete list.
    pub(super) fn new(pins: Arc<PinnedAddresses>) -> Self {
        pins.set_ready(false);
        Self {
            pins,
            relist: Mutex::new(None),
        }
    }

    /// Applies one watch event.
    pub(super) fn observe(&self, ev: &Event<Proxy>) {
        let mut relist = self
            .relist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match ev {
            Event::Apply(p) => {
                self.set(p);
            }
            Event::Delete(p) => {
                if let Some(u) = uid(p) {
                    self.pins.remove(&u);
                }
            }
            Event::Init => {
                self.pins.set_ready(false);
                *relist = Some(HashSet::new());
            }
            Event::InitApply(p) => {
                if let (Some(u), Some(seen)) = (self.set(p), relist.as_mut()) {
                    seen.insert(u);
                }
            }
            Event::InitDone => {
                if let Some(seen) = relist.take() {
                    self.pins.retain(|u| seen.contains(u));
                }
                self.pins.set_ready(true);
            }
        }
    }

    fn set(&self, p: &Proxy) -> Option<ProxyUid> {
        let u = uid(p)?;
        self.pins.set(u, &p.spec.0.egress.pinned());
        Some(u)
    }
}

fn uid(p: &Proxy) -> Option<ProxyUid> {
    ProxyUid::parse_strict(p.uid().as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::net::IpAddr;

    use egress_core::model::{ProxySettings, ProxySpec, Resources};

    use super::*;

    fn proxy(name: &str, uid: u8, pins: &[&str]) -> Proxy {
        let spec = ProxySpec {
            provider: "home".into(),
            host: None,
            image: "debian-12".into(),
            resources: Resources::default(),
            proxy: ProxySettings::default(),
            egress: egress_core::model::EgressSpec {
                address: pins.iter().map(|s| (*s).to_owned()).collect(),
            },
        };
        let mut p = Proxy::new(name, spec.into());
        p.metadata.uid = Some(format!("0f8fad5b-d9cb-469f-a165-7086772895{uid:02x}"));
        p
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_watch_keeps_the_pins_and_holds_them_not_ready_while_it_lists() {
        let pins = Arc::new(PinnedAddresses::new());
        let feed = PinFeed::new(pins.clone());
        assert!(!pins.ready(), "not ready before the first list");
        feed.observe(&Event::Init);
        feed.observe(&Event::InitApply(proxy("a", 1, &["203.0.113.7"])));
        feed.observe(&Event::InitApply(proxy("b", 2, &[])));
        assert!(pins.is_pinned(ip("203.0.113.7")));
        assert!(!pins.ready(), "still listing");
        feed.observe(&Event::InitDone);
        assert!(pins.ready());
        // A change, a new Proxy, a deletion.
        feed.observe(&Event::Apply(proxy("a", 1, &["203.0.113.8"])));
        feed.observe(&Event::Apply(proxy("c", 3, &["203.0.113.9"])));
        assert!(!pins.is_pinned(ip("203.0.113.7")) && pins.is_pinned(ip("203.0.113.8")));
        feed.observe(&Event::Delete(proxy("c", 3, &["203.0.113.9"])));
        assert!(!pins.is_pinned(ip("203.0.113.9")));
        // A relist that no longer shows "a" (deleted while the watch was down) drops its pin.
        feed.observe(&Event::Init);
        assert!(!pins.ready());
        feed.observe(&Event::InitApply(proxy("b", 2, &[])));
        feed.observe(&Event::InitDone);
        assert!(pins.ready() && !pins.is_pinned(ip("203.0.113.8")));
    }
}
