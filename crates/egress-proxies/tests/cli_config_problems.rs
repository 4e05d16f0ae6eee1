//! `egress-proxies check` when the configuration, not the world, is wrong: exit 2 and a
//! message naming the field, before any host is contacted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::process::Output;
use std::time::Duration;

/// A config error is found offline, in milliseconds; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

fn run(args: &[&str]) -> Output {
    cli_support::run(args, RUN_DEADLINE)
}

#[test]
fn check_reports_a_missing_ssh_key_file_as_a_configuration_error_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let kh = dir.path().join("known_hosts");
    std::fs::write(&kh, "").unwrap();
    let cfg = dir.path().join("providers.yaml");
    // A closed port: were the host dialled, the result would be Unreachable (exit 1).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-keys\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: \"127.0.0.1:{port}\"\n        pool: eptest-none\n        \
             sshKeyFile: {}/no-such-key\n        knownHostsFile: {}\n",
            dir.path().display(),
            kh.display()
        ),
    )
    .unwrap();
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("providers[0].hosts[0].sshKeyFile") && err.contains("no-such-key"),
        "{err}"
    );
    assert!(!err.contains("Unreachable") && o.stdout.is_empty(), "{err}");
}

#[test]
fn check_json_with_the_embedded_default_config_prints_only_json_on_stdout() {
    // The embedded default: this machine's libvirtd on its unix socket (read-only check).
    let o = run(&["check", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {out}"));
    assert!(v.is_array(), "{v}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("embedded default config"),
        "the note goes to stderr"
    );
}

#[test]
fn check_of_an_unreachable_host_says_why_without_the_operators_internal_labels() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-labels\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no-libvirtd.sock\n        pool: eptest-none\n        \
             network: default\n",
            dir.path().display()
        ),
    )
    .unwrap();
    for json in [false, true] {
        let mut args = vec!["check", "--config", cfg.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let o = run(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(out.contains("no-libvirtd.sock"), "the cause: {out}");
        for internal in ["Transient", "will be redialed"] {
            assert!(!out.contains(internal), "{internal} in: {out}");
        }
    }
}

/// A config for one SSH host on a closed port whose key file is `key` (mode `mode`).
fn config_with_key(dir: &std::path::Path, mode: u32) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let kh = dir.join("known_hosts");
    std::fs::write(&kh, "").unwrap();
    let key = dir.join("id_ed25519");
    std::fs::write(&key, "not read before its mode is checked").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-keymode\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: \"127.0.0.1:{port}\"\n        pool: eptest-none\n        \
             sshKeyFile: {}\n        knownHostsFile: {}\n",
            key.display(),
            kh.display()
        ),
    )
    .unwrap();
    (cfg, key)
}

#[test]
fn check_and_startup_refuse_a_private_key_others_may_read_naming_the_file_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, key) = config_with_key(dir.path(), 0o644);
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("providers[0].hosts[0].sshKeyFile")
            && err.contains(&key.display().to_string())
            && err.contains("0644")
            && err.contains("too open"),
        "{err}"
    );
    assert!(!err.contains("Unreachable") && o.stdout.is_empty(), "{err}");
    // The operator itself refuses to start on it.
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let o = run(&[
        "standalone",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("sshKeyFile") && err.contains("0644") && err.contains("id_ed25519"),
        "{err}"
    );
    // Owner-only: check goes on to dial (the closed port: Unreachable, exit 1, not 2).
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = config_with_key(dir.path(), 0o600);
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("too open"), "{err}");
    assert_ne!(o.status.code(), Some(2), "{err}");
}
