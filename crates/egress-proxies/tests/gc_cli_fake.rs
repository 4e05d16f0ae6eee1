//! `egress-proxies gc` (the binary) against a libvirt-fake host on a unix socket: the dry run
//! and the real run decide the same for every item — in particular for a domain kept because
//! its mark is malformed, whose disks the dry run must not list as "would delete" when the
//! real run keeps them — and the real run exits 0, round after round.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::{mark, names};
use egress_standalone::manifests::uid_for;
use ep_operator_fixtures::write_proxy_manifest;
use libvirt_fake::{DomainSpec, FakeLibvirt, NetworkSpec, PoolSpec, VolumeSpec};

const ENTRY: &str = "home";
const POOL: &str = "images";
/// Deadline of one run of the binary.
// NB: a pass against the fake takes milliseconds after the process starts; 60 s only turns
// a hang into a failure.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

async fn gc(cfg: &Path, proxies: &Path, dry_run: bool) -> (Output, serde_json::Value) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies"));
    cmd.args(["gc", "--config"])
        .arg(cfg)
        .arg("--proxies")
        .arg(proxies)
        .args(["--min-age", "0s", "--json"])
        .kill_on_drop(true);
    if dry_run {
        cmd.arg("--dry-run");
    }
    let out = tokio::time::timeout(RUN_DEADLINE, cmd.output())
        .await
        .expect("gc finishes within its deadline")
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not a JSON report ({e}):\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

/// (name, whether it is (or would be) deleted) for every item of a report.
fn verdicts(report: &serde_json::Value) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let a = i["action"].as_str().unwrap();
            (
                i["name"].as_str().unwrap().to_owned(),
                a == "deleted" || a == "would-delete",
            )
        })
        .collect();
    v.sort();
    v
}

fn action<'a>(report: &'a serde_json::Value, name: &str) -> &'a str {
    report["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no item {name}: {report:#}"))["action"]
        .as_str()
        .unwrap()
}

fn add_disks(f: &FakeLibvirt, u: &ProxyUid) {
    f.add_volume(
        POOL,
        VolumeSpec::new(names::overlay(ENTRY, u), 1 << 30).format("qcow2"),
    )
    .unwrap();
    f.add_volume(POOL, VolumeSpec::new(names::seed(ENTRY, u), 1 << 20))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dry_run_and_the_real_run_decide_the_same_and_a_malformed_marks_disks_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("h1.sock");
    let fake = FakeLibvirt::new();
    fake.add_pool(PoolSpec::new(POOL).capacity(100 << 30))
        .unwrap();
    fake.add_network(NetworkSpec::new("default")).unwrap();
    fake.listen_unix(&sock).await.unwrap();

    // A live Proxy (its manifest is in the directory) with its domain and disks; an orphan
    // with a valid mark; a domain whose mark is malformed, with its disks.
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    write_proxy_manifest(&proxies, "live", ENTRY, "tiny", None);
    let live = uid_for("default", "live");
    let orphan = ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-708677289501").unwrap();
    let malformed = ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-708677289502").unwrap();
    let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for u in [live, orphan] {
        fake.add_domain(
            DomainSpec::new(names::domain(ENTRY, &u))
                .metadata(mark::NAMESPACE, mark::render(&u, ENTRY, long_ago)),
        )
        .unwrap();
        add_disks(&fake, &u);
    }
    fake.add_domain(
        DomainSpec::new(names::domain(ENTRY, &malformed))
            .metadata(mark::NAMESPACE, "<instance xmlns=\"x\"><uid>not-a-uid"),
    )
    .unwrap();
    add_disks(&fake, &malformed);

    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}\n        pool: {POOL}\n        network: default\n        \
             virtType: qemu\n        poolReserveGiB: 1\n    timeouts:\n      dial: 3\n",
            sock.display()
        ),
    )
    .unwrap();

    let (dry_out, dry) = gc(&cfg, &proxies, true).await;
    assert_eq!(dry_out.status.code(), Some(0), "{dry:#}");
    let (real_out, real) = gc(&cfg, &proxies, false).await;
    assert_eq!(real_out.status.code(), Some(0), "a clean pass: {real:#}");
    assert_eq!(
        verdicts(&dry),
        verdicts(&real),
        "dry:\n{dry:#}\nreal:\n{real:#}"
    );
    for n in [
        names::overlay(ENTRY, &malformed),
        names::seed(ENTRY, &malformed),
    ] {
        assert_eq!(action(&dry, &n), "kept", "{dry:#}");
        assert_eq!(action(&real, &n), "kept", "{real:#}");
    }
    assert_eq!(action(&real, &names::domain(ENTRY, &orphan)), "deleted");
    assert!(fake.domain(&names::domain(ENTRY, &malformed)).is_some());
    assert!(fake.volume(POOL, &names::seed(ENTRY, &malformed)).is_some());
    assert!(fake.domain(&names::domain(ENTRY, &orphan)).is_none());

    // The next round agrees again and is clean: nothing left to collect, nothing failed.
    let (dry_out, dry) = gc(&cfg, &proxies, true).await;
    let (real_out, real) = gc(&cfg, &proxies, false).await;
    assert_eq!(dry_out.status.code(), Some(0), "{dry:#}");
    assert_eq!(real_out.status.code(), Some(0), "{real:#}");
    assert_eq!(verdicts(&dry), verdicts(&real));
    assert!(
        verdicts(&real).iter().all(|(_, deleted)| !deleted),
        "{real:#}"
    );
}
