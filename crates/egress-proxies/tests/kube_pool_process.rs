//! ProxyPools in Kubernetes mode, through the real `egress-proxies kubernetes` binary as its
//! own process against the fake API server behind real HTTPS (kubeconfig, token), over
//! libvirt-fake hosts on unix sockets. The committed CRDs are applied as `kubectl apply`
//! would, so the pool's scale and status subresources are the ones users get.
//!
//! One pool's life: created → members owned by the pool (controller owner reference with
//! blockOwnerDeletion) and labelled, spread over both hosts, using the pool's generated
//! credentials Secret (owned by the pool, labelled) → members Running → pool status
//! (readyReplicas, availableReplicas, observedGeneration, members with addresses, selector)
//! → `PATCH /scale` up and down changes the members → the Secret is reused, never rewritten
//! → a quarantined member is replaced and kept, with an Event → deleting the Secret makes new
//! credentials and rolls every member → deleting the pool removes its members and their VMs,
//! then the pool.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::collections::BTreeSet;
use std::time::Duration;

use egress_kube::api::ProxyPool;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_support::{ApiServer, ClusterConfig, ENTRY, IMAGE, Operator, SocketHosts, wait_for};
use serde_json::{Value, json};

/// Hang guard of every wait.
// NB: a member goes from created to Running in ~3–6 s on the fake hosts (see kube_process.rs);
// a rolling replacement of two members is a few of those; 120 s absorbs a loaded machine.
const DEADLINE: Duration = Duration::from_secs(120);
const GROUP: &str = "egress-proxies.dev";
const POOL: &str = "fleet";
const SECRET: &str = "fleet-credentials";
/// The pool's `update.drainGrace`: a removed member is unpublished, then deleted this long
/// after.
const DRAIN_GRACE: Duration = Duration::from_secs(4);

