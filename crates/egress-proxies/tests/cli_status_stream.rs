//! `/status` and `/proxies` of the real binary in standalone mode, streamed a chunk of rows at
//! a time: with 600 Proxies (three chunks) in two namespaces, each answer is well-formed JSON
//! that reads back into the status document and re-serializes to the same bytes, lists every
//! Proxy once sorted by namespace/name, `/proxies` is the document's rows, a filtered answer
//! is the document filtered, and `egress-proxies status` (table and `--json`) reads it.
//! The host's libvirt socket does not exist, so the Proxies stay Pending and nothing is
//! created.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod cli_support;

use std::io::{Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::BIN;
use egress_web::filters::Filters;
use egress_web::status::{ProxyStatusRow, StatusDocument};

/// Proxies written: more than two chunks of rows ([`egress_web::stream::CHUNK_ROWS`]).
const PROXIES: usize = 600;
const DEADLINE: Duration = Duration::from_secs(60);

/// Kills and reaps the operator when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status code and (de-chunked) body of `GET path` on 127.0.0.1:`port`.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    ep_test_support::http::response(&raw)
}

/// `egress-proxies ARGS`: its exit code and stdout, written to a file (600 rows are more than
/// a pipe holds while the process is only polled), within [`DEADLINE`].
fn cli(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = dir.join("cli.out");
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&out).unwrap())
}

fn status(port: u16, query: &str) -> (String, StatusDocument) {
    let (code, body) = get(port, &format!("/status{query}")).unwrap();
    assert_eq!(code, 200, "{body}");
    let doc = serde_json::from_str(&body).unwrap();
    (body, doc)
}

#[test]
fn status_and_proxies_stream_every_row_once_in_order_and_the_cli_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-libvirtd.sock");
    let cfg = dir.path().join("providers.yaml");
    std::fs::write(
        &cfg,
        format!(
            "providers:\n  - name: eptest-stream\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: local\n        socket: {}\n        pool: eptest-none\n",
            socket.display()
        ),
    )
    .unwrap();
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    for i in 0..PROXIES {
        // NB: names not in file order, two namespaces: the order is the operator's sorting.
        let ns = if i % 3 == 0 { "ns-b" } else { "ns-a" };
        let name = format!("p-{:05}", (i * 7919) % 100_000);
        std::fs::write(
            proxies.join(format!("{i}.yaml")),
            format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  \
                 namespace: {ns}\nspec:\n  provider: eptest-stream\n  image: none\n  resources:\n    \
                 diskGiB: 4\n    memoryMiB: 256\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
            ),
        )
        .unwrap();
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new(BIN)
        .args(["standalone", "--config", cfg.to_str().unwrap(), "--proxies"])
        .arg(&proxies)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut op = Process(child);

    // Every Proxy listed.
    let t0 = Instant::now();
    let (body, doc) = loop {
        assert!(op.0.try_wait().unwrap().is_none(), "standalone exited");
        if let Some((200, body)) = get(port, "/status")
            && let Ok(doc) = serde_json::from_str::<StatusDocument>(&body)
            && doc.proxies.len() == PROXIES
        {
            break (body, doc);
        }
        assert!(
            t0.elapsed() < DEADLINE,
            "not every Proxy in /status in time"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        serde_json::to_string(&doc).unwrap(),
        body,
        "the streamed document is what serializing it writes"
    );
    let keys: Vec<(&str, &str)> = doc
        .proxies
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "sorted by namespace/name, each once"
    );
    assert_eq!(keys.iter().filter(|k| k.0 == "ns-b").count(), PROXIES / 3);

    // /proxies, and the filtered views, against a document read just before and after (the
    // Proxies' conditions may still change: retried until two reads agree).
    let t0 = Instant::now();
    loop {
        let (_, before) = status(port, "");
        let (code, rows) = get(port, "/proxies").unwrap();
        assert_eq!(code, 200, "{rows}");
        let rows: Vec<ProxyStatusRow> = serde_json::from_str(&rows).unwrap();
        let views: Vec<(&str, StatusDocument)> = ["?phase=Pending", "?phase=Running&host=h1"]
            .into_iter()
            .map(|q| (q, status(port, q).1))
            .collect();
        let (_, after) = status(port, "");
        let same = |a: &StatusDocument, b: &StatusDocument| {
            StatusDocument {
                generated_at: String::new(),
                ..a.clone()
            } == StatusDocument {
                generated_at: String::new(),
                ..b.clone()
            }
        };
        if same(&before, &after) {
            assert_eq!(rows, before.proxies, "/proxies is the document's rows");
            for (q, view) in &views {
                let want = before.filtered(&Filters::from_query(q.strip_prefix('?')));
                assert!(same(view, &want), "{q}: {view:?}");
            }
            assert_eq!(views[0].1.proxies.len(), PROXIES, "all Pending");
            assert!(views[1].1.proxies.is_empty());
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "the document never settled");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The CLI: the table and --json.
    let server = format!("http://127.0.0.1:{port}");
    let (code, table) = cli(dir.path(), &["status", "--server", &server]);
    assert_eq!(code, Some(0), "{table}");
    for p in [&doc.proxies[0], &doc.proxies[PROXIES - 1]] {
        assert!(table.contains(&p.name), "{} missing: {table}", p.name);
    }
    let (code, json) = cli(dir.path(), &["status", "--server", &server, "--json"]);
    assert_eq!(code, Some(0));
    let json: StatusDocument = serde_json::from_str(&json).unwrap();
    assert_eq!(json.proxies.len(), PROXIES);
    drop(op);
}
