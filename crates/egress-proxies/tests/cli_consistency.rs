//! The same habits on every command, as a script meets them: under `-o json` a failure is one
//! JSON document on stdout whatever the command (a config that does not parse, a server that
//! does not answer), config errors name the file (never `<input>`) and exit 2, a missing SSH
//! key file is the config's problem for every command that reads one, and every command that
//! prints a result prints one document under `-o json|yaml`. Hosts are unix sockets that do
//! not exist and addresses nothing listens on, so nothing is contacted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use cli_support::BIN;

/// Every run here fails fast; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("KUBECONFIG");
    cli_support::output_within(&mut cmd, RUN_DEADLINE)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// stdout as the one JSON document it must be.
fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            text(&o.stdout),
            text(&o.stderr)
        )
    })
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn a_config_that_does_not_parse_is_a_json_error_naming_the_file_with_exit_2_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "broken-providers.yaml",
        "providers:\n  - name: e\n    type: libvirt\n    hosts: [\n",
    );
    let cfg = cfg.to_str().unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let proxies = proxies.to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let commands: [&[&str]; 7] = [
        &["check", "--config", cfg],
        &["check", "--no-probe", "--config", cfg],
        &["gc", "--config", cfg, "--proxies", proxies],
        &["images", "prefetch", "--config", cfg, "k"],
        &["images", "gc", "--config", cfg],
        &[
            "standalone",
            "--config",
            cfg,
            "--proxies",
            proxies,
            "--listen",
            &listen,
        ],
        &[
            "kubernetes",
            "--config",
            cfg,
            "--listen",
            &listen,
            "--lease-namespace",
            "eptest",
            "--identity",
            "eptest",
        ],
    ];
    for args in commands {
        let mut full = vec!["-o", "json"];
        full.extend_from_slice(args);
        let o = run(&full);
        let v = json(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {v}");
        assert_eq!(v["exitCode"], 2, "{args:?}: {v}");
        let msg = v["error"].as_str().unwrap();
        assert!(
            msg.contains("broken-providers.yaml"),
            "{args:?} names the file: {msg}"
        );
        assert!(msg.contains("4:12"), "{args:?} says where: {msg}");
        assert!(!msg.contains("<input>"), "{args:?}: {msg}");
        assert!(
            msg.matches(" --> ").count() == 1,
            "{args:?} says it once: {msg}"
        );
        // The human form names the file too.
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = text(&o.stderr);
        assert!(
            err.contains("broken-providers.yaml:4:12"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("<input>"), "{args:?}: {err}");
    }
}

#[test]
fn status_or_addresses_with_nothing_listening_is_a_json_error_document_under_o_json_and_the_json_alias()
 {
    let server = format!("127.0.0.1:{}", free_port());
    for args in [
        vec!["-o", "json", "status", "--server", &server],
        vec!["status", "--json", "--server", &server],
        vec!["-o", "json", "addresses", "--server", &server],
        vec!["addresses", "--json", "--server", &server],
    ] {
        let o = run(&args);
        let v = json(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {v}");
        assert_eq!(v["exitCode"], 1, "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("nothing is listening"),
            "{v}"
        );
    }
    let o = run(&["-o", "yaml", "status", "--server", &server]);
    let v: Value = serde_saphyr::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exitCode"], 1, "{v}");
    // Text: the message on stderr, nothing on stdout.
    let o = run(&["status", "--server", &server]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(text(&o.stderr).starts_with("error: nothing is listening"));
}

/// A config whose one SSH host names a key file that does not exist (and a known_hosts file
/// that does), at an address nobody listens on.
fn config_with_missing_key(dir: &Path) -> PathBuf {
    let kh = write(dir, "known_hosts", "");
    write(
        dir,
        "providers.yaml",
        &format!(
            "providers:\n  - name: eptest-key\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: 127.0.0.1:{}\n        sshKeyFile: {}/no-such-key\n        knownHostsFile: {}\n        \
             network: default\n    images:\n      k:\n        url: http://127.0.0.1:9/k.qcow2\n        \
             sha256: {}\n        format: qcow2\n",
            free_port(),
            dir.display(),
            kh.display(),
            "0".repeat(64)
        ),
    )
}

#[test]
fn a_missing_key_file_is_a_configuration_error_for_every_command_that_dials() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_with_missing_key(dir.path());
    let cfg = cfg.to_str().unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let proxies = proxies.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["check", "--config", cfg],
        &["gc", "--config", cfg, "--proxies", proxies, "--allow-empty"],
        &["images", "prefetch", "--config", cfg, "k"],
        &["images", "gc", "--config", cfg, "--dry-run"],
    ];
    for args in commands {
        let o = run(args);
        let err = text(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {err}{}",
            text(&o.stdout)
        );
        assert!(
            err.contains("providers[0].hosts[0].sshKeyFile") && err.contains("no-such-key"),
            "{args:?} names the field and the file: {err}"
        );
        for label in ["Permanent", "Transient", "Unreachable"] {
            assert!(!err.contains(label), "{args:?}: {err}");
        }
    }
}

#[test]
fn version_and_images_prefetch_print_one_document_under_o_json_and_yaml() {
    for f in ["json", "yaml"] {
        let o = run(&["-o", f, "version"]);
        assert_eq!(o.status.code(), Some(0));
        let v: Value = serde_saphyr::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{f}: {e}: {}", text(&o.stdout)));
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
        assert!(v["commit"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
        assert!(
            v["libvirtProgram"].as_str().unwrap().starts_with("0x"),
            "{v}"
        );
    }
    // A host that is a unix socket nobody serves: the prefetch fails there, as a document.
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: eptest-pf\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no.sock\n        pool: eptest-none\n        \
             network: default\n    images:\n      k:\n        url: http://127.0.0.1:9/k.qcow2\n        \
             sha256: {}\n        format: qcow2\n",
            dir.path().display(),
            "0".repeat(64)
        ),
    );
    let cfg = cfg.to_str().unwrap();
    for f in ["json", "yaml"] {
        let o = run(&["-o", f, "images", "prefetch", "--config", cfg, "k"]);
        let v: Value = serde_saphyr::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{f}: {e}: {}", text(&o.stdout)));
        assert_eq!(o.status.code(), Some(1), "{v}");
        assert_eq!(v["key"], "k", "{v}");
        assert_eq!(v["failed"], 1, "{v}");
        assert_eq!(v["hosts"][0]["host"], "eptest-pf/h1", "{v}");
        assert_eq!(v["hosts"][0]["ready"], false, "{v}");
        let m = v["hosts"][0]["message"].as_str().unwrap();
        assert!(!m.starts_with("Transient:"), "{m}");
    }
    // Text keeps its lines.
    let o = run(&["images", "prefetch", "--config", cfg, "k"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stdout).contains("eptest-pf/h1: FAILED: "),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn o_wide_prints_the_table_where_a_command_prints_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: eptest-wide\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no.sock\n        pool: eptest-none\n        \
             network: default\n",
            dir.path().display()
        ),
    );
    let cfg = cfg.to_str().unwrap();
    let plain = run(&["check", "--config", cfg]);
    let wide = run(&["-o", "wide", "check", "--config", cfg]);
    assert_eq!(wide.status.code(), plain.status.code());
    let (p, w) = (text(&plain.stdout), text(&wide.stdout));
    assert!(w.contains("eptest-wide") && w.contains("h1"), "{w}");
    assert_eq!(
        p.lines().next(),
        w.lines().next(),
        "the same entry line above the table (wide's extra columns: cli_output_formats.rs):\n{p}\n{w}"
    );
}

#[test]
fn gc_text_output_quotes_a_host_error_without_the_operators_internal_labels() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: eptest-gc\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no.sock\n        pool: eptest-none\n        \
             network: default\n",
            dir.path().display()
        ),
    );
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--allow-empty",
    ]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("no.sock"), "says why: {out}");
    for label in ["Transient:", "Permanent:", "redialed"] {
        assert!(!out.contains(label), "{label}: {out}");
    }
}

#[test]
fn the_release_profile_builds_a_binary_without_debug_info() {
    // The release binary was 168 MB with debug info and 24 MB stripped; building one here
    // would take minutes, so the workspace's profile is what is checked.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml"))
            .unwrap();
    let release: Vec<&str> = manifest
        .split("\n[")
        .find(|s| s.starts_with("profile.release]"))
        .expect("a [profile.release] section")
        .lines()
        .map(str::trim)
        .collect();
    assert!(release.contains(&"debug = false"), "{release:?}");
    assert!(
        release.contains(&"strip = \"debuginfo\"")
            || release.contains(&"strip = \"symbols\"")
            || release.contains(&"strip = true"),
        "{release:?}"
    );
}
