//! Host maintenance in Kubernetes mode, through the real `egress-proxies kubernetes` binary
//! against the fake API server behind real HTTPS, over three libvirt-fake hosts on unix
//! sockets (`h0` cordoned throughout, `h1` drained by a config reload, `h2` taking over).
//!
//! What it proves: a pool of 2 (`maxSurge: 1`, `maxUnavailable: 0`) leaves the draining host
//! while its `availableReplicas` never drops below 2 (sampled every second and printed); an
//! unpinned Proxy is re-placed on h2; a Proxy pinned to h1 stays there with `Ready` reason
//! `OnDrainingHost`; the entry's `ProviderHealth` shows `Draining (1 left)` for h1 and
//! `Cordoned` for h0, and so does `egress-proxies status` against the operator's
//! `--status-listen` (`host fake/h1 is Ready, Draining (1 left)`); the cordoned host never
//! holds a domain.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::time::{Duration, Instant};

use egress_kube::api::ProxyPool;
use kube::api::{Api, DynamicObject, PostParams};
use kube_support::{
    ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, free_port, health_rows, on,
    pool_members, status_cli, wait_for,
};
use serde_json::json;

/// Hang guard of every wait.
const DEADLINE: Duration = Duration::from_secs(150);
const GROUP: &str = "egress-proxies.dev";
const NS: &str = "team-drain";

async fn create_proxy(client: &kube::Client, name: &str, host: Option<&str>) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &kube_support::proxy_resource());
    let mut spec = json!({"provider": ENTRY, "image": IMAGE,
                          "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}});
    if let Some(h) = host {
        spec["host"] = json!(h);
    }
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": NS}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// The pool's `status.availableReplicas`.
fn available(srv: &ApiServer) -> u64 {
    srv.api
        .object(GROUP, "proxypools", NS, "web")
        .and_then(|p| p["status"]["availableReplicas"].as_u64())
        .unwrap_or(0)
}

/// A Proxy's (phase, status.host, Ready reason).
fn proxy(srv: &ApiServer, name: &str) -> (String, String, String) {
    let Some(p) = srv.proxy(NS, name) else {
        return ("-".into(), "-".into(), "-".into());
    };
    let reason = p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["reason"].as_str())
        .unwrap_or("-")
        .to_owned();
    (
        p["status"]["phase"].as_str().unwrap_or("-").to_owned(),
        p["status"]["host"].as_str().unwrap_or("-").to_owned(),
        reason,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_drained_by_a_config_reload_moves_its_proxies_within_the_pool_budget_in_kubernetes()
{
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(3).await;
    let cfg = hosts.config_with_maintenance(&[("h0", "Cordon"), ("h2", "Cordon")]);
    let kubeconfig = srv.kubeconfig();
    let status_listen = format!("127.0.0.1:{}", free_port());
    let op = Operator::start_with(
        &cfg,
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-drain",
        &[
            "--check-interval".into(),
            "1s".into(),
            "--status-listen".into(),
            status_listen.clone(),
        ],
    );
    let client = srv.client().await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), NS);
    let p: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 2, "update": {"maxSurge": 1, "maxUnavailable": 0},
                 "template": {"spec": {"provider": ENTRY, "image": IMAGE}},
                 "credentials": {"generate": true}},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &p).await.unwrap();
    create_proxy(&client, "solo", None).await;
    create_proxy(&client, "pinned", Some("h1")).await;

    let t0 = Instant::now();
    wait_for("everything Running on h1", DEADLINE, || async {
        let m = pool_members(&srv, NS, "web");
        (available(&srv) == 2
            && on(&m, "h1") == 2
            && proxy(&srv, "solo").0 == "Running"
            && proxy(&srv, "solo").1 == "h1"
            && proxy(&srv, "pinned").0 == "Running")
            .then_some(())
    })
    .await;
    assert_eq!(hosts.domains("h0") + hosts.domains("h2"), 0);
    println!(
        "eptest: settled on h1 after {:.1} s; draining h1",
        t0.elapsed().as_secs_f64()
    );

    hosts.config_with_maintenance(&[("h0", "Cordon"), ("h1", "Drain")]);
    let t1 = Instant::now();
    let mut lowest = u64::MAX;
    loop {
        let m = pool_members(&srv, NS, "web");
        let a = available(&srv);
        let hh = health_rows(&srv, "maintenance");
        println!(
            "eptest: t={:>3}s available={a} members={m:?} solo={:?} pinned={:?} health={hh:?} \
             domains h0/h1/h2={}/{}/{}",
            t1.elapsed().as_secs(),
            proxy(&srv, "solo"),
            proxy(&srv, "pinned"),
            hosts.domains("h0"),
            hosts.domains("h1"),
            hosts.domains("h2"),
        );
        lowest = lowest.min(a);
        assert!(
            a >= 2,
            "availableReplicas dropped to {a} (below replicas - maxUnavailable = 2)\n{}",
            op.stderr()
        );
        assert_eq!(hosts.domains("h0"), 0, "a cordoned host got a proxy");
        let solo = proxy(&srv, "solo");
        let pinned = proxy(&srv, "pinned");
        let done = on(&m, "h1") == 0
            && on(&m, "h2") == 2
            && m.values().all(|(_, running)| *running)
            && solo.0 == "Running"
            && solo.1 == "h2"
            && pinned.1 == "h1"
            && pinned.2 == "OnDrainingHost"
            && hosts.domains("h1") == 1
            && hh.get("h1").map(String::as_str) == Some("Draining (1 left)")
            && hh.get("h0").map(String::as_str) == Some("Cordoned");
        if done {
            break;
        }
        assert!(
            t1.elapsed() < DEADLINE,
            "the drain did not finish within {DEADLINE:?}\n{}",
            op.stderr()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "eptest: drained in {:.1} s; lowest availableReplicas {lowest} (bound 2)",
        t1.elapsed().as_secs_f64()
    );

    // What a user sees: `egress-proxies status` against the operator names both hosts' progress.
    let want = [
        format!("host {ENTRY}/h0 is Ready, Cordoned\n"),
        format!("host {ENTRY}/h1 is Ready, Draining (1 left)\n"),
    ];
    let out = wait_for("status shows the hosts' maintenance", DEADLINE, || async {
        let (_, out) = status_cli(&status_listen);
        want.iter().all(|w| out.contains(w.as_str())).then_some(out)
    })
    .await;
    assert!(
        !out.contains(&format!("{ENTRY}/h2")),
        "h2 is in service: {out}"
    );
    println!("eptest: egress-proxies status:\n{out}");
}
