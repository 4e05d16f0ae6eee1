//! `-o` on every command, through the real binary: no command ignores it. `-o wide` adds
//! columns to the two tables (`status`, `check`) and is refused by every command without one;
//! `crds` and `echo` print one document under `-o json|yaml`; `completions` and `man` take
//! no `-o`; `crds --dir` writes files and takes none either. A refusal is exit 2, names the
//! format and the command, and comes before the command does anything. The `status` server is
//! a canned status document on a loopback port (a stand-in server; the client path is the
//! binary's own); `check`'s host is a unix socket that does not exist. Nothing else is
//! contacted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use cli_support::BIN;

/// Every run here is short or refused at once; this only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

/// Runs the binary with `args`, reading its output while it runs (the CRDs are larger than a
/// pipe's buffer); kills it and fails if it has not finished within [`RUN_DEADLINE`].
fn run(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env_remove("EGRESS_PROXIES_SERVER")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(RUN_DEADLINE) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("egress-proxies {args:?} did not finish within {RUN_DEADLINE:?}");
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A provider config whose one host is a unix socket nobody serves.
fn config(dir: &Path) -> String {
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "providers:\n  - name: eptest-fmt\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}/no-libvirtd-here.sock\n        pool: eptest-none\n        \
             network: default\n    images:\n      k:\n        url: http://127.0.0.1:9/k.qcow2\n        \
             sha256: {}\n        format: qcow2\n",
            dir.display(),
            "0".repeat(64)
        ),
    )
    .unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn every_command_without_a_table_refuses_o_wide_and_pure_text_commands_refuse_every_o() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let proxies = proxies.to_str().unwrap();
    let crds_dir = dir.path().join("crds");
    std::fs::create_dir(&crds_dir).unwrap();
    let crds_dir = crds_dir.to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // (format, the command as the message names it, the arguments)
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("wide", "version", vec!["version"]),
        (
            "wide",
            "check --no-probe",
            vec!["check", "--no-probe", "--config", &cfg],
        ),
        (
            "wide",
            "images prefetch",
            vec!["images", "prefetch", "--config", &cfg, "k"],
        ),
        (
            "wide",
            "images gc",
            vec!["images", "gc", "--config", &cfg, "--dry-run"],
        ),
        (
            "wide",
            "gc",
            vec![
                "gc",
                "--config",
                &cfg,
                "--proxies",
                proxies,
                "--allow-empty",
            ],
        ),
        ("wide", "echo", vec!["echo", "--listen", &listen]),
        ("wide", "addresses", vec!["addresses", "--server", &listen]),
        ("wide", "crds", vec!["crds"]),
        (
            "wide",
            "standalone",
            vec![
                "standalone",
                "--config",
                &cfg,
                "--proxies",
                proxies,
                "--listen",
                &listen,
            ],
        ),
        (
            "wide",
            "kubernetes",
            vec![
                "kubernetes",
                "--config",
                &cfg,
                "--listen",
                &listen,
                "--lease-namespace",
                "eptest",
                "--identity",
                "eptest",
            ],
        ),
        ("json", "crds --dir", vec!["crds", "--dir", crds_dir]),
        ("yaml", "crds --dir", vec!["crds", "--dir", crds_dir]),
        ("wide", "crds --dir", vec!["crds", "--dir", crds_dir]),
        ("json", "completions", vec!["completions", "bash"]),
        ("wide", "completions", vec!["completions", "bash"]),
        ("yaml", "man", vec!["man"]),
        ("wide", "man", vec!["man"]),
    ];
    for (f, name, args) in &cases {
        let mut full = vec!["-o", f];
        full.extend(args);
        let o = run(&full);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(2), "{full:?}: {out}{err}");
        // The message: in the format asked for when it is a document, else on stderr.
        let msg = match *f {
            "json" => {
                let v: Value = serde_json::from_str(&out)
                    .unwrap_or_else(|e| panic!("{full:?}: not JSON ({e}): {out}"));
                assert_eq!(v["exitCode"], 2, "{v}");
                v["error"].as_str().unwrap().to_owned()
            }
            "yaml" => {
                let v: Value = serde_saphyr::from_str(&out)
                    .unwrap_or_else(|e| panic!("{full:?}: not YAML ({e}): {out}"));
                assert_eq!(v["exitCode"], 2, "{v}");
                v["error"].as_str().unwrap().to_owned()
            }
            _ => {
                assert!(out.is_empty(), "{full:?}: nothing on stdout: {out}");
                err.strip_prefix("error: ")
                    .unwrap_or_else(|| panic!("{full:?}: {err}"))
                    .to_owned()
            }
        };
        assert!(
            msg.starts_with(&format!("-o {f}: `egress-proxies {name}` ")),
            "{full:?}: {msg}"
        );
        let takes = if ["completions", "man", "crds --dir"].contains(name) {
            "drop -o"
        } else {
            "it takes -o text, json or yaml"
        };
        assert!(msg.contains(takes), "{full:?}: {msg}");
        // Refused before anything ran: no start, no file written, no listener.
        assert!(!err.contains("starting"), "{full:?}: {err}");
    }
    assert_eq!(
        std::fs::read_dir(crds_dir).unwrap().count(),
        0,
        "crds --dir wrote nothing"
    );
    assert!(
        std::net::TcpStream::connect(&listen).is_err(),
        "nothing listens"
    );
    // The formats they take still work.
    assert_eq!(run(&["-o", "text", "man"]).status.code(), Some(0));
    let o = run(&["crds", "--dir", crds_dir]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_dir(crds_dir).unwrap().count(), 3);
}

