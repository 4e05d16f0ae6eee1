//! `egress-proxies standalone` and `status` as a user runs them when something is wrong: a
//! provider entry whose only host cannot be reached (a unix socket that does not exist, so
//! nothing outside this machine is contacted) and a manifest directory holding a bad file:
//! the host's failure is a WARN once and retried with backoff, the Proxy says what it waits
//! for, the bad file is a WARN once, counted in /metrics and fails `status`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cli_support::BIN;

/// Longest a one-shot CLI run may take here (a local HTTP GET); only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// How long the standalone process is watched with its host down: long enough for five
/// retries at a fixed 2 s poll, so a WARN per poll would show up five times.
const WATCH: Duration = Duration::from_secs(11);

fn run(args: &[&str]) -> Output {
    cli_support::run(args, RUN_DEADLINE)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Kills the child on every path (a failed assertion included).
struct Kill(Option<Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The body of `GET path` on 127.0.0.1:`port` (HTTP/1.0, bounded by [`RUN_DEADLINE`]).
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(RUN_DEADLINE)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out)
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_down_host_is_logged_once_its_proxy_says_what_it_waits_for_and_a_rejected_manifest_fails_status()
 {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-libvirtd.sock");
    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-down\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}\n        pool: eptest-none\n",
            socket.display()
        ),
    )
    .unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    write(
        &proxies,
        "p1.yaml",
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\nspec:\n  \
         provider: eptest-down\n  image: none\n  resources:\n    diskGiB: 4\n    memoryMiB: 256\n  \
         proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n",
    );
    // One error: a proxy open to everyone.
    write(
        &proxies,
        "bad.yaml",
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p2\nspec:\n  \
         provider: eptest-down\n  image: none\n  resources:\n    diskGiB: 4\n    memoryMiB: 256\n  \
         proxy: {}\n",
    );
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let child = Command::new(BIN)
        .args(["standalone", "--config", cfg.to_str().unwrap(), "--proxies"])
        .arg(&proxies)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        // DEBUG from the standalone driver: every failed adoption listing after the first.
        .env("RUST_LOG", "info,egress_standalone=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let pid = child.id();
    let mut guard = Kill(Some(child));

    // p1 is Pending with a condition naming the entry and why; the bad file fails `status`.
    let (doc, code) = loop {
        let o = run(&["status", "--server", &server, "--json"]);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
            let waiting = v["proxies"].as_array().unwrap().iter().any(|p| {
                p["name"] == "p1"
                    && p["conditions"].as_array().unwrap().iter().any(|c| {
                        c["reason"] == "AwaitingAdoption"
                            && c["message"].as_str().unwrap().contains("h1")
                    })
            });
            if waiting {
                break (v, o.status.code());
            }
        }
        assert!(
            started.elapsed() < RUN_DEADLINE,
            "p1 never carried a condition naming the host it waits for"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let p1 = &doc["proxies"][0];
    assert_eq!(p1["phase"], "Pending", "{doc}");
    let cond = p1["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["reason"] == "AwaitingAdoption")
        .unwrap();
    let msg = cond["message"].as_str().unwrap();
    assert!(msg.contains("eptest-down"), "names the entry: {msg}");
    assert!(msg.contains("h1"), "names the host: {msg}");
    assert!(
        !doc["manifestErrors"].as_array().unwrap().is_empty(),
        "{doc}"
    );
    assert_eq!(code, Some(1), "status exits 1 while a manifest is rejected");
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l == "egress_proxies_manifests_rejected 1"),
        "the rejected manifest is counted: {metrics}"
    );

    if let Some(rest) = WATCH.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let mut child = guard.0.take().unwrap();
    let deadline = Instant::now() + RUN_DEADLINE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("standalone did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("--- standalone stderr\n{err}");
    let warns = |what: &str| {
        err.lines()
            .filter(|l| l.contains("WARN") && l.contains(what))
            .count()
    };
    assert_eq!(
        warns("eptest-down"),
        1,
        "the down host's entry is a WARN once, not once per retry"
    );
    assert_eq!(warns("bad.yaml"), 1, "the rejected manifest is a WARN once");
    // Listings at 0, 2 and 6 s (backoff 2 s, 4 s, 8 s from the 2 s poll), not one per poll (6).
    let listings = warns("eptest-down")
        + err
            .lines()
            .filter(|l| l.contains("adoption listing failed again"))
            .count();
    assert!(
        (2..=4).contains(&listings),
        "{listings} adoption listings in {WATCH:?}: retried with backoff"
    );
    assert!(
        !err.contains("GC will not collect"),
        "a manifest is known: no empty-set warning"
    );
}

#[test]
fn standalone_on_an_empty_manifest_directory_warns_at_startup_that_gc_will_not_collect() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-empty\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no.sock\n        pool: eptest-none\n        network: default\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    for (extra, warned) in [(None, true), (Some("--gc-allow-empty"), false)] {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(["standalone", "--config", cfg.to_str().unwrap(), "--proxies"])
            .arg(&proxies)
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        if let Some(e) = extra {
            cmd.arg(e);
        }
        let child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut guard = Kill(Some(child));
        let started = Instant::now();
        // Serving means the first scan (and its warning) is behind it.
        while run(&["status", "--server", &format!("127.0.0.1:{port}"), "--json"])
            .stdout
            .is_empty()
        {
            assert!(started.elapsed() < RUN_DEADLINE, "standalone never served");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        let mut child = guard.0.take().unwrap();
        let deadline = Instant::now() + RUN_DEADLINE;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("standalone did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.contains("GC will not collect"),
            warned,
            "{extra:?}: {err}"
        );
    }
}
