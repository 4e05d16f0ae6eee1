//! The pool gateway in Kubernetes mode, through the real `egress-proxies gateway` binary as
//! two processes (two replicas of the Deployment, leaderless) against the fake API server
//! behind real HTTPS, found with a kubeconfig (CA file and bearer token). The pool's members
//! are real tinyproxy processes on loopback (ep_operator_fixtures::real_members), published
//! as member Proxies of a ProxyPool the way the operator writes them (owned by the pool,
//! labelled, Ready and healthy in their status), so the gateway's whole client path is the
//! user's: watch, list, Secret reads, and a client through the gateway to the echo target.
//!
//! What it proves: each process serves the pool's listeners; round robin spreads over the
//! members; both processes route a session to the same member; the processes follow
//! membership changes (a member turning unhealthy is left, a deleted one too, a new one is
//! used, a client identity added to the pool's spec can log in); a Proxy carrying the pool's
//! label without being owned by it never joins; /readyz and /metrics; SIGTERM is exit 0.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ep_operator_fixtures::real_members::{
    Daemon, Echo, echo, echo_ip, http_tunnel, socks_tunnel, tinyproxy,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube_support::{ApiServer, GatewayProcess, free_port, wait_for};
use serde_json::{Value, json};

/// Hang guard of every wait.
// NB: the gateway rebuilds a pool within ~100 ms of a watch event; 60 s absorbs a loaded
// machine and a watch reconnect.
const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "team-a";
const POOL: &str = "fleet";
const USER: &str = "pool-fleet";
const PW: &str = "fleet-password-0123456789";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("egress-proxies.dev", "v1alpha1", kind),
        plural,
    )
}

fn secret(name: &str, user: &str, password: &str) -> k8s_openapi::api::core::v1::Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"egress-proxies.dev/credentials": "true",
                                "egress-proxies.dev/pool": POOL}},
        "data": {"username": b64(user), "password": b64(password)},
    }))
    .unwrap()
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A gateway process of the test: the pool's HTTP listener on `bind`.
struct GatewayProc {
    p: GatewayProcess,
    http: SocketAddr,
}

impl GatewayProc {
    fn start(kubeconfig: &Path, bind: Ipv4Addr, http_port: u16) -> Self {
        Self {
            p: GatewayProcess::start(kubeconfig, NS, bind, &[]),
            http: SocketAddr::from((bind, http_port)),
        }
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        self.p.get(path, None).await.map(|(c, _, b)| (c, b))
    }

    /// The member's egress (as the echo saw it) for a connection as `user`.
    async fn via(&self, user: &str, password: &str, e: &Echo) -> Result<String, String> {
        let t = http_tunnel(self.http, user, password, &e.addr.to_string()).await?;
        Ok(echo_ip(t, e.addr).await)
    }
}

/// The status the operator writes for a Running, Ready member (healthy through itself or
/// not, seen leaving from `egress`).
fn running(egress: Ipv4Addr, healthy: bool) -> Value {
    json!({"status": {
        "phase": "Running",
        "ip": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": if healthy { "True" } else { "False" },
                        "reason": "Ready", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "observedGeneration": 1,
        "health": {"healthy": healthy, "egressIp": egress.to_string(),
                   "consecutiveFailures": 0, "consecutiveSuccesses": 3},
    }})
}

async fn add_member(proxies: &Api<DynamicObject>, name: &str, pool_uid: &str, d: &Daemon) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"egress-proxies.dev/pool": POOL,
                                "egress-proxies.dev/template-hash": "h"},
                     "ownerReferences": [{"apiVersion": "egress-proxies.dev/v1alpha1",
                                          "kind": "ProxyPool", "name": POOL, "uid": pool_uid,
                                          "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"provider": "fake", "host": "h0", "image": "tiny",
                 "proxy": {"port": d.addr.port(), "credentialsRef": "fleet-credentials"}},
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &obj).await.unwrap();
    proxies
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(running(d.egress, true)),
        )
        .await
        .unwrap();
}

