//! The Helm chart's conventions, through the real Helm engine (`scripts/render-chart --print`,
//! Helm v4 offline): `values.schema.json` declares every value and Helm refuses values it
//! does not allow; two releases (same name in two namespaces, or two names in one namespace)
//! share no object name, cluster-scoped ones included; `nameOverride`/`fullnameOverride`
//! rename everything and keep every selector matching; the PodDisruptionBudget selects the
//! operator and never blocks a drain by default; the `helm test` pod runs a `status` command
//! the real binary accepts, against the Service of the status listener. No cluster.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs `scripts/render-chart --print VALUES --release R --namespace NS`.
fn render_output(values: &str, release: &str, namespace: &str) -> std::process::Output {
    Command::new(repo().join("scripts/render-chart"))
        .args([
            "--print",
            values,
            "--release",
            release,
            "--namespace",
            namespace,
        ])
        .output()
        .unwrap()
}

/// The chart rendered by real Helm with `values` (JSON) over its defaults.
fn render_as(values: &str, release: &str, namespace: &str) -> Vec<Value> {
    let out = render_output(values, release, namespace);
    assert!(
        out.status.success(),
        "render with {values}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn render(values: &str) -> Vec<Value> {
    render_as(values, "egress-proxies", "egress-proxies")
}

/// Helm's refusal of `values`: the render fails and stderr says why.
fn refused(values: &str) -> String {
    let out = render_output(values, "egress-proxies", "egress-proxies");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{values} was accepted");
    err
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objs, kind);
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// (kind, namespace, name) of every object: what the API server keys objects by.
fn keys(objs: &[Value]) -> BTreeSet<(String, String, String)> {
    objs.iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Whether every label of `selector` (a `matchLabels` or a Service selector) is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().expect("a selector");
    !sel.is_empty() && sel.iter().all(|(k, v)| &labels[k] == v)
}

fn operator_pod(objs: &[Value]) -> &Value {
    &one(objs, "Deployment")["spec"]["template"]
}

fn container(objs: &[Value]) -> &Value {
    &operator_pod(objs)["spec"]["containers"][0]
}

fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')))
}

/// Every Role/ClusterRole is bound by a binding of its kind that names it, to the operator's
/// ServiceAccount in the release namespace.
fn assert_bindings_hold(objs: &[Value], namespace: &str) {
    let sa = one(objs, "ServiceAccount")["metadata"]["name"].clone();
    assert_eq!(operator_pod(objs)["spec"]["serviceAccountName"], sa);
    for role in objs
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let binding = format!("{}Binding", role["kind"].as_str().unwrap());
        assert!(
            objs.iter().any(|b| b["kind"] == binding.as_str()
                && b["metadata"]["namespace"] == role["metadata"]["namespace"]
                && b["roleRef"]["kind"] == role["kind"]
                && b["roleRef"]["name"] == role["metadata"]["name"]
                && b["subjects"][0]["name"] == sa
                && b["subjects"][0]["namespace"] == namespace),
            "{} {} is bound to {sa}",
            role["kind"],
            role["metadata"]["name"]
        );
    }
}

