//! Running one test in a process of its own: for measurements the rest of a test binary would
//! disturb (open descriptors and tasks counted per process while other tests run in parallel).
//!
//! Guarantee: [`in_own_process`] passes only when the child process ran exactly the named
//! test and it passed — a filter that matches nothing (a renamed test) fails instead of
//! passing vacuously; the child is killed and the test fails when it outlives its budget.

use std::future::Future;
use std::time::Duration;

/// Environment variable naming the test a child process runs in isolation.
pub const ISOLATED_ENV: &str = "EPTEST_ISOLATED";

/// Runs `body` for the test named `test` (its full path as libtest prints it, e.g.
/// `failed_uploads_leave_nothing_behind` or `module::name`) in a child process of the current
/// test binary: in the parent, spawns the binary filtered to exactly that test and asserts it
/// ran one test and passed, within `budget`; in the child, runs `body`.
pub async fn in_own_process<F: Future<Output = ()>>(test: &str, budget: Duration, body: F) {
    match std::env::var(ISOLATED_ENV) {
        Ok(v) if v == test => return body.await,
        Ok(v) => panic!("{test} ran inside the isolated run of {v}: the filter is wrong"),
        Err(_) => drop(body),
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let child = tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ISOLATED_ENV, test)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(budget, child)
        .await
        .unwrap_or_else(|_| panic!("isolated run of {test} exceeded {budget:?}"))
        .expect("spawn the isolated test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("---- isolated process for {test} ----\n{stdout}{stderr}---- end ----");
    assert!(
        out.status.success(),
        "isolated run of {test} failed: {}",
        out.status
    );
    assert_ran_exactly(&stdout, 1, test);
}

/// Asserts that libtest's summary in `stdout` says exactly `n` tests ran and passed (a run
/// whose filter matched nothing also exits 0).
pub fn assert_ran_exactly(stdout: &str, n: usize, what: &str) {
    let summary = stdout
        .lines()
        .rfind(|l| l.starts_with("test result:"))
        .unwrap_or_else(|| panic!("{what}: no libtest summary in the child's output"));
    let passed = summary
        .split(';')
        .find_map(|part| part.trim().strip_suffix(" passed"))
        .and_then(|p| p.rsplit(' ').next())
        .and_then(|p| p.parse::<usize>().ok());
    assert_eq!(
        passed,
        Some(n),
        "{what}: the child must run exactly {n} test(s): {summary}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ran_no_test_is_a_failure() {
        let ok = "running 1 test\ntest x ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 \
                  ignored; 0 measured; 9 filtered out; finished in 0.01s\n";
        assert_ran_exactly(ok, 1, "x");
        let none = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 \
                    measured; 10 filtered out; finished in 0.00s\n";
        assert!(std::panic::catch_unwind(|| assert_ran_exactly(none, 1, "x")).is_err());
        assert!(std::panic::catch_unwind(|| assert_ran_exactly("", 1, "x")).is_err());
    }
}
