//! The committed deployment artifacts against the code: the CRDs under `deploy/crds/` (and the
//! chart's copy) are exactly what `egress-proxies crds` prints, so CI fails when the types
//! change without regenerating them; the manifests under `deploy/manifests/` are the Helm
//! chart rendered by real Helm (`scripts/render-chart --check`, with the Helm SDK
//! `.ci/setup-host` put in its cache) and have the expected objects, a locked-down pod, probes on the served paths, flags
//! the binary accepts, and RBAC that grants exactly the table in `egress_kube::rbac`. No
//! cluster.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use egress_kube::rbac::{API_ACCESS, GATEWAY_API_ACCESS, Scope};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every object of every `deploy/manifests/*.yaml`, in file-name order.
fn manifests() -> Vec<Value> {
    let dir = repo().join("deploy/manifests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        out.extend(docs.into_iter().filter(|d| !d.is_null()));
    }
    out
}

fn object<'a>(objs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| o["kind"] == kind).collect();
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

#[test]
fn the_committed_crds_are_exactly_what_the_binary_generates() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["crds", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = Command::new(BIN).arg("crds").output().unwrap();
    assert!(stdout.status.success());
    let mut concatenated = String::new();
    for (name, yaml) in egress_kube::api::crds_yaml().unwrap() {
        let generated = std::fs::read_to_string(dir.path().join(&name)).unwrap();
        assert_eq!(generated, yaml);
        for committed in [
            format!("deploy/crds/{name}"),
            format!("deploy/helm/egress-proxies/crds/{name}"),
        ] {
            assert!(
                read(&committed) == generated,
                "{committed} is stale: regenerate with `cargo run -p egress-proxies -- crds \
                 --dir deploy/crds` and copy to deploy/helm/egress-proxies/crds/"
            );
        }
        concatenated.push_str("---\n");
        concatenated.push_str(&yaml);
    }
    assert_eq!(String::from_utf8(stdout.stdout).unwrap(), concatenated);
}

#[test]
fn the_rendered_manifests_hold_the_operator_objects_in_its_namespace() {
    let objs = manifests();
    let kinds: BTreeSet<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ])
    );
    for o in &objs {
        assert!(
            o["apiVersion"].is_string() && o["metadata"]["name"].is_string(),
            "{o}"
        );
        let cluster_scoped = matches!(
            o["kind"].as_str(),
            Some(
                "ClusterRole"
                    | "ClusterRoleBinding"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            )
        );
        assert_eq!(
            o["metadata"]["namespace"].as_str(),
            (!cluster_scoped).then_some("egress-proxies"),
            "{}",
            o["kind"]
        );
    }
    let sa = object(&objs, "ServiceAccount")["metadata"]["name"].clone();
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let b = object(&objs, binding);
        assert_eq!(b["subjects"][0]["name"], sa);
        assert_eq!(b["subjects"][0]["namespace"], "egress-proxies");
    }
    let svc = object(&objs, "Service");
    let pod = &object(&objs, "Deployment")["spec"]["template"];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod["metadata"]["labels"][k], v,
            "the metrics Service selects the pod"
        );
    }
}

#[test]
fn the_operator_pod_is_non_root_read_only_capability_free_and_memory_bounded() {
    // finding: APX-3
    let objs = manifests();
    let dep = object(&objs, "Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        pod["serviceAccountName"],
        object(&objs, "ServiceAccount")["metadata"]["name"]
    );
    let c = &pod["containers"][0];
    assert_eq!(pod["containers"].as_array().unwrap().len(), 1);
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());
    let limit = c["resources"]["limits"]["memory"].as_str().unwrap();
    let mib: u64 = limit.strip_suffix("Mi").unwrap().parse().unwrap();
    // NB: the budget is the Kubernetes-mode peak measured with 1000 Proxies (docs/benchmarks.md:
    // ~44 MiB) plus an image import's ~18 MiB, with headroom; a larger limit hides a leak.
    assert!(mib <= 96, "memory limit {limit} exceeds the 96 MiB budget");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["requests"]["cpu"].is_string());
    let port = &c["ports"][0];
    assert_eq!(port["name"], "metrics");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "metrics");
    }
    let args = strings(&c["args"]);
    let listen = args.iter().find(|a| a.starts_with("--listen=")).unwrap();
    assert!(
        listen.ends_with(&format!(":{}", port["containerPort"])),
        "{listen}"
    );
    // The config and SSH material are mounted read-only where the args point.
    let mounts: Vec<(&str, &str, bool)> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
                m["readOnly"] == true,
            )
        })
        .collect();
    assert!(mounts.contains(&("config", "/etc/egress-proxies/config", true)));
    assert!(mounts.contains(&("ssh", "/etc/egress-proxies/ssh", true)));
    assert!(args.contains(&"--config=/etc/egress-proxies/config/providers.yaml".to_owned()));
    assert!(args.contains(&"--ssh-dir=/etc/egress-proxies/ssh".to_owned()));
    let vols = &pod["volumes"];
    assert_eq!(
        vols[0]["configMap"]["name"],
        object(&objs, "ConfigMap")["metadata"]["name"]
    );
    assert!(vols[1]["secret"]["secretName"].is_string());
}

