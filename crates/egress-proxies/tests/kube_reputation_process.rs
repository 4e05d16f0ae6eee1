//! Egress address reputation in Kubernetes mode, through the real `egress-proxies kubernetes`
//! binary as its own process against the fake API server behind real HTTPS (kubeconfig,
//! token), over libvirt-fake hosts on unix sockets, with a real DNS server (nsd, on a
//! private loopback port) serving the blocklist zone the provider config's `reputation:`
//! section names. The committed CRDs are applied, so a status field missing from them is
//! pruned by the server and the test fails.
//!
//! A ProxyPool with `reputation.onListed: Replace` on a host whose address pool has four
//! addresses, the first of them listed in the zone: the first member gets it → its status
//! shows the listing (`status.reputation`, `Listed` True) and a `Listed` Event → the pool
//! replaces it (never dropping below its one available member: `maxUnavailable: 0`), the
//! replacement at another address → the listed address is retired in the pool's
//! `status.retiredAddresses`, and `egress-proxies addresses` (against the operator's
//! `--status-listen`) lists it retired with its pool and member → scaled to 3, the members
//! get the three other addresses; scaled to 4, the fourth finds the pool exhausted with its
//! retired address named, never given the retired one. `/metrics` counts the listed address by zone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use egress_kube::api::ProxyPool;
use ep_test_support::nsd::{Nsd, TestZone};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_support::{ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, wait_for};
use serde_json::{Value, json};

/// Hang guard of every wait.
// NB: a member is Running in ~3–6 s on the fake hosts (kube_process.rs); a new address is
// checked within 5 s (the worker's poll); a replacement is a create, a check and a delete.
const DEADLINE: Duration = Duration::from_secs(120);
const GROUP: &str = "egress-proxies.dev";
const POOL: &str = "clean";
const ZONE: &str = "bl.test";
/// The address the first member gets (the first of the pool's range), listed in the zone.
const LISTED: &str = "203.0.113.2";
const OTHERS: [&str; 3] = ["203.0.113.3", "203.0.113.4", "203.0.113.5"];

/// The provider config of `hosts` (host h0 only) with an address pool of four addresses and
/// the `reputation:` section asking `resolver`.
fn config(hosts: &SocketHosts, resolver: std::net::SocketAddr) -> PathBuf {
    let base = std::fs::read_to_string(hosts.config()).unwrap();
    let dir: &Path = hosts.dir.path();
    let sock = dir.join("h0.sock");
    let pool = "        addressPool:\n          ipv4:\n            prefix: 203.0.113.0/24\n            \
                gateway: 203.0.113.1\n            ranges: [203.0.113.2-203.0.113.5]\n";
    // Host h0 gets the address pool; every other host is dropped.
    let mut out = String::new();
    let mut keep = true;
    for line in base.lines() {
        if line.starts_with("      - name: ") {
            keep = line == "      - name: h0";
        } else if line.starts_with("    images:") {
            out.push_str(pool);
            keep = true;
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(out.contains(&sock.display().to_string()), "{out}");
    out.push_str(&format!(
        "reputation:\n  resolvers: ['{resolver}']\n  interval: 1m\n  timeout: 2s\n  \
         retireFor: 1h\n  zones:\n    - name: {ZONE}\n      codes:\n        \
         - {{answer: 127.0.0.2, means: listed, label: SBL}}\n"
    ));
    let path = dir.join("providers-reputation.yaml");
    std::fs::write(&path, out).unwrap();
    path
}

fn members(srv: &ApiServer, ns: &str) -> Vec<Value> {
    srv.api
        .objects(GROUP, "proxies")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"] == ns
                && p["metadata"]["labels"]["egress-proxies.dev/pool"] == POOL
        })
        .collect()
}

