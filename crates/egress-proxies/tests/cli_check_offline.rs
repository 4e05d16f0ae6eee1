//! `egress-proxies check --no-probe [--proxies DIR]`: the config and the manifests validated
//! offline (the only host is a unix socket that does not exist: a probe would fail), exit 2
//! on any error with every error named by its file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// Offline work takes milliseconds; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

fn run(args: &[&str]) -> Output {
    cli_support::run(args, RUN_DEADLINE)
}

fn config(dir: &Path) -> PathBuf {
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "providers:\n  - name: eptest-off\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no-libvirtd.sock\n        pool: eptest-none\n        \
             network: default\n    images:\n      none:\n        url: https://img.example/none.qcow2\n",
            dir.display()
        ),
    )
    .unwrap();
    p
}

fn manifest(dir: &Path, file: &str, name: &str, provider: &str) {
    std::fs::write(
        dir.join(file),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\nspec:\n  \
             provider: {provider}\n  image: none\n  resources:\n    diskGiB: 4\n    memoryMiB: 256\n  \
             proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    )
    .unwrap();
}

#[test]
fn check_no_probe_accepts_a_valid_config_and_manifests_without_contacting_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    manifest(&proxies, "p1.yaml", "p1", "eptest-off");
    let c = cfg.to_str().unwrap();
    let p = proxies.to_str().unwrap();
    let o = run(&["check", "--config", c, "--no-probe", "--proxies", p]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("config OK") && out.contains("manifests OK: 1"),
        "{out}"
    );
    let o = run(&[
        "check",
        "--config",
        c,
        "--no-probe",
        "--proxies",
        p,
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"entries": 1, "hosts": 1, "proxies": 1})
    );
}

#[test]
fn check_no_probe_exits_2_naming_every_bad_manifest_and_an_unknown_provider_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    manifest(&proxies, "good.yaml", "good", "eptest-off");
    manifest(&proxies, "elsewhere.yaml", "elsewhere", "no-such-entry");
    std::fs::write(proxies.join("broken.yaml"), "kind: Proxy\nspec: [1]\n").unwrap();
    let args = [
        "check",
        "--config",
        cfg.to_str().unwrap(),
        "--no-probe",
        "--proxies",
        proxies.to_str().unwrap(),
    ];
    let o = run(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("broken.yaml"), "{err}");
    assert!(
        err.contains("elsewhere.yaml") && err.contains("no-such-entry"),
        "{err}"
    );
    assert!(!err.contains("good.yaml"), "{err}");
    let mut json = args.to_vec();
    json.extend(["-o", "json"]);
    let o = run(&json);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exitCode"], 2, "{v}");
}

/// A manifest of Proxy `name` in `namespace` with client networks `cidrs` (YAML flow list).
fn tenant_manifest(dir: &Path, name: &str, namespace: &str, cidrs: &str) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  \
             namespace: {namespace}\nspec:\n  provider: eptest-off\n  image: none\n  proxy:\n    \
             allowedClientCidrs: {cidrs}\n"
        ),
    )
    .unwrap();
}

#[test]
fn check_no_probe_refuses_tenancy_violations_with_their_field_paths() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    // The entry: for team-a only, its client networks at most one /16 together.
    let text = std::fs::read_to_string(&cfg).unwrap()
        + "    access:\n      namespaces: [team-a]\n    policy:\n      maxClientSpanV4: 16\n";
    std::fs::write(&cfg, text).unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    tenant_manifest(&proxies, "ok", "team-a", "[10.1.0.0/16]");
    tenant_manifest(&proxies, "stranger", "team-b", "[10.1.0.0/16]");
    tenant_manifest(&proxies, "mapped", "team-a", "['::/32']");
    let every: Vec<String> = (0..=255).map(|a| format!("{a}.0.0.0/8")).collect();
    tenant_manifest(
        &proxies,
        "union",
        "team-a",
        &format!("[{}]", every.join(", ")),
    );
    tenant_manifest(&proxies, "wide", "team-a", "[10.0.0.0/8]");
    let o = run(&[
        "check",
        "--config",
        cfg.to_str().unwrap(),
        "--no-probe",
        "--proxies",
        proxies.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = |file: &str| {
        err.lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("nothing about {file}:\n{err}"))
            .to_owned()
    };
    let l = line("stranger.yaml");
    assert!(
        l.contains(
            "spec.provider: provider entry \"eptest-off\" is not available to namespace \"team-b\""
        ),
        "{l}"
    );
    assert!(!l.contains("team-a"), "names no other tenant: {l}");
    for file in ["mapped.yaml", "union.yaml"] {
        let l = line(file);
        assert!(
            l.contains("spec.proxy.allowedClientCidrs: the list admits"),
            "{l}"
        );
    }
    // Within the CRD's ceiling but over this entry's cap: refused as the renderer would.
    let l = line("wide.yaml");
    assert!(
        l.contains("spec.proxy.allowedClientCidrs: the list admits 16777216 IPv4")
            && l.contains("policy.maxClientSpanV4"),
        "{l}"
    );
    assert!(!err.contains("ok.yaml"), "{err}");
}
