//! `egress-proxies status --watch`: refreshes every --interval until Ctrl-C, which ends it at
//! once. The server is a closed local port, so each refresh fails fast and says so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
/// Far above the 1 s interval and a refused connect; only catches a hang.
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn status_watch_refreshes_every_interval_and_ctrl_c_ends_it_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(BIN)
        .args(["status", "--watch", "--interval", "1s", "--server"])
        .arg(format!("127.0.0.1:{port}"))
        .env_remove("EGRESS_PROXIES_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Three refreshes take two intervals.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "--watch ended by itself"
    );
    assert!(
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > WAIT {
            let _ = child.kill();
            panic!("Ctrl-C did not end --watch");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let refreshes = err.matches("nothing is listening").count();
    assert!((2..=4).contains(&refreshes), "{refreshes} refreshes: {err}");
    assert_eq!(status.code(), Some(1), "the last refresh failed: {err}");
}

#[test]
fn status_watch_refuses_an_interval_under_one_second() {
    let o = Command::new(BIN)
        .args(["status", "--watch", "--interval", "100ms"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("at least 1s"));
}
