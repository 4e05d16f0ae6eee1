//! The fleet page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `.ci/setup-host`) driven over WebDriver (fantoccini) loads
//! `/` from the real `egress-proxies standalone` binary, run as its own process over three
//! libvirt-fake hosts served from this test process on unix sockets (one Ready, one Degraded
//! by its pool reserve, one Unreachable).
//!
//! - With JavaScript: the rows are there, a manifest added after the page loaded shows up as
//!   a new row and turns Running without a reload (a marker set on `window` survives), the
//!   browser console has no error (a probe error proves the console is read at all), and a
//!   screenshot is kept under `target/test-artifacts/` (the path is printed).
//! - Without JavaScript: the server-rendered rows are there and the page's script did not run.
//!
//! Every wait has a deadline; chromedriver runs in its own process group, and on every path
//! (panics included) that group and any process using this test's browser profile directory
//! are killed, then the operator.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use egress_core::model::Phase;
use egress_web::status::StatusDocument;
use ep_operator_fixtures::{GIB, POOL, dhcp_network, publish_base, run_dhcp, write_proxy_manifest};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use libvirt_fake::{FakeLibvirt, PoolSpec};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
const ENTRY: &str = "lab";
const IMAGE: &str = "tiny";
/// How long the operator may take to bring the first proxies to Running.
// NB: the fakes answer in microseconds and 1000 proxies take ~15 s in the benchmark; two take
// a few seconds; 90 s is a hang guard on a loaded 2-core machine.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(90);
/// How long chromedriver and a browser session may take to start.
// NB: Chromium starts in ~1 s here; 60 s tolerates a cold disk cache on a busy machine.
const BROWSER_DEADLINE: Duration = Duration::from_secs(60);
/// Bound on one WebDriver command (navigation included).
// NB: the page is a few KiB from loopback; 30 s only guards against a wedged browser.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);
/// How long a change may take to appear on the open page.
// NB: manifest poll (2 s) + reconcile (< 1 s) + the page's refresh interval (5 s), plus the
// provisioning poll before Running; 90 s is a hang guard.
const LIVE_DEADLINE: Duration = Duration::from_secs(90);
/// Pause between two looks at the page or at `/status`.
const POLL: Duration = Duration::from_millis(250);
/// How many times a read starts again because the live page replaced the element it read.
const STALE_RETRIES: usize = 20;
/// How long the operator and chromedriver get to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The Chromium flags this machine needs (no sandbox as root, no network beyond loopback).
const CHROMIUM_FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1440,1000",
];

