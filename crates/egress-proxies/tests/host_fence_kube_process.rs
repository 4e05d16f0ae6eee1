//! An administrator declares a dead host dead in Kubernetes mode, through the real
//! `egress-proxies kubernetes` binary against the fake API server behind real HTTPS, over two
//! libvirt-fake hosts of one segment sharing one address pool (no fence command configured).
//! The declaration is the `fence.egress-proxies.dev/HOST` annotation on the entry's
//! ProviderHealth, written with `egress-proxies hosts fence --kubernetes` (a JSON merge
//! patch, as `kubectl annotate` does).
//!
//! What it proves, through what a user reads (the Proxies' and the ProviderHealth's status,
//! the ProviderHealth's annotations):
//! - Proxy `a` holds the pool's first address on host X; a declaration on X while X answers
//!   is removed by the operator and frees nothing (later, `b` still waits for X);
//! - X frozen (nothing answered): Proxy `b`, pinned to that address, waits (not Running,
//!   nothing defined on Y) for longer than several checks; an annotation naming no host of the entry is reported in the
//!   `FenceDeclarations` condition and never crashes anything;
//! - X declared dead: `b` comes up on the other host Y with the address, X's row shows the
//!   declaration `Applied` with the freed address, and so does `egress-proxies status`
//!   against the operator's `--status-listen` (`host fake/X is Timeout…` then `declared
//!   dead: REASON (Applied at …, freed ADDRESS)`); the annotation stays while X is dead;
//! - `a`, whose host X is dead, keeps its phase with `Ready` False, reason `HostUnreachable`
//!   naming X;
//! - once X answers again, the operator removes X's annotation, and `status` no longer shows
//!   the declaration.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube_support::{
    ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, free_port, health_rows,
    proxy_resource, status_cli, wait_for,
};
use serde_json::{Value, json};

const NS: &str = "team-fence";
const ADDRESS: &str = "203.0.113.10";
/// Hang guard of every wait (fake hosts answer in microseconds).
const DEADLINE: Duration = Duration::from_secs(90);
/// How long `b` is watched waiting (several 1 s checks).
const WAITING: Duration = Duration::from_secs(6);
const GROUP: &str = "egress-proxies.dev";

const POOL_YAML: &str = "        segment: lan\n        addressPool:\n          ipv4:\n            \
    prefix: 203.0.113.0/24\n            gateway: 203.0.113.1\n            \
    ranges: [203.0.113.10-203.0.113.12]\n";

