//! Benchmark of a ProxyPool in standalone mode: one pool of N members across H libvirt-fake
//! hosts (served by `bench_standalone hosts` in its own process), driven by the real
//! `egress-proxies standalone` binary.
//!
//! Per run: starts the hosts, writes a provider config and one pool manifest (`replicas: N`,
//! `update: {maxSurge: 10%, maxUnavailable: 0}`), starts the operator and measures
//! 1. **fill**: empty → N members Running and available (the pool's own count), wall time;
//! 2. **rotation**: once every member is older than a minute, `rotation.maxAge: 1m` is added
//!    to the manifest, so every member is past its age at once (a full age rotation through
//!    the update budget); wall time until no original member is left and N new ones are
//!    available. Throughout, `/pools/bench/healthy.txt` (the published, available members) is
//!    read every `--sample-ms` (100 ms): the fewest lines seen is the minimum available during rotation;
//! 3. the operator's peak RSS (`VmHWM`) and CPU time.
//!
//! `bench_pool --bin target/release/egress-proxies --hosts-bin
//! target/release/examples/bench_standalone [--hosts 10] [--replicas 1000] [--runs 1]
//! [--sample-ms 100]`.
//! Used by `scripts/bench pool`; figures in `docs/benchmarks.md`.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use egress_web::status::StatusDocument;
use ep_operator_fixtures::POOL;

const ENTRY: &str = "bench";
const NETWORK: &str = "default";
const IMAGE: &str = "tiny";
/// `timeouts.dial` of the bench entry, seconds (see `bench_standalone`).
const BENCH_DIAL_SECS: u64 = 3;
/// Default between reads of healthy.txt (`--sample-ms`).
// NB: 100 ms resolution for the fewest-available figure; each read costs the operator one
// status snapshot (milliseconds at 1,000 members).
const SAMPLE_MS: usize = 100;
/// How long one phase may take before the run fails (a hang guard, not a goal).
const PHASE_BUDGET: Duration = Duration::from_secs(600);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const PROCESS_BUDGET: Duration = Duration::from_secs(90);
/// `rotation.maxAge` set for the rotation (the shortest allowed).
const MAX_AGE: Duration = Duration::from_secs(60);

struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn arg(args: &[String], k: &str) -> Option<String> {
    args.iter()
        .position(|a| a == &format!("--{k}"))
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], k: &str, d: usize) -> Result<usize> {
    arg(args, k).map_or(Ok(d), |v| {
        v.parse().with_context(|| format!("--{k} must be a number"))
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bin = PathBuf::from(arg(&args, "bin").ok_or_else(|| anyhow!("--bin is required"))?);
    let hosts_bin =
        PathBuf::from(arg(&args, "hosts-bin").ok_or_else(|| anyhow!("--hosts-bin is required"))?);
    let hosts = num(&args, "hosts", 10)?;
    let replicas = num(&args, "replicas", 1000)?;
    let runs = num(&args, "runs", 1)?;
    let sample = Duration::from_millis(u64::try_from(num(&args, "sample-ms", SAMPLE_MS)?)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    println!(
        "== pool: {replicas} members across {hosts} fake hosts, maxSurge 10%, maxUnavailable 0 \
         ({runs} runs)"
    );
    for r in 1..=runs {
        let res = rt
            .block_on(one_run(&bin, &hosts_bin, hosts, replicas, sample))
            .with_context(|| format!("run {r}"))?;
        println!(
            "run {r}: fill {:.2} s to {replicas} Running and available; rotation {:.2} s \
             ({} members replaced), fewest available during rotation {} (floor {replicas}); \
             operator peak RSS (VmHWM) {:.1} MiB; operator CPU {:.2} s",
            res.fill.as_secs_f64(),
            res.rotation.as_secs_f64(),
            res.replaced,
            res.fewest,
            res.hwm_kib as f64 / 1024.0,
            res.cpu.as_secs_f64()
        );
        println!(
            "run {r}: goals: fill ≤ 10 s {}; never below {replicas} {}; RSS ≤ 40 MiB {}",
            if res.fill.as_secs_f64() <= 10.0 {
                "met"
            } else {
                "MISSED"
            },
            if res.fewest >= replicas {
                "met"
            } else {
                "MISSED"
            },
            if res.hwm_kib <= 40 * 1024 {
                "met"
            } else {
                "MISSED"
            },
        );
    }
    Ok(())
}

struct RunResult {
    fill: Duration,
    rotation: Duration,
    replaced: usize,
    fewest: usize,
    hwm_kib: u64,
    cpu: Duration,
}

fn manifest(replicas: usize, max_age: Option<Duration>) -> String {
    let rotation = max_age
        .map(|a| format!("  rotation:\n    maxAge: {}s\n", a.as_secs()))
        .unwrap_or_default();
    format!(
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: bench\n\
         spec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: {ENTRY}\n      \
         image: {IMAGE}\n      proxy:\n        allowedClientCidrs: [10.0.0.0/8]\n  update:\n    \
         maxSurge: 10%\n    \
         maxUnavailable: 0\n{rotation}"
    )
}

async fn one_run(
    bin: &Path,
    hosts_bin: &Path,
    hosts: usize,
    replicas: usize,
    sample: Duration,
) -> Result<RunResult> {
    let dir = tempfile::Builder::new().prefix("epbench-pool").tempdir()?;
    let sockets = dir.path().join("sockets");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&sockets)?;
    std::fs::create_dir(&manifests)?;
    let mut hosts_child = Reap(Some(
        Command::new(hosts_bin)
            .args(["hosts", "--hosts", &hosts.to_string(), "--dir"])
            .arg(&sockets)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the hosts process")?,
    ));
    let stdout = hosts_child
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .ok_or_else(|| anyhow!("no stdout of the hosts process"))?;
    let line = tokio::time::timeout(
        PROCESS_BUDGET,
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        }),
    )
    .await
    .context("the hosts process did not get ready")???;
    if line.trim() != "ready" {
        bail!("the hosts process said {line:?}");
    }
    let mut cfg = format!("providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n");
    for i in 0..hosts {
        cfg.push_str(&format!(
            "      - name: h{i}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
             network: {NETWORK}\n        virtType: qemu\n        poolReserveGiB: 1\n",
            sockets.join(format!("h{i}.sock")).display()
        ));
    }
    cfg.push_str(&format!(
        "    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        \
         sha256: {}\n        format: qcow2\n    timeouts:\n      dial: {BENCH_DIAL_SECS}\n    \
         defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
        "ab".repeat(32)
    ));
    let cfg_path = dir.path().join("providers.yaml");
    std::fs::write(&cfg_path, cfg)?;
    let pool_file = manifests.join("bench.yaml");
    std::fs::write(&pool_file, manifest(replicas, None))?;

    let listen = SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
    ));
    let log = std::fs::File::create(dir.path().join("operator.log"))?;
    let start = Instant::now();
    let operator = Command::new(bin)
        .arg("standalone")
        .arg("--config")
        .arg(&cfg_path)
        .arg("--proxies")
        .arg(&manifests)
        .args(["--listen", &listen.to_string()])
        .env_remove("EGRESS_PROXIES_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting the operator")?;
    let pid = operator.id();
    let mut operator = Reap(Some(operator));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(HTTP_TIMEOUT)
        .build()?;
    let healthy_url = format!("http://{listen}/pools/bench/healthy.txt");
    let status_url = format!("http://{listen}/status");
    let healthy = |c: reqwest::Client, u: String| async move {
        let r = c.get(&u).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        Some(r.text().await.ok()?.lines().count())
    };

    // 1. Fill.
    let fill = loop {
        if start.elapsed() > PHASE_BUDGET {
            bail!(
                "not {replicas} available within {PHASE_BUDGET:?}; see {}",
                dir.path().display()
            );
        }
        if let Some(c) = operator.0.as_mut()
            && let Some(s) = c.try_wait()?
        {
            bail!("the operator exited early: {s}");
        }
        if healthy(client.clone(), healthy_url.clone()).await == Some(replicas) {
            break start.elapsed();
        }
        tokio::time::sleep(sample).await;
    };
    let status = |c: reqwest::Client, u: String| async move {
        let b = c.get(&u).send().await?.bytes().await?;
        anyhow::Ok(serde_json::from_slice::<StatusDocument>(&b)?)
    };
    let doc = status(client.clone(), status_url.clone()).await?;
    let originals: BTreeSet<String> = doc
        .pools
        .first()
        .ok_or_else(|| anyhow!("no pool in /status"))?
        .members
        .iter()
        .map(|m| m.name.clone())
        .collect();
    if originals.len() != replicas {
        bail!("{} members after the fill", originals.len());
    }

    // 2. Rotation: every member past maxAge at once.
    let wait =
        (start + MAX_AGE + Duration::from_secs(1) + fill).saturating_duration_since(Instant::now());
    tokio::time::sleep(wait).await;
    std::fs::write(&pool_file, manifest(replicas, Some(MAX_AGE)))?;
    let t = Instant::now();
    let mut fewest = usize::MAX;
    let mut last_status = Instant::now();
    let rotation = loop {
        if t.elapsed() > PHASE_BUDGET {
            bail!("rotation not done within {PHASE_BUDGET:?}; fewest {fewest}");
        }
        if let Some(n) = healthy(client.clone(), healthy_url.clone()).await {
            fewest = fewest.min(n);
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            last_status = Instant::now();
            let d = status(client.clone(), status_url.clone()).await?;
            let p = d
                .pools
                .first()
                .ok_or_else(|| anyhow!("no pool in /status"))?;
            if p.members.len() == replicas
                && p.members
                    .iter()
                    .all(|m| !originals.contains(&m.name) && m.available && !m.deleting)
            {
                break t.elapsed();
            }
        }
        tokio::time::sleep(sample).await;
    };
    let hwm_kib = read_proc(pid, "VmHWM:")?;
    let cpu = cpu_time(pid)?;
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    if let Some(mut c) = operator.0.take() {
        let t = Instant::now();
        while c.try_wait()?.is_none() && t.elapsed() < PROCESS_BUDGET {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Some(mut c) = hosts_child.0.take() {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    Ok(RunResult {
        fill,
        rotation,
        replaced: originals.len(),
        fewest,
        hwm_kib,
        cpu,
    })
}

fn read_proc(pid: u32, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

fn cpu_time(pid: u32) -> Result<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("bad /proc/{pid}/stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..13)
        .ok_or_else(|| anyhow!("short /proc/{pid}/stat"))?
        .iter()
        .map(|x| x.parse::<u64>().unwrap_or(0))
        .sum();
    Ok(Duration::from_millis(ticks * 10))
}