/// The CRDs as printed by `-o FORMAT crds`, parsed.
fn crds_document(format: &str) -> Value {
    let o = run(&["-o", format, "crds"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let parsed = if format == "json" {
        serde_json::from_str(&out).map_err(|e| e.to_string())
    } else {
        serde_saphyr::from_str(&out).map_err(|e| e.to_string())
    };
    parsed.unwrap_or_else(|e| panic!("-o {format}: not one document ({e}): {out}"))
}

#[test]
fn crds_prints_one_list_document_under_o_json_and_yaml_holding_the_committed_crds() {
    let json = crds_document("json");
    assert_eq!(json["apiVersion"], "v1", "{json}");
    assert_eq!(json["kind"], "List", "{json}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut committed: Vec<Value> = std::fs::read_dir(root.join("deploy/crds"))
        .unwrap()
        .map(|e| serde_saphyr::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()))
        .collect::<Result<_, _>>()
        .unwrap();
    let name = |v: &Value| v["metadata"]["name"].as_str().unwrap().to_owned();
    committed.sort_by_key(name);
    let mut items = json["items"].as_array().unwrap().clone();
    items.sort_by_key(name);
    assert_eq!(items.len(), 3, "{json}");
    assert_eq!(
        items, committed,
        "the same CRDs, keys as the API spells them"
    );
    assert_eq!(crds_document("yaml"), json, "YAML and JSON: one document");
    // Text is unchanged: one YAML document per CRD.
    let o = run(&["crds"]);
    assert_eq!(text(&o.stdout).matches("---\n").count(), 3);
}

#[test]
fn crds_help_names_every_kind_it_prints() {
    let kinds: Vec<String> = crds_document("json")["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["spec"]["names"]["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    for args in [vec!["crds", "--help"], vec!["help"]] {
        let help = text(&run(&args).stdout);
        let line = if args.len() == 1 {
            help.lines()
                .find(|l| l.trim_start().starts_with("crds "))
                .unwrap_or_else(|| panic!("{help}"))
                .to_owned()
        } else {
            help
        };
        for k in &kinds {
            assert!(line.contains(k.as_str()), "{args:?} names {k}: {line}");
        }
    }
}

/// A server answering every request with `body` as JSON, until the test ends.
fn canned_server(body: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            // Read the request head; the answer does not depend on it.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// A status document with one Proxy (health checked, a long error) and one pool member.
fn status_document() -> String {
    use egress_core::model::{HealthStatus, Phase};
    use egress_web::status::{PoolMemberRow, PoolStatusRow, ProxyStatusRow, StatusDocument};
    let now = humantime_now();
    let doc = StatusDocument {
        generated_at: now.clone(),
        proxies: vec![ProxyStatusRow {
            namespace: "default".into(),
            name: "p1".into(),
            uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            phase: Phase::Running,
            host: Some("h1".into()),
            ip: Some("192.0.2.1".into()),
            provider_id: Some("libvirt://home/h1/ep-home-p1".into()),
            created_at: now.clone(),
            last_error: Some(format!("{}THE-END", "x".repeat(100))),
            conditions: vec![],
            port: Some(3128),
            health: Some(HealthStatus {
                healthy: Some(true),
                latency_ms: Some(17),
                last_check: Some(now.clone()),
                consecutive_failures: 0,
                ..HealthStatus::default()
            }),
            reputation: None,
            egress_address: vec![],
        }],
        hosts: vec![],
        manifest_errors: vec![],
        pools: vec![PoolStatusRow {
            namespace: "default".into(),
            name: "web".into(),
            desired: 1,
            status: egress_core::pool::ProxyPoolStatus {
                template_hash: "abc123".into(),
                ..Default::default()
            },
            members: vec![PoolMemberRow {
                name: "web-a".into(),
                host: Some("h1".into()),
                phase: Phase::Running,
                available: true,
                template_hash: "abc123".into(),
                created_at: now,
                quarantine: None,
                deleting: false,
                egress_address: vec![],
                draining_since: None,
            }],
            error: None,
        }],
    };
    serde_json::to_string(&doc).unwrap()
}

fn humantime_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[test]
fn status_o_wide_adds_columns_and_the_whole_error_that_text_leaves_out() {
    let server = canned_server(status_document());
    let plain = run(&["status", "--server", &server]);
    let wide = run(&["-o", "wide", "status", "--server", &server]);
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));
    assert_eq!(wide.status.code(), Some(0), "{}", text(&wide.stderr));
    let (p, w) = (text(&plain.stdout), text(&wide.stdout));
    let head = |s: &str| s.lines().next().unwrap_or_default().to_owned();
    for c in ["PORT", "LATENCY", "CHECKED", "FAILURES", "PROVIDER ID"] {
        assert!(head(&w).contains(c), "wide has {c}:\n{w}");
        assert!(!head(&p).contains(c), "text has no {c}:\n{p}");
    }
    let row = w.lines().nth(1).unwrap();
    for cell in ["3128", "17ms", "libvirt://home/h1/ep-home-p1"] {
        assert!(row.contains(cell), "{cell}: {w}");
    }
    assert!(row.ends_with("THE-END"), "the whole error: {w}");
    assert!(!p.contains("THE-END"), "text truncates it: {p}");
    // The pool's members: TEMPLATE in wide only.
    let member = |s: &str| {
        s.lines()
            .find(|l| l.contains("web-a"))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(member(&w).ends_with("abc123 (current)"), "{w}");
    assert!(
        !p.contains("TEMPLATE") && !member(&p).contains("abc123"),
        "{p}"
    );
}

#[test]
fn check_o_wide_adds_the_hostname_and_the_whole_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let plain = run(&["check", "--config", &cfg]);
    let wide = run(&["-o", "wide", "check", "--config", &cfg]);
    assert_eq!(plain.status.code(), Some(1));
    assert_eq!(wide.status.code(), Some(1));
    let (p, w) = (text(&plain.stdout), text(&wide.stdout));
    let header = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("HOST "))
            .unwrap_or_else(|| panic!("{s}"))
            .to_owned()
    };
    assert!(header(&w).contains("HOSTNAME"), "{w}");
    assert!(!header(&p).contains("HOSTNAME"), "{p}");
    // The socket's path makes the error longer than the text table shows.
    let row = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("h1 "))
            .unwrap_or_else(|| panic!("{s}"))
            .to_owned()
    };
    assert!(row(&w).contains("no-libvirtd-here.sock"), "{w}");
    assert!(!row(&p).contains("no-libvirtd-here.sock"), "truncated: {p}");
}

