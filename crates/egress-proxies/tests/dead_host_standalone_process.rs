//! What a user sees of a dead, a declared-dead and a cordoned host in standalone mode, through
//! the real `egress-proxies standalone`, `egress-proxies status` and `egress-proxies hosts
//! fence` binaries on two libvirt-fake hosts (unix sockets).
//!
//! What it proves, through `egress-proxies status` and `/status`:
//! - h2 is cordoned in the config: `status` prints `host ENTRY/h2 is Ready, Cordoned`, and
//!   Proxy `a` runs on h1;
//! - h1 frozen (libvirt-fake's freeze fault: nothing answered): its line turns `Timeout`
//!   (the check's calls give up after the entry's `timeouts.check`, 3 s here); `a` keeps its phase `Running` with `Ready` False, reason
//!   `HostUnreachable`, its message naming h1, since when and h1's error (what `status`
//!   shows as its LAST ERROR);
//! - `hosts fence h1`: `status` prints the declaration under h1's line, `declared dead:
//!   REASON (Applied at …)`;
//! - h1 thawed: `a` is back to `Ready` True, reason `Running`, and the declaration line is
//!   gone (the operator removed it once h1 answered).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use standalone_support::{
    BIN, FakeHosts, Operator, free_port, json, providers_yaml, write, write_whole,
};

const ENTRY: &str = "eptest-deadhost";
const IMAGE: &str = "tiny";
const HOSTS: [&str; 2] = ["h1", "h2"];
/// Hang guard of every wait: a Running Proxy is read every 60 s, and a read of a frozen host
/// gives up after 22.5 s.
const DEADLINE: Duration = Duration::from_secs(150);

