//! `kube-fake-server` as its own process: the files it writes, the ready line, TLS that only
//! its CA verifies, bearer-token authentication, the CRD status subresource, and a clean exit
//! on SIGTERM.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest the server may take to print its ready line, and to exit on SIGTERM.
// NB: both take milliseconds (key generation is the slow part, ~10 ms); 30 s absorbs a
// loaded 2-core CI machine.
const PROCESS_DEADLINE: Duration = Duration::from_secs(30);
/// Bound on one HTTP request of the tests.
// NB: loopback requests to an in-memory store answer in milliseconds.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, token: &str) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-fake-server"))
        .arg("--dir")
        .arg(dir)
        .args(["--token", token])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(PROCESS_DEADLINE).unwrap();
    let url = line
        .trim()
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server { child, url }
}

fn client(ca: Option<&Path>) -> reqwest::Client {
    let mut b = reqwest::Client::builder().no_proxy().timeout(HTTP_TIMEOUT);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        b = b.tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()]);
    }
    b.build().unwrap()
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            start.elapsed() < PROCESS_DEADLINE,
            "no exit within {PROCESS_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_server_process_answers_only_over_tls_with_its_ca_and_the_token_and_exits_0_on_sigterm()
{
    let dir = tempfile::tempdir().unwrap();
    let mut srv = start(dir.path(), "t0ken");
    for f in [
        "ca.crt",
        "tls.crt",
        "tls.key",
        "kubeconfig",
        "serviceaccount/token",
        "serviceaccount/ca.crt",
        "serviceaccount/namespace",
    ] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("serviceaccount/token")).unwrap(),
        "t0ken"
    );
    let kubeconfig = std::fs::read_to_string(dir.path().join("kubeconfig")).unwrap();
    assert!(
        kubeconfig.contains(&format!("server: {}", srv.url)),
        "{kubeconfig}"
    );
    let ca = dir.path().join("ca.crt");
    let list = format!("{}/api/v1/namespaces/default/configmaps", srv.url);

    // Not trusted without the CA (the system roots do not know it).
    let e = client(None).get(&list).send().await.unwrap_err();
    assert!(e.is_connect(), "{e:?}");

    let c = client(Some(&ca));
    let r = c.get(&list).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (body["kind"].as_str(), body["reason"].as_str()),
        (Some("Status"), Some("Unauthorized"))
    );
    let r = c.get(&list).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c.get(&list).bearer_auth("t0ken").send().await.unwrap();
    assert_eq!(r.status(), 200);

    // A CRD declaring a status subresource gets one: a main-resource write keeps status.
    let crd = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": {"group": "example.dev", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    });
    let r = c
        .post(format!(
            "{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            srv.url
        ))
        .bearer_auth("t0ken")
        .json(&crd)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let w = serde_json::json!({"apiVersion": "example.dev/v1", "kind": "Widget",
        "metadata": {"name": "w"}, "status": {"ready": true}});
    let r = c
        .post(format!(
            "{}/apis/example.dev/v1/namespaces/default/widgets",
            srv.url
        ))
        .bearer_auth("t0ken")
        .json(&w)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: serde_json::Value = r.json().await.unwrap();
    assert!(
        created.get("status").is_none(),
        "create must drop status: {created}"
    );

    // SIGTERM: exit 0.
    let st = Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = wait_exit(&mut srv.child);
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn an_empty_token_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kube-fake-server"))
        .arg("--dir")
        .arg(dir.path())
        .args(["--token", ""])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
}
