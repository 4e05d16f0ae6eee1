//! Debris of an upload cut by a real libvirtd crash: a PRIVATE libvirtd (its own network and
//! mount namespaces, never the machine's shared one) is killed with SIGKILL while an image
//! streams into its pool; the partial `.part-*` volume is still in the pool when the daemon
//! comes back, and the provider's first host check that finds the host answering again
//! removes it. The pool is listed with `virsh` before and after.
//!
//! Needs root, libvirtd, iproute2 and util-linux (`.ci/setup-host`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    Firmware, HostConfig, ImageFormat, ImageSpec, Timeouts, VirtType,
};
use egress_provider::libvirt::hostpool::{HostPool, PoolOptions, UnixConnector};
use egress_provider::libvirt::image::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{HostState, NoProgress, Provider};
use ep_test_support::libvirtd::PrivateLibvirtd;
use image_support::{ImageServer, Route, qcow2, sha};

const MIB: u64 = 1 << 20;
/// Bound for each wait of the test.
// NB: a private libvirtd starts in ~1 s and the upload reaches its stall in well under a
// second; 60 s covers a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

fn volumes(lv: &PrivateLibvirtd, pool: &str) -> Vec<String> {
    let mut v: Vec<String> = lv
        .virsh_ok(&["vol-list", pool])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_left_by_a_killed_libvirtd_is_removed_once_it_answers_again() {
    let mut lv = PrivateLibvirtd::start("debris");
    let pool = "eptest-debris";
    let pool_dir = lv.dir.join("pool");
    std::fs::create_dir_all(&pool_dir).unwrap();
    lv.virsh_ok(&[
        "pool-define-as",
        pool,
        "dir",
        "--target",
        pool_dir.to_str().unwrap(),
    ]);
    lv.virsh_ok(&["pool-start", pool]);
    lv.virsh_ok(&["pool-autostart", pool]);

    // An image that stalls after 8 MiB: the upload is in flight when the daemon is killed.
    let server = ImageServer::start().await;
    let img = qcow2(64 * MIB, 24 * MIB as usize);
    let mut route = Route::new(img.clone());
    route.stall_at = Some(8 * MIB as usize);
    let url = server.route("/tiny", route);
    let mut e = image_fixtures::entry("eptest");
    e.images.insert(
        "tiny".into(),
        ImageSpec {
            url,
            sha256: Some(sha(&img)),
            format: ImageFormat::Qcow2,
            firmware: Firmware::Bios,
            ca_file: None,
        },
    );
    e.hosts = vec![HostConfig {
        name: "h1".into(),
        address: "local".into(),
        user: "root".into(),
        socket: lv.socket().to_str().unwrap().into(),
        pool: pool.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }];
    let hostpool = HostPool::new(
        e,
        Arc::new(UnixConnector::new(&Timeouts::default())),
        PoolOptions::default(),
    )
    .unwrap();
    let fetch = FetchOptions {
        allow_loopback_for_tests: true,
        ..FetchOptions::default()
    };
    let provider = Arc::new(LibvirtProvider::new(
        hostpool,
        fetch,
        CheckOptions::default(),
    ));
    let p = provider.clone();
    let import = tokio::spawn(async move { p.prefetch("h1", "tiny", &NoProgress).await });

    let t0 = Instant::now();
    let part = loop {
        let part_file = std::fs::read_dir(&pool_dir).unwrap().find_map(|e| {
            let e = e.unwrap();
            let n = e.file_name().to_string_lossy().into_owned();
            (n.contains(".part-") && e.metadata().unwrap().len() >= 4 * MIB).then_some(n)
        });
        if let Some(p) = part_file {
            break p;
        }
        assert!(t0.elapsed() < WAIT, "the upload never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("uploading into {part}; killing the private libvirtd with SIGKILL");
    lv.kill9();
    let r = tokio::time::timeout(WAIT, import).await.unwrap().unwrap();
    println!("the import: {r:?}");
    assert!(r.is_err(), "the import failed with its daemon");

    lv.restart();
    let before = volumes(&lv, pool);
    println!("pool {pool} after the restart: {before:?}");
    assert!(
        before.contains(&part),
        "the partial volume survived the crash: {before:?}"
    );

    let reports = tokio::time::timeout(WAIT, provider.check()).await.unwrap();
    assert_eq!(reports[0].state, HostState::Ready, "{reports:?}");
    let after = volumes(&lv, pool);
    println!("pool {pool} after the first host check: {after:?}");
    assert!(
        !after.iter().any(|v| v.contains(".part-")),
        "the check removed the debris: {after:?}"
    );
    lv.virsh_ok(&["pool-destroy", pool]);
    lv.virsh_ok(&["pool-undefine", pool]);
}
