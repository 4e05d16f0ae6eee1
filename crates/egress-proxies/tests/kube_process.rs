//! The real `egress-proxies kubernetes` binary, as its own process, against the fake API server
//! behind real HTTPS (a generated CA, bearer-token authentication): the paths a pod walks.
//!
//! - With a kubeconfig (`KUBECONFIG`) and with in-cluster configuration
//!   (`KUBERNETES_SERVICE_HOST/PORT` + the service-account token and CA at the fixed in-cluster
//!   path, bound there inside a private mount namespace), it takes the Lease, reconciles a
//!   Proxy against libvirt-fake hosts on unix sockets to Running with an IP, serves /healthz and
//!   /readyz, and on SIGTERM releases the Lease and exits 0. The kubeconfig run is also the
//!   regression test of the startup crash with an https:// server ("Could not automatically
//!   determine the process-level CryptoProvider", exit 101).
//! - A CA that did not sign the server's certificate, a wrong token, an API server that is not
//!   there: each a logged, retried Lease attempt naming the cause, /readyz 503, no panic, and
//!   a clean exit 0 on SIGTERM. A kubeconfig that does not exist: exit 1 with a clear error.
//!
//! Needs root only for the in-cluster test (`unshare -m`, `mount`); the others need nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::time::Duration;

use kube_support::{
    ApiServer, ClusterConfig, Operator, SocketHosts, create_proxy, wait_for, write_kubeconfig,
};

/// From start to holding the Lease.
// NB: the first acquire attempt runs right after start (milliseconds); 60 s covers the
// elector's 2 s retry period many times over on a loaded machine.
const LEASE_DEADLINE: Duration = Duration::from_secs(60);
/// From Proxy created to Running with an IP on the fake hosts.
// NB: fakes answer in microseconds, the DHCP task runs every 100 ms, the controller's running
// poll is seconds; measured ~3–6 s here. 120 s is a hang guard.
const RUNNING_DEADLINE: Duration = Duration::from_secs(120);
/// From start to a failed Lease attempt logged.
// NB: the first attempt fails at once (TLS alert, 401, connection refused); its timeout is
// the renew deadline (10 s). 60 s is a hang guard.
const ERROR_LOG_DEADLINE: Duration = Duration::from_secs(60);

/// No panic, no crypto-provider crash in a process's stderr.
fn assert_no_panic(stderr: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("CryptoProvider"),
        "the operator panicked:\n{stderr}"
    );
}