/// The pool's members (Proxies labelled for it), by name.
fn members(srv: &ApiServer, ns: &str) -> Vec<Value> {
    let mut v: Vec<Value> = srv
        .api
        .objects(GROUP, "proxies")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"] == ns
                && p["metadata"]["labels"]["egress-proxies.dev/pool"] == POOL
        })
        .collect();
    v.sort_by_key(|p| {
        p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    v
}

fn name(p: &Value) -> String {
    p["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn pool(srv: &ApiServer, ns: &str) -> Option<Value> {
    srv.api.object(GROUP, "proxypools", ns, POOL)
}

fn secret(srv: &ApiServer, ns: &str) -> Option<Value> {
    srv.api.object("", "secrets", ns, SECRET)
}

/// Members not being deleted.
fn live(srv: &ApiServer, ns: &str) -> Vec<Value> {
    members(srv, ns)
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["status"]["ip"].is_string()
}

/// Waits until the pool reports `n` ready and available members for its current generation,
/// holding `quarantined` (and nothing else) in quarantine.
async fn pool_settled(
    srv: &ApiServer,
    ns: &str,
    n: u64,
    quarantined: &[String],
    what: &str,
) -> Value {
    let start = std::time::Instant::now();
    loop {
        let got = pool(srv, ns).filter(|p| {
            let s = &p["status"];
            s["replicas"] == n
                // Quarantined members count as ready, not as available.
                && s["readyReplicas"] == n + quarantined.len() as u64
                && s["availableReplicas"] == n
                && s["updatedReplicas"] == n
                && s["observedGeneration"] == p["metadata"]["generation"]
                && s["quarantined"].as_array().map_or(&[][..], |q| &q[..])
                    == quarantined
                        .iter()
                        .map(|q| json!(q))
                        .collect::<Vec<_>>()
                        .as_slice()
                && live(srv, ns).len() as u64
                    == n + s["quarantined"].as_array().map_or(0, |q| q.len() as u64)
                && members(srv, ns).len() == live(srv, ns).len()
        });
        if let Some(p) = got {
            return p;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for {what}: pool {}\nmembers {:?}",
            pool(srv, ns).unwrap_or_default(),
            members(srv, ns)
                .iter()
                .map(|m| (name(m), m["metadata"].clone(), m["status"]["phase"].clone()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(kube_support::POLL).await;
    }
}

/// Waits until the operator's `/metrics` holds every line of `want` (and none of `absent`);
/// on timeout shows its pool series.
async fn metrics_show(op: &Operator, want: &[String], absent: &str, what: &str) {
    let start = std::time::Instant::now();
    loop {
        let text = op.get("/metrics").await.map(|(_, t)| t).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if want.iter().all(|w| lines.contains(&w.as_str()))
            && (absent.is_empty() || !text.contains(absent))
        {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for {what} in /metrics; its pool series:\n{}",
            lines
                .iter()
                .filter(|l| l.contains("pool"))
                .copied()
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(kube_support::POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_owns_its_members_scales_through_the_scale_subresource_quarantines_rolls_new_credentials_and_takes_its_members_when_deleted()
 {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(2).await;
    let kubeconfig = srv.kubeconfig();
    let mut op = Operator::start(
        &hosts.config(),
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-pool",
    );
    let ns = "team-pool";
    let client = srv.client().await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), ns);
    let p: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": POOL, "namespace": ns},
        "spec": {"replicas": 2, "template": {"spec": {"provider": ENTRY, "image": IMAGE}},
                 "credentials": {"generate": true},
                 "update": {"drainGrace": format!("{}s", DRAIN_GRACE.as_secs())}},
    }))
    .unwrap();
    let created = pools.create(&PostParams::default(), &p).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();

    // Members: owned by the pool, labelled, spread, using the generated credentials.
    let ms = wait_for("two members", DEADLINE, || async {
        Some(members(&srv, ns)).filter(|m| m.len() == 2)
    })
    .await;
    let mut on_hosts = BTreeSet::new();
    for m in &ms {
        let owners = m["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "{m}");
        let o = &owners[0];
        assert_eq!(
            (&o["kind"], &o["name"], &o["uid"]),
            (&json!("ProxyPool"), &json!(POOL), &json!(uid)),
            "{m}"
        );
        assert_eq!(o["apiVersion"], "egress-proxies.dev/v1alpha1");
        assert_eq!(
            (&o["controller"], &o["blockOwnerDeletion"]),
            (&json!(true), &json!(true))
        );
        assert!(
            m["metadata"]["labels"]["egress-proxies.dev/template-hash"]
                .as_str()
                .is_some_and(|h| !h.is_empty()),
            "{m}"
        );
        assert_eq!(m["spec"]["proxy"]["credentialsRef"], SECRET, "{m}");
        on_hosts.insert(m["spec"]["host"].as_str().unwrap().to_owned());
    }
    assert_eq!(on_hosts.len(), 2, "spread over both hosts: {ms:?}");
    let s = secret(&srv, ns).expect("the generated credentials Secret");
    let so = &s["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&so["kind"], &so["uid"]),
        (&json!("ProxyPool"), &json!(uid)),
        "{s}"
    );
    assert_eq!(
        s["metadata"]["labels"]["egress-proxies.dev/credentials"],
        "true"
    );
    assert_eq!(s["metadata"]["labels"]["egress-proxies.dev/pool"], POOL);
    assert_eq!(s["type"], "egress-proxies.dev/credentials");
    let (secret_uid, secret_data) = (s["metadata"]["uid"].clone(), s["data"].clone());

    // Running, and the pool's status says so.
    let st = pool_settled(&srv, ns, 2, &[], "the pool with 2 ready members").await;
    println!("eptest: pool status {}", st["status"]);
    assert_eq!(st["status"]["selector"], "egress-proxies.dev/pool=fleet");
    let rows = st["status"]["members"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{st}");
    for r in rows {
        assert!(r["ip"].is_string() && r["phase"] == "Running", "{r}");
    }
    assert!(
        st["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "egress-proxies.dev/members")),
        "{st}"
    );
    assert!(members(&srv, ns).iter().all(running));
    wait_for("the pool's Service", DEADLINE, || async {
        srv.api.object("", "services", ns, POOL)
    })
    .await;

    // The scale subresource: read, then scaled up and down.
    let sc = pools.get_scale(POOL).await.unwrap();
    assert_eq!(sc.spec.as_ref().unwrap().replicas, Some(2));
    let sc_status = sc.status.unwrap();
    assert_eq!(sc_status.replicas, 2);
    assert_eq!(
        sc_status.selector.as_deref(),
        Some("egress-proxies.dev/pool=fleet")
    );
    pools
        .patch_scale(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    pool_settled(&srv, ns, 3, &[], "3 ready members after scaling to 3").await;
    pools
        .patch_scale(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    // The scale-in drains: the two removed members get the drain annotation (unpublished:
    // never an endpoint again) and stay, not deleting, for the grace.
    let drained = wait_for(
        "two members unpublished by the scale-in",
        DEADLINE,
        || async {
            let d: Vec<String> = members(&srv, ns)
                .iter()
                .filter(|m| m["metadata"]["annotations"]["egress-proxies.dev/drain"].is_string())
                .map(name)
                .collect();
            Some(d).filter(|d| d.len() == 2)
        },
    )
    .await;
    let marked = std::time::Instant::now();
    while marked.elapsed() + Duration::from_millis(1500) < DRAIN_GRACE {
        let ms = members(&srv, ns);
        for d in &drained {
            let m = ms.iter().find(|m| name(m) == *d);
            assert!(
                m.is_some_and(|m| m["metadata"]["deletionTimestamp"].is_null()),
                "{d} deleted {:.1} s after it was unpublished, before the grace {DRAIN_GRACE:?}",
                marked.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(kube_support::POLL).await;
    }
    pool_settled(&srv, ns, 1, &[], "1 member after scaling to 1").await;
    println!(
        "eptest: the scale-in's members unpublished, deleted {:.1} s later (grace {DRAIN_GRACE:?})",
        marked.elapsed().as_secs_f64()
    );
    // Three members made, each available once; two deleted by the scale-in, each counted once.
    let series = |family: &str, labels: &str, v: u64| {
        format!("egress_proxies_{family}{{pool=\"{ns}/{POOL}\"{labels}}} {v}")
    };
    metrics_show(
        &op,
        &[
            series("pool_replacements_total", ",cause=\"scale-in\"", 2),
            series("pool_member_ready_seconds_count", "", 3),
            series("pool_members", ",state=\"available\"", 1),
            series("pool_members", ",state=\"deleting\"", 0),
        ],
        "",
        "the scale-in's replacements and the members' ready times",
    )
    .await;
    let domains: usize = hosts.fakes.values().map(|f| f.domains().len()).sum();
    assert_eq!(domains, 1, "the removed members' VMs are gone");

    // The Secret was reused, never rewritten.
    let s = secret(&srv, ns).unwrap();
    assert_eq!(
        (&s["metadata"]["uid"], &s["data"]),
        (&secret_uid, &secret_data)
    );

    // Quarantine: replaced, kept, announced.
    let q = name(&live(&srv, ns)[0]);
    let proxies: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &kube_support::proxy_resource());
    proxies
        .patch(
            &q,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "egress-proxies.dev/quarantine": "banned by a target"}}})),
        )
        .await
        .unwrap();
    let st = pool_settled(
        &srv,
        ns,
        1,
        std::slice::from_ref(&q),
        "a replacement for the quarantined member",
    )
    .await;
    assert_eq!(st["status"]["quarantined"], json!([q]), "{st}");
    let row = |st: &Value, n: &str| {
        st["status"]["members"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == n).cloned())
            .unwrap_or_default()
    };
    assert_eq!(
        (&row(&st, &q)["quarantined"], &row(&st, &q)["available"]),
        (&json!(true), &json!(false)),
        "{st}"
    );
    let names: Vec<String> = members(&srv, ns).iter().map(name).collect();
    assert!(names.contains(&q) && names.len() == 2, "kept: {names:?}");
    let events = srv.api.objects("events.k8s.io", "events");
    assert!(
        events.iter().any(|e| e["reason"] == "MemberQuarantined"
            && e["regarding"]["kind"] == "ProxyPool"
            && e["regarding"]["name"] == POOL),
        "no MemberQuarantined event"
    );
    assert!(events.iter().any(|e| e["reason"] == "MemberCreated"));

    // New credentials (the Secret deleted): a new Secret, and every counted member rolls.
    let before: BTreeSet<String> = live(&srv, ns)
        .iter()
        .map(name)
        .filter(|n| *n != q)
        .collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .delete(SECRET, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("a new credentials Secret", DEADLINE, || async {
        secret(&srv, ns).filter(|s| s["metadata"]["uid"] != secret_uid && s["data"] != secret_data)
    })
    .await;
    wait_for(
        "members rolled onto the new credentials",
        DEADLINE,
        || async {
            let now: BTreeSet<String> = live(&srv, ns)
                .iter()
                .map(name)
                .filter(|n| *n != q)
                .collect();
            (now.len() == 1 && now.is_disjoint(&before)).then_some(())
        },
    )
    .await;
    pool_settled(
        &srv,
        ns,
        1,
        std::slice::from_ref(&q),
        "the rolled pool settled",
    )
    .await;

    // Deleting the pool removes its members (and their VMs), then the pool.
    pools.delete(POOL, &DeleteParams::default()).await.unwrap();
    wait_for("the members and the pool gone", DEADLINE, || async {
        (members(&srv, ns).is_empty() && pool(&srv, ns).is_none()).then_some(())
    })
    .await;
    let domains: usize = hosts.fakes.values().map(|f| f.domains().len()).sum();
    assert_eq!(domains, 0, "every member's VM is deleted");
    // The pool's series went with it.
    metrics_show(
        &op,
        &[],
        &format!("pool=\"{ns}/{POOL}\""),
        "the pool's series gone",
    )
    .await;

    op.sigterm();
    let status = op.wait_exit(kube_support::EXIT_DEADLINE).await;
    let stderr = op.stderr();
    assert_eq!(status.code(), Some(0), "exit {status}; stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
