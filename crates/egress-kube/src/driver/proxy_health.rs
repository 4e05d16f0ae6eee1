//! The Kubernetes driver's side of the shared proxy health task
//! ([`egress_core::background::proxy_health`]): targets and the set of known Proxies come
//! from the controller's watch cache, the credentials from what each Proxy's last reconcile
//! read, and the address probed from the core controller (the one the provider reported,
//! never `status.ip` as stored in the API); after each round the publishing pass is woken,
//! which merges the new states into status, and each Proxy the round turned Unhealthy is
//! sent to the controller's per-object trigger, so it is reconciled at once (its instance
//! read; one whose guest stopped re-created) rather than at its next periodic read.
//!
//! Guarantees: the first round starts only once the watch cache holds a complete first
//! listing (so no Proxy's state is dropped for being missing from a partial cache); Proxies
//! gone from the cache are dropped from the engine, a Proxy only not probed this round keeps
//! its state (finding H3). The task runs only while this replica leads (it is started with
//! the term's stop token).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use egress_core::background::proxy_health::{self, ProxyHealthDriver};
use egress_core::controller::ProxyCredentials;
use egress_core::health::{HealthEngine, ProbeTarget, RoundReport};
use egress_provider::ProxyUid;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::status::wait_synced;
use super::{Ctx, key_of, lock, uid_of};
use crate::api::Proxy;

/// Probe targets from the watch cache; a round's end wakes the publisher.
struct CacheTargets {
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    wake: Arc<Notify>,
    reconcile: mpsc::UnboundedSender<ObjectRef<Proxy>>,
}

impl ProxyHealthDriver for CacheTargets {
    fn targets(&self) -> Vec<ProbeTarget> {
        let creds = lock(&self.ctx.creds).clone();
        self.store
            .state()
            .iter()
            .filter_map(|p| {
                target_of(p, &creds, |uid| {
                    (
                        self.ctx.core.verified_address(uid),
                        self.ctx.core.declared_egress(uid),
                    )
                })
            })
            .collect()
    }

    fn known(&self) -> HashSet<ProxyUid> {
        self.store
            .state()
            .iter()
            .filter_map(|p| uid_of(p))
            .collect()
    }

    fn round_done(&self, _engine: &HealthEngine, _report: &RoundReport) {
        self.wake.notify_one();
    }

    fn reconcile_now(&self, proxies: &[(ProxyUid, String)]) {
        for (_, key) in proxies {
            if let Some(r) = object_ref(key) {
                // NB: the receiver is gone only when the controller stopped (end of term).
                let _ = self.reconcile.send(r);
            }
        }
    }
}

/// The reference of the Proxy keyed `namespace/name` (see [`key_of`]).
fn object_ref(key: &str) -> Option<ObjectRef<Proxy>> {
    let (ns, name) = key.split_once('/')?;
    (!ns.is_empty() && !name.is_empty()).then(|| ObjectRef::new(name).within(ns))
}

/// The probe target of `p` (none while it is being deleted, not Running, or has no address
/// from the provider), aimed at the address and expecting the declared egress addresses the
/// provider reported to this process (`from_core(uid)`): see [`at_verified`].
fn target_of(
    p: &Proxy,
    creds: &HashMap<ProxyUid, Option<ProxyCredentials>>,
    from_core: impl Fn(&ProxyUid) -> (Option<IpAddr>, Vec<IpAddr>),
) -> Option<ProbeTarget> {
    if p.meta().deletion_timestamp.is_some() {
        return None;
    }
    let uid = uid_of(p)?;
    let status = p.status.as_ref()?;
    let c = creds.get(&uid).cloned().flatten();
    let target = ProbeTarget::of(
        uid,
        key_of(p),
        &p.spec.provider,
        &p.spec.proxy,
        c.as_ref(),
        status,
    )?;
    let (verified, declared) = from_core(&uid);
    at_verified(target, verified, declared)
}

