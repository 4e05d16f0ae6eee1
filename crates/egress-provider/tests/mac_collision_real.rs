//! The MAC collision check against the real libvirtd (its unix socket): a shut-off domain
//! of someone else's whose NIC has the MAC a Proxy would get is found, by name; the domain
//! being created itself is not counted; a MAC nobody uses is free.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use egress_provider::ProxyUid;
use egress_provider::libvirt::names;
use egress_provider::libvirt::ops::mac::mac_user;
use libvirt_remote::{Client, OpenOptions};

/// Bound for the test body: a listing and one XML read per domain on the host.
const BUDGET: Duration = Duration::from_secs(60);

fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .args(["60", "virsh", "-c", "qemu:///system"])
        .args(args)
        .output()
        .expect("virsh")
}

struct Undefine(String);

impl Drop for Undefine {
    fn drop(&mut self) {
        let _ = virsh(&["undefine", &self.0]);
    }
}

#[tokio::test]
async fn the_real_daemon_reports_the_domain_already_using_a_derived_mac() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let name = format!(
        "eptest-mac-{}-{:08x}",
        now.as_secs(),
        now.subsec_nanos() ^ std::process::id()
    );
    println!("eptest: domain {name}");
    let uid = ProxyUid(uuid::Uuid::new_v4());
    let mac = names::mac("eptestmac", &uid);
    // A user-mode NIC needs no network or bridge on the host.
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><devices><interface type='user'>\
         <mac address='{}'/><model type='virtio'/></interface></devices></domain>",
        mac.to_ascii_uppercase()
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.xml");
    std::fs::write(&f, xml).unwrap();
    let out = virsh(&["define", f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "virsh define: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _guard = Undefine(name.clone());
    tokio::time::timeout(BUDGET, async {
        let t = libvirt_remote::transport::unix::connect(
            "/run/libvirt/libvirt-sock",
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let c = Client::open(t, OpenOptions::default()).await.unwrap();
        let found = mac_user(&c, "local", &mac, "ep-eptestmac-new")
            .await
            .unwrap();
        assert_eq!(found.as_deref(), Some(name.as_str()));
        // The domain being created (or adopted) is not a collision with itself.
        assert_eq!(mac_user(&c, "local", &mac, &name).await.unwrap(), None);
        let free = names::mac("eptestmac", &ProxyUid(uuid::Uuid::new_v4()));
        if free != mac {
            let other = mac_user(&c, "local", &free, "x").await.unwrap();
            assert!(other.as_deref() != Some(name.as_str()), "{other:?}");
        }
    })
    .await
    .expect("within the budget");
}