fn digest() -> String {
    "ab".repeat(32)
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn target_dir() -> PathBuf {
    // BIN is target/<profile>/egress-proxies.
    Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
}

fn kill(signal: &str, target: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", target])
        .stderr(Stdio::null())
        .status();
}

/// A child process stopped on every path: SIGTERM, a grace period, then SIGKILL; with
/// `group`, the whole process group, and with `marker`, every process whose command line
/// contains it (the browser's profile directory: Chromium's helpers).
struct Guard {
    child: Option<Child>,
    group: bool,
    marker: Option<String>,
}

impl Guard {
    fn pids_with_marker(&self) -> Vec<String> {
        let Some(m) = &self.marker else {
            return Vec::new();
        };
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| {
                let pid = e.file_name().into_string().ok()?;
                pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&cmd)
                    .contains(m.as_str())
                    .then_some(pid)
            })
            .collect()
    }

    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let target = if self.group {
            format!("-{}", c.id())
        } else {
            c.id().to_string()
        };
        kill("TERM", &target);
        let start = Instant::now();
        while start.elapsed() < STOP_GRACE {
            if matches!(c.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        kill("KILL", &target);
        let _ = c.kill();
        let _ = c.wait();
        for pid in self.pids_with_marker() {
            kill("KILL", &pid);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three fake hosts and the operator binary over them.
struct Operator {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    process: Guard,
    fakes: BTreeMap<String, FakeLibvirt>,
    dhcp_stop: CancellationToken,
}

impl Operator {
    fn manifests(&self) -> PathBuf {
        self.dir.path().join("proxies")
    }

    async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ep-fleet-page")
            .tempdir()
            .unwrap();
        let sockets = dir.path().join("sockets");
        let manifests = dir.path().join("proxies");
        std::fs::create_dir(&sockets).unwrap();
        std::fs::create_dir(&manifests).unwrap();

        // h1: room and a published base; h2: a pool below its reserve (Degraded);
        // h3: no daemon at its socket (Unreachable).
        let mut fakes = BTreeMap::new();
        for (name, capacity) in [("h1", 100 * GIB), ("h2", GIB)] {
            let f = FakeLibvirt::new();
            f.add_pool(PoolSpec::new(POOL).capacity(capacity)).unwrap();
            f.add_network(dhcp_network("default")).unwrap();
            publish_base(&f, ENTRY, IMAGE, &digest());
            f.listen_unix(sockets.join(format!("{name}.sock")))
                .await
                .unwrap();
            fakes.insert(name.to_owned(), f);
        }
        let dhcp_stop = CancellationToken::new();
        tokio::spawn(run_dhcp(
            ENTRY.to_owned(),
            fakes.clone(),
            Duration::from_millis(100),
            dhcp_stop.clone(),
        ));

        // NB: h3 is in an entry of its own: an entry is adopted only from a complete listing,
        // so an unreachable host would hold back every proxy of its entry.
        let mut cfg = String::from("providers:\n");
        for (entry, hosts) in [
            (ENTRY, &[("h1", 1), ("h2", 5)][..]),
            ("edge", &[("h3", 1)][..]),
        ] {
            cfg.push_str(&format!(
                "  - name: {entry}\n    type: libvirt\n    hosts:\n"
            ));
            for (name, reserve) in hosts {
                cfg.push_str(&format!(
                    "      - name: {name}\n        address: local\n        socket: {}\n        \
                     pool: {POOL}\n        network: default\n        virtType: qemu\n        \
                     poolReserveGiB: {reserve}\n",
                    sockets.join(format!("{name}.sock")).display()
                ));
            }
            cfg.push_str(&format!(
                "    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        \
                 sha256: {}\n        format: qcow2\n    timeouts:\n      dial: 3\n    defaults:\n      \
                 diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
                digest()
            ));
        }
        let cfg_path = dir.path().join("providers.yaml");
        std::fs::write(&cfg_path, cfg).unwrap();
        for name in ["web-1", "web-2"] {
            write_proxy_manifest(&manifests, name, ENTRY, IMAGE, Some("h1"));
        }
        // A Proxy that cannot be built: its last error and reason are on the page.
        write_proxy_manifest(&manifests, "broken", ENTRY, "no-such-image", Some("h1"));

        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let log = std::fs::File::create(dir.path().join("operator.log")).unwrap();
        let child = Command::new(BIN)
            .arg("standalone")
            .arg("--config")
            .arg(&cfg_path)
            .arg("--proxies")
            .arg(&manifests)
            .args(["--listen", &addr.to_string()])
            .env_remove("EGRESS_PROXIES_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let op = Self {
            dir,
            addr,
            process: Guard {
                child: Some(child),
                group: false,
                marker: None,
            },
            fakes,
            dhcp_stop,
        };
        op.wait_status("web-1 and web-2 Running", |d| {
            ["web-1", "web-2"].iter().all(|n| {
                d.proxies
                    .iter()
                    .any(|p| p.name == *n && p.phase == Phase::Running)
            }) && d.hosts.iter().all(|h| h.state != "Unknown")
        })
        .await;
        op
    }

    async fn status(&self) -> Option<StatusDocument> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(COMMAND_DEADLINE)
            .build()
            .ok()?;
        let r = client
            .get(format!("http://{}/status", self.addr))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        serde_json::from_slice(&r.bytes().await.ok()?).ok()
    }

    async fn wait_status(&self, what: &str, ok: impl Fn(&StatusDocument) -> bool) {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < CONVERGE_DEADLINE {
            if let Some(d) = self.status().await {
                if ok(&d) {
                    return;
                }
                last = Some(d);
            }
            tokio::time::sleep(POLL).await;
        }
        let log = std::fs::read_to_string(self.dir.path().join("operator.log")).unwrap_or_default();
        panic!("not within {CONVERGE_DEADLINE:?}: {what}; last /status: {last:#?}\nlog:\n{log}");
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.process.stop();
        self.dhcp_stop.cancel();
        for f in self.fakes.values() {
            f.shutdown();
        }
    }
}

/// chromedriver (and the Chromium it starts) plus one WebDriver session.
struct Browser {
    client: Option<Client>,
    driver: Guard,
    _profile: tempfile::TempDir,
}

fn chromium_binary() -> &'static str {
    // NB: /usr/bin/chromium is Debian's wrapper script; the real binary is next to
    // chromedriver's. Either works; the real one skips the wrapper's environment probing.
    if Path::new("/usr/lib/chromium/chromium").exists() {
        "/usr/lib/chromium/chromium"
    } else {
        "/usr/bin/chromium"
    }
}