/// `egress-proxies status --server http://listen`: stdout.
fn status(listen: SocketAddr) -> String {
    let out = Command::new(BIN)
        .args(["status", "--server", &format!("http://{listen}")])
        .env_remove("EGRESS_PROXIES_SERVER")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Proxy `a` in `/status`: (phase, host, Ready reason, Ready message).
async fn proxy_a(listen: SocketAddr) -> Option<(String, String, String, String)> {
    let doc = json(listen, "/status").await;
    let p = doc["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == "a")?
        .clone();
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let ready = p["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some((
        s(&p["phase"]),
        s(&p["host"]),
        s(&ready["reason"]),
        s(&ready["message"]),
    ))
}

/// Polls `f` every 250 ms until it returns `Some`, failing after [`DEADLINE`] with `what`, the
/// last `status` output and the operator's log.
async fn until<T, F, Fut>(what: &str, op: &mut Operator, listen: SocketAddr, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        op.assert_running();
        assert!(
            start.elapsed() < DEADLINE,
            "no {what} within {DEADLINE:?}; status:\n{}\n{}",
            status(listen),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_a_dead_a_declared_dead_and_a_cordoned_host_and_a_proxy_says_its_host_is_dead()
{
    let work = tempfile::tempdir().unwrap();
    let fakes = FakeHosts::start(work.path(), ENTRY, IMAGE, &HOSTS).await;
    let cfg = work.path().join("providers.yaml");
    let hosts = fakes.host_yaml("h1", "") + &fakes.host_yaml("h2", "        maintenance: Cordon\n");
    // A host check's calls get 3 s instead of the default 10 s: a frozen h1 reads Timeout
    // 3 s into the first check after the freeze, and its error says so.
    write_whole(
        &cfg,
        &providers_yaml(ENTRY, IMAGE, &hosts, "    timeouts:\n      check: 3\n"),
    );
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(
        &dir,
        "a.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: a\n\
             spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    \
             allowedClientCidrs: [10.0.0.0/8]\n"
        ),
    );
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        "1s",
        [] as [&str; 0],
        work.path().join("operator.log"),
        40,
    );

    until("a running on h1", &mut op, listen, || async {
        let a = proxy_a(listen).await?;
        (a.0 == "Running" && a.2 == "Running").then_some(())?;
        assert_eq!(a.1, "h1", "h2 is cordoned: {a:?}");
        Some(())
    })
    .await;
    let out = status(listen);
    assert!(
        out.contains(&format!("\nhost {ENTRY}/h2 is Ready, Cordoned\n")),
        "{out}"
    );
    assert!(
        !out.contains(&format!("{ENTRY}/h1")),
        "h1 is in service: {out}"
    );
    println!("eptest: egress-proxies status:\n{out}");

    println!("eptest: freezing h1");
    fakes.fakes["h1"].faults().freeze();
    let t_freeze = Instant::now();
    // NB: keepalive declares the link dead 30 s after h1's last answer (then `Unreachable`);
    // the first check after the freeze (every 1 s here) gives up 3 s in, long before that:
    // `Timeout`, its error naming the entry's `timeouts.check`.
    let row = until("h1 Timeout in /hosts", &mut op, listen, || async {
        let doc = json(listen, "/hosts").await;
        let row = doc
            .as_array()?
            .iter()
            .find(|h| h["host"] == format!("{ENTRY}/h1") || h["host"] == "h1")?
            .clone();
        (row["state"] == "Timeout").then_some(row)
    })
    .await;
    assert!(
        row.to_string().contains("within 3s"),
        "h1's check did not give up after timeouts.check (3 s): {row}"
    );
    let out = status(listen);
    assert!(
        out.contains(&format!("host {ENTRY}/h1 is Timeout"))
            || out.contains(&format!("host {ENTRY}/h1 is Unreachable")),
        "{out}"
    );
    println!(
        "eptest: h1 dead in status {:.1} s after the freeze",
        t_freeze.elapsed().as_secs_f64()
    );

    // `a` says its host is dead, naming it (its next read of h1 fails).
    let msg = until(
        "a's Ready naming its dead host",
        &mut op,
        listen,
        || async {
            let a = proxy_a(listen).await?;
            (a.2 == "HostUnreachable").then_some(())?;
            assert_eq!((a.0.as_str(), a.1.as_str()), ("Running", "h1"), "{a:?}");
            Some(a.3)
        },
    )
    .await;
    assert!(
        msg.starts_with("host h1 Timeout since ") || msg.starts_with("host h1 Unreachable since "),
        "{msg}"
    );

    println!(
        "eptest: a says {:.1} s after the freeze: {msg}",
        t_freeze.elapsed().as_secs_f64()
    );
    let out = status(listen);
    let row = out
        .lines()
        .find(|l| l.starts_with("default/a "))
        .unwrap_or_default();
    assert!(
        row.contains(" Running ") && row.contains("host h1 "),
        "{out}"
    );

    // The administrator declares h1 dead: status shows the declaration applied.
    let fence = Command::new(BIN)
        .args([
            "hosts",
            "fence",
            "h1",
            "--reason",
            "rack 4 unplugged",
            "--config",
        ])
        .arg(&cfg)
        .arg("--proxies")
        .arg(&dir)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("USER", "ops-alice")
        .output()
        .unwrap();
    assert!(fence.status.success(), "{fence:?}");
    let out = until("the declaration in status", &mut op, listen, || async {
        let out = status(listen);
        out.contains("\n  declared dead: rack 4 unplugged (Applied at ")
            .then_some(out)
    })
    .await;
    println!("eptest: egress-proxies status:\n{out}");

    // h1 answers again: `a` is Ready again, and the declaration is gone.
    fakes.fakes["h1"].faults().thaw();
    let t_thaw = Instant::now();
    until(
        "a Ready again and no declaration",
        &mut op,
        listen,
        || async {
            let a = proxy_a(listen).await?;
            let out = status(listen);
            (a.2 == "Running" && !out.contains("declared dead")).then_some(())
        },
    )
    .await;
    println!(
        "eptest: a Ready again {:.1} s after the thaw",
        t_thaw.elapsed().as_secs_f64()
    );
    let out = status(listen);
    assert!(!out.contains(&format!("{ENTRY}/h1")), "{out}");
    println!("eptest: egress-proxies status:\n{out}");
}
