//! What standalone mode reports about itself, against libvirt-fake hosts in this process: the
//! `image_bytes` metric fed from create progress, `createdAt` in /status from the instance's
//! mark, readiness through a bad config reload, and the wake-ups that let queued Proxies go
//! as soon as a host slot frees up (the 1000-proxy benchmark's fix).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use egress_core::model::Phase;
use egress_core::providers::Providers;
use egress_provider::libvirt::mark;
use egress_provider::libvirt::names;
use egress_standalone::manifests::uid_for;
use egress_standalone::{POLL_INTERVAL, StandaloneOptions};
use egress_web::status::StatusDocument;
use ep_operator_fixtures::{
    Dhcp, FakeHosts, GIB, get, qcow2_image, standalone_options, start_standalone, status,
    wait_status, write_proxy_manifest,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{DomainSpec, FakeLibvirt};

const ENTRY: &str = "ob";
/// Bound on every wait here; convergence takes about a second.
const WAIT: Duration = Duration::from_secs(90);
/// A poll interval no test may rely on: if a Proxy converges well before it, something other
/// than polling (a wake-up) moved it.
const SLOW_POLL: Duration = Duration::from_secs(3600);
/// Period of the "DHCP" task.
// NB: 20 ms: addresses appear well within one controller poll (200 ms here), so the
// wake-up tests measure the operator, not the fake guest.
const DHCP_PERIOD: Duration = Duration::from_millis(20);

struct World {
    fakes: BTreeMap<String, FakeLibvirt>,
    hosts: FakeHosts,
    server: ImageServer,
    image_len: u64,
    dir: tempfile::TempDir,
    _dhcp: Dhcp,
}

async fn world(max_concurrent: u32) -> World {
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 64 * 1024);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    let hosts = FakeHosts::new(ENTRY, &["h1"])
        .max_concurrent(max_concurrent)
        .image("tiny", qcow2_image(url, sha(&image)));
    World {
        fakes: hosts.fakes().clone(),
        _dhcp: hosts.start_dhcp(DHCP_PERIOD),
        hosts,
        server,
        image_len: image.len() as u64,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl World {
    fn providers(&self) -> Providers {
        self.hosts.providers()
    }

    fn write_manifest(&self, name: &str) {
        write_proxy_manifest(self.dir.path(), name, ENTRY, "tiny", None);
    }

    fn options(&self) -> StandaloneOptions {
        let mut o = standalone_options(self.dir.path());
        o.workers = 2;
        o
    }
}

fn running<'a>(names: &'a [&'a str]) -> impl Fn(&StatusDocument) -> bool + 'a {
    move |d| {
        names.iter().all(|n| {
            d.proxies
                .iter()
                .any(|p| p.name == *n && p.phase == Phase::Running && p.ip.is_some())
        })
    }
}

/// The value of an un-labelled metric in the OpenMetrics text.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_bytes_metric_counts_what_creates_imported_once_per_import() {
    let w = world(2).await;
    let r = start_standalone(w.options(), w.providers()).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_transferred_bytes_total"),
        Some(0),
        "{m}"
    );

    w.write_manifest("p1");
    wait_status(r.addr, "p1 Running", WAIT, running(&["p1"])).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_transferred_bytes_total"),
        Some(w.image_len),
        "the whole image was imported by p1's create: {m}"
    );
    assert_eq!(w.server.body_bytes_sent("/tiny.qcow2"), w.image_len);

    // A second create on the same host uses the cached base: nothing more is transferred.
    w.write_manifest("p2");
    wait_status(r.addr, "p2 Running", WAIT, running(&["p1", "p2"])).await;
    let (_, m) = get(r.addr, "/metrics").await;
    assert_eq!(
        metric(&m, "egress_proxies_image_transferred_bytes_total"),
        Some(w.image_len),
        "{m}"
    );
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_at_in_status_is_the_adopted_instances_mark_time_and_a_new_ones_create_time() {
    let w = world(2).await;
    // An instance of `old` from an earlier run: created 2020-01-01 according to its mark.
    let old = uid_for("default", "old");
    let name = names::domain(ENTRY, &old);
    w.fakes["h1"]
        .add_domain(
            DomainSpec::new(name.clone()).running().metadata(
                mark::NAMESPACE,
                format!(
                    "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{}</uid>\n  \
                     <entry>{ENTRY}</entry>\n  <createdAt>2020-01-01T00:00:00Z</createdAt>\n</instance>",
                    mark::NAMESPACE,
                    old.canonical()
                ),
            ),
        )
        .unwrap();
    w.write_manifest("old");
    w.write_manifest("new");
    let before = SystemTime::now();
    let r = start_standalone(w.options(), w.providers()).await;
    wait_status(r.addr, "both Running", WAIT, running(&["old", "new"])).await;
    let d = status(r.addr).await;
    let row = |n: &str| d.proxies.iter().find(|p| p.name == n).unwrap().clone();
    assert_eq!(
        row("old").created_at,
        "2020-01-01T00:00:00Z",
        "the mark's time, not when this process first saw the manifest"
    );
    assert_eq!(
        w.fakes["h1"].domains().len(),
        2,
        "old was adopted, not recreated"
    );
    let new_at = humantime::parse_rfc3339(&row("new").created_at).unwrap();
    assert!(
        new_at + Duration::from_secs(1) >= before,
        "a fresh instance is dated by its create: {new_at:?}"
    );
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_reload_keeps_the_process_ready_and_the_running_config_working() {
    let w = world(2).await;
    let cfg = w.dir.path().join("providers.conf");
    std::fs::write(&cfg, "# replaced below\n").unwrap();
    let mut o = w.options();
    o.config_path = Some(cfg.clone());
    let r = start_standalone(o, w.providers()).await;
    w.write_manifest("p1");
    wait_status(r.addr, "p1 Running", WAIT, running(&["p1"])).await;
    assert_eq!(get(r.addr, "/readyz").await.0, 200);

    std::fs::write(&cfg, "providers:\n  - name: BAD NAME\n    type: libvirt\n").unwrap();
    // Let the config poller see the change and refuse it.
    tokio::time::sleep(POLL_INTERVAL * 2 + Duration::from_millis(500)).await;
    assert_eq!(
        get(r.addr, "/readyz").await.0,
        200,
        "readiness stays on: the running config still serves"
    );
    w.write_manifest("p2");
    wait_status(
        r.addr,
        "p2 Running under the running config",
        WAIT,
        running(&["p1", "p2"]),
    )
    .await;
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_refused_a_host_slot_start_as_soon_as_one_frees_without_waiting_for_a_poll() {
    // One slot on the only host, and every requeue (provisioning poll, host-busy retry,
    // backoff) an hour away: a create's result can only be picked up if its finish wakes its
    // Proxy, and p2 and p3 can only get the slot if its release wakes them.
    let w = world(1).await;
    for n in ["p1", "p2", "p3"] {
        w.write_manifest(n);
    }
    let mut o = w.options();
    o.controller.poll_provisioning = SLOW_POLL;
    o.controller.backoff_base = SLOW_POLL;
    o.controller.backoff_max = SLOW_POLL;
    let r = start_standalone(o, w.providers()).await;
    wait_status(r.addr, "p1..p3 created", WAIT, |d| {
        d.proxies.len() == 3 && d.proxies.iter().all(|p| p.provider_id.is_some())
    })
    .await;
    assert_eq!(w.fakes["h1"].domains().len(), 3);
    let (_, m) = get(r.addr, "/metrics").await;
    assert!(
        metric(&m, "egress_proxies_host_busy_refusals_total").is_some_and(|n| n >= 1),
        "some Proxy was refused the slot: {m}"
    );
    r.stop(WAIT).await;
}