#[test]
fn every_flag_the_manifest_passes_is_one_the_binary_accepts() {
    let objs = manifests();
    let c = &object(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&c["args"]);
    assert_eq!(args[0], "kubernetes");
    let help = Command::new(BIN)
        .args(["kubernetes", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "`kubernetes` has no {flag}:\n{help}"
        );
    }
    for env in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(help.contains(env), "{env} is read by the binary");
        assert!(
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == env)
        );
    }
}

/// Where a grant applies: `None` cluster-wide (a ClusterRole), `Some(ns)` in one namespace (a
/// Role).
type Grant = (Option<String>, String, String, String);

/// (where, group, resource, verb) for every grant of the rendered Roles and ClusterRoles,
/// each bound to the operator's ServiceAccount by a binding of the same name and namespace.
fn granted(objs: &[Value]) -> BTreeSet<Grant> {
    granted_to(objs, "egress-proxies")
}

/// [`granted`] for the roles bound to ServiceAccount `sa` (of namespace egress-proxies);
/// every role is bound to one of the chart's ServiceAccounts.
fn granted_to(objs: &[Value], sa: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for role in objs
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let ns = role["metadata"]["namespace"].as_str().map(str::to_owned);
        let binding = format!("{}Binding", role["kind"].as_str().unwrap());
        let bound_to = |who: &str| {
            objs.iter().any(|b| {
                b["kind"] == binding.as_str()
                    && b["metadata"]["namespace"] == role["metadata"]["namespace"]
                    && b["roleRef"]["name"] == role["metadata"]["name"]
                    && b["subjects"][0]["name"] == who
                    && b["subjects"][0]["namespace"] == "egress-proxies"
            })
        };
        assert!(
            bound_to("egress-proxies") || bound_to("egress-proxies-gateway"),
            "{} {} is bound",
            role["kind"],
            role["metadata"]["name"]
        );
        if !bound_to(sa) {
            continue;
        }
        for rule in role["rules"].as_array().unwrap() {
            assert!(rule["resourceNames"].is_null() && rule["nonResourceURLs"].is_null());
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        assert_ne!(v, "*", "no wildcard verbs");
                        assert_ne!(r, "*", "no wildcard resources");
                        let grant = (ns.clone(), g.clone(), r.clone(), v);
                        assert!(out.insert(grant.clone()), "duplicate {grant:?}");
                    }
                }
            }
        }
    }
    out
}

/// The grants `API_ACCESS` asks for when `watched` is the one watched namespace (`None`:
/// every namespace) and `secrets` the namespaces granted Secret access.
fn wanted(watched: Option<&str>, secrets: &[&str]) -> BTreeSet<Grant> {
    wanted_from(API_ACCESS, watched, secrets)
}

/// [`wanted`] for another table (the gateway's).
fn wanted_from(
    table: &[egress_kube::rbac::ApiAccess],
    watched: Option<&str>,
    secrets: &[&str],
) -> BTreeSet<Grant> {
    table
        .iter()
        .flat_map(|a| {
            let at: Vec<Option<String>> = match a.scope {
                Scope::Cluster => vec![None],
                Scope::OperatorNamespace => vec![Some("egress-proxies".to_owned())],
                Scope::WatchedNamespaces => vec![watched.map(str::to_owned)],
                Scope::SecretNamespaces => secrets.iter().map(|n| Some((*n).to_owned())).collect(),
            };
            at.into_iter().flat_map(move |at| {
                a.verbs.iter().map(move |v| {
                    (
                        at.clone(),
                        a.group.to_owned(),
                        a.resource.to_owned(),
                        (*v).to_owned(),
                    )
                })
            })
        })
        .collect()
}

