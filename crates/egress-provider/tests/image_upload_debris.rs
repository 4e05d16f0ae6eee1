//! Debris of an upload cut by a daemon crash (libvirt-fake): libvirtd dies mid-upload (every
//! connection closed, no new one accepted), so the import cannot delete its temporary volume;
//! the part stays in the pool while the host is down, and the first host check that finds the
//! host answering again removes it — not the age-based sweep (40 minutes later by default).
//! A published base and another process's part are never touched.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod image_fixtures;
mod image_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_provider::libvirt::check::CheckOptions;
use egress_provider::libvirt::config::{
    Firmware, HostConfig, ImageFormat, ImageSpec, LibvirtEntry, VirtType,
};
use egress_provider::libvirt::hostpool::{Connector, HostPool, PoolOptions};
use egress_provider::libvirt::image::FetchOptions;
use egress_provider::libvirt::provider_impl::LibvirtProvider;
use egress_provider::{HostState, NoProgress, Provider, ProviderError};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{ConnHandle, FakeLibvirt, PoolSpec, VolumeSpec};
use libvirt_remote::Transport;

const POOL: &str = "images";
const MIB: u64 = 1 << 20;
/// Bound for the test body and each wait in it.
// NB: one small upload into the in-memory fake and three host checks; a minute covers a
// loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);

/// A libvirtd that can crash and come back: while down, every dial fails; a crash closes
/// every connection it served. Its state (the pool's volumes) survives, as on a real host.
struct Daemon {
    fake: FakeLibvirt,
    up: AtomicBool,
    served: Mutex<Vec<ConnHandle>>,
}

impl Daemon {
    fn crash(&self) {
        self.up.store(false, Ordering::SeqCst);
        for h in self.served.lock().unwrap().drain(..) {
            h.close();
        }
    }

    fn restart(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

struct DaemonConnector(Arc<Daemon>);

#[async_trait]
impl Connector for DaemonConnector {
    async fn connect(&self, host: &HostConfig) -> Result<Transport, ProviderError> {
        if !self.0.up.load(Ordering::SeqCst) {
            return Err(ProviderError::transient(format!(
                "connecting to host {}: connection refused",
                host.name
            )));
        }
        let (t, h) = self.0.fake.duplex();
        self.0.served.lock().unwrap().push(h);
        Ok(t)
    }
}

fn parts(fake: &FakeLibvirt) -> Vec<String> {
    fake.volumes(POOL)
        .unwrap()
        .into_iter()
        .filter(|n| n.contains(".part-"))
        .collect()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < BUDGET, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_left_by_a_daemon_crash_is_removed_once_the_host_answers_again() {
    tokio::time::timeout(BUDGET, async {
        let fake = FakeLibvirt::new();
        fake.add_pool(PoolSpec::new(POOL).capacity(800 * MIB).path("/pool"))
            .unwrap();
        // Another process's import in progress: a part this process never noted.
        let theirs = "ep-home-base-img-other-unverified.part-1900000000-0123456789abcdef";
        fake.add_volume(POOL, VolumeSpec::new(theirs, 4 * MIB))
            .unwrap();
        let daemon = Arc::new(Daemon {
            fake: fake.clone(),
            up: AtomicBool::new(true),
            served: Mutex::new(Vec::new()),
        });
        // The image stalls after 4 MiB: the upload is in flight when the daemon dies.
        let server = ImageServer::start().await;
        let img = qcow2(64 * MIB, 12 * MIB as usize);
        let mut route = Route::new(img.clone());
        route.stall_at = Some(4 * MIB as usize);
        let url = server.route("/tiny", route);
        let mut e = image_fixtures::entry("home");
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
            address: "h1.invalid".into(),
            user: "root".into(),
            socket: "/run/libvirt/libvirt-sock".into(),
            pool: POOL.into(),
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
        let provider = Arc::new(provider_over(daemon.clone(), e));
        let p = provider.clone();
        let import = tokio::spawn(async move { p.prefetch("h1", "tiny", &NoProgress).await });

        until("the upload to start", || parts(&fake).len() == 2).await;
        let ours: Vec<String> = parts(&fake).into_iter().filter(|n| n != theirs).collect();
        println!("upload in progress into {ours:?}");
        daemon.crash();
        let r = import.await.unwrap();
        println!("import: {r:?}");
        assert!(r.is_err(), "the import failed with the daemon");
        assert_eq!(
            parts(&fake).len(),
            2,
            "the daemon was down: nothing could delete the part"
        );

        // While the host is down, a check finds it Unreachable and removes nothing.
        let reports = provider.check().await;
        assert_eq!(reports[0].state, HostState::Unreachable, "{reports:?}");
        assert_eq!(parts(&fake).len(), 2);

        // The daemon is back: the next check removes our part, and only ours.
        daemon.restart();
        let reports = provider.check().await;
        assert_eq!(reports[0].state, HostState::Ready, "{reports:?}");
        assert_eq!(parts(&fake), vec![theirs.to_owned()], "{reports:?}");
        // Nothing is left to do: a further check deletes nothing more.
        let before = fake.volumes(POOL).unwrap();
        provider.check().await;
        assert_eq!(fake.volumes(POOL).unwrap(), before);
    })
    .await
    .expect("within the test budget");
}

fn provider_over(daemon: Arc<Daemon>, e: LibvirtEntry) -> LibvirtProvider {
    let pool = HostPool::new(e, Arc::new(DaemonConnector(daemon)), PoolOptions::default()).unwrap();
    let fetch = FetchOptions {
        allow_loopback_for_tests: true,
        ..FetchOptions::default()
    };
    LibvirtProvider::new(pool, fetch, CheckOptions::default())
}
