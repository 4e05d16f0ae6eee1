//! Shared by the CLI integration tests: the binary under test and a runner that waits for it
//! with a deadline, so that a hang fails the test instead of stalling it.

#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `egress-proxies` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

/// Runs `egress-proxies ARGS` without a config path from the environment
/// (`EGRESS_PROXIES_CONFIG` removed); see [`output_within`].
pub fn run(args: &[&str], deadline: Duration) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("EGRESS_PROXIES_CONFIG");
    output_within(&mut cmd, deadline)
}

/// Runs `cmd` with stdin closed and stdout and stderr captured; panics, after killing it, if
/// it has not finished within `deadline`.
pub fn output_within(cmd: &mut Command, deadline: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