fn assert_grants(got: &BTreeSet<Grant>, want: &BTreeSet<Grant>) {
    let extra: Vec<_> = got.difference(want).collect();
    let missing: Vec<_> = want.difference(got).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "RBAC differs from egress_kube::rbac::API_ACCESS: granted but unused {extra:?}; \
         used but not granted {missing:?}"
    );
}

/// The chart rendered by real Helm with `values` (JSON) over its defaults.
fn render(values: &str) -> Vec<Value> {
    let out = Command::new(repo().join("scripts/render-chart"))
        .args(["--print", values])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render with {values}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

#[test]
fn the_gateway_runs_apart_with_read_only_grants_a_service_per_pool_and_an_optional_autoscaler() {
    let values = r#"{"gateway":{"enabled":true,"replicas":3,
        "pools":[{"namespace":"team-a","name":"web",
                  "ports":[{"name":"http","port":3128},{"name":"socks5","port":1080}]}]}}"#;
    let objs = render(values);
    // Read-only, exactly the gateway's table, cluster-wide when every namespace is watched...
    // Secrets never cluster-wide: none granted unless secretNamespaces names some...
    assert_grants(
        &granted_to(&objs, "egress-proxies-gateway"),
        &wanted_from(GATEWAY_API_ACCESS, None, &[]),
    );
    // ... and the operator's grants are unchanged.
    assert_grants(&granted(&objs), &wanted(None, &[]));
    // ... and only in the watched namespace when one is, Secrets there too...
    let one = render(&values.replace(r#"{"gateway""#, r#"{"watchNamespace":"team-a","gateway""#));
    assert_grants(
        &granted_to(&one, "egress-proxies-gateway"),
        &wanted_from(GATEWAY_API_ACCESS, Some("team-a"), &["team-a"]),
    );
    // ... and in each namespace secretNamespaces lists.
    let listed = render(&values.replace(
        r#"{"gateway""#,
        r#"{"secretNamespaces":["team-a","team-b"],"gateway""#,
    ));
    assert_grants(
        &granted_to(&listed, "egress-proxies-gateway"),
        &wanted_from(GATEWAY_API_ACCESS, None, &["team-a", "team-b"]),
    );
    let deployments: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "Deployment").collect();
    assert_eq!(deployments.len(), 2);
    let gw = deployments
        .iter()
        .find(|d| d["metadata"]["name"] == "egress-proxies-gateway")
        .unwrap();
    let op = deployments
        .iter()
        .find(|d| d["metadata"]["name"] == "egress-proxies")
        .unwrap();
    assert_eq!(gw["spec"]["replicas"], 3);
    let pod = &gw["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "egress-proxies-gateway");
    // Neither Deployment's selector (nor the operator's Services) takes the other's pods.
    let labels_of = |d: &Value| d["spec"]["template"]["metadata"]["labels"].clone();
    let selects = |sel: &Value, labels: &Value| {
        sel.as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v)
    };
    assert!(!selects(
        &op["spec"]["selector"]["matchLabels"],
        &labels_of(gw)
    ));
    assert!(!selects(
        &gw["spec"]["selector"]["matchLabels"],
        &labels_of(op)
    ));
    let services: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "Service").collect();
    for svc in &services {
        let sel = &svc["spec"]["selector"];
        assert!(
            selects(sel, &labels_of(gw)) != selects(sel, &labels_of(op)),
            "{} selects exactly one of the two: {sel}",
            svc["metadata"]["name"]
        );
    }
    let web = services
        .iter()
        .find(|s| s["metadata"]["name"] == "egress-proxies-gw-team-a-web")
        .unwrap();
    assert!(selects(&web["spec"]["selector"], &labels_of(gw)));
    let ports: Vec<(String, u64)> = web["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["port"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [("http".into(), 3128), ("socks5".into(), 1080)]);
    // The pod: non-root, read-only, probes on its metrics port, flags the binary accepts.
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        pod["spec"]["terminationGracePeriodSeconds"], 45,
        "grace 30 s + 15"
    );
    let args = strings(&c["args"]);
    assert_eq!(args[0], "gateway");
    assert!(
        args.contains(&"--health-checks=false".to_owned()),
        "{args:?}"
    );
    let help = Command::new(BIN)
        .args(["gateway", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for a in &args[1..] {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "`gateway` has no {flag}:\n{help}"
        );
    }
    assert!(objs.iter().all(|o| o["kind"] != "HorizontalPodAutoscaler"));
    // With an autoscaler the HPA owns the count; with health checks on, only healthy members.
    let scaled = render(
        &values
            .replace(
                r#""replicas":3,"#,
                r#""replicas":3,"autoscaling":{"enabled":true,"minReplicas":2,"maxReplicas":6},"#,
            )
            .replace(
                r#"{"gateway""#,
                r#"{"health":{"target":"http://192.0.2.1:9465/"},"gateway""#,
            ),
    );
    let hpa = scaled
        .iter()
        .find(|o| o["kind"] == "HorizontalPodAutoscaler")
        .unwrap();
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        "egress-proxies-gateway"
    );
    assert_eq!(
        (
            hpa["spec"]["minReplicas"].as_u64(),
            hpa["spec"]["maxReplicas"].as_u64()
        ),
        (Some(2), Some(6))
    );
    let gw = scaled
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "egress-proxies-gateway")
        .unwrap();
    assert!(gw["spec"]["replicas"].is_null());
    let args = strings(&gw["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--health-checks=true".to_owned()),
        "{args:?}"
    );
    // Off by default: the committed manifests hold no gateway object.
    assert!(
        manifests()
            .iter()
            .all(|o| !o["metadata"]["name"].as_str().unwrap().contains("gateway"))
    );
}

