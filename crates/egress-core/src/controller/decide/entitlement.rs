//! What a Proxy's namespace (its tenant) may use: the provider entry, its hosts, and the
//! entry's features, as the entry's `access` grants them (see
//! [`LibvirtEntry::admits`] and [`LibvirtEntry::grants`]).
//!
//! Guarantees: pure; every refusal names the field path, the entry or host and the
//! namespace asking — never another namespace, Proxy or instance; a Proxy outside its
//! entitlement is refused before anything is placed or created.

use egress_provider::libvirt::config::{Feature, HostConfig, LibvirtEntry};
use egress_provider::libvirt::image::source::is_url;

use crate::controller::ProxyObject;

/// Every way `obj` asks for more than its namespace is granted on `entry`, each naming the
/// field path.
pub fn entitlement_errors(obj: &ProxyObject, entry: &LibvirtEntry) -> Vec<String> {
    let ns = obj.namespace.as_str();
    let labels = obj.namespace_labels.as_deref();
    if !entry.admits(ns, labels) {
        return vec![format!(
            "spec.provider: provider entry {:?} is not available to namespace {ns:?} (it is not \
             among the namespaces the entry's access grants); nothing is created",
            entry.name
        )];
    }
    let mut errs = Vec::new();
    if let Some(h) = obj.spec.host.as_deref()
        && let Some(host) = entry.hosts.iter().find(|c| c.name == h)
        && !eligible(obj, entry, host)
    {
        errs.push(format!(
            "spec.host: host {h:?} of provider entry {:?} is not available to namespace \
             {ns:?} (its access, or its address pool's, does not grant it)",
            entry.name
        ));
    }
    if is_url(&obj.spec.image)
        && entry.url_images.enabled
        && !entry.grants(ns, labels, Feature::UrlImages)
    {
        errs.push(format!(
            "spec.image: URL images of provider entry {:?} are not granted to namespace {ns:?} \
             (access.urlImages); use a catalogue key",
            entry.name
        ));
    }
    if !obj.spec.egress.pinned().is_empty() && !entry.grants(ns, labels, Feature::AddressPools) {
        errs.push(format!(
            "spec.egress.address: declared addresses of provider entry {:?} are not granted to \
             namespace {ns:?} (access.addressPools)",
            entry.name
        ));
    }
    if !errs.is_empty() {
        return errs;
    }
    if entry.hosts.iter().all(|h| !eligible(obj, entry, h)) {
        errs.push(format!(
            "spec.provider: no host of provider entry {:?} is available to namespace {ns:?} \
             (the hosts' access and address pools grant it none); nothing is created",
            entry.name
        ));
    }
    errs
}

/// Whether `obj`'s namespace may have a proxy on `host`: the host admits it and, for a host
/// with an address pool (whose guests always get declared addresses), the entry grants it
/// address pools.
pub fn eligible(obj: &ProxyObject, entry: &LibvirtEntry, host: &HostConfig) -> bool {
    let ns = obj.namespace.as_str();
    let labels = obj.namespace_labels.as_deref();
    host.admits(ns, labels)
        && (host.address_pool.is_none() || entry.grants(ns, labels, Feature::AddressPools))
}

/// Whether `obj`'s namespace may reach the entry's `policy.allowedInternalCidrs`.
pub fn lifts_internal(obj: &ProxyObject, entry: &LibvirtEntry) -> bool {
    entry.grants(
        &obj.namespace,
        obj.namespace_labels.as_deref(),
        Feature::InternalCidrs,
    )
}