fn name(p: &Value) -> String {
    p["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn egress(p: &Value) -> Vec<String> {
    p["status"]["egressAddress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn condition<'a>(p: &'a Value, type_: &str) -> Option<&'a Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn pool(srv: &ApiServer, ns: &str) -> Value {
    srv.api
        .object(GROUP, "proxypools", ns, POOL)
        .unwrap_or_default()
}

/// Members available per the pool's status.
fn available(srv: &ApiServer, ns: &str) -> u64 {
    pool(srv, ns)["status"]["availableReplicas"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_member_is_reported_replaced_within_budget_and_its_address_retired_not_reused() {
    let nsd = tokio::task::spawn_blocking(|| {
        Nsd::start(
            None,
            &[TestZone::new(ZONE).list(LISTED.parse().unwrap(), Ipv4Addr::new(127, 0, 0, 2))],
        )
    })
    .await
    .unwrap();
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(1).await;
    let kubeconfig = srv.kubeconfig();
    let status_listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut op = Operator::start_with(
        &config(&hosts, nsd.addr()),
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-reputation",
        &["--status-listen".to_owned(), status_listen.to_string()],
    );
    let ns = "team-rep";
    let client = srv.client().await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), ns);
    let p: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": POOL, "namespace": ns},
        "spec": {"replicas": 1, "template": {"spec": {"provider": ENTRY, "image": IMAGE,
                     "proxy": {"allowedClientCidrs": ["10.0.0.0/8"]}}},
                 "update": {"maxSurge": 1, "maxUnavailable": 0},
                 "reputation": {"onListed": "Replace"}},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &p).await.unwrap();

    // The first member gets the listed address; its status shows the listing.
    let first = wait_for("the first member listed", DEADLINE, || async {
        members(&srv, ns).into_iter().find(|m| {
            egress(m) == [LISTED] && condition(m, "Listed").is_some_and(|c| c["status"] == "True")
        })
    })
    .await;
    let first_name = name(&first);
    let rep = &first["status"]["reputation"];
    assert_eq!(rep["listed"][0]["address"], LISTED, "{rep}");
    assert_eq!(rep["listed"][0]["zone"], ZONE, "{rep}");
    assert_eq!(rep["listed"][0]["codes"], json!(["SBL"]), "{rep}");
    assert!(rep["listed"][0]["since"].is_string(), "{rep}");
    assert!(rep["lastCheck"].is_string(), "{rep}");
    let c = condition(&first, "Listed").unwrap();
    assert_eq!(c["reason"], "Listed");
    assert!(
        c["message"].as_str().unwrap().contains(LISTED)
            && c["message"].as_str().unwrap().contains(ZONE),
        "{c}"
    );

    // Replaced: the listed member goes once a replacement at another address is available;
    // the pool never has fewer than one available member once it had one.
    let mut had_one = false;
    let replacement = wait_for("the listed member replaced", DEADLINE, || {
        let n = available(&srv, ns);
        had_one |= n >= 1;
        assert!(
            !had_one || n >= 1,
            "the pool dropped below its budget: {}",
            pool(&srv, ns)
        );
        let ms = members(&srv, ns);
        let found = (ms.len() == 1 && name(&ms[0]) != first_name && n == 1).then(|| ms[0].clone());
        async move { found }
    })
    .await;
    let got = egress(&replacement);
    assert_eq!(got.len(), 1, "{replacement}");
    assert!(OTHERS.contains(&got[0].as_str()), "{replacement}");
    assert_ne!(
        condition(&replacement, "Listed").map(|c| c["status"].clone()),
        Some(json!("True")),
        "{replacement}"
    );

    // Retired in the pool's status, with the member and the listing.
    let st = pool(&srv, ns)["status"].clone();
    let retired = st["retiredAddresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(retired.len(), 1, "{st}");
    assert_eq!(
        (
            &retired[0]["address"],
            &retired[0]["host"],
            &retired[0]["member"]
        ),
        (&json!(LISTED), &json!("h0"), &json!(first_name)),
        "{st}"
    );
    assert!(
        retired[0]["reason"].as_str().unwrap().contains(ZONE),
        "{st}"
    );
    assert!(retired[0]["until"].is_string(), "{st}");

    // Events: the listing on the Proxy, the retirement on the pool.
    let events = srv.api.objects("events.k8s.io", "events");
    assert!(
        events.iter().any(|e| e["reason"] == "Listed"
            && e["type"] == "Warning"
            && e["regarding"]["kind"] == "Proxy"
            && e["regarding"]["name"] == first_name.as_str()),
        "no Listed event on {first_name}"
    );
    assert!(
        events.iter().any(|e| e["reason"] == "AddressRetired"
            && e["regarding"]["kind"] == "ProxyPool"
            && e["note"].as_str().is_some_and(|n| n.contains(LISTED))),
        "no AddressRetired event"
    );

    // `egress-proxies addresses` against the operator's status listener lists the retirement
    // (from the pool's status) and the replacement's address allocated to it. The operator's
    // Proxy rows are set once per health round, so they may lag the read above by up to a
    // round: asked again until they show the replacement's address.
    let listen = status_listen;
    let ask = move || {
        let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies"))
            .args([
                "addresses",
                "--server",
                &format!("http://{listen}"),
                "-o",
                "json",
            ])
            .env_remove("EGRESS_PROXIES_SERVER")
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        doc
    };
    let want = got[0].clone();
    let doc = wait_for(
        "the operator's view to show the replacement's address",
        DEADLINE,
        || {
            let want = want.clone();
            async move {
                let doc = tokio::task::spawn_blocking(ask).await.unwrap();
                let shown = doc["addresses"]
                    .as_array()
                    .is_some_and(|rows| rows.iter().any(|r| r["address"] == want.as_str()));
                shown.then_some(doc)
            }
        },
    )
    .await;
    let rows = doc["addresses"].as_array().cloned().unwrap_or_default();
    let row = |a: &str| rows.iter().find(|r| r["address"] == a).cloned();
    let r = row(LISTED).unwrap_or_else(|| panic!("{doc:#}"));
    assert_eq!(
        (&r["state"], &r["pool"], &r["proxy"]),
        (
            &json!("retired"),
            &json!(format!("{ns}/{POOL}")),
            &json!(format!("{ns}/{first_name}"))
        ),
        "{doc:#}"
    );
    assert!(
        r["reason"].as_str().unwrap_or_default().contains(ZONE),
        "{doc:#}"
    );
    let r = row(&got[0]).unwrap_or_else(|| panic!("{doc:#}"));
    assert_eq!(
        (&r["state"], &r["proxy"]),
        (
            &json!("allocated"),
            &json!(format!("{ns}/{}", name(&replacement)))
        ),
        "{doc:#}"
    );

    // Never reused while retired: three members take the three other addresses, and a
    // fourth finds the pool exhausted, its retired address named.
    let pp = PatchParams::default();
    pools
        .patch(POOL, &pp, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    let three = wait_for("three members at the other addresses", DEADLINE, || async {
        let got: BTreeSet<String> = members(&srv, ns).iter().flat_map(egress).collect();
        (got.len() == 3).then_some(got)
    })
    .await;
    assert_eq!(three, OTHERS.iter().map(|s| (*s).to_owned()).collect());
    pools
        .patch(POOL, &pp, &Patch::Merge(json!({"spec": {"replicas": 4}})))
        .await
        .unwrap();
    let refused = wait_for("the fourth member refused", DEADLINE, || async {
        members(&srv, ns).into_iter().find(|m| {
            egress(m).is_empty()
                && serde_json::to_string(&m["status"])
                    .unwrap()
                    .contains("retired")
        })
    })
    .await;
    let text = serde_json::to_string(&refused["status"]).unwrap();
    assert!(text.contains("exhausted"), "{text}");
    for m in members(&srv, ns) {
        assert!(!egress(&m).contains(&LISTED.to_owned()), "reused: {m}");
    }

    // Metrics: the listing counted by zone at its time; checks counted.
    let (code, text) = op.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        text.lines()
            .any(|l| l.starts_with("egress_proxies_reputation_checks_total{")
                && l.contains(&format!("zone=\"{ZONE}\""))
                && l.contains("result=\"listed\"")),
        "{text}"
    );
    assert!(op.try_exit().is_none(), "{}", op.stderr());
    drop(nsd);
}