#[test]
fn the_schema_declares_every_default_value_and_refuses_unknown_top_level_keys() {
    let schema: Value =
        serde_json::from_str(&read("deploy/helm/egress-proxies/values.schema.json")).unwrap();
    let values: Value =
        serde_saphyr::from_str(&read("deploy/helm/egress-proxies/values.yaml")).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    // Walk values.yaml: every key of an object the chart defines has its own schema.
    fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
        match s["$ref"].as_str() {
            Some(r) => {
                let name = r.strip_prefix("#/definitions/").unwrap();
                &root["definitions"][name]
            }
            None => s,
        }
    }
    fn walk(root: &Value, schema: &Value, v: &Value, path: &str, seen: &mut usize) {
        let schema = resolve(root, schema);
        let Some(map) = v.as_object() else { return };
        let Some(props) = schema["properties"].as_object() else {
            // An embedded Kubernetes object (securityContext, affinity): open by design.
            assert!(
                schema["type"] == "object",
                "{path}: no schema for an object"
            );
            return;
        };
        assert_eq!(
            schema["additionalProperties"], false,
            "{path}: unknown keys accepted"
        );
        for (k, child) in map {
            let s = props
                .get(k)
                .unwrap_or_else(|| panic!("{path}.{k} is not in values.schema.json"));
            *seen += 1;
            walk(root, s, child, &format!("{path}.{k}"), seen);
        }
    }
    let mut seen = 0;
    walk(&schema, &schema, &values, "", &mut seen);
    assert!(seen >= 40, "only {seen} values walked");
    // And Helm accepts the defaults under the schema (lint + render).
    assert!(!render("{}").is_empty());
}

