//! Pool failover when a host dies, in Kubernetes mode, through the real `egress-proxies
//! kubernetes` binary against the fake API server behind real HTTPS, over two libvirt-fake
//! hosts on unix sockets.
//!
//! What it proves: a pool of 2 spread over two hosts (h0 and h1, called h1 and h2 in the
//! code); h1 frozen (libvirt-fake's freeze fault), its `ProviderHealth` row turns
//! `Timeout`/`Unreachable`; the member on h1 is replaced on h2 no sooner than `autohealing.hostDeadAfter` (10 s) after that and within it + the check
//! interval + slack; the old member keeps no deletion timestamp and its domain stays on h1
//! while h1 is frozen (the pool's status names it in `lostMembers`, `ReplicaFailure`
//! `HostLost`); once h1 answers again the old member and its domain are deleted; then, once
//! h1 has been Ready for `hostDeadAfter` and never before, the pool (both members on h2) is
//! spread again (`placement.rebalance`, on by default): one member back on h1, a `Rebalancing`
//! event on the pool, `status.rebalancing` gone at the end.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::time::{Duration, Instant};

use egress_kube::api::ProxyPool;
use kube::api::{Api, PostParams};
use kube_support::{
    ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, health_rows, on, pool_members,
    wait_for,
};
use serde_json::{Value, json};

/// Hang guard of every wait.
const DEADLINE: Duration = Duration::from_secs(150);
const GROUP: &str = "egress-proxies.dev";
const NS: &str = "team-hostlost";
const BUDGET: Duration = Duration::from_secs(10);
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long h1 stays frozen once the pool is whole on h2.
const HOLD: Duration = Duration::from_secs(15);

fn pool_status(srv: &ApiServer) -> Value {
    srv.api
        .object(GROUP, "proxypools", NS, "web")
        .map(|p| p["status"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_a_member_on_a_dead_host_after_the_budget_and_spreads_again_in_kubernetes()
{
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(2).await;
    let cfg = hosts.config();
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
        let m = pool_members(&srv, NS, "web");
        (on(&m, &h1) == 1 && on(&m, &h2) == 1 && m.values().all(|(_, r)| *r)).then_some(())
    })
    .await;
    let old = pool_members(&srv, NS, "web")
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
        let m = pool_members(&srv, NS, "web");
        let st = health_rows(&srv, "state")
            .get(&h1)
            .cloned()
            .unwrap_or_default();
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
        assert_eq!(hosts.domains(&h1), 1, "{old}'s domain deleted while dead");
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
        let m = pool_members(&srv, NS, "web");
        assert!(
            m.contains_key(&old),
            "{old} deleted while {h1} is dead: {m:?}"
        );
        assert_eq!(hosts.domains(&h1), 1, "{old}'s domain deleted while dead");
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
        let m = pool_members(&srv, NS, "web");
        (!m.contains_key(&old) && hosts.domains(&h1) == 0 && on(&m, &h2) == 2).then_some(())
    })
    .await;
    println!(
        "eptest: {old} and its domain on {h1} deleted {:.1} s after {h1} was thawed",
        t_thaw.elapsed().as_secs_f64()
    );

    // Spread again: one member back on h1, never before h1 has been Ready for the budget.
    let t_spread = loop {
        let m = pool_members(&srv, NS, "web");
        let since = t_thaw.elapsed();
        if on(&m, &h1) == 1
            && on(&m, &h2) == 1
            && m.values().all(|(_, r)| *r)
            && pool_status(&srv)["rebalancing"].is_null()
        {
            break since;
        }
        assert!(
            on(&m, &h1) == 0 || since + Duration::from_millis(500) >= BUDGET,
            "a member moved to {h1} {since:?} after it was thawed, before the budget: {m:?}"
        );
        assert!(
            since < DEADLINE,
            "not spread again {DEADLINE:?} after {h1} returned: {m:?} {}",
            pool_status(&srv)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "eptest: spread again (one member on each host) {:.1} s after {h1} was thawed",
        t_spread.as_secs_f64()
    );
    let events = srv.api.objects("events.k8s.io", "events");
    assert!(
        events.iter().any(|e| e["reason"] == "Rebalancing"
            && e["regarding"]["kind"] == "ProxyPool"
            && e["regarding"]["name"] == "web"
            && e["note"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("host {h1}"))),
        "no Rebalancing event naming {h1}"
    );
}
