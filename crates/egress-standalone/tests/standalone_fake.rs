//! Standalone mode end to end against libvirt-fake: several fake hosts behind one provider
//! entry, manifests in a temp directory, the status endpoint on 127.0.0.1, and a local HTTP
//! server for the image. A background "DHCP" task gives every running fake domain an address
//! on the NIC with its derived MAC (as the guest agent would report it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use egress_core::gc::GcSettings;
use egress_core::model::Phase;
use egress_core::providers::Providers;
use egress_provider::ProxyUid;
use egress_provider::libvirt::config::LibvirtEntry;
use egress_provider::libvirt::mark;
use egress_provider::libvirt::names;
use egress_standalone::manifests::uid_for;
use egress_standalone::{StandaloneError, StandaloneOptions, run};
use egress_web::status::StatusDocument;
use ep_operator_fixtures::{
    Dhcp, FakeHosts, GIB, POOL, get, qcow2_image, standalone_options, start_standalone, status,
    wait_status, write_proxy_manifest,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::{DomainSpec, FakeLibvirt, domain_state};
use tokio_util::sync::CancellationToken;

const ENTRY: &str = "fk";
/// Bound on every wait in these tests; far above what convergence takes (seconds).
const WAIT: Duration = Duration::from_secs(90);
/// Period of the "DHCP" task.
// NB: 50 ms: addresses appear well within one controller poll (200 ms here).
const DHCP_PERIOD: Duration = Duration::from_millis(50);

struct World {
    fakes: BTreeMap<String, FakeLibvirt>,
    hosts: FakeHosts,
    entry: LibvirtEntry,
    _server: ImageServer,
    dir: tempfile::TempDir,
    _dhcp: Option<Dhcp>,
}

/// Fake hosts `names`, an image server with `tiny`, a manifest directory, and (when
/// `dhcp`) a task giving running domains addresses.
async fn world(host_names: &[&str], dhcp: bool) -> World {
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    let hosts = FakeHosts::new(ENTRY, host_names).image("tiny", qcow2_image(url, sha(&image)));
    World {
        fakes: hosts.fakes().clone(),
        entry: hosts.entry().clone(),
        _dhcp: dhcp.then(|| hosts.start_dhcp(DHCP_PERIOD)),
        hosts,
        _server: server,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl World {
    /// A fresh provider registry over the same fakes (a restart builds a new one).
    fn providers(&self) -> Providers {
        self.hosts.providers_for(self.entry.clone())
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.yaml"))
    }

    fn write_manifest(&self, name: &str, host: Option<&str>) {
        write_proxy_manifest(self.dir.path(), name, ENTRY, "tiny", host);
    }

    fn options(&self) -> StandaloneOptions {
        let mut o = standalone_options(self.dir.path());
        o.workers = 4;
        o
    }

    /// Every domain, and every volume that is not a published base's (a base, its marker,
    /// and the `.part-` data volume a base names as its backing store), across all fakes:
    /// after convergence exactly the proxies' overlays and seeds; an orphaned `.part-`
    /// upload shows up here as a leak.
    fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        let mut doms = Vec::new();
        let mut vols = Vec::new();
        let prefix = names::base_prefix(ENTRY);
        for f in self.fakes.values() {
            doms.extend(f.domains().into_iter().map(|d| d.name));
            let all = f.volumes(POOL).unwrap();
            let backing: HashSet<String> = all
                .iter()
                .filter(|v| v.starts_with(&prefix))
                .filter_map(|v| f.volume(POOL, v).and_then(|i| i.backing))
                .collect();
            for v in all {
                let published = v.starts_with(&prefix)
                    && (!v.contains(".part-")
                        || f.volume(POOL, &v)
                            .is_some_and(|i| backing.contains(&i.path)));
                if !published {
                    vols.push(v);
                }
            }
        }
        doms.sort();
        vols.sort();
        (doms, vols)
    }
}

fn phase_of(doc: &StatusDocument, name: &str) -> Option<Phase> {
    doc.proxies.iter().find(|p| p.name == name).map(|p| p.phase)
}

fn all_running(names: &[String]) -> impl Fn(&StatusDocument) -> bool + '_ {
    move |d| names.iter().all(|n| phase_of(d, n) == Some(Phase::Running))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_runs_is_served_on_status_and_metrics_and_deleting_its_manifest_leaves_nothing() {
    let w = world(&["h1"], true).await;
    w.write_manifest("p1", None);
    let r = start_standalone(w.options(), w.providers()).await;
    assert_eq!(get(r.addr, "/healthz").await.0, 200);
    wait_status(r.addr, "p1 Running", WAIT, all_running(&["p1".into()])).await;
    assert_eq!(get(r.addr, "/readyz").await.0, 200);
    let d = status(r.addr).await;
    let row = &d.proxies[0];
    assert_eq!(row.uid, uid_for("default", "p1").canonical());
    assert_eq!(row.host.as_deref(), Some("h1"));
    assert!(
        row.ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.1.0.")),
        "{row:?}"
    );
    assert!(
        row.provider_id
            .as_deref()
            .is_some_and(|p| p.starts_with("libvirt://fk/h1/"))
    );
    let (code, m) = get(r.addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        m.contains("egress_proxies_proxies{phase=\"Running\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("egress_proxies_instance_creates_total{result=\"ok\"} 1"),
        "{m}"
    );
    wait_status(r.addr, "host h1 checked", WAIT, |d| {
        d.hosts.iter().any(|h| h.host == "h1" && h.state == "Ready")
    })
    .await;

    // A broken edit keeps the proxy (nothing lost on bad input) and is reported.
    std::fs::write(w.manifest_path("p1"), "apiVersion: [broken").unwrap();
    wait_status(r.addr, "manifest error reported", WAIT, |d| {
        !d.manifest_errors.is_empty() && phase_of(d, "p1") == Some(Phase::Running)
    })
    .await;

    std::fs::remove_file(w.manifest_path("p1")).unwrap();
    wait_status(r.addr, "p1 forgotten", WAIT, |d| d.proxies.is_empty()).await;
    assert_eq!(w.leftovers(), (vec![], vec![]), "nothing left on the host");
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_on_healthy_hosts_converge_while_another_host_freezes_mid_create() {
    // finding: H1
    let w = world(&["h1", "h2", "h3"], true).await;
    let mut names = Vec::new();
    for h in ["h1", "h2", "h3"] {
        for i in 0..3 {
            let n = format!("{h}-p{i}");
            w.write_manifest(&n, Some(h));
            names.push(n);
        }
    }
    // Freeze h2 as soon as its first create has begun (its first volume exists).
    let h2 = w.fakes["h2"].clone();
    let froze = tokio::spawn(async move {
        loop {
            if !h2.volumes(POOL).unwrap().is_empty() {
                h2.faults().freeze();
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // Fewer workers than proxies on the frozen host: if work on it could hold a worker
    // without bound, the healthy hosts would starve (the seed's H1).
    let mut o = w.options();
    o.workers = 2;
    let r = start_standalone(o, w.providers()).await;
    tokio::time::timeout(WAIT, froze).await.unwrap().unwrap();
    let healthy: Vec<String> = names
        .iter()
        .filter(|n| !n.starts_with("h2"))
        .cloned()
        .collect();
    wait_status(
        r.addr,
        "proxies on h1 and h3 Running",
        WAIT,
        all_running(&healthy),
    )
    .await;
    let d = status(r.addr).await;
    for i in 0..3 {
        assert_ne!(phase_of(&d, &format!("h2-p{i}")), Some(Phase::Running));
    }
    r.stop(WAIT).await;
    w.fakes["h2"].faults().thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_create_converges_without_leaks() {
    // finding: M3
    let mut w = world(&["h1", "h2"], true).await;
    // A cut upload leaves its `.part-` volume (a killed process cannot clean up); GC takes
    // it once it is older than the import deadline, shortened here so the test sees it.
    w.entry.timeouts.image_import = Duration::from_secs(4);
    let names: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    for n in &names {
        w.write_manifest(n, None);
    }
    for f in w.fakes.values() {
        f.faults().delay_replies(Some(Duration::from_millis(20)));
    }
    // No grace: creates in flight are cut, as a crash or a kill would.
    let mut first = w.options();
    first.shutdown_grace = Duration::ZERO;
    let r = start_standalone(first, w.providers()).await;
    // Stop as soon as a create is under way on some host (a volume of ours exists).
    let t0 = Instant::now();
    while w
        .fakes
        .values()
        .all(|f| f.volumes(POOL).unwrap().is_empty())
    {
        assert!(t0.elapsed() < WAIT, "no create started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    r.stop(WAIT).await;
    let running_before = w
        .fakes
        .values()
        .flat_map(|f| f.domains())
        .filter(|d| d.state == domain_state::RUNNING)
        .count();
    assert!(
        running_before < names.len(),
        "the stop did not cut any create"
    );
    for f in w.fakes.values() {
        f.faults().delay_replies(None);
    }

    // Restart with fresh providers over the same hosts: adoption finds what exists.
    let mut second = w.options();
    second.gc_interval = Duration::from_millis(500);
    second.gc = GcSettings {
        min_age: Duration::ZERO,
        dry_run: false,
        ..GcSettings::default()
    };
    let r = start_standalone(second, w.providers()).await;
    wait_status(
        r.addr,
        "every proxy Running after restart",
        WAIT,
        all_running(&names),
    )
    .await;
    let uids: Vec<ProxyUid> = names.iter().map(|n| uid_for("default", n)).collect();
    let mut want_doms: Vec<String> = uids.iter().map(|u| names::domain(ENTRY, u)).collect();
    want_doms.sort();
    let mut want_vols: Vec<String> = uids
        .iter()
        .flat_map(|u| [names::overlay(ENTRY, u), names::seed(ENTRY, u)])
        .collect();
    want_vols.sort();
    let t0 = Instant::now();
    loop {
        let (doms, vols) = w.leftovers();
        assert_eq!(doms, want_doms, "exactly one domain per proxy");
        if vols == want_vols {
            break;
        }
        assert!(
            t0.elapsed() < WAIT,
            "leaked volumes never collected: {vols:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let d = status(r.addr).await;
    assert!(
        names
            .iter()
            .all(|n| phase_of(&d, n) == Some(Phase::Running))
    );
    r.stop(WAIT).await;
}

/// The mark as libvirt hands it back, with any UID text.
fn mark_xml(uid_text: &str) -> String {
    format!(
        "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{uid_text}</uid>\n  \
         <entry>{ENTRY}</entry>\n  <createdAt>2020-01-01T00:00:00Z</createdAt>\n</instance>",
        mark::NAMESPACE
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_refuses_padded_case_changed_and_mismatched_marks_and_takes_a_true_orphan() {
    // finding: E2
    let w = world(&["h1"], true).await;
    let f = &w.fakes["h1"];
    let u = |n: u8| {
        ProxyUid::parse_strict(&format!("0f8fad5b-d9cb-469f-a165-7086772895{n:02x}")).unwrap()
    };
    let (padded, upper, renamed, orphan) = (u(1), u(2), u(3), u(4));
    f.add_domain(
        DomainSpec::new(names::domain(ENTRY, &padded))
            .metadata(mark::NAMESPACE, mark_xml(&format!(" {padded} "))),
    )
    .unwrap();
    f.add_domain(
        DomainSpec::new(names::domain(ENTRY, &upper))
            .metadata(mark::NAMESPACE, mark_xml(&upper.canonical().to_uppercase())),
    )
    .unwrap();
    // A valid mark on a domain whose name is another UID's: the name does not match.
    f.add_domain(
        DomainSpec::new(names::domain(ENTRY, &u(9)))
            .metadata(mark::NAMESPACE, mark_xml(&renamed.canonical())),
    )
    .unwrap();
    f.add_domain(
        DomainSpec::new(names::domain(ENTRY, &orphan))
            .metadata(mark::NAMESPACE, mark_xml(&orphan.canonical())),
    )
    .unwrap();
    w.write_manifest("live", None);
    let mut o = w.options();
    o.gc_interval = Duration::from_millis(500);
    o.gc = GcSettings {
        min_age: Duration::ZERO,
        dry_run: false,
        ..GcSettings::default()
    };
    let r = start_standalone(o, w.providers()).await;
    wait_status(r.addr, "live Running", WAIT, all_running(&["live".into()])).await;
    let t0 = Instant::now();
    while f.domain(&names::domain(ENTRY, &orphan)).is_some() {
        assert!(t0.elapsed() < WAIT, "GC never took the true orphan");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let several more passes run: the refused ones must still be there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (what, name) in [
        ("padded", names::domain(ENTRY, &padded)),
        ("case-changed", names::domain(ENTRY, &upper)),
        ("mismatched", names::domain(ENTRY, &u(9))),
        ("live", names::domain(ENTRY, &uid_for("default", "live"))),
    ] {
        assert!(
            f.domain(&name).is_some(),
            "GC deleted the {what} domain {name}"
        );
    }
    let (_, m) = get(r.addr, "/metrics").await;
    assert!(
        m.lines().any(
            |l| l.starts_with("egress_proxies_gc_deleted_instances_total ") && !l.ends_with(" 0")
        ),
        "{m}"
    );
    r.stop(WAIT).await;
}

/// Where `name`'s instance is, per the fakes: every host holding a domain named for its UID.
fn hosts_holding(w: &World, uid: &ProxyUid) -> Vec<String> {
    let dom = names::domain(ENTRY, uid);
    w.fakes
        .iter()
        .filter(|(_, f)| f.domain(&dom).is_some())
        .map(|(h, _)| h.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_a_live_proxys_instance_on_another_host_is_deleted_after_a_restart() {
    // A copy of the Proxy's instance on the other host, as a create whose answer was lost
    // there leaves it: its mark names the live UID, so GC must keep it; the controller does
    // not, and the copy the Proxy runs on stays.
    let w = world(&["h1", "h2"], true).await;
    w.write_manifest("twice", None);
    let uid = uid_for("default", "twice");
    let r = start_standalone(w.options(), w.providers()).await;
    wait_status(r.addr, "Running", WAIT, all_running(&["twice".into()])).await;
    r.stop(WAIT).await;
    let first = hosts_holding(&w, &uid);
    assert_eq!(first.len(), 1, "{first:?}");
    let other = if first[0] == "h1" { "h2" } else { "h1" };
    w.fakes[other]
        .add_domain(
            DomainSpec::new(names::domain(ENTRY, &uid))
                .metadata(mark::NAMESPACE, mark_xml(&uid.canonical())),
        )
        .unwrap();
    assert_eq!(hosts_holding(&w, &uid).len(), 2);

    // GC runs often and takes anything old: it must not be what removes the copy.
    let mut o = w.options();
    o.gc_interval = Duration::from_millis(500);
    o.gc = GcSettings {
        min_age: Duration::ZERO,
        dry_run: false,
        ..GcSettings::default()
    };
    let r = start_standalone(o, w.providers()).await;
    let t0 = Instant::now();
    loop {
        let d = status(r.addr).await;
        let held = hosts_holding(&w, &uid);
        if held.len() == 1 && all_running(&["twice".into()])(&d) {
            let row = d.proxies.iter().find(|p| p.name == "twice").unwrap();
            assert_eq!(row.host.as_deref(), Some(held[0].as_str()), "{row:?}");
            // The copy in use (the newer mark) is the one kept.
            assert_eq!(held, first, "the Proxy moved to the older copy");
            break;
        }
        assert!(
            t0.elapsed() < WAIT,
            "the second copy was never deleted: on {held:?}; {:?}",
            d.proxies
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It stays that way: nothing is created again or deleted further.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(hosts_holding(&w, &uid).len(), 1);
    let (_, m) = get(r.addr, "/metrics").await;
    assert!(
        m.lines().any(|l| l
            .starts_with("egress_proxies_instance_duplicate_deletes_total{result=\"ok\"}")
            && !l.ends_with(" 0")),
        "{m}"
    );
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provisioning_deadline_fails_a_proxy_that_never_reports_an_address() {
    // finding: APX-1
    let w = world(&["h1"], false).await; // no DHCP: the guest never reports an address
    w.write_manifest("mute", None);
    let mut o = w.options();
    o.controller.provisioning_deadline = Duration::from_secs(3);
    o.controller.replace_on_deadline = false;
    let started = Instant::now();
    let r = start_standalone(o, w.providers()).await;
    wait_status(r.addr, "mute Failed", WAIT, |d| {
        phase_of(d, "mute") == Some(Phase::Failed)
    })
    .await;
    // Status timestamps have whole-second resolution, so the deadline can expire up to 1 s
    // early by the wall clock.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "failed before its deadline: {:#?}",
        status(r.addr).await
    );
    let d = status(r.addr).await;
    let row = &d.proxies[0];
    let err = row.last_error.clone().unwrap_or_default();
    assert!(err.contains("provisioning deadline"), "{row:#?}");
    assert!(
        err.contains("no address"),
        "the condition says what is missing: {err}"
    );
    assert!(
        row.conditions
            .iter()
            .any(|c| c.reason == "ProvisioningTimeout"),
        "{row:#?}"
    );
    r.stop(WAIT).await;
}

#[tokio::test]
async fn a_broken_config_refuses_to_start_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        "providers:\n  - name: Bad_Name\n    type: libvirt\n    hosts: []\n",
    )
    .unwrap();
    let mut o = StandaloneOptions::new(dir.path());
    o.config_path = Some(cfg);
    o.listen = "127.0.0.1:0".parse().unwrap();
    let e = run(o, CancellationToken::new()).await.unwrap_err();
    assert!(matches!(e, StandaloneError::Config(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("providers[0].name") && msg.contains("providers[0].hosts"),
        "{msg}"
    );
}

/// Peak resident set size of this process (operator, fakes and test together), KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The benchmark shape, scaled by `EP_BENCH_PROXIES` (default 1000): proxies across
/// 10 fake hosts from empty to Running. Prints wall time and peak RSS; run with
/// `cargo test --release -p egress-standalone --test standalone_fake -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn bench_proxies_across_ten_fake_hosts_reach_running() {
    let n: usize = std::env::var("EP_BENCH_PROXIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let hosts: Vec<String> = (0..10).map(|i| format!("h{i}")).collect();
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let mut w = world(&host_refs, true).await;
    for h in &mut w.entry.hosts {
        h.max_concurrent = 8;
    }
    let mut docs = String::new();
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("b{i}");
        docs.push_str(&format!(
            "---\napiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: {ENTRY}\n  host: h{}\n  image: tiny\n  resources:\n    diskGiB: 4\n    \
             memoryMiB: 256\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n",
            i % 10
        ));
        names.push(name);
    }
    std::fs::write(w.dir.path().join("all.yaml"), docs).unwrap();
    let mut o = w.options();
    o.workers = 8;
    o.controller.poll_provisioning = Duration::from_millis(500);
    let t0 = Instant::now();
    let r = start_standalone(o, w.providers()).await;
    let t = Instant::now();
    loop {
        let d = status(r.addr).await;
        let running = d
            .proxies
            .iter()
            .filter(|p| p.phase == Phase::Running)
            .count();
        if running == n {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "{running}/{n} Running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "bench: {n} proxies on 10 fake hosts Running in {:.1} s; peak RSS of the test process \
         (operator + 10 fakes + image server) {} MiB",
        t0.elapsed().as_secs_f64(),
        peak_rss_kib() / 1024
    );
    r.stop(WAIT).await;
}
