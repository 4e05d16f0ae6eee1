//! The command line both drivers share, through the real binary: `standalone` and
//! `kubernetes` take the same GC (dry run included), deadline, shutdown and health flags;
//! `--log-format json|text` for every command, never coloured off a terminal; the Lease
//! identity defaults to the hostname; in Kubernetes mode the main listener serves only the
//! probes and the status views need their own, opt-in listener; every listener answers only
//! requests addressed to an IP address, `localhost` or an `--allowed-host` name (DNS
//! rebinding). No cluster: the Kubernetes
//! API server is a closed port (the driver keeps retrying it while the listeners serve).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

/// Longest the binary may take to fail on a missing config, or to start serving.
// NB: both take milliseconds (no network: the config is read before the API server is
// contacted); 60 s only catches a hang on a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// The flags [`DriverArgs`](../src/cli/mod.rs) defines once for both drivers.
const SHARED_FLAGS: &[&str] = &[
    "--gc-interval",
    "--gc-min-age",
    "--gc-dry-run",
    "--check-interval",
    "--provisioning-deadline",
    "--shutdown-grace",
    "--health-target",
    "--health-target-ipv6",
    "--health-interval",
    "--health-concurrency",
    "--log-format",
    "--allowed-host",
];

fn help(cmd: &str) -> String {
    let o = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// Every `--flag` of a help text.
fn flags(help: &str) -> Vec<String> {
    help.split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .to_owned()
        })
        .collect()
}

#[test]
fn standalone_and_kubernetes_take_the_same_gc_deadline_shutdown_and_health_flags() {
    let (s, k) = (flags(&help("standalone")), flags(&help("kubernetes")));
    for f in SHARED_FLAGS {
        assert!(s.iter().any(|x| x == f), "standalone lacks {f}");
        assert!(k.iter().any(|x| x == f), "kubernetes lacks {f}");
    }
}