#[test]
fn helm_refuses_values_of_the_wrong_type_range_or_spelling() {
    for (values, says) in [
        (r#"{"replicas":"two"}"#, "/replicas"),
        (r#"{"replicas":-1}"#, "/replicas"),
        (r#"{"replica":1}"#, "replica"),
        (
            r#"{"image":{"pullPolicy":"Sometimes"}}"#,
            "/image/pullPolicy",
        ),
        (r#"{"image":{"tag":1}}"#, "/image/tag"),
        (r#"{"metrics":{"port":70000}}"#, "/metrics/port"),
        (r#"{"metrics":{"port":"8080"}}"#, "/metrics/port"),
        (
            r#"{"metrics":{"serviceMonitor":{"interval":"30 s"}}}"#,
            "/metrics/serviceMonitor/interval",
        ),
        (r#"{"status":{"enabled":"yes"}}"#, "/status/enabled"),
        (r#"{"status":{"address":"localhost"}}"#, "/status/address"),
        (
            r#"{"health":{"interval":"30 seconds"}}"#,
            "/health/interval",
        ),
        (r#"{"health":{"concurrency":0}}"#, "/health/concurrency"),
        (
            r#"{"health":{"target":"https://echo.example"}}"#,
            "/health/target",
        ),
        (r#"{"nameOverride":"Bad_Name"}"#, "/nameOverride"),
        (r#"{"fullnameOverride":"a:b"}"#, "/fullnameOverride"),
        (r#"{"watchNamespace":"Team-A"}"#, "/watchNamespace"),
        (r#"{"sshSecret":{"name":""}}"#, "/sshSecret/name"),
        (
            r#"{"podDisruptionBudget":{"maxUnavailable":"half"}}"#,
            "/podDisruptionBudget/maxUnavailable",
        ),
        (r#"{"tests":{"enabled":1}}"#, "/tests/enabled"),
        (r#"{"resources":{"limit":{}}}"#, "limit"),
        (r#"{"nodeSelector":{"disk":1}}"#, "/nodeSelector/disk"),
    ] {
        let err = refused(values);
        assert!(
            err.contains(says),
            "{values}: the refusal names {says}: {err}"
        );
    }
    // The shapes the schema allows render.
    for values in [
        r#"{"status":{"enabled":true,"address":"::"}}"#,
        r#"{"status":{"enabled":true,"address":"0.0.0.0","port":9000}}"#,
        r#"{"podDisruptionBudget":{"maxUnavailable":null,"minAvailable":"50%"}}"#,
        r#"{"health":{"target":"http://echo.example:8080/ip","interval":"1m30s"}}"#,
        r#"{"global":{"imageRegistry":"x"}}"#,
        r#"{"nodeSelector":{"kubernetes.io/arch":"amd64"},"tolerations":[{"operator":"Exists"}]}"#,
    ] {
        render(values);
    }
}

#[test]
fn two_releases_of_one_name_in_two_namespaces_share_no_object_name() {
    // Both watch the same namespace, so each has a Role there too, and both put their
    // Grafana dashboard in the sidecar's namespace; every optional object is on.
    let values = r#"{"watchNamespace":"team-a","status":{"enabled":true,"address":"0.0.0.0"},"networkPolicy":{"enabled":true},"metrics":{"serviceMonitor":{"enabled":true},"prometheusRule":{"enabled":true},"grafanaDashboard":{"enabled":true,"namespace":"monitoring"}}}"#;
    let a = render_as(values, "egress-proxies", "ops-a");
    let b = render_as(values, "egress-proxies", "ops-b");
    let (ka, kb) = (keys(&a), keys(&b));
    let shared: Vec<_> = ka.intersection(&kb).collect();
    assert!(shared.is_empty(), "both releases write {shared:?}");
    for (objs, ns) in [(&a, "ops-a"), (&b, "ops-b")] {
        assert_bindings_hold(objs, ns);
        // Everything outside the release namespace (cluster-scoped, or in another namespace)
        // is named NAMESPACE.FULLNAME[-SUFFIX].
        let mut foreign = 0;
        for o in objs.iter() {
            let kind = o["kind"].as_str().unwrap();
            let name = o["metadata"]["name"].as_str().unwrap();
            if o["metadata"]["namespace"] != ns {
                foreign += 1;
                assert!(
                    name == format!("{ns}.egress-proxies")
                        || name.starts_with(&format!("{ns}.egress-proxies-")),
                    "{kind} {name} outside {ns} is not named from the release namespace"
                );
            }
        }
        assert_eq!(
            foreign, 9,
            "ClusterRole, ClusterRoleBinding, the watched namespace's and the Secrets' Role and \
             RoleBinding, the Secret-type ValidatingAdmissionPolicy and its binding, and the \
             dashboard ConfigMap"
        );
    }
    // Two names in one namespace: no object and no Lease in common either.
    let c = render_as(values, "egress-proxies", "ops");
    let d = render_as(values, "second", "ops");
    let shared: Vec<_> = keys(&c).intersection(&keys(&d)).cloned().collect();
    assert!(shared.is_empty(), "both releases write {shared:?}");
    let lease =
        |o: &[Value]| arg(&strings(&container(o)["args"]), "--lease-name").map(str::to_owned);
    assert_eq!(lease(&c).as_deref(), Some("egress-proxies-leader"));
    assert_eq!(lease(&d).as_deref(), Some("second-egress-proxies-leader"));
    assert_bindings_hold(&d, "ops");
}

#[test]
fn name_overrides_rename_every_object_and_keep_every_selector_matching() {
    let by_name = render_as(r#"{"nameOverride":"egress"}"#, "prod", "ops");
    let full = render_as(r#"{"fullnameOverride":"gateway"}"#, "prod", "ops");
    let plain = render_as("{}", "prod", "ops");
    for (objs, fullname, app) in [
        (&plain, "prod-egress-proxies", "egress-proxies"),
        (&by_name, "prod-egress", "egress"),
        (&full, "gateway", "egress-proxies"),
    ] {
        for o in objs.iter() {
            let name = o["metadata"]["name"].as_str().unwrap();
            assert!(
                name.starts_with(fullname)
                    || name == format!("ops.{fullname}")
                    || name.starts_with(&format!("ops.{fullname}-")),
                "{} {name} is not named from {fullname}",
                o["kind"]
            );
            assert_eq!(o["metadata"]["labels"]["app.kubernetes.io/name"], app);
        }
        let pod = operator_pod(objs);
        assert!(selects(
            &one(objs, "Deployment")["spec"]["selector"]["matchLabels"],
            &pod["metadata"]["labels"]
        ));
        assert!(selects(
            &one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
            &pod["metadata"]["labels"]
        ));
        for svc in of_kind(objs, "Service") {
            assert!(selects(
                &svc["spec"]["selector"],
                &pod["metadata"]["labels"]
            ));
        }
        assert_eq!(
            pod["spec"]["volumes"][0]["configMap"]["name"],
            one(objs, "ConfigMap")["metadata"]["name"]
        );
        assert_bindings_hold(objs, "ops");
    }
}

#[test]
fn the_disruption_budget_selects_the_operator_and_never_blocks_a_drain_by_default() {
    let objs = render("{}");
    let pdb = one(&objs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["metadata"]["namespace"], "egress-proxies");
    assert!(selects(
        &pdb["spec"]["selector"]["matchLabels"],
        &operator_pod(&objs)["metadata"]["labels"]
    ));
    // One replica may always be evicted; with two, one at a time.
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null());
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    let pdb =
        render(r#"{"replicas":2,"podDisruptionBudget":{"maxUnavailable":null,"minAvailable":1}}"#);
    let pdb = one(&pdb, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"]["maxUnavailable"].is_null());
    let err = refused(r#"{"podDisruptionBudget":{"minAvailable":1}}"#);
    assert!(err.contains("not both"), "{err}");
    let off = render(r#"{"podDisruptionBudget":{"enabled":false}}"#);
    assert!(of_kind(&off, "PodDisruptionBudget").is_empty());
}

/// A one-shot HTTP server answering `GET /status...` with an empty status document (and 404
/// to anything else); returns its port and a handle yielding the request line it got.
fn status_server() -> (u16, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
        }
        // An empty status document, as the operator serves it with no Proxy yet.
        let body = serde_json::json!({
            "generatedAt": "2026-01-01T00:00:00Z",
            "proxies": [],
            "hosts": [],
            "manifestErrors": []
        })
        .to_string();
        let head = if request.starts_with("GET /status") {
            "200 OK"
        } else {
            "404 Not Found"
        };
        write!(
            conn,
            "HTTP/1.1 {head}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        request
    });
    (port, handle)
}

#[test]
fn helm_test_runs_the_status_command_against_the_status_service() {
    let objs = render(r#"{"status":{"enabled":true,"address":"0.0.0.0"}}"#);
    let pods = of_kind(&objs, "Pod");
    assert_eq!(pods.len(), 1, "one test pod");
    let t = pods[0];
    assert_eq!(t["metadata"]["annotations"]["helm.sh/hook"], "test");
    assert_eq!(t["metadata"]["namespace"], "egress-proxies");
    assert_eq!(t["spec"]["restartPolicy"], "Never");
    assert_eq!(t["spec"]["automountServiceAccountToken"], false);
    // Not one of the operator's pods: no ReplicaSet adopts it, no Service sends to it.
    let labels = &t["metadata"]["labels"];
    assert!(!selects(
        &one(&objs, "Deployment")["spec"]["selector"]["matchLabels"],
        labels
    ));
    assert!(!selects(
        &one(&objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        labels
    ));
    for svc in of_kind(&objs, "Service") {
        assert!(!selects(&svc["spec"]["selector"], labels));
    }
    let c = &t["spec"]["containers"][0];
    assert!(
        c["command"].is_null(),
        "the image's entrypoint is the binary"
    );
    assert_eq!(c["image"], container(&objs)["image"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(t["spec"]["securityContext"]["runAsNonRoot"], true);
    let args = strings(&c["args"]);
    assert_eq!(args[0], "status");
    let server = &args[args.iter().position(|a| a == "--server").unwrap() + 1];
    // The URL names the status Service and its port, which reaches the status listener.
    let authority = server.strip_prefix("http://").unwrap();
    let (host, port) = authority.split_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let svc = of_kind(&objs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == host)
        .unwrap_or_else(|| panic!("no Service {host}"));
    let sp = &svc["spec"]["ports"][0];
    assert_eq!(sp["port"], port);
    assert!(selects(
        &svc["spec"]["selector"],
        &operator_pod(&objs)["metadata"]["labels"]
    ));
    let op = container(&objs);
    let cport = op["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == sp["targetPort"])
        .expect("the Service's targetPort is a container port");
    let op_args = strings(&op["args"]);
    let listen = arg(&op_args, "--status-listen").expect("--status-listen");
    assert_eq!(listen, format!("0.0.0.0:{}", cport["containerPort"]));
    // The real binary runs exactly these arguments (only the Service's address is swapped
    // for a local server's): it parses them, GETs /status and exits 0 on the document.
    let (local, served) = status_server();
    let here: Vec<String> = args
        .iter()
        .map(|a| a.replace(authority, &format!("127.0.0.1:{local}")))
        .collect();
    let out = Command::new(BIN)
        .args(&here)
        .env_remove("EGRESS_PROXIES_SERVER")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{here:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(served.join().unwrap().starts_with("GET /status"));
}

#[test]
fn no_test_pod_without_a_reachable_status_listener_and_none_in_the_committed_manifests() {
    for values in [
        "{}",
        r#"{"status":{"enabled":true}}"#,
        r#"{"status":{"enabled":true,"address":"::1"}}"#,
        r#"{"status":{"enabled":true,"address":"0.0.0.0"},"tests":{"enabled":false}}"#,
    ] {
        let objs = render(values);
        assert!(of_kind(&objs, "Pod").is_empty(), "{values}");
    }
    // Loopback: no Service points at the status port.
    let objs = render(r#"{"status":{"enabled":true}}"#);
    assert_eq!(of_kind(&objs, "Service").len(), 1);
    // An IPv6 address is bracketed for the binary's ADDR:PORT.
    let objs = render(r#"{"status":{"enabled":true,"address":"::"}}"#);
    let args = strings(&container(&objs)["args"]);
    assert_eq!(arg(&args, "--status-listen"), Some("[::]:8081"));
    let parsed: Result<std::net::SocketAddr, _> = "[::]:8081".parse();
    assert!(parsed.is_ok());
    // deploy/manifests/ is applied with kubectl: no hook may be in it.
    for f in std::fs::read_dir(repo().join("deploy/manifests")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains("helm.sh/hook"));
    }
}

#[test]
fn the_network_policy_admits_the_test_pod_to_the_status_port() {
    let objs = render(
        r#"{"status":{"enabled":true,"address":"0.0.0.0"},"networkPolicy":{"enabled":true,"statusFrom":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]}}"#,
    );
    let np = one(&objs, "NetworkPolicy");
    let rule = np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"][0]["port"] == "status")
        .expect("a rule for the status port");
    let test_labels = &one(&objs, "Pod")["metadata"]["labels"];
    let from = rule["from"].as_array().unwrap();
    assert!(
        from.iter().any(|p| p["namespaceSelector"].is_null()
            && selects(&p["podSelector"]["matchLabels"], test_labels)),
        "{from:?}"
    );
}

#[test]
fn crd_upgrades_are_documented_where_users_install_the_chart() {
    // Helm installs crds/ once and never upgrades them: every place that tells how to
    // install or upgrade says how to apply them.
    let apply = "kubectl apply --server-side -f";
    for doc in [
        "docs/operations.md",
        "deploy/helm/egress-proxies/README.md",
        "deploy/helm/egress-proxies/templates/NOTES.txt",
    ] {
        let text = read(doc);
        assert!(
            text.contains(apply),
            "{doc} does not say `{apply}` for the CRDs"
        );
        assert!(
            text.contains("crds/"),
            "{doc} does not name the CRDs' directory"
        );
    }
    // The CRDs are what scripts/gen-crds writes: the binary's `crds --dir` into deploy/crds/,
    // copied into the chart (tests/deploy.rs compares the files with the binary's output).
    let script = read("scripts/gen-crds");
    assert!(script.contains("crds --dir deploy/crds"));
    assert!(script.contains("deploy/helm/egress-proxies/crds/"));
}

// ---------------------------------------------------------------- the Helm SDK cache

/// The shared Helm SDK cache `.ci/setup-host` fills (`EGRESS_PROXIES_HELM_CACHE` or the
/// default of `scripts/render-chart`).
fn shared_helm_cache() -> PathBuf {
    std::env::var_os("EGRESS_PROXIES_HELM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/egress-proxies/helm-sdk"))
}

/// The pinned wheel in the shared cache; fails naming the setup step when it is not there.
fn shared_helm_wheel() -> PathBuf {
    let cache = shared_helm_cache();
    let wheels: Vec<PathBuf> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("helm_python_sdk-") && n.ends_with(".whl"))
        })
        .collect();
    assert_eq!(
        wheels.len(),
        1,
        "the Helm SDK wheel is not in {} (found {wheels:?}): run .ci/setup-host",
        cache.display()
    );
    wheels[0].clone()
}

/// Longest one render may take while several unpack the SDK at once.
// NB: a render takes ~1 s with the SDK unpacked; unpacking the ~60 MiB wheel a few seconds on
// a loaded machine. Two minutes catch a hang, never a slow machine.
const RENDER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Waits for `child` within [`RENDER_DEADLINE`], killing it and failing otherwise.
fn finish_render(mut child: std::process::Child) -> std::process::Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > RENDER_DEADLINE {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "a render did not finish within {RENDER_DEADLINE:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A render with `cache` as its Helm SDK cache (and `wheel`, if given, as the wheel to unpack).
fn render_with_cache(cache: &Path, wheel: Option<&Path>) -> std::process::Child {
    let mut cmd = Command::new(repo().join("scripts/render-chart"));
    cmd.args(["--print", "{}"])
        .env("EGRESS_PROXIES_HELM_CACHE", cache)
        .env_remove("EGRESS_PROXIES_HELM_WHEEL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(w) = wheel {
        cmd.env("EGRESS_PROXIES_HELM_WHEEL", w);
    }
    cmd.spawn().unwrap()
}

#[test]
fn renders_started_at_once_on_an_empty_cache_all_succeed_and_publish_one_complete_sdk() {
    // Several first users of an empty cache at once, as the chart tests are on a fresh
    // machine: each unpacks the SDK and publishes it; every one must succeed.
    const RENDERS: usize = 6;
    let wheel = shared_helm_wheel();
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("helm-sdk");
    let children: Vec<_> = (0..RENDERS)
        .map(|_| render_with_cache(&cache, Some(&wheel)))
        .collect();
    let outs: Vec<_> = children.into_iter().map(finish_render).collect();
    for (i, out) in outs.iter().enumerate() {
        assert!(
            out.status.success(),
            "render {i} of {RENDERS} on an empty cache failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        outs.iter()
            .all(|o| o.stdout == outs[0].stdout && !o.stdout.is_empty()),
        "the renders printed different charts"
    );
    // One SDK published whole, and no render's private copy left behind.
    let mut names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        1,
        "the cache holds more than the SDK: {names:?}"
    );
    assert!(
        cache
            .join(&names[0])
            .join("helm_python/__init__.py")
            .is_file(),
        "the published SDK is incomplete: {names:?}"
    );
    // A render on the now-filled cache needs no wheel at all.
    let out = finish_render(render_with_cache(&cache, None));
    assert!(
        out.status.success() && out.stdout == outs[0].stdout,
        "a render on the filled cache: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_render_with_no_sdk_in_its_cache_fails_naming_the_setup_step_and_downloads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("helm-sdk");
    let out = finish_render(render_with_cache(&cache, None));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a render with no SDK succeeded");
    assert!(
        err.contains(".ci/setup-host") && err.contains(&cache.display().to_string()),
        "the error names neither the setup step nor the cache: {err}"
    );
    let left: Vec<_> = std::fs::read_dir(&cache)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "something was fetched into the cache: {left:?}"
    );
}
