//! `egress-proxies completions SHELL` and `egress-proxies man [COMMAND]` as a user runs them:
//! generated from the parser's own definitions, so they name the real commands and flags.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

fn run(args: &[&str]) -> Output {
    // No network and no waiting in these commands: output() returns at once.
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_bash_completion_script_is_valid_bash_and_knows_every_command_and_flag() {
    let o = run(&["completions", "bash"]);
    assert_eq!(o.status.code(), Some(0));
    let script = String::from_utf8(o.stdout).unwrap();
    for word in [
        "standalone",
        "status",
        "check",
        "gc",
        "--gc-allow-empty",
        "--proxies",
    ] {
        assert!(script.contains(word), "no {word} in the script");
    }
    let mut bash = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    bash.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let r = bash.wait_with_output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn every_supported_shell_gets_a_script_and_an_unknown_one_is_a_usage_error() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = run(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("egress-proxies"),
            "{shell}"
        );
    }
    assert_eq!(run(&["completions", "tcsh"]).status.code(), Some(2));
}

#[test]
fn the_man_page_lists_every_command_and_a_commands_page_its_flags() {
    let o = run(&["man"]);
    assert_eq!(o.status.code(), Some(0));
    let page = String::from_utf8(o.stdout).unwrap();
    assert!(page.contains(".TH egress-proxies 1"), "{page}");
    for cmd in [
        "check",
        "images",
        "standalone",
        "status",
        "addresses",
        "gc",
        "kubernetes",
        "completions",
    ] {
        assert!(page.contains(cmd), "{cmd} missing from the page");
    }
    let o = run(&["man", "standalone"]);
    assert_eq!(o.status.code(), Some(0));
    let page = String::from_utf8(o.stdout).unwrap();
    assert!(page.contains(".TH egress-proxies-standalone 1"), "{page}");
    assert!(page.contains("\\-\\-proxies"), "{page}");
    let o = run(&["man", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no command \"nope\""));
}
