//! The conformance suite (crates/testing/kube-fake/conformance/): pytest drives
//! `kube-fake-server` with clients we did not write — the official Kubernetes Python client
//! and kubectl — and checks what the Kubernetes documentation says a real API server does.
//! This target runs it as a child process with a deadline and fails unless exactly
//! [`EXPECTED_TESTS`] tests ran and all passed (a suite that silently collects fewer tests, or
//! none, fails here too).
//!
//! Needs what `.ci/setup-host` installs: the venv with the pinned requirements
//! (`KUBE_CONFORMANCE_PYTHON`, default [`DEFAULT_PYTHON`]) and Debian's kubectl (`KUBECTL`,
//! default the unpacked `kubernetes-client`).
#![allow(clippy::expect_used, clippy::panic)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The number of tests the suite holds; change it with the suite.
const EXPECTED_TESTS: u32 = 66;
/// The venv `.ci/setup-host` creates with conformance/requirements.txt.
const DEFAULT_PYTHON: &str = "/opt/egress-proxies/kube-conformance-venv/bin/python";
/// Longest the whole suite may run.
// NB: it takes ~20 s on an idle 2-core machine (the 410 test makes ~200 writes); 5 minutes
// absorbs a CI machine busy with the rest of the workspace's tests.
const SUITE_DEADLINE: Duration = Duration::from_secs(300);

/// Counts from pytest's closing line (`1 failed, 45 passed, 2 errors in 3.2s`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Summary {
    passed: u32,
    failed: u32,
    errors: u32,
    skipped: u32,
    other: u32,
}

fn parse_summary(output: &str) -> Option<Summary> {
    let line = output
        .lines()
        .rev()
        .map(|l| l.trim().trim_matches('='))
        .find(|l| {
            l.contains(" in ")
                && (l.contains("passed")
                    || l.contains("failed")
                    || l.contains("error")
                    || l.contains("no tests ran"))
        })?;
    let counts = line.split(" in ").next()?;
    let mut s = Summary::default();
    for part in counts.split(',') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        match what {
            "passed" => s.passed = n,
            "failed" => s.failed = n,
            "error" | "errors" => s.errors = n,
            "skipped" => s.skipped = n,
            _ => s.other += n,
        }
    }
    Some(s)
}

/// Kills the process group `pgid` (the pytest child and the server it started).
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

#[test]
fn pytest_summaries_are_parsed_into_counts() {
    assert_eq!(
        parse_summary("x\n======= 1 failed, 44 passed, 2 errors in 3.21s =======\n"),
        Some(Summary {
            passed: 44,
            failed: 1,
            errors: 2,
            ..Summary::default()
        })
    );
    assert_eq!(
        parse_summary("46 passed in 18.76s"),
        Some(Summary {
            passed: 46,
            ..Summary::default()
        })
    );
    assert_eq!(parse_summary("no summary here"), None);
}

#[test]
fn the_fake_answers_the_official_python_client_and_kubectl_as_the_kubernetes_docs_say() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let python = std::env::var_os("KUBE_CONFORMANCE_PYTHON")
        .map_or_else(|| PathBuf::from(DEFAULT_PYTHON), PathBuf::from);
    assert!(
        python.exists(),
        "{} is missing: run .ci/setup-host (it creates the conformance venv)",
        python.display()
    );
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(&dir)
        .env("KUBE_FAKE_SERVER", env!("CARGO_BIN_EXE_kube-fake-server"))
        .env("REPO_ROOT", &repo)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group, so a deadline kills pytest and the server it started.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("start pytest");
    let pgid = child.id();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() > SUITE_DEADLINE => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                kill_group(pgid);
                panic!("waiting for pytest: {e}");
            }
        }
    };
    // On every path: nothing the suite started outlives it.
    kill_group(pgid);
    let _ = child.wait();
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    println!("{out}");
    eprintln!("{err}");
    let Some(status) = status else {
        panic!("the conformance suite did not finish within {SUITE_DEADLINE:?}");
    };
    let summary = parse_summary(&out)
        .unwrap_or_else(|| panic!("no pytest summary line (exit {status}); output above"));
    assert_eq!(
        (summary.failed, summary.errors),
        (0, 0),
        "conformance failures (see the pytest output above)"
    );
    assert_eq!(
        summary.passed, EXPECTED_TESTS,
        "expected {EXPECTED_TESTS} conformance tests to pass, {summary:?}"
    );
    assert_eq!(
        (summary.skipped, summary.other),
        (0, 0),
        "skipped or unexpected results: {summary:?}"
    );
    assert!(status.success(), "pytest exited with {status}");
}
