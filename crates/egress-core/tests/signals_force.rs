//! The process's stop signal ([`egress_core::background::signals`]) in a real process: this
//! test binary runs itself again as a child whose graceful shutdown never ends, and signals
//! it. The first signal cancels the token; the second ends the process at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use egress_core::background::signals::{FORCED_EXIT_CODE, shutdown_on_signals};

/// Set in the child's environment: run as the child.
const CHILD_ENV: &str = "EP_SIGNALS_FORCE_CHILD";
/// Bound on every wait here; the child reacts in milliseconds.
const WAIT: Duration = Duration::from_secs(20);

/// The child: prints `armed` once the handlers are installed, `cancelled` when the token is,
/// then "shuts down" forever.
fn child() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let token = shutdown_on_signals();
        // Let the signal task install its handlers before announcing it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        println!("armed");
        token.cancelled().await;
        println!("cancelled");
        std::future::pending::<()>().await;
    });
}

fn kill(pid: u32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn a_second_signal_ends_the_process_while_its_graceful_shutdown_still_runs() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    for (first, second) in [("-TERM", "-INT"), ("-INT", "-INT"), ("-TERM", "-TERM")] {
        let mut c = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_second_signal_ends_the_process_while_its_graceful_shutdown_still_runs",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = c.id();
        let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
        let mut wait_for = |what: &str| {
            // A reader thread would be needed for a timeout on a blocking read; the child
            // prints within milliseconds, and the watchdog below kills it after WAIT.
            for l in lines.by_ref() {
                if l.unwrap().trim_end().ends_with(what) {
                    return;
                }
            }
            panic!("the child ended before printing {what}");
        };
        let watchdog = std::thread::spawn(move || {
            std::thread::sleep(WAIT);
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        });
        wait_for("armed");
        kill(pid, first);
        wait_for("cancelled");
        // The shutdown hangs: only the second signal can end it.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            c.try_wait().unwrap().is_none(),
            "the first signal alone ended it"
        );
        let t0 = Instant::now();
        kill(pid, second);
        let status = c.wait().unwrap();
        assert!(t0.elapsed() < WAIT, "the second signal did not end it");
        assert_eq!(
            status.code(),
            Some(FORCED_EXIT_CODE),
            "{first} then {second}"
        );
        drop(watchdog);
    }
}
