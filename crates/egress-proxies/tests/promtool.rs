//! `/metrics` of the real binary, judged by Prometheus's own `promtool`, in both modes: the
//! exposition passes `promtool check metrics`; the format follows the `Accept` header
//! (Prometheus text by default, OpenMetrics when asked); the families served are exactly
//! those `docs/metrics.md` lists, and every one without per-host or per-object labels has a
//! series from the first scrape (so `absent()` alerts work); the chart's alerting rules pass
//! `promtool check rules`, and every metric they and the Grafana dashboard query is served.
//!
//! Standalone runs from a host socket that does not exist and no manifest (its first scrape is
//! what a fresh process serves); Kubernetes mode runs against the fake API server over HTTPS
//! and a libvirt-fake host on a unix socket, takes the Lease and brings a Proxy to Running, so
//! its exposition carries every per-host family too.
//!
//! promtool comes from Debian's `prometheus` package (`.ci/setup-host` installs it); a missing
//! promtool fails these tests rather than skipping them. No cluster, no libvirtd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_support::{ApiServer, ClusterConfig, Operator, SocketHosts, create_proxy, wait_for};
use serde_json::Value;

mod kube_support;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

/// Longest the binary may take to serve its first host check's metrics.
// NB: it serves within milliseconds and checks its hosts at start; 60 s only catches a hang
// on a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// Accept header of a Prometheus 2.x scrape (OpenMetrics preferred).
const PROMETHEUS_SCRAPE_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Families whose series are per host (they appear with the host's first check) or per
/// object (with the object), as docs/metrics.md says.
const NOT_FROM_START: &[&str] = &[
    "egress_proxies_host_up",
    "egress_proxies_host_check_latency_seconds",
    "egress_proxies_host_egress_addresses",
    "egress_proxies_health_probe_latency_seconds",
    "egress_proxies_health_probes_total",
    "egress_proxies_health_proxy_up",
    "egress_proxies_pool_replicas",
    "egress_proxies_pool_available_replicas",
    "egress_proxies_pool_members",
    "egress_proxies_pool_replacements_total",
    "egress_proxies_pool_member_ready_seconds",
    // Per configured blocklist zone (none in these configs).
    "egress_proxies_reputation_listed_addresses",
    "egress_proxies_reputation_failing_addresses",
    "egress_proxies_reputation_checks_total",
    "egress_proxies_reputation_check_failures_total",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The promtool binary; panics (never skips) when it is missing.
fn promtool() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("promtool");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "promtool not found on PATH: install Debian's `prometheus` package (.ci/setup-host \
         does); these tests do not skip without it"
    );
}

/// `promtool ARGS` with `stdin`: (success, stdout + stderr).
fn run_promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A response: status code, `Content-Type`, body.
struct Answer {
    code: u16,
    content_type: String,
    body: String,
}

/// `GET /metrics` on 127.0.0.1:`port` with `accept`, or `None` while nothing answers.
fn scrape(port: u16, accept: Option<&str>) -> Option<Answer> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Some(Answer {
        code,
        content_type,
        body: body.to_owned(),
    })
}

/// The binary, killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A provider config whose only host is a libvirt socket that does not exist (its check
/// fails at once: the host is reported down), and a kubeconfig whose API server is a closed
/// port.
fn fixtures(dir: &Path) -> (PathBuf, PathBuf) {
    let cfg = dir.join("providers.yaml");
    std::fs::write(
        &cfg,
        "providers:\n  - name: eptest-prom\n    type: libvirt\n    hosts:\n      - name: h1\n        \
         address: local\n        user: root\n        socket: /nonexistent/libvirt-sock\n        \
         pool: eptest-none\n",
    )
    .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user:\n    token: t\n",
            free_port()
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.join("proxies")).unwrap();
    (cfg, kubeconfig)
}