/// The whole happy path for one way of finding the cluster.
async fn takes_the_lease_reconciles_and_releases(
    srv: &ApiServer,
    cluster: ClusterConfig<'_>,
    ns: &str,
) {
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(2).await;
    let mut op = Operator::start(&hosts.config(), cluster, "op-1");

    let start = std::time::Instant::now();
    let holder = loop {
        if let Some(s) = op.try_exit() {
            panic!("the operator exited early ({s}):\n{}", op.stderr());
        }
        if let Some(h) = srv.lease_holder() {
            break h;
        }
        assert!(
            start.elapsed() < LEASE_DEADLINE,
            "no Lease holder within {LEASE_DEADLINE:?}; stderr:\n{}",
            op.stderr()
        );
        tokio::time::sleep(kube_support::POLL).await;
    };
    assert_eq!(holder, "op-1");
    wait_for("/readyz 200", LEASE_DEADLINE, || async {
        op.get("/readyz").await.filter(|(c, _)| *c == 200)
    })
    .await;
    let (code, _) = op.get("/healthz").await.unwrap();
    assert_eq!(code, 200);

    let client = srv.client().await;
    create_proxy(&client, ns, "web", "g1").await;
    let p = wait_for("the Proxy Running with an IP", RUNNING_DEADLINE, || async {
        srv.proxy(ns, "web")
            .filter(|p| p["status"]["phase"] == "Running" && p["status"]["ip"].is_string())
    })
    .await;
    assert!(
        p["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "egress-proxies.dev/instance")),
        "no finalizer: {p}"
    );
    let domains: usize = hosts.fakes.values().map(|f| f.domains().len()).sum();
    assert_eq!(domains, 1, "one VM on the fake hosts");
    // The operator's own view agrees (its rows follow the status write).
    wait_for("/metrics counting 1 Running", RUNNING_DEADLINE, || async {
        op.get("/metrics")
            .await
            .filter(|(c, m)| *c == 200 && m.contains("egress_proxies_proxies{phase=\"Running\"} 1"))
    })
    .await;

    op.sigterm();
    let status = op.wait_exit(kube_support::EXIT_DEADLINE).await;
    let stderr = op.stderr();
    assert_eq!(status.code(), Some(0), "exit {status}; stderr:\n{stderr}");
    assert_no_panic(&stderr);
    assert!(srv.lease_exists(), "the Lease must still exist");
    assert_eq!(srv.lease_holder(), None, "the Lease must be released");
    assert!(stderr.contains("lease released"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_https_kubeconfig_the_binary_takes_the_lease_reconciles_a_proxy_and_releases_the_lease_on_sigterm()
 {
    let srv = ApiServer::start().await;
    let kubeconfig = srv.kubeconfig();
    takes_the_lease_reconciles_and_releases(&srv, ClusterConfig::Kubeconfig(&kubeconfig), "team-a")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_in_cluster_configuration_the_binary_takes_the_lease_reconciles_a_proxy_and_releases_the_lease_on_sigterm()
 {
    let srv = ApiServer::start().await;
    let sa = srv.serviceaccount_dir();
    takes_the_lease_reconciles_and_releases(
        &srv,
        ClusterConfig::InCluster {
            addr: srv.addr,
            serviceaccount: &sa,
        },
        "team-b",
    )
    .await;
    // The real in-cluster path was never touched.
    assert!(
        !std::path::Path::new("/run/secrets/kubernetes.io/serviceaccount/token").exists()
            || std::fs::read_to_string("/run/secrets/kubernetes.io/serviceaccount/token")
                .unwrap_or_default()
                != kube_support::TOKEN
    );
}

/// Starts the operator with `kubeconfig`, waits for a failed Lease attempt naming `cause`,
/// checks it keeps retrying (still running, not ready, no panic), then SIGTERM → exit 0.
async fn a_failing_api_is_retried_with_a_log_line(kubeconfig: &std::path::Path, cause: &[&str]) {
    let hosts = SocketHosts::start(1).await;
    let mut op = Operator::start(
        &hosts.config(),
        ClusterConfig::Kubeconfig(kubeconfig),
        "op-1",
    );
    let stderr = op
        .wait_stderr("lease attempt failed", ERROR_LOG_DEADLINE)
        .await;
    let line = stderr
        .lines()
        .find(|l| l.contains("lease attempt failed"))
        .unwrap_or_default()
        .to_owned();
    println!("eptest: the operator logged: {line}");
    assert!(
        cause.iter().any(|c| line.contains(c)),
        "the log line must name the cause (one of {cause:?}): {line}"
    );
    assert_eq!(op.try_exit(), None, "it must keep retrying:\n{stderr}");
    let (code, _) = op.get("/readyz").await.unwrap();
    assert_eq!(code, 503, "not ready while the API server refuses it");
    let (code, _) = op.get("/healthz").await.unwrap();
    assert_eq!(code, 200, "alive while retrying");
    op.sigterm();
    let status = op.wait_exit(kube_support::EXIT_DEADLINE).await;
    let stderr = op.stderr();
    assert_no_panic(&stderr);
    assert_eq!(status.code(), Some(0), "exit {status}; stderr:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_did_not_sign_the_server_certificate_is_a_retried_lease_attempt_naming_the_certificate()
 {
    let srv = ApiServer::start().await;
    let other = kube_fake::https::Pki::generate(&["127.0.0.1".into()]).unwrap();
    let ca = srv.dir.path().join("other-ca.crt");
    std::fs::write(&ca, other.ca_pem).unwrap();
    let kc = srv.write_kubeconfig("wrong-ca", &ca, kube_support::TOKEN);
    a_failing_api_is_retried_with_a_log_line(&kc, &["certificate", "UnknownIssuer"]).await;
    assert!(srv.lease_holder().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_a_retried_lease_attempt_naming_unauthorized() {
    let srv = ApiServer::start().await;
    let kc = srv.write_kubeconfig(
        "wrong-token",
        &srv.dir.path().join("ca.crt"),
        "not-the-token",
    );
    a_failing_api_is_retried_with_a_log_line(&kc, &["Unauthorized", "401"]).await;
    assert!(srv.lease_holder().is_none());
    let refused = srv
        .api
        .requests()
        .iter()
        .filter(|r| r.path.contains("leases"))
        .count();
    assert_eq!(
        refused, 0,
        "an unauthenticated request must not reach the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_a_retried_lease_attempt_naming_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let srv = ApiServer::start().await;
    // A port nothing listens on.
    let url = format!("https://127.0.0.1:{}", kube_support::free_port());
    let kc = write_kubeconfig(
        &dir.path().join("kubeconfig"),
        &url,
        &srv.dir.path().join("ca.crt"),
        kube_support::TOKEN,
    );
    a_failing_api_is_retried_with_a_log_line(&kc, &["onnection refused", "connect"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_that_does_not_exist_is_a_clear_error_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = SocketHosts::start(1).await;
    let missing = dir.path().join("no-such-kubeconfig");
    let mut op = Operator::start(&hosts.config(), ClusterConfig::Kubeconfig(&missing), "op-1");
    let status = op.wait_exit(kube_support::EXIT_DEADLINE).await;
    let stderr = op.stderr();
    assert_no_panic(&stderr);
    assert_eq!(status.code(), Some(1), "exit {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("error: cannot configure a Kubernetes client"),
        "{stderr}"
    );
}
