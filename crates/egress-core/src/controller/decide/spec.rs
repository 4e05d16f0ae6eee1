//! The spec against its provider entry: every spec error naming its field path and value,
//! the sizes from the entry's defaults within its limits, and the create request.
//!
//! Guarantees: pure; sizes are computed with checked arithmetic (finding L20); a request
//! that cannot be made says whether that is permanent (an invalid spec) or will clear
//! (credentials not readable yet).

use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::libvirt::image::source::is_url;
use egress_provider::libvirt::nwfilter::host_ip;
use egress_provider::model::CreateRequest;

use crate::controller::{ProxyObject, userdata};
use crate::proxy_policy::GuestPolicy;

pub(super) const GIB: u64 = 1 << 30;
pub(super) const MIB: u64 = 1 << 20;

/// Every spec problem against `entry`, each naming the field path and the value.
pub fn spec_errors(obj: &ProxyObject, entry: &LibvirtEntry) -> Vec<String> {
    let mut errs: Vec<String> = obj
        .spec
        .validate()
        .iter()
        .map(ToString::to_string)
        .collect();
    let spec = &obj.spec;
    if let Some(h) = &spec.host
        && !h.trim().is_empty()
        && !entry.hosts.iter().any(|c| &c.name == h)
    {
        let known: Vec<&str> = entry.hosts.iter().map(|c| c.name.as_str()).collect();
        errs.push(format!(
            "spec.host: {h:?} is not a host of provider entry {:?} (hosts: {})",
            entry.name,
            known.join(", ")
        ));
    }
    if !spec.image.trim().is_empty() {
        if is_url(&spec.image) {
            if !entry.url_images.enabled {
                errs.push(format!(
                    "spec.image: {:?} is a URL and provider entry {:?} does not allow URL \
                     images (urlImages.enabled); use a catalogue key",
                    spec.image, entry.name
                ));
            }
        } else if !entry.images.contains_key(&spec.image) {
            let known: Vec<&str> = entry.images.keys().map(String::as_str).collect();
            errs.push(format!(
                "spec.image: {:?} is not in the catalogue of provider entry {:?} (known: {})",
                spec.image,
                entry.name,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    if let Err(e) = sizes(obj, entry) {
        errs.extend(e);
    }
    errs
}

/// Disk GiB, memory MiB and vCPUs of `obj`: the spec's overrides, else the entry's defaults,
/// within the entry's limits; byte sizes are computed with checked arithmetic (L20).
pub fn sizes(obj: &ProxyObject, entry: &LibvirtEntry) -> Result<(u64, u64, u32), Vec<String>> {
    let r = &obj.spec.resources;
    let (d, l) = (&entry.defaults, &entry.limits);
    let disk = r.disk_gib.unwrap_or(d.disk_gib);
    let mem = r.memory_mib.unwrap_or(d.memory_mib);
    let cpus = r.vcpus.unwrap_or(d.vcpus);
    let mut errs = Vec::new();
    if disk > l.disk_gib || disk.checked_mul(GIB).is_none() {
        errs.push(format!(
            "spec.resources.diskGiB: {disk} exceeds the limit of provider entry {:?} \
             (limits.diskGiB: {})",
            entry.name, l.disk_gib
        ));
    }
    if mem > l.memory_mib || mem.checked_mul(MIB).is_none() {
        errs.push(format!(
            "spec.resources.memoryMiB: {mem} exceeds the limit of provider entry {:?} \
             (limits.memoryMiB: {})",
            entry.name, l.memory_mib
        ));
    }
    if cpus > l.vcpus {
        errs.push(format!(
            "spec.resources.vcpus: {cpus} exceeds the limit of provider entry {:?} \
             (limits.vcpus: {})",
            entry.name, l.vcpus
        ));
    }
    if errs.is_empty() {
        Ok((disk, mem, cpus))
    } else {
        Err(errs)
    }
}

/// The create request for `obj` on `host`, or why it cannot be made yet.
pub(super) fn request(
    obj: &ProxyObject,
    entry: &LibvirtEntry,
    host: &str,
    connect_ports: &[u16],
) -> Result<CreateRequest, (bool, String)> {
    let (disk_gib, memory_mib, vcpus) = sizes(obj, entry).map_err(|e| (true, e.join("; ")))?;
    if obj.spec.proxy.credentials_ref.is_some() && obj.credentials.is_none() {
        return Err((
            false,
            format!(
                "spec.proxy.credentialsRef: {:?} could not be read yet (missing, without \
                 both keys username and password, not marked for egress-proxies, or in a \
                 namespace whose Secrets the operator is not granted)",
                obj.spec
                    .proxy
                    .credentials_ref
                    .as_deref()
                    .unwrap_or_default()
            ),
        ));
    }
    // The host's own addresses the guest firewall denies: the IP in its address and its
    // `hostAddresses` (the host's network filter also denies what its name resolves to).
    let host_addrs: Vec<std::net::IpAddr> = entry
        .hosts
        .iter()
        .filter(|h| h.name == host)
        .flat_map(|h| {
            host_ip(&h.address).into_iter().chain(
                h.host_addresses
                    .iter()
                    .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok()),
            )
        })
        .collect();
    // The entry's internal networks are lifted only for namespaces granted them.
    let lift_internal = super::lifts_internal(obj, entry);
    let strict;
    let entry_policy = if lift_internal {
        &entry.policy
    } else {
        strict = egress_provider::libvirt::config::ProxyPolicy {
            allowed_internal_cidrs: Vec::new(),
            ..entry.policy.clone()
        };
        &strict
    };
    let policy = GuestPolicy::for_proxy(
        entry_policy,
        &obj.spec.proxy.allowed_destinations,
        &host_addrs,
    )
    .map_err(|e| (true, e.join("; ")))?;
    let mut policy = policy;
    policy.connect_default = connect_ports.to_vec();
    let user_data = userdata::render(&obj.spec.proxy, obj.credentials.as_ref(), &policy)
        .map_err(|e| (true, e.to_string()))?;
    Ok(CreateRequest {
        uid: obj.uid,
        display_name: format!("{}/{}", obj.namespace, obj.name),
        host: host.to_owned(),
        image: obj.spec.image.clone(),
        disk_gib,
        memory_mib,
        vcpus,
        user_data,
        pinned_egress: obj.spec.egress.pinned(),
        // Filled by the executor, which knows every Proxy's pins and the holds.
        reserved: Vec::new(),
        prefer_egress: Vec::new(),
        lift_internal,
        replaces: obj.replaces,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::controller::test_fixtures::{entry, uid};
    use crate::model::{ProxySettings, ProxySpec, Resources};

    fn obj() -> ProxyObject {
        ProxyObject {
            namespace: "default".into(),
            name: "p1".into(),
            uid: uid(1),
            generation: 1,
            spec: std::sync::Arc::new(ProxySpec {
                provider: "home".into(),
                host: None,
                image: "debian-12".into(),
                resources: Resources::default(),
                proxy: ProxySettings {
                    allowed_client_cidrs: vec!["10.0.0.0/8".into()],
                    ..ProxySettings::default()
                },
                egress: Default::default(),
            }),
            deleting: false,
            credentials: None,
            namespace_labels: None,
            replaces: None,
        }
    }

    #[test]
    fn a_host_address_is_an_ip_only_when_it_is_one() {
        for (a, ip) in [
            ("198.51.100.9", Some("198.51.100.9")),
            ("198.51.100.9:2222", Some("198.51.100.9")),
            ("[2001:db8::9]:22", Some("2001:db8::9")),
            ("2001:db8::9", Some("2001:db8::9")),
            ("kvm1.example.com:22", None),
            ("local", None),
        ] {
            assert_eq!(host_ip(a).map(|i| i.to_string()).as_deref(), ip, "{a}");
        }
    }

    #[test]
    fn the_guest_firewall_denies_the_hosts_address_and_host_addresses() {
        let mut e = entry(2);
        e.hosts[0].address = "198.51.100.9:22".into();
        e.hosts[1].address = "198.51.100.10".into();
        let r = request(&obj(), &e, "h1", &[443, 80]).unwrap();
        assert!(
            r.user_data.contains("elements = { 198.51.100.9/32 }"),
            "{}",
            r.user_data
        );
        assert!(
            !r.user_data.contains("198.51.100.10"),
            "only the placed host"
        );
        // Its hostAddresses too (e.g. its public address, or a host reached by name).
        e.hosts[0].host_addresses = vec!["203.0.113.44".into()];
        let r = request(&obj(), &e, "h1", &[443, 80]).unwrap();
        assert!(
            r.user_data
                .contains("elements = { 198.51.100.9/32, 203.0.113.44/32 }"),
            "{}",
            r.user_data
        );
        let mut o = obj();
        std::sync::Arc::make_mut(&mut o.spec)
            .proxy
            .allowed_destinations
            .cidrs = vec!["10.1.0.0/16".into()];
        let (permanent, msg) = request(&o, &e, "h1", &[443, 80]).unwrap_err();
        assert!(permanent, "{msg}");
        assert!(
            msg.starts_with("spec.proxy.allowedDestinations.cidrs[0]"),
            "{msg}"
        );
    }
}