#[test]
fn rbac_grants_exactly_the_verbs_and_resources_the_driver_calls() {
    // Every namespace watched (the defaults): the namespaced grants are cluster-wide.
    assert_grants(&granted(&manifests()), &wanted(None, &[]));
}

/// Every Secret grant of `objs`: where (None: cluster-wide) and the verb.
fn secret_grants(objs: &[Value]) -> BTreeSet<(Option<String>, String)> {
    granted(objs)
        .into_iter()
        .filter(|(_, g, r, _)| g.is_empty() && r == "secrets")
        .map(|(at, _, _, v)| (at, v))
        .collect()
}

/// The chart's ValidatingAdmissionPolicy limiting the operator's Secret creates to its own
/// type, bound with `Deny`, matching exactly the operator's ServiceAccount.
fn assert_secret_type_policy(objs: &[Value]) {
    let p = object(objs, "ValidatingAdmissionPolicy");
    let b = object(objs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(b["spec"]["policyName"], p["metadata"]["name"]);
    assert_eq!(strings(&b["spec"]["validationActions"]), ["Deny"]);
    assert_eq!(p["spec"]["failurePolicy"], "Fail");
    let rule = &p["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(strings(&rule["resources"]), ["secrets"]);
    assert_eq!(strings(&rule["operations"]), ["CREATE", "UPDATE"]);
    let cond = p["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        cond.contains("'system:serviceaccount:egress-proxies:egress-proxies'"),
        "{cond}"
    );
    let v = p["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(
        v.contains(&format!(
            "object.type == '{}'",
            egress_kube::rbac::SECRET_TYPE
        )),
        "{v}"
    );
}

#[test]
fn no_install_grants_secret_access_cluster_wide_and_creates_only_its_own_type() {
    // The defaults (every namespace watched) and each documented variant.
    for (values, secrets) in [
        ("{}", &[][..]),
        (r#"{"watchNamespace":"team-a"}"#, &["team-a"][..]),
        (
            r#"{"secretNamespaces":["team-a","team-b"]}"#,
            &["team-a", "team-b"][..],
        ),
        (
            r#"{"watchNamespace":"team-a","secretNamespaces":["team-b"]}"#,
            &["team-b"][..],
        ),
    ] {
        let objs = if values == "{}" {
            manifests()
        } else {
            render(values)
        };
        let got = secret_grants(&objs);
        assert!(
            got.iter().all(|(at, _)| at.is_some()),
            "{values}: Secrets granted cluster-wide: {got:?}"
        );
        let want: BTreeSet<(Option<String>, String)> = secrets
            .iter()
            .flat_map(|n| ["create", "get"].map(|v| (Some((*n).to_owned()), v.to_owned())))
            .collect();
        assert_eq!(got, want, "{values}");
        let watched = serde_json::from_str::<Value>(values).unwrap()["watchNamespace"]
            .as_str()
            .map(str::to_owned);
        assert_grants(&granted(&objs), &wanted(watched.as_deref(), secrets));
        assert_secret_type_policy(&objs);
    }
    // The policy can be left out (a cluster older than 1.30), never the Role scoping.
    let objs = render(r#"{"secretTypePolicy":{"enabled":false}}"#);
    assert!(
        !objs
            .iter()
            .any(|o| o["kind"] == "ValidatingAdmissionPolicy")
    );
    assert!(secret_grants(&objs).is_empty());
}

#[test]
fn with_one_watched_namespace_secrets_services_slices_and_events_are_granted_only_there() {
    let objs = render(r#"{"watchNamespace":"team-a"}"#);
    let got = granted(&objs);
    assert_grants(&got, &wanted(Some("team-a"), &["team-a"]));
    for (at, _, resource, _) in &got {
        if at.is_none() {
            assert!(
                matches!(
                    resource.as_str(),
                    "providerhealths" | "providerhealths/status" | "proxies" | "namespaces"
                ),
                "cluster-wide grant on {resource}"
            );
        }
    }
    assert!(got.contains(&(
        Some("team-a".into()),
        String::new(),
        "secrets".into(),
        "get".into()
    )));
    let c = &object(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert!(strings(&c["args"]).contains(&"--namespace=team-a".to_owned()));
}

#[test]
fn the_status_views_are_off_by_default_and_on_their_own_port_when_enabled() {
    let default = manifests();
    let c = &object(&default, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert!(
        !strings(&c["args"])
            .iter()
            .any(|a| a.starts_with("--status-listen")),
        "status views are off by default"
    );
    let objs = render(r#"{"status":{"enabled":true}}"#);
    let c = &object(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&c["args"]);
    assert!(
        args.contains(&"--status-listen=127.0.0.1:8081".to_owned()),
        "{args:?}"
    );
    let help = Command::new(BIN)
        .args(["kubernetes", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--status-listen "));
    assert!(
        args.contains(&"--listen=0.0.0.0:8080".to_owned()),
        "{args:?}"
    );
    // No Service exposes the status port.
    let svc = object(&objs, "Service");
    for p in svc["spec"]["ports"].as_array().unwrap() {
        assert_eq!(p["targetPort"], "metrics");
    }
}

#[test]
fn the_network_policy_admits_only_the_metrics_port_from_the_listed_peers() {
    // On by default (deploy/manifests is the default render): /metrics names every tenant's
    // Proxies and pools, so only the namespace `monitoring` may scrape it, selected by the
    // name the API server sets (a tenant can label a pod, not rename its namespace).
    let defaults = manifests();
    let np = object(&defaults, "NetworkPolicy");
    let pod = &object(&defaults, "Deployment")["spec"]["template"];
    for (k, v) in np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &pod["metadata"]["labels"][k], v,
            "selects the operator's pods"
        );
    }
    assert_eq!(strings(&np["spec"]["policyTypes"]), ["Ingress"]);
    let ingress = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(ingress[0]["ports"][0]["port"], "metrics");
    let from = ingress[0]["from"].as_array().unwrap();
    assert_eq!(from.len(), 1, "{from:?}");
    assert_eq!(
        from[0]["namespaceSelector"]["matchLabels"],
        serde_json::json!({"kubernetes.io/metadata.name": "monitoring"})
    );
    assert!(from[0].get("podSelector").is_none(), "{from:?}");

    // Other peers replace the default.
    let objs = render(
        r#"{"networkPolicy":{"metricsFrom":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"observability"}}}]}}"#,
    );
    let np = object(&objs, "NetworkPolicy");
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "observability"
    );
    // An empty list admits anyone to the metrics port (and only to it); `enabled: false` drops
    // the policy.
    let objs = render(r#"{"networkPolicy":{"metricsFrom":[]}}"#);
    let ingress = object(&objs, "NetworkPolicy")["spec"]["ingress"].clone();
    assert!(ingress[0].get("from").is_none(), "{ingress:?}");
    let objs = render(r#"{"networkPolicy":{"enabled":false}}"#);
    assert!(!objs.iter().any(|o| o["kind"] == "NetworkPolicy"));
    // A status port reachable beyond loopback gets its own rule.
    let objs = render(r#"{"status":{"enabled":true,"address":"0.0.0.0"}}"#);
    let ingress = object(&objs, "NetworkPolicy")["spec"]["ingress"].clone();
    assert_eq!(ingress[1]["ports"][0]["port"], "status");
}

#[test]
fn every_object_carries_the_standard_labels_and_the_chart_needs_kubernetes_1_31() {
    for o in manifests() {
        let l = &o["metadata"]["labels"];
        assert_eq!(l["helm.sh/chart"], "egress-proxies-0.1.0", "{}", o["kind"]);
        for k in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
        ] {
            assert!(l[k].is_string(), "{} lacks {k}", o["kind"]);
        }
    }
    let chart_meta: Value =
        serde_saphyr::from_str(&read("deploy/helm/egress-proxies/Chart.yaml")).unwrap();
    // The Proxy CRD's CEL rules call isCIDR(), which Kubernetes has from 1.31.
    assert_eq!(chart_meta["kubeVersion"], ">=1.31.0-0");
    assert!(read("deploy/crds/proxies.egress-proxies.dev.yaml").contains("isCIDR"));
}

#[test]
fn an_empty_image_repository_fails_the_render_with_a_reason() {
    let out = Command::new(repo().join("scripts/render-chart"))
        .args(["--print", r#"{"image":{"repository":""}}"#])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image.repository is required"), "{err}");
}

#[test]
fn the_chart_values_hold_the_rendered_settings() {
    let values: Value =
        serde_saphyr::from_str(&read("deploy/helm/egress-proxies/values.yaml")).unwrap();
    let objs = manifests();
    let c = &object(&objs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["resources"], values["resources"]);
    assert_eq!(c["securityContext"], values["securityContext"]);
    assert_eq!(
        object(&objs, "Deployment")["spec"]["template"]["spec"]["securityContext"],
        values["podSecurityContext"]
    );
    assert_eq!(
        object(&objs, "ConfigMap")["data"]["providers.yaml"],
        values["providerConfig"]["providers.yaml"]
    );
    let chart_meta: Value =
        serde_saphyr::from_str(&read("deploy/helm/egress-proxies/Chart.yaml")).unwrap();
    assert_eq!(chart_meta["appVersion"], env!("CARGO_PKG_VERSION"));
    assert!(
        c["image"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", env!("CARGO_PKG_VERSION")))
    );
}

#[test]
fn the_example_provider_config_in_the_chart_passes_the_loader() {
    let objs = manifests();
    let text = object(&objs, "ConfigMap")["data"]["providers.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    match egress_core::config::parse(&text, "providers.yaml") {
        Ok(cfg) => assert_eq!(cfg.providers.len(), 1),
        Err(e) => panic!("the chart's example config is rejected:\n{e}"),
    }
}

#[test]
fn the_manifests_are_the_chart_rendered_by_helm_and_the_chart_lints_clean() {
    // Real Helm v4 (PyPI helm-python-sdk, fetched once by the script, pinned by sha256).
    let out = Command::new(repo().join("scripts/render-chart"))
        .arg("--check")
        .output()
        .unwrap();
    println!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "scripts/render-chart --check failed");
}

/// The workspace members of the root Cargo.toml (`members = [ ... ]`), as (package name, path).
fn workspace_members() -> BTreeSet<(String, String)> {
    let root = read("Cargo.toml");
    let start = root
        .find("members = [")
        .expect("root Cargo.toml has `members = [`");
    let list = &root[start..];
    let list = &list[..list.find(']').expect("members list ends")];
    let mut out = BTreeSet::new();
    for line in list.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let Some(path) = line.split('"').nth(1) else {
            continue;
        };
        let manifest = read(&format!("{path}/Cargo.toml"));
        let name = manifest
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| panic!("{path}/Cargo.toml has no package name"));
        out.insert((name, path.to_owned()));
    }
    out
}

/// The README's crate table: every row `| [`NAME`](PATH) | ... |`, as (NAME, PATH).
fn readme_crate_table() -> BTreeSet<(String, String)> {
    let readme = read("README.md");
    let mut out = BTreeSet::new();
    for line in readme.lines() {
        let Some(rest) = line.strip_prefix("| [`") else {
            continue;
        };
        let (name, rest) = rest
            .split_once("`](")
            .expect("a crate row: | [`NAME`](PATH) |");
        let (path, _) = rest
            .split_once(')')
            .expect("a crate row: | [`NAME`](PATH) |");
        let path = path.trim_end_matches('/').to_owned();
        assert!(
            out.insert((name.to_owned(), path.clone())),
            "README lists {name} ({path}) twice"
        );
    }
    out
}

#[test]
fn the_readme_crate_table_lists_exactly_the_workspace_members() {
    let members = workspace_members();
    assert!(members.len() >= 6, "too few members parsed: {members:?}");
    let table = readme_crate_table();
    let missing: Vec<_> = members.difference(&table).collect();
    let extra: Vec<_> = table.difference(&members).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README.md's crate table drifted from the workspace members (name, path):\n\
         missing from the README: {missing:?}\nlisted but not a member: {extra:?}"
    );
}
