//! Pool failover when a host dies, in Kubernetes mode, through the real `egress-proxies
//! kubernetes` binary against the fake API server behind real HTTPS, over two libvirt-fake
//! hosts on unix sockets.
//!
//! What it proves: a pool of 2 spread over two hosts (h0 and h1, called h1 and h2 in the
//! code); h1 frozen (libvirt-fake's freeze fault), its `ProviderHealth` row turns
//! `Timeout`/`Unreachable`; the member on h1 is replaced on h2 no sooner than `autohealing.hostDeadAfter` (10 s) after that and within it + the check
//! interval + slack; the old member keeps no deletion timestamp and its domain stays on h1
//! while h1 is frozen (the pool's status names it in `lostMembers`, `ReplicaFailure`
//! `HostLost`); once h1 answers again the old member and its domain are deleted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use egress_kube::api::ProxyPool;
use kube::api::{Api, PostParams};
use kube_support::{ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, wait_for};
use serde_json::{Value, json};

/// Hang guard of every wait.
const DEADLINE: Duration = Duration::from_secs(150);
const GROUP: &str = "egress-proxies.dev";
const NS: &str = "team-hostlost";
const BUDGET: Duration = Duration::from_secs(10);
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long h1 stays frozen once the pool is whole on h2.
const HOLD: Duration = Duration::from_secs(15);

fn write_config(hosts: &SocketHosts) -> PathBuf {
    let mut cfg = format!("providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n");
    for h in hosts.fakes.keys() {
        cfg.push_str(&format!(
            "      - name: {h}\n        address: local\n        socket: {}\n        pool: {}\n        \
             network: default\n        virtType: qemu\n        poolReserveGiB: 1\n",
            hosts.dir.path().join(format!("{h}.sock")).display(),
            ep_operator_fixtures::POOL,
        ));
    }
    cfg.push_str(&format!(
        "    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        \
         sha256: {}\n        format: qcow2\n    timeouts:\n      dial: 3\n    defaults:\n      \
         diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
        kube_support::digest()
    ));
    let path = hosts.dir.path().join("providers.yaml");
    std::fs::write(&path, cfg).unwrap();
    path
}

/// The pool's members not being deleted: name → (host, Running with an address).
fn members(srv: &ApiServer) -> BTreeMap<String, (String, bool)> {
    srv.api
        .objects(GROUP, "proxies")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"] == NS
                && p["metadata"]["labels"]["egress-proxies.dev/pool"] == "web"
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                (
                    p["spec"]["host"].as_str().unwrap_or("-").to_owned(),
                    p["status"]["phase"] == "Running" && p["status"]["ip"].is_string(),
                ),
            )
        })
        .collect()
}

fn pool_status(srv: &ApiServer) -> Value {
    srv.api
        .object(GROUP, "proxypools", NS, "web")
        .map(|p| p["status"].clone())
        .unwrap_or(Value::Null)
}