/// Starts the binary in `mode` (`standalone` or `kubernetes`) serving /metrics on a free port,
/// and waits until a scrape satisfies `ready`.
fn start(mode: &str, dir: &Path, ready: impl Fn(&str) -> bool) -> (Process, u16) {
    let (cfg, kubeconfig) = fixtures(dir);
    let port = free_port();
    let mut args = vec![
        mode.to_owned(),
        format!("--config={}", cfg.display()),
        format!("--listen=127.0.0.1:{port}"),
        // Health checks on (families recorded); nothing listens there.
        "--health-target=http://127.0.0.1:9/".to_owned(),
    ];
    if mode == "standalone" {
        args.push(format!("--proxies={}", dir.join("proxies").display()));
    }
    let child = Command::new(BIN)
        .args(&args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("POD_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", "eptest")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut op = Process(child);
    let start = Instant::now();
    loop {
        if let Some(a) = scrape(port, None)
            && a.code == 200
            && ready(&a.body)
        {
            return (op, port);
        }
        assert!(
            op.0.try_wait().unwrap().is_none(),
            "{mode} exited before serving /metrics"
        );
        assert!(start.elapsed() < DEADLINE, "{mode}: /metrics not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Family names of a Prometheus text exposition (its `# TYPE` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Whether `text` has a sample of family `name` (a histogram's through its `_count`).
fn has_sample(text: &str, name: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        [name.to_owned(), format!("{name}_count")].iter().any(|n| {
            l.strip_prefix(n.as_str())
                .is_some_and(|r| r.starts_with(['{', ' ']))
        })
    })
}

/// The families docs/metrics.md lists (the first column of its tables) for the operator
/// (every section but the pool gateway's).
fn documented() -> BTreeSet<String> {
    documented_in(|section| section != "Pool gateway")
}

/// The pool gateway's families (docs/metrics.md, section "Pool gateway"), but its process's
/// build info.
fn documented_gateway() -> BTreeSet<String> {
    let mut d = documented_in(|section| section == "Pool gateway");
    d.remove("egress_proxies_gateway_build_info");
    d
}

/// The families listed in the sections `keep` accepts.
fn documented_in(keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let mut section = String::new();
    doc.lines()
        .filter(|l| {
            if let Some(h) = l.strip_prefix("## ") {
                section = h.trim().to_owned();
            }
            keep(&section)
        })
        .filter_map(|l| l.strip_prefix("| `egress_proxies_"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| format!("egress_proxies_{name}"))
        .collect()
}

/// The checks every mode's exposition passes; returns the Prometheus text.
fn check_exposition(mode: &str, port: u16) -> String {
    let plain = scrape(port, None).unwrap();
    assert_eq!(plain.code, 200);
    assert!(
        plain.content_type.starts_with("text/plain; version=0.0.4"),
        "{mode}: {}",
        plain.content_type
    );
    assert!(
        !plain.body.contains("# EOF"),
        "{mode}: EOF in the text format"
    );
    let (ok, out) = run_promtool(&["check", "metrics"], &plain.body);
    assert!(
        ok && out.trim().is_empty(),
        "{mode}: promtool check metrics:\n{out}"
    );
    for accept in [PROMETHEUS_SCRAPE_ACCEPT, "application/openmetrics-text"] {
        let om = scrape(port, Some(accept)).unwrap();
        assert!(
            om.content_type
                .starts_with("application/openmetrics-text; version=1.0.0"),
            "{mode}, Accept {accept}: {}",
            om.content_type
        );
        assert_eq!(om.body.matches("# EOF").count(), 1, "{mode}");
        assert!(om.body.ends_with("# EOF\n"), "{mode}");
    }
    let text = scrape(port, Some("text/plain;version=0.0.4")).unwrap();
    assert!(text.content_type.starts_with("text/plain"), "{mode}");
    plain.body
}

/// The families of `text` are those docs/metrics.md lists, but for the families of `later`
/// (per host or per object: their series come with the host or object), and every listed
/// family not in `later` has a series.
fn check_families(mode: &str, text: &str, later: &[&str]) {
    let docs = documented();
    assert!(docs.len() >= 25, "docs/metrics.md lists {docs:?}");
    check_families_of(mode, text, later, &docs);
}

/// [`check_families`] against the families `docs` (standalone adds the gateway's).
fn check_families_of(mode: &str, text: &str, later: &[&str], docs: &BTreeSet<String>) {
    let docs = docs.clone();
    assert!(docs.len() >= 14, "docs/metrics.md lists {docs:?}");
    let served = families(text);
    let undocumented: Vec<&String> = served.difference(&docs).collect();
    assert!(
        undocumented.is_empty(),
        "{mode}: served, not in docs/metrics.md: {undocumented:?}"
    );
    let missing: Vec<&String> = docs
        .difference(&served)
        .filter(|f| !later.contains(&f.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{mode}: in docs/metrics.md, not served: {missing:?}"
    );
    for f in &docs {
        if later.contains(&f.as_str()) {
            continue;
        }
        assert!(has_sample(text, f), "{mode}: {f} has no series:\n{text}");
    }
}

#[test]
fn standalone_metrics_pass_promtool_and_every_family_is_present_from_the_first_scrape() {
    let dir = tempfile::tempdir().unwrap();
    // The first scrape that answers: nothing has been reconciled or probed yet.
    let (op, port) = start("standalone", dir.path(), |_| true);
    let first = check_exposition("standalone", port);
    // Standalone serves the pool gateway's families too (their series come with a pool's
    // gateway; the access log's counter is there from start).
    let with_gateway: BTreeSet<String> =
        documented().union(&documented_gateway()).cloned().collect();
    let mut later: Vec<&str> = NOT_FROM_START.to_vec();
    let gateway_per_pool: Vec<String> = documented_gateway()
        .into_iter()
        .filter(|f| f != "egress_proxies_gateway_access_log_dropped_total")
        .collect();
    later.extend(gateway_per_pool.iter().map(String::as_str));
    check_families_of("standalone", &first, &later, &with_gateway);
    // After the host's first check, its series are there too (the host is down).
    let start = Instant::now();
    let text = loop {
        let t = scrape(port, None).unwrap().body;
        if t.contains("egress_proxies_host_up{") {
            break t;
        }
        assert!(start.elapsed() < DEADLINE, "no host check:\n{t}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        text.contains("egress_proxies_host_up{entry=\"eptest-prom\",host=\"h1\"} 0"),
        "{text}"
    );
    for f in [
        "egress_proxies_health_probe_latency_seconds",
        "egress_proxies_health_probes_total",
    ] {
        assert!(has_sample(&text, f), "{f} has no per-host series:\n{text}");
    }
    assert!(text.contains("egress_proxies_leader 1"), "{text}");
    assert!(
        text.contains("egress_proxies_config_last_reload_successful 1"),
        "{text}"
    );
    let (ok, out) = run_promtool(&["check", "metrics"], &text);
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics:\n{out}"
    );
    drop(op);
}

/// The chart rendered with the rules and the dashboard on.
fn rendered() -> Vec<Value> {
    let out = Command::new(repo().join("scripts/render-chart"))
        .args([
            "--print",
            r#"{"metrics":{"prometheusRule":{"enabled":true},"grafanaDashboard":{"enabled":true}}}"#,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// The metric names a PromQL expression uses: every `egress_proxies_*` word, a histogram's
/// `_bucket`/`_sum`/`_count` series named by its family.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("egress_proxies_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Whether metric `name` (a series name) is served in `text`: a family, or a histogram's
/// series.
fn served(text: &str, name: &str) -> bool {
    let fams = families(text);
    fams.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|s| {
            name.strip_suffix(s).is_some_and(|f| {
                fams.contains(f) && text.contains(&format!("# TYPE {f} histogram"))
            })
        })
}

/// From start to the Proxy Running on the fake host, through the Lease.
// NB: measured ~3-6 s (kube_process.rs); 120 s is a hang guard.
const RUNNING_DEADLINE: Duration = Duration::from_secs(120);

/// `GET /metrics` of `op` with `accept` (async: the fakes run on this runtime).
async fn scrape_async(op: &Operator, accept: Option<&str>) -> Answer {
    let c = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut req = c.get(format!("http://{}/metrics", op.listen));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let r = req.send().await.unwrap();
    let code = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Answer {
        code,
        content_type,
        body: r.text().await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_metrics_pass_promtool_and_the_alerts_and_dashboard_query_only_served_metrics() {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let hosts = SocketHosts::start(1).await;
    let kubeconfig = srv.kubeconfig();
    let op = Operator::start(
        &hosts.config(),
        ClusterConfig::Kubeconfig(&kubeconfig),
        "op-prom",
    );
    // Present from the first scrape, before the Lease.
    let first = wait_for("/metrics", RUNNING_DEADLINE, || async {
        op.get("/metrics").await.filter(|(c, _)| *c == 200)
    })
    .await
    .1;
    check_families("kubernetes (first scrape)", &first, NOT_FROM_START);
    create_proxy(&srv.client().await, "default", "web", "g1").await;
    wait_for("the Proxy Running", RUNNING_DEADLINE, || async {
        srv.proxy("default", "web")
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let text = wait_for(
        "/metrics: leader, host checked, 1 Running",
        RUNNING_DEADLINE,
        || async {
            op.get("/metrics").await.map(|(_, m)| m).filter(|m| {
                m.contains("egress_proxies_leader 1")
                    && m.contains("egress_proxies_host_up{entry=\"fake\",host=\"h0\"} 1")
                    && m.contains("egress_proxies_proxies{phase=\"Running\"} 1")
            })
        },
    )
    .await;
    // Health checks are off here (a probe would leave loopback): no per-proxy `up`.
    // Per object: no pool exists (its families are listed without series). The host has no
    // address pool: no series of its usage.
    check_families(
        "kubernetes",
        &text,
        &[
            "egress_proxies_health_proxy_up",
            "egress_proxies_host_egress_addresses",
            "egress_proxies_pool_replicas",
            "egress_proxies_pool_available_replicas",
            "egress_proxies_pool_members",
            "egress_proxies_pool_replacements_total",
            "egress_proxies_pool_member_ready_seconds",
            // Per configured blocklist zone: none here.
            "egress_proxies_reputation_listed_addresses",
            "egress_proxies_reputation_failing_addresses",
            "egress_proxies_reputation_checks_total",
            "egress_proxies_reputation_check_failures_total",
        ],
    );
    let (ok, out) = run_promtool(&["check", "metrics"], &text);
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics:\n{out}"
    );
    let plain = scrape_async(&op, None).await;
    assert!(
        plain.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        plain.content_type
    );
    let om = scrape_async(&op, Some(PROMETHEUS_SCRAPE_ACCEPT)).await;
    assert_eq!(om.code, 200);
    assert!(
        om.content_type
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{}",
        om.content_type
    );
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    assert!(
        text.contains("egress_proxies_reconcile_duration_seconds_count ")
            && !text.contains("egress_proxies_reconcile_duration_seconds_count 0\n"),
        "reconciles are timed:\n{text}"
    );
    drop(op);
    let text2 = text.clone();
    tokio::task::spawn_blocking(move || alerts_and_dashboard_use_served_metrics(&text2))
        .await
        .unwrap();
}

/// The chart's rules pass `promtool check rules`; every metric the rules and the dashboard
/// query is served in `text`.
fn alerts_and_dashboard_use_served_metrics(text: &str) {
    let objs = rendered();
    let rule = objs
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("the chart renders a PrometheusRule when enabled");
    let spec = &rule["spec"];
    let dir = tempfile::tempdir().unwrap();
    let rules_file = dir.path().join("rules.json");
    // promtool reads YAML, of which JSON is a subset.
    std::fs::write(&rules_file, serde_json::to_string(spec).unwrap()).unwrap();
    let (ok, out) = run_promtool(&["check", "rules", rules_file.to_str().unwrap()], "");
    assert!(ok, "promtool check rules:\n{out}");
    let mut exprs: Vec<String> = Vec::new();
    let mut alerts = BTreeSet::new();
    for g in spec["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            alerts.insert(r["alert"].as_str().unwrap().to_owned());
            exprs.push(r["expr"].as_str().unwrap().to_owned());
        }
    }
    for a in [
        "EgressProxiesHostDown",
        "EgressProxiesProxiesUnhealthy",
        "EgressProxiesPoolBelowReplicas",
        "EgressProxiesReconcileErrors",
    ] {
        assert!(alerts.contains(a), "{a} missing: {alerts:?}");
    }
    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    for a in &alerts {
        assert!(
            doc.contains(&format!("`{a}`")),
            "docs/metrics.md does not list {a}"
        );
    }
    // The dashboard: valid JSON in its ConfigMap, the same as the chart's file.
    let cm = objs
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with("-dashboard")
        })
        .expect("the chart renders the dashboard ConfigMap when enabled");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = cm["data"]["egress-proxies.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(json).expect("the dashboard is valid JSON");
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(
            repo().join("deploy/helm/egress-proxies/files/grafana-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(dashboard, file);
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    // Every metric they name is served by the real binary.
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no egress_proxies_ metric in {e}");
        used.extend(names);
    }
    for name in &used {
        assert!(
            served(text, name),
            "{name} (used by a rule or the dashboard) is not served:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_metrics_pass_promtool_and_are_the_documented_gateway_families() {
    let srv = ApiServer::start().await;
    srv.apply_committed_crds().await;
    let g = kube_support::GatewayProcess::start(
        &srv.kubeconfig(),
        "default",
        std::net::Ipv4Addr::LOCALHOST,
        &[],
    );
    let (code, ct, text) = wait_for("the gateway's /metrics", RUNNING_DEADLINE, || async {
        g.get("/metrics", None).await.filter(|(c, _, _)| *c == 200)
    })
    .await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let (ok, out) = run_promtool(&["check", "metrics"], &text);
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics:\n{out}"
    );
    let (_, om_ct, om) = g
        .get("/metrics", Some(PROMETHEUS_SCRAPE_ACCEPT))
        .await
        .unwrap();
    assert!(
        om_ct.starts_with("application/openmetrics-text; version=1.0.0"),
        "{om_ct}"
    );
    assert_eq!(om.matches("# EOF").count(), 1);
    // Exactly the gateway's families and its build info; none of the operator's. No pool
    // declares a gateway: the per-pool families are listed without series.
    let mut docs = documented_gateway();
    docs.insert("egress_proxies_gateway_build_info".into());
    let per_pool: Vec<String> = docs
        .iter()
        .filter(|f| {
            ![
                "egress_proxies_gateway_build_info",
                "egress_proxies_gateway_access_log_dropped_total",
            ]
            .contains(&f.as_str())
        })
        .cloned()
        .collect();
    let later: Vec<&str> = per_pool.iter().map(String::as_str).collect();
    check_families_of("gateway", &text, &later, &docs);
    // Ready once the pools and Proxies were listed (none here).
    wait_for("/readyz 200", RUNNING_DEADLINE, || async {
        g.get("/readyz", None).await.filter(|(c, _, _)| *c == 200)
    })
    .await;
}
