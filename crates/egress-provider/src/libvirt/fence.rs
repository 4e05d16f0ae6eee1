//! Runs a host's fence command (`hosts[].fence`): the program that powers a dead host off so
//! that the addresses its guests held may move to another host of its segment.
//!
//! Guarantees:
//! - **success is exit status 0 within the deadline, and nothing else**: a non-zero exit, a
//!   signal, a command that cannot be started and a timeout are all failures, each with its own
//!   message (for the waiting member's condition) carrying the tail of the command's stderr;
//! - **every run has a deadline**: the command runs in its own process group, which is killed
//!   (SIGKILL) when `fence.timeout` passes; stderr is read for at most one more second after
//!   the command ended (a grandchild holding it open cannot stall the caller);
//! - no shell: the argv is executed as given; stdin and stdout are closed; at most
//!   [`STDERR_TAIL`] bytes of stderr are kept.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::config::Fence;
use crate::sync::lock;

/// Bytes of the command's stderr kept for the message (its end).
pub const STDERR_TAIL: usize = 512;
/// How long stderr is still read after the command ended.
const STDERR_GRACE: Duration = Duration::from_secs(1);

/// Runs `f` for `host`: `Ok(())` once it exited 0 within its timeout, else why not (e.g.
/// `fence command exited 1: ipmitool: connection refused`).
pub async fn run(host: &str, f: &Fence) -> Result<(), String> {
    let Some((prog, args)) = f.command.split_first() else {
        return Err("fence command is empty".to_owned());
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("EGRESS_PROXIES_FENCE_HOST", host)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("fence command {prog:?} could not be started: {e}"))?;
    let tail = Arc::new(Mutex::new(Vec::<u8>::new()));
    let reader = child.stderr.take().map(|mut err| {
        let tail = Arc::clone(&tail);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                match err.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut t = lock(&tail);
                        t.extend_from_slice(buf.get(..n).unwrap_or_default());
                        let excess = t.len().saturating_sub(STDERR_TAIL);
                        t.drain(..excess);
                    }
                }
            }
        })
    });
    let pgid = child.id();
    let waited = tokio::time::timeout(f.timeout, child.wait()).await;
    if waited.is_err() {
        // NB: the whole group, so a shell's children die too; then reap the child.
        if let Some(pid) = pgid
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = child.start_kill();
        let _ = tokio::time::timeout(STDERR_GRACE, child.wait()).await;
    }
    if let Some(r) = reader {
        let abort = r.abort_handle();
        if tokio::time::timeout(STDERR_GRACE, r).await.is_err() {
            abort.abort();
        }
    }
    let tail = stderr_text(&lock(&tail));
    let with_tail = |s: String| {
        if tail.is_empty() {
            s
        } else {
            format!("{s}: {tail}")
        }
    };
    match waited {
        Err(_) => Err(with_tail(format!(
            "fence command timed out after {} (killed)",
            secs_text(f.timeout)
        ))),
        Ok(Err(e)) => Err(format!("waiting for the fence command failed: {e}")),
        Ok(Ok(st)) if st.success() => Ok(()),
        Ok(Ok(st)) => Err(with_tail(match st.code() {
            Some(c) => format!("fence command exited {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!(
                    "fence command was killed by signal {}",
                    st.signal().unwrap_or_default()
                )
            }
        })),
    }
}

/// `30s`, or `1.5s` for a fraction.
fn secs_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

/// Stderr bytes as one line: lossy UTF-8, control characters as spaces, trimmed.
fn stderr_text(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Instant;

    fn sh(script: &str, timeout: Duration) -> Fence {
        Fence {
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            timeout,
        }
    }

    #[tokio::test]
    async fn exit_zero_fences_and_the_host_is_in_the_environment() {
        let f = sh(
            r#"test "$EGRESS_PROXIES_FENCE_HOST" = h1"#,
            Duration::from_secs(5),
        );
        assert_eq!(run("h1", &f).await, Ok(()));
        assert!(run("h2", &f).await.is_err());
    }

    #[tokio::test]
    async fn a_failure_names_the_status_and_the_end_of_stderr() {
        let f = sh(
            "echo 'lots of noise' >&2; echo 'bmc-h1: connection refused' >&2; exit 3",
            Duration::from_secs(5),
        );
        let e = run("h1", &f).await.unwrap_err();
        assert!(e.starts_with("fence command exited 3: "), "{e}");
        assert!(e.ends_with("bmc-h1: connection refused"), "{e}");
        let long = sh(
            "head -c 100000 /dev/zero | tr '\\0' x >&2; exit 1",
            Duration::from_secs(5),
        );
        let e = run("h1", &long).await.unwrap_err();
        assert!(e.len() < STDERR_TAIL + 64, "{}", e.len());
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed_at_its_deadline_with_its_children() {
        let f = sh(
            "echo 'waiting for the BMC' >&2; sleep 30 & sleep 30",
            Duration::from_secs(1),
        );
        let t = Instant::now();
        let e = run("h1", &f).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        assert!(
            e.starts_with("fence command timed out after 1s (killed)"),
            "{e}"
        );
        assert!(e.contains("waiting for the BMC"), "{e}");
    }

    #[tokio::test]
    async fn a_missing_program_is_a_failure() {
        let f = Fence {
            command: vec!["/nonexistent/fence".into()],
            timeout: Duration::from_secs(1),
        };
        let e = run("h1", &f).await.unwrap_err();
        assert!(e.contains("could not be started"), "{e}");
    }
}