/// Starts `egress-proxies -o FORMAT echo --listen 127.0.0.1:0`, reads its stdout until the
/// document is complete, and returns the child and what it printed.
fn echo_document(format: &str) -> (std::process::Child, String) {
    let mut child = Command::new(BIN)
        .args(["-o", format, "echo", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let json = format == "json";
    std::thread::spawn(move || {
        let mut doc = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            doc.push_str(&line);
            doc.push('\n');
            // JSON ends with the closing brace; the YAML document is one line.
            if !json || line == "}" {
                break;
            }
        }
        let _ = tx.send(doc);
    });
    let doc = rx.recv_timeout(RUN_DEADLINE).unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("-o {format} echo printed no document")
    });
    (child, doc)
}

/// GET / from the echo at `addr`: its answer (the caller's address in the body).
fn ask_echo(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

/// Sends SIGTERM to `child` and returns its exit code (it must stop within the deadline).
fn terminate(child: &mut std::process::Child) -> Option<i32> {
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if t0.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            panic!("echo did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn echo_prints_the_address_it_listens_on_as_one_document_under_o_json_and_yaml() {
    for format in ["json", "yaml"] {
        // The reader stops at the end of the document and closes the pipe, as a script does.
        let (mut child, doc) = echo_document(format);
        let v: Value = serde_saphyr::from_str(&doc)
            .unwrap_or_else(|e| panic!("-o {format}: not a document ({e}): {doc}"));
        let addr = v["listening"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(
            addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
            "{v}"
        );
        // It serves there: the caller's address comes back.
        let answer = ask_echo(addr);
        assert!(answer.contains("127.0.0.1"), "-o {format}: {answer:?}");
        assert_eq!(terminate(&mut child), Some(0));
    }
}

#[test]
fn echo_keeps_serving_when_nobody_reads_its_stdout() {
    // Its stdout is a pipe whose reader is already gone: printing the address fails (EPIPE).
    let port = free_port();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args(["-o", "yaml", "echo", "--listen", &addr])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the echo stopped: {:?}",
            child.try_wait()
        );
        assert!(t0.elapsed() < RUN_DEADLINE, "the echo never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "the echo died");
    assert!(ask_echo(&addr).contains("127.0.0.1"));
    assert_eq!(terminate(&mut child), Some(0));
}