impl Browser {
    async fn start(javascript: bool) -> Self {
        assert!(
            Path::new("/usr/bin/chromedriver").exists(),
            "chromedriver is missing: run .ci/setup-host (apt-get install chromium chromium-driver)"
        );
        let profile = tempfile::Builder::new()
            .prefix("ep-fleet-chromium")
            .tempdir()
            .unwrap();
        let port = free_port();
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let driver = Guard {
            child: Some(child),
            group: true,
            marker: Some(profile.path().display().to_string()),
        };
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| (*s).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        if !javascript {
            args.push("--blink-settings=scriptEnabled=false".to_owned());
        }
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium_binary(), "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let caps = match caps {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        let client = loop {
            let mut b =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
            b.capabilities(caps.clone());
            match tokio::time::timeout(COMMAND_DEADLINE, b.connect(&url)).await {
                Ok(Ok(c)) => break c,
                Ok(Err(e)) if start.elapsed() > BROWSER_DEADLINE => {
                    panic!("no WebDriver session within {BROWSER_DEADLINE:?}: {e}")
                }
                Err(_) => panic!("starting a session took over {COMMAND_DEADLINE:?}"),
                Ok(Err(_)) => tokio::time::sleep(POLL).await,
            }
        };
        Self {
            client: Some(client),
            driver,
            _profile: profile,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    async fn goto(&self, url: &str) {
        tokio::time::timeout(COMMAND_DEADLINE, self.c().goto(url))
            .await
            .expect("navigation deadline")
            .unwrap();
    }

    async fn exec(&self, script: &str) -> Value {
        tokio::time::timeout(COMMAND_DEADLINE, self.c().execute(script, vec![]))
            .await
            .expect("script deadline")
            .unwrap()
    }

    /// The values of `attr` on every element matching `css`. The live page replaces rows while
    /// it is read: an element gone between the find and the read (a stale reference) makes the
    /// whole read start again, a bounded number of times.
    async fn attrs(&self, css: &str, attr: &str) -> Vec<String> {
        self.fresh(css, |c| async move {
            let found = tokio::time::timeout(COMMAND_DEADLINE, c.find_all(Locator::Css(css)))
                .await
                .expect("find deadline")?;
            let mut out = Vec::new();
            for e in found {
                if let Some(v) = tokio::time::timeout(COMMAND_DEADLINE, e.attr(attr))
                    .await
                    .expect("attr deadline")?
                {
                    out.push(v);
                }
            }
            Ok(out)
        })
        .await
    }

    /// The text of the first element matching `css` (read again if the page replaced it).
    async fn text(&self, css: &str) -> String {
        self.fresh(css, |c| async move {
            let e = tokio::time::timeout(COMMAND_DEADLINE, c.find(Locator::Css(css)))
                .await
                .expect("find deadline")?;
            tokio::time::timeout(COMMAND_DEADLINE, e.text())
                .await
                .expect("text deadline")
        })
        .await
    }

    /// Runs `read` until it does not hit an element the page replaced meanwhile (at most
    /// `STALE_RETRIES` times); any other error fails the test.
    async fn fresh<'a, T, F, Fut>(&'a self, css: &str, read: F) -> T
    where
        F: Fn(&'a Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, fantoccini::error::CmdError>>,
    {
        for _ in 0..STALE_RETRIES {
            match read(self.c()).await {
                Ok(v) => return v,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference =>
                {
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => panic!("reading {css}: {e}"),
            }
        }
        panic!("{css}: the page replaced the element {STALE_RETRIES} times in a row");
    }

    /// Waits until `attrs(css, attr)` contains `want`.
    async fn wait_attr(&self, css: &str, attr: &str, want: &str) {
        let start = Instant::now();
        loop {
            let got = self.attrs(css, attr).await;
            if got.iter().any(|v| v == want) {
                return;
            }
            assert!(
                start.elapsed() < LIVE_DEADLINE,
                "{css} [{attr}] never showed {want:?} within {LIVE_DEADLINE:?}; last: {got:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The browser console entries since the last call (chromedriver's log endpoint).
    async fn console(&self) -> Vec<Value> {
        let v = tokio::time::timeout(COMMAND_DEADLINE, self.c().issue_cmd(BrowserLog))
            .await
            .expect("log deadline")
            .unwrap();
        v.as_array().cloned().unwrap_or_default()
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let png = tokio::time::timeout(COMMAND_DEADLINE, self.c().screenshot())
            .await
            .expect("screenshot deadline")
            .unwrap();
        let dir = target_dir().join("test-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = tokio::time::timeout(COMMAND_DEADLINE, c.close()).await;
        }
        self.driver.stop();
    }
}

/// chromedriver's `POST /session/{id}/se/log` for the `browser` log (the console).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.to_owned()))
    }
}

fn severe(entries: &[Value]) -> Vec<&Value> {
    entries
        .iter()
        .filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_the_fleet_and_shows_a_new_proxy_without_a_reload() {
    let op = Operator::start().await;
    let browser = Browser::start(true).await;
    browser.goto(&format!("http://{}/", op.addr)).await;

    assert_eq!(
        browser
            .attrs("#hosts tbody tr[data-host]", "data-host")
            .await,
        ["h3", "h1", "h2"],
        "sorted by entry (edge, lab), then host"
    );
    assert_eq!(
        browser
            .attrs("#hosts tbody tr[data-host]", "data-state")
            .await,
        ["Unreachable", "Ready", "Degraded"]
    );
    assert_eq!(
        browser
            .attrs("#proxies tbody tr[data-proxy]", "data-proxy")
            .await,
        ["default/broken", "default/web-1", "default/web-2"]
    );
    // Nothing was refused or failed while loading (a CSP refusal of the inline style or
    // script, a missing asset, a script error all land in the console).
    let at_load = browser.console().await;
    assert!(
        severe(&at_load).is_empty(),
        "console errors at load: {at_load:#?}"
    );
    browser.wait_attr("html", "data-live", "on").await;

    // A new manifest appears on the open page and turns Running, with no reload in between.
    browser.exec("window.__fleetMarker = 42; return 1;").await;
    write_proxy_manifest(&op.manifests(), "web-3", ENTRY, IMAGE, Some("h1"));
    browser
        .wait_attr(
            "#proxies tbody tr[data-proxy]",
            "data-proxy",
            "default/web-3",
        )
        .await;
    browser
        .wait_attr("tr[data-proxy='default/web-3']", "data-phase", "Running")
        .await;
    assert_eq!(
        browser.exec("return window.__fleetMarker;").await,
        json!(42),
        "the page was reloaded"
    );
    assert_eq!(
        browser.text("#summary").await,
        "3 hosts (1 Ready) · 4 proxies (3 ready)",
        "the header's totals follow"
    );
    let live = browser.text("#live").await;
    assert!(live.starts_with("live, updated "), "{live}");

    // The console holds no error or warning (CSP refusals and script errors land there); a
    // probe error proves the console is read at all.
    browser
        .exec("console.error('fleet-page-probe'); return 1;")
        .await;
    let entries = browser.console().await;
    assert!(
        entries.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("fleet-page-probe"))),
        "the console log is not being read: {entries:?}"
    );
    let bad: Vec<&Value> = severe(&entries)
        .into_iter()
        .filter(|e| {
            !e["message"]
                .as_str()
                .is_some_and(|m| m.contains("fleet-page-probe"))
        })
        .collect();
    assert!(bad.is_empty(), "console errors: {bad:#?}");

    let shot = browser.screenshot("fleet-page.png").await;
    println!("fleet page screenshot: {}", shot.display());
    browser.close().await;
    drop(op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_fleet_with_javascript_disabled() {
    let op = Operator::start().await;
    let browser = Browser::start(false).await;
    browser.goto(&format!("http://{}/?host=h1", op.addr)).await;

    assert_eq!(
        browser
            .attrs("#hosts tbody tr[data-host]", "data-host")
            .await,
        ["h1"],
        "the filter from the query is applied on the server"
    );
    assert_eq!(
        browser
            .attrs("#proxies tbody tr[data-proxy]", "data-proxy")
            .await,
        ["default/web-1", "default/web-2"],
        "the unplaced proxy is not on h1"
    );
    assert_eq!(
        browser
            .attrs("#proxies tbody tr[data-proxy]", "data-phase")
            .await,
        ["Running", "Running"]
    );
    assert!(
        browser.attrs("html", "data-live").await.is_empty(),
        "the page's script ran: JavaScript is not off"
    );
    assert_eq!(
        browser.text("#live").await,
        "reload the page for fresh data"
    );
    let shot = browser.screenshot("fleet-page-no-js.png").await;
    println!("fleet page (JavaScript off) screenshot: {}", shot.display());
    browser.close().await;
    drop(op);
}