/// `target` aimed at `verified`, the address the provider last reported for the Proxy's
/// instance to this process (see [`egress_core::controller::Controller::verified_address`]),
/// whatever `status.ip` in the API says: whoever may write a Proxy's status could otherwise
/// point the operator's probes, and the proxy's credentials, anywhere. `None` (no probe) while
/// the provider has reported no address. Likewise the egress expected is `declared`, the
/// addresses the provider reported the instance holds
/// ([`egress_core::controller::Controller::declared_egress`]), never `status.egressAddress`.
fn at_verified(
    mut target: ProbeTarget,
    verified: Option<IpAddr>,
    declared: Vec<IpAddr>,
) -> Option<ProbeTarget> {
    // finding: M22
    target.endpoint.addr.set_ip(verified?);
    target.declared = declared;
    Some(target)
}

/// Leader-only: once the watch cache synced, runs the proxy health engine over every Running
/// Proxy with an address in it (not being deleted), waking the publishing pass after each
/// round and sending each Proxy a round turned Unhealthy to `reconcile`.
pub(super) async fn run(
    ctx: Arc<Ctx>,
    engine: Arc<HealthEngine>,
    store: Store<Proxy>,
    mut synced: watch::Receiver<bool>,
    wake: Arc<Notify>,
    reconcile: mpsc::UnboundedSender<ObjectRef<Proxy>>,
    stop: CancellationToken,
) {
    if !wait_synced(&mut synced, &stop).await {
        return;
    }
    let targets = Arc::new(CacheTargets {
        ctx,
        store,
        wake,
        reconcile,
    });
    proxy_health::run(targets, engine, stop).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::SocketAddr;

    use egress_core::model::{Phase, ProxySettings, ProxySpec, ProxyStatus};

    use super::*;
    use crate::api::ProxyCrdSpec;

    const UID: &str = "0f8fad5b-d9cb-469f-a165-708677289501";

    /// A Running Proxy whose `status.ip` someone rewrote to an internal address.
    fn proxy() -> Proxy {
        let mut p = Proxy::new(
            "p",
            ProxyCrdSpec(ProxySpec {
                provider: "home".into(),
                host: None,
                image: "tiny".into(),
                resources: Default::default(),
                proxy: ProxySettings {
                    port: 3128,
                    allowed_client_cidrs: vec!["10.0.0.0/8".into()],
                    ..ProxySettings::default()
                },
                egress: Default::default(),
            }),
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(UID.into());
        p.status = Some(ProxyStatus {
            phase: Phase::Running,
            ip: Some("10.0.0.1".into()),
            egress_address: vec!["198.51.100.66".into()],
            host: Some("h1".into()),
            ..ProxyStatus::default()
        });
        p
    }

    #[test]
    fn the_probe_goes_to_the_providers_address_never_to_the_one_in_status() {
        // finding: M22
        let uid = ProxyUid::parse_strict(UID).unwrap();
        let verified: IpAddr = "192.168.122.7".parse().unwrap();
        let creds = HashMap::new();
        let declared: IpAddr = "203.0.113.7".parse().unwrap();
        let t = target_of(&proxy(), &creds, |u| {
            ((*u == uid).then_some(verified), vec![declared])
        })
        .unwrap();
        assert_eq!(t.endpoint.addr, SocketAddr::new(verified, 3128));
        assert_eq!(
            t.declared,
            [declared],
            "the egress expected is the provider's, not status.egressAddress"
        );
        assert!(
            target_of(&proxy(), &creds, |_| (None, Vec::new())).is_none(),
            "no address from the provider: no probe, whatever the status says"
        );
    }

    #[test]
    fn a_key_names_the_proxy_to_reconcile() {
        let r = object_ref(&key_of(&proxy())).unwrap();
        assert_eq!(r, ObjectRef::new("p").within("ns"));
        assert!(object_ref("no-slash").is_none());
        assert!(object_ref("/p").is_none());
    }
}