/// The egress addresses `n` round-robin connections through `g` reach.
async fn spread(g: &GatewayProc, e: &Echo, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        if let Ok(ip) = g.via(USER, PW, e).await {
            seen.insert(ip);
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_serve_a_pool_and_follow_its_membership() {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let client = srv.client().await;
    let e = echo().await;
    let m: Vec<Daemon> = vec![
        tinyproxy(0, USER, PW).await,
        tinyproxy(1, USER, PW).await,
        tinyproxy(2, USER, PW).await,
        tinyproxy(3, USER, PW).await,
    ];
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(
            &PostParams::default(),
            &secret("fleet-credentials", USER, PW),
        )
        .await
        .unwrap();
    let (http_port, socks_port) = (free_port(), free_port());
    let pools: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &resource("ProxyPool", "proxypools"));
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"replicas": 3,
                 "template": {"spec": {"provider": "fake", "image": "tiny",
                                               "proxy": {"port": 3128}}},
                 "credentials": {"generate": true},
                 "gateway": {"listeners": [{"port": http_port},
                                           {"port": socks_port, "protocol": "socks5"}],
                             "drainGrace": "0s"}},
    }))
    .unwrap();
    let pool = pools.create(&PostParams::default(), &pool).await.unwrap();
    let pool_uid = pool.metadata.uid.clone().unwrap();
    let proxies: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &resource("Proxy", "proxies"));
    for (i, d) in m.iter().take(3).enumerate() {
        add_member(&proxies, &format!("fleet-m{i}"), &pool_uid, d).await;
    }
    // A Proxy with the pool's label but not owned by the pool never joins.
    let stray: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "impostor", "namespace": NS,
                     "labels": {"egress-proxies.dev/pool": POOL}},
        "spec": {"provider": "fake", "image": "tiny",
                 "proxy": {"port": m[3].addr.port(), "credentialsRef": "fleet-credentials"}},
    }))
    .unwrap();
    proxies
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    proxies
        .patch_status(
            "impostor",
            &PatchParams::default(),
            &Patch::Merge(running(m[3].egress, true)),
        )
        .await
        .unwrap();

    let kubeconfig = srv.kubeconfig();
    let a = GatewayProc::start(&kubeconfig, Ipv4Addr::new(127, 0, 0, 1), http_port);
    let b = GatewayProc::start(&kubeconfig, Ipv4Addr::new(127, 0, 0, 3), http_port);
    for g in [&a, &b] {
        wait_for(
            "the gateway ready and serving the pool",
            DEADLINE,
            || async {
                let ready = g.get("/readyz").await.is_some_and(|(c, _)| c == 200);
                (ready && g.via(USER, PW, &e).await.is_ok()).then_some(())
            },
        )
        .await;
    }
    let three: BTreeSet<String> = m.iter().take(3).map(|d| d.egress.to_string()).collect();
    assert_eq!(
        spread(&a, &e, 9).await,
        three,
        "round robin over the pool's members, never the impostor"
    );
    // Two replicas, no shared state: each session lands on the same member through either.
    let mut by_session = BTreeMap::new();
    for s in 0..12 {
        let u = format!("{USER}-session-s{s}");
        let via_a = a.via(&u, PW, &e).await.unwrap();
        let via_b = b.via(&u, PW, &e).await.unwrap();
        assert_eq!(via_a, via_b, "{u}");
        by_session.insert(u, via_a);
    }
    let on_m1: Vec<String> = by_session
        .iter()
        .filter(|(_, ip)| **ip == m[1].egress.to_string())
        .map(|(u, _)| u.clone())
        .collect();
    assert!(!on_m1.is_empty(), "{by_session:?}");
    // The SOCKS5 listener is served too.
    let t = socks_tunnel(
        SocketAddr::from((Ipv4Addr::LOCALHOST, socks_port)),
        USER,
        PW,
        e.addr,
    )
    .await
    .unwrap();
    assert!(three.contains(&echo_ip(t, e.addr).await));

    // Member 1 turns unhealthy: both gateways leave it; only its sessions move.
    proxies
        .patch_status(
            "fleet-m1",
            &PatchParams::default(),
            &Patch::Merge(running(m[1].egress, false)),
        )
        .await
        .unwrap();
    let two: BTreeSet<String> = [m[0].egress.to_string(), m[2].egress.to_string()].into();
    for g in [&a, &b] {
        wait_for("member 1 left", DEADLINE, || async {
            (spread(g, &e, 6).await == two).then_some(())
        })
        .await;
    }
    for (u, ip) in &by_session {
        let via_a = a.via(u, PW, &e).await.unwrap();
        let via_b = b.via(u, PW, &e).await.unwrap();
        assert_eq!(via_a, via_b, "{u}");
        if on_m1.contains(u) {
            assert_ne!(&via_a, ip, "{u} moved");
        } else {
            assert_eq!(&via_a, ip, "{u} stayed");
        }
    }
    // Member 2 deleted, member 3 added: the gateways follow.
    proxies
        .delete("fleet-m2", &DeleteParams::default())
        .await
        .unwrap();
    add_member(&proxies, "fleet-m3", &pool_uid, &m[3]).await;
    let now: BTreeSet<String> = [m[0].egress.to_string(), m[3].egress.to_string()].into();
    for g in [&a, &b] {
        wait_for("member 2 gone, member 3 in", DEADLINE, || async {
            (spread(g, &e, 6).await == now).then_some(())
        })
        .await;
    }
    // A client identity added to the pool's spec can log in; the pool's own stays.
    secrets
        .create(
            &PostParams::default(),
            &secret("alice", "alice", "alice-password-99"),
        )
        .await
        .unwrap();
    let refused = a.via("alice", "alice-password-99", &e).await.unwrap_err();
    assert!(refused.starts_with("HTTP/1.1 407"), "{refused}");
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"gateway": {"clientCredentials": ["fleet-credentials", "alice"]}}}),
            ),
        )
        .await
        .unwrap();
    for g in [&a, &b] {
        wait_for("alice accepted", DEADLINE, || async {
            g.via("alice", "alice-password-99", &e).await.ok()
        })
        .await;
    }
    assert!(now.contains(&a.via(USER, PW, &e).await.unwrap()));
    // Metrics per pool and per identity.
    let (code, text) = a.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        text.contains("egress_proxies_gateway_members{pool=\"team-a/fleet\"} 2"),
        "{text}"
    );
    assert!(
        text.contains(
            "egress_proxies_gateway_client_connections_total{pool=\"team-a/fleet\",identity=\"alice\"}"
        ),
        "{text}"
    );
    assert!(
        text.contains("egress_proxies_gateway_build_info{"),
        "{text}"
    );
    // SIGTERM: both exit 0.
    for mut g in [a, b] {
        let st = g.p.stop(DEADLINE).await;
        assert!(st.success(), "{st:?}; stderr:\n{}", g.p.stderr());
        assert!(
            g.p.stderr().contains("egress-proxies gateway: stopped"),
            "{}",
            g.p.stderr()
        );
    }
}