/// Each host's `state` in the entry's ProviderHealth ("-" when absent).
fn states(srv: &ApiServer) -> BTreeMap<String, String> {
    srv.api
        .objects(GROUP, "providerhealths")
        .into_iter()
        .filter(|o| o["metadata"]["name"] == ENTRY)
        .flat_map(|o| o["status"]["hosts"].as_array().cloned().unwrap_or_default())
        .map(|h| {
            (
                h["host"].as_str().unwrap_or("").to_owned(),
                h["state"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

fn domains(hosts: &SocketHosts, h: &str) -> usize {
    hosts.fakes[h].domains().len()
}

fn on(m: &BTreeMap<String, (String, bool)>, host: &str) -> usize {
    m.values().filter(|(h, _)| h == host).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_a_member_on_a_dead_host_after_the_budget_in_kubernetes() {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(2).await;
    let cfg = write_config(&hosts);
    let kubeconfig = srv.kubeconfig();
    let op = Operator::start_with(
        &cfg,
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-hostlost",
        &[
            "--check-interval".into(),
            format!("{}s", CHECK_INTERVAL.as_secs()),
        ],
    );
    let client = srv.client().await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), NS);
    let p: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 2, "update": {"maxSurge": 1, "maxUnavailable": 0},
                 "autohealing": {"hostDeadAfter": format!("{}s", BUDGET.as_secs())},
                 "template": {"spec": {"provider": ENTRY, "image": IMAGE}},
                 "credentials": {"generate": true}},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &p).await.unwrap();

    let hs: Vec<String> = hosts.fakes.keys().cloned().collect();
    let (h1, h2) = (hs[0].clone(), hs[1].clone());
    let t0 = Instant::now();
    wait_for("one Running member on each host", DEADLINE, || async {
        let m = members(&srv);
        (on(&m, &h1) == 1 && on(&m, &h2) == 1 && m.values().all(|(_, r)| *r)).then_some(())
    })
    .await;
    let old = members(&srv)
        .into_iter()
        .find(|(_, (h, _))| *h == h1)
        .map(|(n, _)| n)
        .unwrap();
    println!(
        "eptest: settled after {:.1} s; {old} on {h1}; freezing {h1}",
        t0.elapsed().as_secs_f64()
    );

    hosts.fakes[&h1].faults().freeze();
    let t_freeze = Instant::now();
    let mut t_dead: Option<Instant> = None;
    let t_replaced = loop {
        let m = members(&srv);
        let st = states(&srv).get(&h1).cloned().unwrap_or_default();
        if t_dead.is_none() && (st == "Timeout" || st == "Unreachable") {
            t_dead = Some(Instant::now());
            println!(
                "eptest: {h1} {st} {:.1} s after the freeze",
                t_freeze.elapsed().as_secs_f64()
            );
        }
        assert!(
            m.contains_key(&old),
            "{old} deleted while {h1} is dead: {m:?}"
        );
        assert_eq!(domains(&hosts, &h1), 1, "{old}'s domain deleted while dead");
        if on(&m, &h2) == 2 {
            break Instant::now().duration_since(t_dead.expect("replaced before h1 was dead"));
        }
        assert!(
            t_freeze.elapsed() < DEADLINE,
            "not replaced within {DEADLINE:?}: {m:?} {st}\n{}",
            op.stderr()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // The ProviderHealth row is written after the check round that set the clock, so the
    // row may show later than the clock started: up to one check interval and a write.
    let early = CHECK_INTERVAL + Duration::from_secs(1);
    let bound = BUDGET + CHECK_INTERVAL + Duration::from_secs(3);
    println!(
        "eptest: replaced on {h2} {:.1} s after {h1} showed dead (budget {BUDGET:?}, bound \
         {bound:?})",
        t_replaced.as_secs_f64()
    );
    assert!(
        t_replaced + early >= BUDGET,
        "replaced {t_replaced:?} after {h1} showed dead, before the budget"
    );
    assert!(
        t_replaced <= bound,
        "replaced {t_replaced:?} later than {bound:?}"
    );
    wait_for(
        "the pool's status names the lost member",
        DEADLINE,
        || async {
            let s = pool_status(&srv);
            (s["lostMembers"][0]["member"] == old.as_str()
                && s["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "ReplicaFailure" && c["reason"] == "HostLost"))
            .then_some(())
        },
    )
    .await;

    // Still frozen: the old member stays, also once the pool is whole on h2.
    let hold = Instant::now();
    let mut whole: Option<Instant> = None;
    while whole.is_none_or(|t| t.elapsed() < HOLD) {
        let m = members(&srv);
        assert!(
            m.contains_key(&old),
            "{old} deleted while {h1} is dead: {m:?}"
        );
        assert_eq!(domains(&hosts, &h1), 1, "{old}'s domain deleted while dead");
        if whole.is_none()
            && m.iter()
                .filter(|(n, (h, r))| **n != old && *h == h2 && *r)
                .count()
                == 2
        {
            whole = Some(Instant::now());
        }
        assert!(hold.elapsed() < DEADLINE, "the replacement never ran");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    hosts.fakes[&h1].faults().thaw();
    let t_thaw = Instant::now();
    wait_for("the old copy deleted once h1 answers", DEADLINE, || async {
        let m = members(&srv);
        (!m.contains_key(&old) && domains(&hosts, &h1) == 0 && on(&m, &h2) == 2).then_some(())
    })
    .await;
    println!(
        "eptest: {old} and its domain on {h1} deleted {:.1} s after {h1} was thawed",
        t_thaw.elapsed().as_secs_f64()
    );
}
