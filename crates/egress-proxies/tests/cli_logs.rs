//! Log lines as collectors and people see them: `--log-format json` is one JSON object per
//! line, `text` has no ANSI colour in a pipe or a file and is coloured only on a terminal
//! (run under `script`, which gives the binary a pseudo-terminal). The run is `standalone`
//! with a config that does not parse: it logs its start at INFO, then stops (exit 2), so no
//! host is contacted and nothing has to be stopped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use cli_support::BIN;

/// The run stops at its config; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
const ESC: char = '\u{1b}';

fn run(mut cmd: Command) -> Output {
    cmd.env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("EGRESS_PROXIES_LOG_FORMAT")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR");
    cli_support::output_within(&mut cmd, RUN_DEADLINE)
}

/// `standalone`'s arguments against a broken config in `dir`.
fn standalone_args(dir: &Path, format: &str) -> Vec<String> {
    let cfg = dir.join("providers.yaml");
    std::fs::write(&cfg, "providers: [\n").unwrap();
    let proxies = dir.join("proxies");
    let _ = std::fs::create_dir(&proxies);
    [
        "--log-format",
        format,
        "standalone",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

#[test]
fn json_logs_are_one_object_per_line_and_never_coloured() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(standalone_args(dir.path(), "json"));
    let o = run(cmd);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains(ESC), "{err:?}");
    let mut logs = 0;
    // The command's own failure (`error: ...`, several lines) is its result, printed last,
    // not a log line.
    for line in err
        .lines()
        .take_while(|l| !l.starts_with("error:"))
        .filter(|l| !l.is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line:?}"));
        assert!(v["timestamp"].is_string(), "{v}");
        assert!(v["level"].is_string(), "{v}");
        if v["fields"]["message"] == "egress-proxies standalone starting" {
            assert_eq!(v["level"], "INFO", "{v}");
            assert_eq!(v["fields"]["listen"], "127.0.0.1:0", "{v}");
        }
        logs += 1;
    }
    assert!(logs >= 1, "no log line at all: {err}");
}

#[test]
fn text_logs_are_plain_in_a_pipe_and_coloured_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let args = standalone_args(dir.path(), "text");
    let mut cmd = Command::new(BIN);
    cmd.args(&args);
    let o = run(cmd);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains(ESC), "colour in a pipe: {err:?}");

    // The same run on a pseudo-terminal (`script` copies the terminal's output to its stdout).
    let line = std::iter::once(BIN.to_owned())
        .chain(args)
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("TERM", "xterm");
    let o = run(cmd);
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(tty.contains("standalone starting"), "{tty:?}");
    assert!(tty.contains(ESC), "no colour on a terminal: {tty:?}");

    // JSON stays uncoloured on a terminal too.
    let line = line.replace("'text'", "'json'");
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("TERM", "xterm");
    let o = run(cmd);
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(tty.contains("standalone starting"), "{tty:?}");
    assert!(!tty.contains(ESC), "{tty:?}");
}
