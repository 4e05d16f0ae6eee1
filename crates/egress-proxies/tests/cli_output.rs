//! `-o json|yaml` (and `--json`) as a script uses them: stdout is one document with the
//! config's camelCase keys, failures included. Hosts are a unix socket that does not exist,
//! so nothing is contacted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

/// Every run here fails fast on a missing socket; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

fn run(args: &[&str]) -> Output {
    cli_support::run(args, RUN_DEADLINE)
}

fn config(dir: &Path) -> PathBuf {
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "providers:\n  - name: eptest-out\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no-libvirtd.sock\n        pool: eptest-none\n        \
             network: default\n",
            dir.display()
        ),
    )
    .unwrap();
    p
}

/// Every object key at any depth.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

fn assert_camel(v: &Value) {
    let mut ks = Vec::new();
    keys(v, &mut ks);
    assert!(!ks.is_empty(), "{v}");
    for k in ks {
        assert!(!k.contains('_'), "key {k} is not camelCase in {v}");
    }
}

#[test]
fn check_prints_one_yaml_or_json_document_with_the_configs_casing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let c = cfg.to_str().unwrap();
    let y = run(&["check", "--config", c, "-o", "yaml"]);
    assert_eq!(y.status.code(), Some(1));
    let yv: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&y.stdout))
        .unwrap_or_else(|e| panic!("not YAML ({e}): {}", String::from_utf8_lossy(&y.stdout)));
    assert_eq!(yv[0]["host"], "h1", "{yv}");
    assert!(
        yv[0].get("poolReserveGiB").is_some(),
        "the config's spelling: {yv}"
    );
    assert_camel(&yv);
    for args in [
        vec!["check", "--config", c, "-o", "json"],
        vec!["check", "--config", c, "--json"],
    ] {
        let j = run(&args);
        let jv: Value = serde_json::from_slice(&j.stdout).unwrap();
        assert_eq!(jv, yv, "{args:?}: the same document");
    }
}

#[test]
fn gc_json_uses_camel_case_keys() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--allow-empty",
        "--dry-run",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    assert_camel(&v);
}

#[test]
fn a_failure_under_o_json_is_a_json_error_document_with_the_exit_code() {
    let o = run(&[
        "check",
        "--config",
        "/nonexistent/eptest.yaml",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["exitCode"], 2, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/eptest.yaml"),
        "{v}"
    );
}

#[test]
fn a_failure_under_the_json_alias_is_a_json_error_document_too() {
    let o = run(&["check", "--config", "/nonexistent/eptest.yaml", "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["exitCode"], 2, "{v}");
}