/// The fake hosts' provider config with both hosts on segment `lan` sharing the pool.
fn segment_config(hosts: &SocketHosts) -> std::path::PathBuf {
    let text = std::fs::read_to_string(hosts.config()).unwrap();
    let text = text.replace(
        "poolReserveGiB: 1\n",
        &format!("poolReserveGiB: 1\n{POOL_YAML}"),
    );
    assert_eq!(text.matches("segment: lan").count(), 2, "{text}");
    let path = hosts.dir.path().join("providers-segment.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn create_proxy(client: &kube::Client, name: &str, pinned: Option<&str>) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &proxy_resource());
    let mut spec = json!({"provider": ENTRY, "image": IMAGE,
                          "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}});
    if let Some(a) = pinned {
        spec["egress"] = json!({"address": [a]});
    }
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": NS}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// Proxy `name`: (phase, host, egress addresses, Ready message).
fn proxy_row(srv: &ApiServer, name: &str) -> Option<(String, String, Vec<String>, String)> {
    let p = srv.proxy(NS, name)?;
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let st = &p["status"];
    let host = st["host"].as_str().or(p["spec"]["host"].as_str());
    let egress = st["egressAddress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let ready = st["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| s(&c["message"]))
        .unwrap_or_default();
    Some((
        s(&st["phase"]),
        host.unwrap_or("-").to_owned(),
        egress,
        ready,
    ))
}

fn provider_health(srv: &ApiServer) -> Value {
    srv.api
        .object(GROUP, "providerhealths", "", ENTRY)
        .unwrap_or(Value::Null)
}

fn fence_annotation(srv: &ApiServer, host: &str) -> Option<String> {
    provider_health(srv)["metadata"]["annotations"][format!("fence.egress-proxies.dev/{host}")]
        .as_str()
        .map(str::to_owned)
}

/// Host `host`'s `fenced` in the ProviderHealth's status.
fn fenced_row(srv: &ApiServer, host: &str) -> Value {
    provider_health(srv)["status"]["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["host"] == host)
        .map(|h| h["fenced"].clone())
        .unwrap_or(Value::Null)
}

/// Runs `egress-proxies hosts ARGS --kubernetes --kubeconfig K`: (exit code, stdout, stderr).
fn hosts_cmd(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
        .arg("hosts")
        .args(args)
        .arg("--kubernetes")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("KUBECONFIG")
        .env("USER", "ops-alice")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_address_held_on_a_dead_host_moves_only_after_a_fence_annotation_in_kubernetes() {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(2).await;
    let cfg = segment_config(&hosts);
    let kubeconfig = srv.kubeconfig();
    let status_listen = format!("127.0.0.1:{}", free_port());
    let op = Operator::start_with(
        &cfg,
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-fence",
        &[
            "--check-interval".into(),
            "1s".into(),
            "--status-listen".into(),
            status_listen.clone(),
        ],
    );
    let client = srv.client().await;
    create_proxy(&client, "a", None).await;

    // `a` runs with the pool's first address on one host: that host is X.
    let x = wait_for("a running with the first address", DEADLINE, || async {
        proxy_row(&srv, "a")
            .filter(|(phase, _, egress, _)| phase == "Running" && egress == &[ADDRESS])
            .map(|(_, host, _, _)| host)
    })
    .await;
    let y = hosts.fakes.keys().find(|h| **h != x).unwrap().clone();
    println!("eptest: a runs on {x} with {ADDRESS}");

    // A declaration on X while X answers: removed by the operator, nothing applied.
    let (code, out, err) = hosts_cmd(&kubeconfig, &["fence", &x, "--reason", "wrong host"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(fence_annotation(&srv, &x).is_some());
    let t_ann = Instant::now();
    wait_for("the operator removes X's declaration", DEADLINE, || async {
        let row = fenced_row(&srv, &x);
        assert_ne!(row["state"], "Applied", "applied while {x} answers: {row}");
        fence_annotation(&srv, &x).is_none().then_some(())
    })
    .await;
    println!(
        "eptest: the declaration on a live {x} removed {:.1} s after it was written",
        t_ann.elapsed().as_secs_f64()
    );

    println!("eptest: freezing {x}");
    hosts.fakes[&x].faults().freeze();
    wait_for(&format!("{x} dead in its row"), DEADLINE, || async {
        let st = health_rows(&srv, "state")
            .get(&x)
            .cloned()
            .unwrap_or_default();
        (st == "Timeout" || st == "Unreachable").then_some(())
    })
    .await;

    // `b` pins the address: it waits, saying for what.
    create_proxy(&client, "b", Some(ADDRESS)).await;
    let want = format!("held by another Proxy's instance on host {x}");
    let t_b = Instant::now();
    let mut waiting_since: Option<Instant> = None;
    while waiting_since.is_none_or(|t| t.elapsed() < WAITING) {
        let row = proxy_row(&srv, "b");
        if let Some((phase, _, egress, msg)) = &row {
            assert_ne!(phase, "Running", "b running while {x} is dead: {row:?}");
            assert!(egress.is_empty(), "{row:?}");
            // NB: the create waits inside the provider; the condition may say only
            // "creating" until it returns with the reason.
            if waiting_since.is_none() {
                waiting_since = Some(Instant::now());
                println!("eptest: b waits: {msg}");
            }
            if msg.contains(&want) {
                println!("eptest: b says: {msg}");
            }
        }
        assert_eq!(hosts.domains(&y), 0, "b defined on {y} while {x} is dead");
        assert!(
            t_b.elapsed() < DEADLINE,
            "b never said it waits for {x}: {row:?}\n{}",
            op.stderr()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // An annotation naming no host of the entry: reported, never applied, nothing crashes.
    // (The CLI refuses it, so it is written as a raw `kubectl annotate` would.)
    let (code, _, err) = hosts_cmd(&kubeconfig, &["fence", "h9"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("h9") && err.contains(ENTRY), "{err}");
    let phs: Api<egress_kube::api::ProviderHealth> = Api::all(client.clone());
    phs.patch(
        ENTRY,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
            "fence.egress-proxies.dev/h9": "typo"}}})),
    )
    .await
    .unwrap();
    wait_for("the unknown host reported", DEADLINE, || async {
        provider_health(&srv)["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| {
                c["type"] == "FenceDeclarations"
                    && c["status"] == "False"
                    && c["message"].as_str().unwrap_or("").contains("h9")
            })
            .map(|_| ())
    })
    .await;
    let row = proxy_row(&srv, "b");
    assert_ne!(
        row.as_ref().map(|r| r.0.as_str()),
        Some("Running"),
        "{row:?}"
    );

    // The administrator declares X dead: b comes up on Y with the address.
    let (code, out, err) = hosts_cmd(&kubeconfig, &["fence", &x, "--reason", "rack 4 unplugged"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("host {x} of entry {ENTRY} declared dead")),
        "{out}"
    );
    assert_eq!(
        fence_annotation(&srv, &x).as_deref(),
        Some("rack 4 unplugged")
    );
    let t_fence = Instant::now();
    let row = wait_for(
        "X's row shows the declaration applied",
        DEADLINE,
        || async {
            let r = fenced_row(&srv, &x);
            (r["state"] == "Applied").then_some(r)
        },
    )
    .await;
    println!(
        "eptest: {x}'s row shows the declaration applied {:.1} s after it was written",
        t_fence.elapsed().as_secs_f64()
    );
    wait_for("b running after the declaration", DEADLINE, || async {
        let row = proxy_row(&srv, "b")?;
        (row.0 == "Running").then_some(())?;
        assert_eq!(
            (row.1.as_str(), row.2.as_slice()),
            (y.as_str(), &[ADDRESS.to_owned()][..])
        );
        Some(())
    })
    .await;
    println!(
        "eptest: b running on {y} with {ADDRESS} {:.1} s after the declaration",
        t_fence.elapsed().as_secs_f64()
    );
    assert_eq!(row["reason"], "rack 4 unplugged", "{row}");
    assert_eq!(row["freed"], json!([ADDRESS]), "{row}");
    assert!(row["appliedAt"].is_string(), "{row}");
    assert!(
        fence_annotation(&srv, &x).is_some(),
        "the annotation went while {x} is dead"
    );

    // What a user sees: `egress-proxies status` names X dead and the declaration applied.
    let declared = "\n  declared dead: rack 4 unplugged (Applied at ";
    let freed = format!(", freed {ADDRESS})\n");
    let out = wait_for("status shows the declaration", DEADLINE, || async {
        let (_, out) = status_cli(&status_listen);
        (out.contains(declared) && out.contains(&freed)).then_some(out)
    })
    .await;
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("host {ENTRY}/{x} is ")))
        .unwrap_or_default();
    assert!(
        line.starts_with(&format!("host {ENTRY}/{x} is Timeout"))
            || line.starts_with(&format!("host {ENTRY}/{x} is Unreachable")),
        "{out}"
    );
    println!("eptest: egress-proxies status:\n{out}");

    // `a`, on the dead X: Ready False, reason HostUnreachable, naming X (its next reconcile).
    let t_a = Instant::now();
    let msg = wait_for("a's Ready names its dead host", DEADLINE, || async {
        let p = srv.proxy(NS, "a")?;
        let c = p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready" && c["reason"] == "HostUnreachable")?
            .clone();
        assert_eq!(p["status"]["phase"], "Running", "{p:#}");
        Some(c["message"].as_str().unwrap_or("").to_owned())
    })
    .await;
    assert!(
        msg.starts_with(&format!("host {x} Timeout since "))
            || msg.starts_with(&format!("host {x} Unreachable since ")),
        "{msg}"
    );
    println!(
        "eptest: a says (after {:.1} s more): {msg}",
        t_a.elapsed().as_secs_f64()
    );

    // X answers again: the operator removes its annotation (the unknown one stays).
    hosts.fakes[&x].faults().thaw();
    let t_thaw = Instant::now();
    wait_for(
        "X's annotation removed once it answers",
        DEADLINE,
        || async { fence_annotation(&srv, &x).is_none().then_some(()) },
    )
    .await;
    assert_eq!(fence_annotation(&srv, "h9").as_deref(), Some("typo"));
    wait_for("status without the declaration", DEADLINE, || async {
        let (_, out) = status_cli(&status_listen);
        (!out.contains("declared dead") && !out.is_empty()).then_some(())
    })
    .await;
    println!(
        "eptest: {x}'s annotation removed {:.1} s after it was thawed",
        t_thaw.elapsed().as_secs_f64()
    );
    let log = op.stderr();
    assert!(
        log.contains("host declared dead by an administrator") && log.contains("answered again"),
        "{log}"
    );
}