#[test]
fn a_bad_ipv6_health_target_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, kubeconfig) = fixtures(dir.path());
    let cfg = cfg.display().to_string();
    for (extra, want) in [
        (
            vec![
                "--health-target",
                "http://127.0.0.1:9/",
                "--health-target-ipv6",
                "https://[2001:db8::53]/",
            ],
            "--health-target-ipv6",
        ),
        // Without --health-target there is nothing to add an IPv6 target to.
        (
            vec!["--health-target-ipv6", "http://[2001:db8::53]/"],
            "--health-target",
        ),
    ] {
        let mut args = vec!["standalone", "--config", cfg.as_str()];
        args.extend(extra);
        let o = command(&args, &kubeconfig).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A provider config whose only host is this machine's libvirt socket (read at start, never
/// contacted by these tests) and a kubeconfig whose API server is a closed port.
fn fixtures(dir: &Path) -> (PathBuf, PathBuf) {
    let cfg = dir.join("providers.yaml");
    std::fs::write(
        &cfg,
        "providers:\n  - name: eptest-flags\n    type: libvirt\n    hosts:\n      - name: h1\n        \
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
    (cfg, kubeconfig)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `egress-proxies [args]` with a clean environment for the Kubernetes client.
fn command(args: &[&str], kubeconfig: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("EGRESS_PROXIES_LOG_FORMAT")
        .env_remove("POD_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", "eptest")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child` to exit within [`DEADLINE`] (killing it otherwise) and returns its output.
fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("egress-proxies did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    println!(
        "[exit {:?}]\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `kubernetes` with a config file that does not exist: it logs its start line, then fails.
fn kubernetes_failing(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (_, kubeconfig) = fixtures(dir.path());
    let mut args = extra.to_vec();
    args.extend([
        "kubernetes",
        "--config=/nonexistent/providers.yaml",
        "--listen=127.0.0.1:0",
    ]);
    finish(command(&args, &kubeconfig).spawn().unwrap())
}

#[test]
fn json_logs_are_one_object_per_line_with_no_colour_codes() {
    let out = kubernetes_failing(&["--log-format", "json"]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!err.contains('\u{1b}'), "ANSI escape in JSON logs:\n{err}");
    let logs: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = logs
        .iter()
        .find(|v| v["fields"]["message"] == "egress-proxies kubernetes starting")
        .unwrap_or_else(|| panic!("no JSON start line in:\n{err}"));
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["fields"]["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn text_logs_written_to_a_pipe_carry_no_colour_codes() {
    // stderr is a pipe here, as under `kubectl logs` or a service manager.
    let out = kubernetes_failing(&[]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("egress-proxies kubernetes starting"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escape in piped logs:\n{err}");
}

#[test]
fn the_lease_identity_defaults_to_the_hostname_when_pod_name_is_unset() {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let out = kubernetes_failing(&["--log-format=json"]);
    let err = String::from_utf8(out.stderr).unwrap();
    let start: serde_json::Value = err
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "egress-proxies kubernetes starting")
        .unwrap_or_else(|| panic!("no start line:\n{err}"));
    assert_eq!(start["fields"]["identity"], host.trim());
}

#[test]
fn an_unknown_log_format_is_a_usage_error() {
    let o = Command::new(BIN)
        .args(["--log-format", "xml", "version"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// `GET path` on 127.0.0.1:`port`: the status code, or `None` while nothing answers.
fn get(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn the_main_listener_serves_only_probes_and_the_status_views_only_their_own_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, kubeconfig) = fixtures(dir.path());
    let (main, status) = (free_port(), free_port());
    let child = command(
        &[
            "kubernetes",
            &format!("--config={}", cfg.display()),
            &format!("--listen=127.0.0.1:{main}"),
            &format!("--status-listen=127.0.0.1:{status}"),
        ],
        &kubeconfig,
    )
    .spawn()
    .unwrap();
    struct Kill(Option<Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            if let Some(c) = &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut guard = Kill(Some(child));
    let start = Instant::now();
    while get(main, "/healthz").is_none() || get(status, "/status").is_none() {
        assert!(start.elapsed() < DEADLINE, "the listeners did not answer");
        if let Some(c) = &mut guard.0
            && let Some(s) = c.try_wait().unwrap()
        {
            let out = finish(guard.0.take().unwrap());
            panic!("kubernetes exited early ({s}): {out:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for path in ["/metrics", "/healthz"] {
        assert_eq!(get(main, path), Some(200), "{path} on the main listener");
        assert_eq!(
            get(status, path),
            Some(404),
            "{path} on the status listener"
        );
    }
    for path in ["/status", "/proxies", "/hosts", "/healthy.txt"] {
        assert_eq!(get(main, path), Some(404), "{path} on the main listener");
        assert_eq!(
            get(status, path),
            Some(200),
            "{path} on the status listener"
        );
    }
    let pid = guard.0.as_ref().unwrap().id();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let out = finish(guard.0.take().unwrap());
    assert_eq!(out.status.code(), Some(0), "SIGTERM is a clean stop");
}

#[test]
fn kubeconfig_names_the_file_to_connect_with_over_the_environment() {
    // $KUBECONFIG is usable (the driver would start and retry); --kubeconfig names a file
    // that does not exist: that one is used, so the start fails naming it.
    let dir = tempfile::tempdir().unwrap();
    let (cfg, kubeconfig) = fixtures(dir.path());
    let out = finish(
        command(
            &[
                "kubernetes",
                &format!("--config={}", cfg.display()),
                "--listen=127.0.0.1:0",
                "--kubeconfig=/nonexistent/kubeconfig",
            ],
            &kubeconfig,
        )
        .spawn()
        .unwrap(),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("kubeconfig /nonexistent/kubeconfig"), "{err}");
}

/// `GET path` on 127.0.0.1:`port` with the `Host` header `host` (none when `None`): the
/// status code, or `None` while nothing answers.
fn get_as(port: u16, path: &str, host: Option<&str>) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (version, header) = match host {
        Some(h) => ("1.1", format!("Host: {h}\r\n")),
        None => ("1.0", String::new()),
    };
    write!(
        s,
        "GET {path} HTTP/{version}\r\n{header}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

/// Kills the child on drop (a failed assertion never leaves it running).
struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `port` answers `path` (as 127.0.0.1), failing past [`DEADLINE`] or when the
/// child exits.
fn wait_serving(child: &mut KillOnDrop, port: u16, path: &str) {
    let start = Instant::now();
    while get_as(port, path, Some("127.0.0.1")).is_none() {
        assert!(
            start.elapsed() < DEADLINE,
            "port {port} did not answer {path}"
        );
        if let Some(s) = child.0.try_wait().unwrap() {
            panic!("egress-proxies exited early ({s})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `Host` headers every listener must answer, and those it must refuse (421), with the
/// allowed name `status.example.test`.
fn assert_host_check(port: u16, path: &str) {
    for host in [
        Some(format!("127.0.0.1:{port}")),
        Some("127.0.0.1".to_owned()),
        Some(format!("localhost:{port}")),
        Some(format!("[::1]:{port}")),
        Some(format!("status.example.test:{port}")),
        Some("STATUS.example.test.".to_owned()),
        None,
    ] {
        assert_eq!(
            get_as(port, path, host.as_deref()),
            Some(200),
            "{path} as {host:?}"
        );
    }
    for host in [
        format!("rebind.example:{port}"),
        "rebind.example".to_owned(),
        format!("127.0.0.1.rebind.example:{port}"),
        format!("localhost.rebind.example:{port}"),
        "status.example.test.rebind.example".to_owned(),
    ] {
        assert_eq!(
            get_as(port, path, Some(&host)),
            Some(421),
            "{path} as {host}"
        );
    }
}

#[test]
fn every_listener_answers_only_ip_addresses_localhost_and_allowed_host_names() {
    // DNS rebinding: a page on rebind.example, its name pointed at 127.0.0.1, makes the
    // browser send `Host: rebind.example:PORT`; the binary refuses it on every listener.
    let dir = tempfile::tempdir().unwrap();
    let (cfg, kubeconfig) = fixtures(dir.path());
    let (main, status) = (free_port(), free_port());
    let mut kube = KillOnDrop(
        command(
            &[
                "kubernetes",
                &format!("--config={}", cfg.display()),
                &format!("--listen=127.0.0.1:{main}"),
                &format!("--status-listen=127.0.0.1:{status}"),
                "--allowed-host=status.example.test",
            ],
            &kubeconfig,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_serving(&mut kube, main, "/healthz");
    wait_serving(&mut kube, status, "/status");
    assert_host_check(main, "/healthz");
    assert_host_check(main, "/metrics");
    assert_host_check(status, "/status");
    drop(kube);

    // Standalone: one listener, every route (the fleet page included).
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let port = free_port();
    let mut standalone = KillOnDrop(
        command(
            &[
                "standalone",
                &format!("--config={}", cfg.display()),
                &format!("--proxies={}", proxies.display()),
                &format!("--listen=127.0.0.1:{port}"),
                "--allowed-host=status.example.test",
            ],
            &kubeconfig,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_serving(&mut standalone, port, "/healthz");
    for path in ["/", "/status", "/metrics", "/healthz"] {
        assert_host_check(port, path);
    }
    // Without --allowed-host, a name is refused even when it is the one a user set up.
    drop(standalone);
    let port = free_port();
    let mut plain = KillOnDrop(
        command(
            &[
                "standalone",
                &format!("--config={}", cfg.display()),
                &format!("--proxies={}", proxies.display()),
                &format!("--listen=127.0.0.1:{port}"),
            ],
            &kubeconfig,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_serving(&mut plain, port, "/healthz");
    assert_eq!(
        get_as(port, "/status", Some("status.example.test")),
        Some(421)
    );
    assert_eq!(get_as(port, "/status", Some("localhost")), Some(200));
}
