//! Fixtures the image-cache tests share besides the HTTP server (image_support): bulk
//! connections to libvirt-fake and to the real libvirtd over SSH, a bare provider entry,
//! `virsh` and unique resource names.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Command;

use async_trait::async_trait;
use egress_provider::ProviderError;
use egress_provider::libvirt::config::{GuestSettings, LibvirtEntry, Timeouts, UrlImagePolicy};
use egress_provider::libvirt::image::BulkConnect;
use libvirt_fake::FakeLibvirt;
use libvirt_remote::transport::ssh::{self, SshOptions, SshTarget};
use libvirt_remote::{Client, OpenOptions};

/// Opens every bulk (upload) connection as a fresh in-memory connection to the fake.
pub struct FakeBulk(pub FakeLibvirt);

#[async_trait]
impl BulkConnect for FakeBulk {
    async fn open(&self) -> Result<Client, ProviderError> {
        Client::open(self.0.connect_duplex(), OpenOptions::default())
            .await
            .map_err(|e| ProviderError::transient(e.to_string()))
    }
}

/// Entry `name`: no hosts, no images, URL images off, a 64 MiB image cap, defaults elsewhere.
pub fn entry(name: &str) -> LibvirtEntry {
    LibvirtEntry {
        name: name.into(),
        hosts: Vec::new(),
        images: BTreeMap::new(),
        url_images: UrlImagePolicy::default(),
        max_image_bytes: 64 << 20,
        guest: GuestSettings::default(),
        timeouts: Timeouts::default(),
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

/// Opens every bulk (upload) connection to the real libvirtd through SSH to `target`.
pub struct SshBulk {
    /// Where the SSH connection goes.
    pub target: SshTarget,
}

#[async_trait]
impl BulkConnect for SshBulk {
    async fn open(&self) -> Result<Client, ProviderError> {
        let t = ssh::connect(&self.target, &SshOptions::default())
            .await
            .map_err(|e| ProviderError::transient(format!("ssh: {e}")))?;
        Client::open(t, OpenOptions::default())
            .await
            .map_err(|e| ProviderError::transient(format!("libvirt open: {e}")))
    }
}

/// `virsh -c qemu:///system ARGS`, bounded by `timeout 60`.
pub fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["60", "virsh", "-c", "qemu:///system"])
        .args(args)
        .output()
        .expect("virsh")
}

/// `eptest-TAG-` and the time and process id: a name no other test run uses.
pub fn unique(tag: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!(
        "eptest-{tag}-{}-{:08x}",
        now.as_secs(),
        now.subsec_nanos() ^ std::process::id()
    )
}
