//! Fixtures shared by the controller's unit tests: one entry "home" with hosts h1 and h2 and
//! the catalogue image `debian-12`, canonical test UIDs, a Proxy of that entry, a fixed clock
//! and host reports.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{
    HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::model::{HostReport, HostState, ProxyUid};

use super::ProxyObject;
use crate::model::{ProxySettings, ProxySpec, Resources};

/// The canonical UID numbered `n`.
pub(super) fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
}

/// Host `name` of the test entry.
pub(super) fn host(name: &str, max_concurrent: u32) -> HostConfig {
    HostConfig {
        name: name.into(),
        address: format!("{name}.invalid"),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "images".into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 1,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

/// Entry "home": hosts h1, h2 (each `max_concurrent` slots), image `debian-12` pinned.
pub(super) fn entry(max_concurrent: u32) -> LibvirtEntry {
    let mut images = BTreeMap::new();
    images.insert(
        "debian-12".to_string(),
        ImageSpec {
            url: "https://images.invalid/debian-12.qcow2".into(),
            sha256: Some("a".repeat(64)),
            format: ImageFormat::Qcow2,
            firmware: Default::default(),
            ca_file: None,
        },
    );
    LibvirtEntry {
        name: "home".into(),
        hosts: vec![host("h1", max_concurrent), host("h2", max_concurrent)],
        images,
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: Default::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

/// Proxy `p{n}` (UID [`uid`]`(n)`) of entry "home", pinned to `host` when given.
pub(super) fn obj(n: u8, host: Option<&str>) -> ProxyObject {
    ProxyObject {
        namespace: "default".into(),
        name: format!("p{n}"),
        uid: uid(n),
        generation: 1,
        spec: Arc::new(ProxySpec {
            provider: "home".into(),
            host: host.map(str::to_owned),
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

/// The tests' fixed wall clock.
pub(super) fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A check report of `host` in `state`, nothing else known.
pub(super) fn report(host: &str, state: HostState) -> HostReport {
    HostReport {
        host: host.into(),
        state,
        latency: None,
        hostname: None,
        libvirt_version: None,
        virt_types: vec![],
        uefi: false,
        pool_free_bytes: None,
        missing: vec![],
        error: None,
        addresses: Vec::new(),
    }
}
