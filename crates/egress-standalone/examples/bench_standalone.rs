//! Benchmark of standalone mode (issue 4): N Proxies across H libvirt-fake hosts, from empty
//! to Running, measured on the real `egress-proxies standalone` binary in its own process.
//!
//! Two modes of one program:
//! - `bench_standalone hosts --dir DIR --hosts H`: serves H `FakeLibvirt` daemons on the unix
//!   sockets `DIR/h0.sock`..., each with the pool, the network and a published base (base +
//!   marker of equal capacity: the image cache's publish protocol, seeded by
//!   `ep_operator_fixtures::publish_base`, so no image is downloaded), plus the fixtures'
//!   "DHCP" task (`ep_operator_fixtures::run_dhcp`) that gives every running domain an
//!   address on the NIC with its derived MAC. Prints `ready` on stdout once every socket listens;
//!   exits when its stdin closes. With `--proxy-port P` (health ON) its own "DHCP" gives each
//!   running domain a distinct address `10.{host index + 1}.X.Y` and serves an in-process HTTP
//!   CONNECT proxy (`ep_operator_fixtures::health_proxies`) on that address and port P, so the
//!   operator's health probes of `ip:P` reach a real proxy. (Loopback guest addresses are
//!   skipped by the provider, so 10.0.0.0/8 is made local instead: this mode must run inside a
//!   fresh network namespace with `ip route add local 10.0.0.0/8 dev lo table local`, as
//!   `HEALTH=1 scripts/bench operator` does; no traffic leaves that namespace.)
//! - `bench_standalone run --bin target/release/egress-proxies`: per run, starts the hosts
//!   process above (fresh, empty daemons), writes a provider config with H hosts
//!   `address: local` + `socket: DIR/hI.sock` and N manifests, starts the operator, polls
//!   `/metrics` until N proxies are Running, checks `/status` agrees (N rows Running, each with
//!   an IP), reads the operator's peak RSS (`VmHWM` of `/proc/PID/status`) and CPU time, then
//!   stops it with SIGTERM. The operator's RSS is its own: the fakes live in the other process.
//!   With `--health-interval SECS` (health ON) it also starts `egress-proxies echo` on
//!   127.0.0.1, starts the hosts with `--proxy-port 3128` (the Proxy spec's default port) and the
//!   operator with `--health-target http://ECHO/ --health-interval SECSs`, waits until `/status`
//!   shows every proxy Running and healthy, reads the peak RSS there, then samples `VmRSS` every
//!   second for `--steady-secs` (default 60) and reports its min/max/last and the Healthy count
//!   at the end. Everything listens and connects inside the bench's network namespace.
//!
//! Used by `scripts/bench operator`; figures in `docs/benchmarks.md`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use egress_core::model::Phase;
use egress_provider::libvirt::names;
use egress_web::status::StatusDocument;
use ep_operator_fixtures::health_proxies::{ProxyBehaviour, TestProxy, serve};
use ep_operator_fixtures::{POOL, publish_base, run_dhcp};
use libvirt_fake::{FakeLibvirt, Interface, NetworkSpec, PoolSpec, domain_state};
use tokio_util::sync::CancellationToken;

const ENTRY: &str = "bench";
const NETWORK: &str = "default";
const IMAGE: &str = "tiny";
const GIB: u64 = 1 << 30;
/// `timeouts.dial` of the bench entry, seconds.
// NB: the host check's round timeout (60 s) must cover its worst case, 2 waves of 8 hosts for
// 10 hosts, each wave up to 3 × dial + 20 s of probes: the default dial (10 s) gives 100 s,
// so every host would be reported Degraded and get no placements. 3 s gives 58 s; a unix
// socket connects in microseconds.
const BENCH_DIAL_SECS: u64 = 3;
/// Capacity of each fake pool.
// NB: 100 overlays of 4 GiB per host plus the reserve and the base; 16 TiB never limits.
const POOL_CAPACITY: u64 = 16 * 1024 * GIB;
/// How often the DHCP task looks for running domains without an address.
// NB: a real guest reports its address ~40 s after start; 100 ms makes the fake's share of
// the measured time negligible without spinning one of the 2 cores on scans.
const DHCP_INTERVAL: Duration = Duration::from_millis(100);
/// How often the driver polls `/metrics` for the Running count.
// NB: 100 ms resolution on a figure whose goal is 6 s or more; a /metrics scrape costs the operator
// a few hundred microseconds.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Default for how long one run may take before it is reported failed (`--budget-secs`; a
/// hang guard, not a goal).
const RUN_BUDGET: Duration = Duration::from_secs(600);
/// Lines of the operator's log shown when a run fails.
const LOG_TAIL_LINES: usize = 40;
/// Longest the hosts process may take to print `ready`, and the operator to stop on SIGTERM.
// NB: both take milliseconds; the operator's default shutdown grace is 60 s.
const PROCESS_BUDGET: Duration = Duration::from_secs(90);
/// Bound on one HTTP request of the driver.
// NB: /status of 1000 proxies is ~1 MB of JSON, built in milliseconds.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The port of every fake guest's proxy with health ON: the Proxy spec's default.
const PROXY_PORT: u16 = egress_core::model::DEFAULT_PROXY_PORT;
/// How often the steady-state `VmRSS` is sampled.
// NB: 1 s gives 60+ samples over the window and several per 5 s health round.
const RSS_SAMPLE: Duration = Duration::from_secs(1);

fn digest() -> String {
    "ab".repeat(32)
}

/// A tiny argument reader: `--flag value` pairs after the mode (no clap needed here).
struct Args(BTreeMap<String, String>);

impl Args {
    fn parse(rest: &[String]) -> Result<Self> {
        let mut m = BTreeMap::new();
        let mut it = rest.iter();
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .ok_or_else(|| anyhow!("unexpected argument {k}"))?;
            let v = it.next().ok_or_else(|| anyhow!("--{key} needs a value"))?;
            m.insert(key.to_owned(), v.clone());
        }
        Ok(Self(m))
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    fn num(&self, k: &str, default: usize) -> Result<usize> {
        self.get(k)
            .map_or(Ok(default), str::parse)
            .with_context(|| format!("--{k} must be a number"))
    }
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (mode, rest) = argv
        .split_first()
        .ok_or_else(|| anyhow!("usage: bench_standalone hosts|run [--flag value]..."))?;
    let args = Args::parse(rest)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match mode.as_str() {
        "hosts" => {
            let dir = PathBuf::from(
                args.get("dir")
                    .ok_or_else(|| anyhow!("--dir is required"))?,
            );
            let port = args
                .get("proxy-port")
                .map(str::parse::<u16>)
                .transpose()
                .context("--proxy-port must be a port")?;
            rt.block_on(serve_hosts(&dir, args.num("hosts", 10)?, port))
        }
        "run" => rt.block_on(run_bench(&args)),
        other => bail!("unknown mode {other}; use hosts or run"),
    }
}

// ---- the hosts process ---------------------------------------------------------------------

async fn serve_hosts(dir: &Path, hosts: usize, proxy_port: Option<u16>) -> Result<()> {
    let mut fakes = BTreeMap::new();
    for i in 0..hosts {
        let f = FakeLibvirt::new();
        f.add_pool(PoolSpec::new(POOL).capacity(POOL_CAPACITY))?;
        // The network's subnet must hold the guests' addresses (10.H.X.Y): the provider uses
        // only an address inside the host's network.
        f.add_network(NetworkSpec::new(NETWORK).xml(format!(
            "<network>\n  <name>{NETWORK}</name>\n  <forward mode='nat'/>\n  \
             <bridge name='virbr0'/>\n  <ip address='10.0.0.1' prefix='8'/>\n</network>\n"
        )))?;
        publish_base(&f, ENTRY, IMAGE, &digest());
        f.listen_unix(dir.join(format!("h{i}.sock"))).await?;
        fakes.insert(format!("h{i}"), f);
    }
    let stop = CancellationToken::new();
    let dhcp = match proxy_port {
        None => tokio::spawn(run_dhcp(
            ENTRY.to_owned(),
            fakes.clone(),
            DHCP_INTERVAL,
            stop.clone(),
        )),
        Some(port) => tokio::spawn(run_loopback_dhcp(fakes.clone(), port, stop.clone())),
    };
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    // Until the driver closes our stdin (or dies).
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut sink)
    })
    .await;
    stop.cancel();
    let _ = dhcp.await;
    for f in fakes.values() {
        f.shutdown();
    }
    Ok(())
}

/// The "DHCP" of health-ON runs, until `stop`: every [`DHCP_INTERVAL`] each running domain
/// without an address gets `10.{host index + 1}.X.Y` (local only inside the bench's network
/// namespace) (X.Y from a counter from 0.2, distinct
/// for the first 62,500 domains of a host) with an HTTP CONNECT proxy listening on it at
/// `port`; a domain that stops loses its proxy and gets a new address when it runs again.
async fn run_loopback_dhcp(
    fakes: BTreeMap<String, FakeLibvirt>,
    port: u16,
    stop: CancellationToken,
) {
    let mut given: BTreeMap<(String, String), TestProxy> = BTreeMap::new();
    let mut next: u32 = 0;
    while !stop.is_cancelled() {
        for (i, (h, f)) in fakes.iter().enumerate() {
            let Ok(a) = u8::try_from(i + 1) else { continue };
            for d in f.domains() {
                if d.state != domain_state::RUNNING
                    || given.contains_key(&(h.clone(), d.name.clone()))
                {
                    continue;
                }
                let Some(u) = names::uid_of_domain(ENTRY, &d.name) else {
                    continue;
                };
                let (Ok(b), Ok(c)) = (
                    u8::try_from((next / 250) % 250),
                    u8::try_from(next % 250 + 2),
                ) else {
                    continue;
                };
                next = next.wrapping_add(1);
                let ip = Ipv4Addr::new(10, a, b, c);
                let listener = match tokio::net::TcpListener::bind((ip, port)).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("hosts: cannot listen on {ip}:{port}: {e}");
                        continue;
                    }
                };
                let proxy = serve(listener, ProxyBehaviour::default(), false);
                let iface = Interface::new("eth0", names::mac(ENTRY, &u)).addr(ip.to_string(), 16);
                if f.set_interfaces(&d.name, vec![iface]).is_ok() {
                    given.insert((h.clone(), d.name.clone()), proxy);
                }
            }
        }
        given.retain(|(h, n), _| {
            fakes
                .get(h)
                .and_then(|f| f.domain(n))
                .is_some_and(|d| d.state == domain_state::RUNNING)
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(DHCP_INTERVAL) => {}
        }
    }
}

// ---- the driver ----------------------------------------------------------------------------

/// One run's figures.
struct RunResult {
    wall: Duration,
    hwm_kib: u64,
    cpu: Duration,
    shutdown: Duration,
    /// With health ON.
    health: Option<HealthFigures>,
}

/// Health ON: how the run is set up.
#[derive(Clone, Copy)]
struct HealthRun {
    /// `--health-interval` of the operator, seconds.
    interval_secs: u64,
    /// How long the steady-state RSS is sampled after all are Healthy.
    steady: Duration,
}

/// Health ON: one run's extra figures.
struct HealthFigures {
    /// From operator start to every proxy Running and healthy in `/status`.
    to_healthy: Duration,
    /// Healthy rows in `/status` when all were first seen healthy, and at the end.
    healthy_first: usize,
    healthy_end: usize,
    /// `VmRSS` over the steady window, KiB.
    rss_min: u64,
    rss_max: u64,
    rss_last: u64,
    samples: usize,
    /// `VmHWM` at the end of the steady window, KiB.
    hwm_end: u64,
}

async fn run_bench(args: &Args) -> Result<()> {
    let bin = PathBuf::from(
        args.get("bin")
            .ok_or_else(|| anyhow!("--bin PATH (the egress-proxies binary) is required"))?,
    );
    let hosts = args.num("hosts", 10)?;
    let proxies = args.num("proxies", 1000)?;
    let runs = args.num("runs", 3)?;
    let budget = Duration::from_secs(u64::try_from(
        args.num("budget-secs", usize::try_from(RUN_BUDGET.as_secs())?)?,
    )?);
    let workers = args.get("workers").map(str::to_owned);
    let max_concurrent = args.get("max-concurrent").map(str::to_owned);
    let health = match args.get("health-interval") {
        None => None,
        Some(v) => Some(HealthRun {
            interval_secs: v
                .parse()
                .context("--health-interval must be whole seconds")?,
            steady: Duration::from_secs(u64::try_from(args.num("steady-secs", 60)?)?),
        }),
    };
    if let Some(h) = health {
        println!(
            "== health ON: probes every {} s through a CONNECT proxy per guest (10.H.X.Y, local in the bench network namespace) to an \
             `egress-proxies echo` on 127.0.0.1; steady-state RSS sampled every {} s for {} s",
            h.interval_secs,
            RSS_SAMPLE.as_secs(),
            h.steady.as_secs()
        );
    }
    println!(
        "== standalone: {proxies} Proxies across {hosts} fake hosts, empty to Running ({runs} runs; \
         workers {}, maxConcurrent {})",
        workers.as_deref().unwrap_or("default"),
        max_concurrent.as_deref().unwrap_or("default")
    );
    let mut results = Vec::new();
    for r in 1..=runs {
        let res = one_run(
            &bin,
            hosts,
            proxies,
            workers.as_deref(),
            max_concurrent.as_deref(),
            budget,
            health,
        )
        .await
        .with_context(|| format!("run {r}"))?;
        println!(
            "run {r}: {:.2} s to {proxies} Running; operator peak RSS (VmHWM) {:.1} MiB; \
             operator CPU {:.2} s; SIGTERM to exit {:.2} s",
            res.wall.as_secs_f64(),
            mib(res.hwm_kib),
            res.cpu.as_secs_f64(),
            res.shutdown.as_secs_f64()
        );
        if let Some(h) = &res.health {
            println!(
                "run {r}: health ON: {:.2} s to {}/{proxies} Running and Healthy; peak RSS (VmHWM) \
                 there {:.1} MiB; steady VmRSS over {} samples: min {:.1} MiB, max {:.1} MiB, \
                 last {:.1} MiB; VmHWM at the end {:.1} MiB; Healthy at the end {}/{proxies}",
                h.to_healthy.as_secs_f64(),
                h.healthy_first,
                mib(res.hwm_kib),
                h.samples,
                mib(h.rss_min),
                mib(h.rss_max),
                mib(h.rss_last),
                mib(h.hwm_end),
                h.healthy_end
            );
        }
        results.push(res);
    }
    let range = |f: &dyn Fn(&RunResult) -> f64| {
        let v: Vec<f64> = results.iter().map(f).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    println!(
        "{}",
        summary(
            proxies,
            hosts,
            range(&|r| r.wall.as_secs_f64()),
            range(&|r| mib(r.hwm_kib)),
            range(&|r| r.cpu.as_secs_f64()),
        )
    );
    Ok(())
}

/// The goals of one size of the standalone benchmark, as `docs/benchmarks.md` sets them.
#[derive(Debug, Clone, Copy)]
struct Goals {
    /// Proxies.
    proxies: usize,
    /// Hosts.
    hosts: usize,
    /// Seconds to all Running.
    wall_s: f64,
    /// The operator's peak RSS, MiB.
    rss_mib: f64,
    /// The operator's CPU until all Running, seconds (where one is set).
    cpu_s: Option<f64>,
}

/// Every size with goals (`docs/benchmarks.md`, "Scaling"); other sizes have none.
const GOALS: [Goals; 2] = [
    Goals {
        proxies: 1000,
        hosts: 10,
        wall_s: 6.0,
        rss_mib: 26.0,
        cpu_s: None,
    },
    Goals {
        proxies: 10_000,
        hosts: 100,
        wall_s: 30.0,
        rss_mib: 100.0,
        cpu_s: Some(15.0),
    },
];

/// The last line of a size's runs: each figure's range, with this size's own goal beside it
/// (how far the worst run is from it), or the sizes that have goals when this one has none.
fn summary(
    proxies: usize,
    hosts: usize,
    (wl, wh): (f64, f64),
    (ml, mh): (f64, f64),
    (cl, ch): (f64, f64),
) -> String {
    let Some(g) = GOALS
        .iter()
        .find(|g| g.proxies == proxies && g.hosts == hosts)
    else {
        let sized: Vec<String> = GOALS
            .iter()
            .map(|g| format!("{}/{}", g.proxies, g.hosts))
            .collect();
        return format!(
            "wall {wl:.2}–{wh:.2} s; peak RSS {ml:.1}–{mh:.1} MiB; operator CPU {cl:.2}–{ch:.2} s \
             (no goal set for {proxies}/{hosts}; sizes with goals: {})",
            sized.join(", ")
        );
    };
    let cpu_goal = g.cpu_s.map_or_else(String::new, |c| {
        format!(" (goal ≤ {c} s: {:.2}× at worst)", ch / c)
    });
    format!(
        "wall {wl:.2}–{wh:.2} s (goal ≤ {} s for {proxies}/{hosts}: {:.2}× at worst); peak RSS \
         {ml:.1}–{mh:.1} MiB (goal ≤ {} MiB: {:.2}× at worst); operator CPU {cl:.2}–{ch:.2} s{cpu_goal}",
        g.wall_s,
        wh / g.wall_s,
        g.rss_mib,
        mh / g.rss_mib,
    )
}

fn mib(kib: u64) -> f64 {
    // NB: RSS figures are far below 2^52 KiB, so the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    let k = kib as f64;
    k / 1024.0
}

/// Kills (SIGKILL) and reaps a child on every path; the normal path takes it out first.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

async fn one_run(
    bin: &Path,
    hosts: usize,
    proxies: usize,
    workers: Option<&str>,
    max_concurrent: Option<&str>,
    budget: Duration,
    health: Option<HealthRun>,
) -> Result<RunResult> {
    let dir = tempfile::Builder::new().prefix("epbench-op").tempdir()?;
    let sockets = dir.path().join("sockets");
    let manifests = dir.path().join("proxies");
    std::fs::create_dir(&sockets)?;
    std::fs::create_dir(&manifests)?;

    // Health ON: the echo target, its own process on loopback.
    let mut echo_child = Reap(None);
    let mut echo_addr = None;
    if health.is_some() {
        let mut c = Command::new(bin)
            .args(["echo", "--listen", "127.0.0.1:0"])
            .env_remove("EGRESS_PROXIES_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the echo")?;
        let out = c
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout of the echo"))?;
        echo_child.0 = Some(c);
        let line = tokio::time::timeout(
            PROCESS_BUDGET,
            tokio::task::spawn_blocking(move || {
                let mut line = String::new();
                BufReader::new(out).read_line(&mut line).map(|_| line)
            }),
        )
        .await
        .context("the echo did not start")???;
        let addr: SocketAddr = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| anyhow!("the echo said {line:?}"))?
            .parse()?;
        echo_addr = Some(addr);
    }

    // The fake hosts, in their own process.
    let mut hosts_cmd = Command::new(std::env::current_exe()?);
    hosts_cmd
        .args(["hosts", "--hosts", &hosts.to_string(), "--dir"])
        .arg(&sockets);
    if health.is_some() {
        hosts_cmd.args(["--proxy-port", &PROXY_PORT.to_string()]);
    }
    let mut hosts_child = Reap(Some(
        hosts_cmd
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
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(PROCESS_BUDGET, ready)
        .await
        .context("the hosts process did not get ready")???;
    if line.trim() != "ready" {
        bail!("the hosts process said {line:?}");
    }

    // Config and manifests.
    let mut cfg = format!("providers:\n  - name: {ENTRY}\n    type: libvirt\n    hosts:\n");
    for i in 0..hosts {
        cfg.push_str(&format!(
            "      - name: h{i}\n        address: local\n        socket: {}\n        pool: {POOL}\n        \
             network: {NETWORK}\n        virtType: qemu\n        poolReserveGiB: 1\n",
            sockets.join(format!("h{i}.sock")).display()
        ));
        if let Some(m) = max_concurrent {
            cfg.push_str(&format!("        maxConcurrent: {m}\n"));
        }
    }
    cfg.push_str(&format!(
        "    images:\n      {IMAGE}:\n        url: https://images.invalid/tiny.qcow2\n        \
         sha256: {}\n        format: qcow2\n    timeouts:\n      dial: {BENCH_DIAL_SECS}\n    defaults:\n      diskGiB: 4\n      memoryMiB: 256\n      vcpus: 1\n",
        digest()
    ));
    let cfg_path = dir.path().join("providers.yaml");
    std::fs::write(&cfg_path, cfg)?;
    for n in 0..proxies {
        std::fs::write(
            manifests.join(format!("p{n:05}.yaml")),
            format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p{n:05}\n\
                 spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n"
            ),
        )?;
    }

    // The operator.
    let port = free_port()?;
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let log = std::fs::File::create(dir.path().join("operator.log"))?;
    let mut cmd = Command::new(bin);
    cmd.arg("standalone")
        .arg("--config")
        .arg(&cfg_path)
        .arg("--proxies")
        .arg(&manifests)
        .args(["--listen", &listen.to_string()]);
    if let Some(w) = workers {
        cmd.args(["--workers", w]);
    }
    if let (Some(h), Some(e)) = (health, echo_addr) {
        cmd.args(["--health-target", &format!("http://{e}/")])
            .args(["--health-interval", &format!("{}s", h.interval_secs)]);
    }
    let start = Instant::now();
    let operator = cmd
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
    let metrics_url = format!("http://{listen}/metrics");
    let want = format!("egress_proxies_proxies{{phase=\"Running\"}} {proxies}\n");
    let wall = loop {
        if start.elapsed() > budget {
            let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL_LINES).collect();
            let phases = match client.get(format!("http://{listen}/status")).send().await {
                Ok(r) => match r
                    .bytes()
                    .await
                    .map(|b| serde_json::from_slice::<StatusDocument>(&b))
                {
                    Ok(Ok(d)) => {
                        let mut m: BTreeMap<String, usize> = BTreeMap::new();
                        for p in &d.proxies {
                            *m.entry(format!("{:?}", p.phase)).or_default() += 1;
                        }
                        format!("{m:?}")
                    }
                    _ => "unreadable /status".into(),
                },
                Err(e) => format!("no /status: {e}"),
            };
            bail!(
                "not all Running within {budget:?}; phases {phases}; last log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if let Some(c) = operator.0.as_mut()
            && let Some(s) = c.try_wait()?
        {
            bail!("the operator exited early: {s}");
        }
        if let Ok(resp) = client.get(&metrics_url).send().await
            && let Ok(body) = resp.bytes().await
            && String::from_utf8_lossy(&body).contains(&want)
        {
            break start.elapsed();
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };

    let hwm_before_status = vm_hwm_kib(pid)?;
    // /status must agree: every row Running with an address.
    let body = client
        .get(format!("http://{listen}/status"))
        .send()
        .await?
        .bytes()
        .await?;
    let doc: StatusDocument = serde_json::from_slice(&body)?;
    let running = doc
        .proxies
        .iter()
        .filter(|p| p.phase == Phase::Running && p.ip.is_some())
        .count();
    if running != proxies || doc.proxies.len() != proxies {
        bail!(
            "/status shows {running} Running with an IP of {} rows",
            doc.proxies.len()
        );
    }

    let mut hwm_kib = vm_hwm_kib(pid)?;
    let health_figures = match health {
        None => None,
        Some(h) => {
            let (to_healthy, healthy_first) =
                wait_healthy(&client, listen, proxies, start, budget).await?;
            hwm_kib = vm_hwm_kib(pid)?;
            let mut rss = Vec::new();
            let t0 = Instant::now();
            while t0.elapsed() < h.steady {
                tokio::time::sleep(RSS_SAMPLE).await;
                if let Some(c) = operator.0.as_mut()
                    && let Some(s) = c.try_wait()?
                {
                    bail!("the operator exited during the steady window: {s}");
                }
                rss.push(vm_rss_kib(pid)?);
            }
            let healthy_end = healthy_rows(&client, listen).await?;
            Some(HealthFigures {
                to_healthy,
                healthy_first,
                healthy_end,
                rss_min: rss.iter().copied().min().unwrap_or(0),
                rss_max: rss.iter().copied().max().unwrap_or(0),
                rss_last: rss.last().copied().unwrap_or(0),
                samples: rss.len(),
                hwm_end: vm_hwm_kib(pid)?,
            })
        }
    };
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("  VmHWM before the /status request: {hwm_before_status} kB");
        let st = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        for l in st
            .lines()
            .filter(|l| l.starts_with("Vm") || l.starts_with("Rss") || l.starts_with("Threads"))
        {
            eprintln!("  {l}");
        }
    }
    let cpu = cpu_time(pid)?;
    // SIGTERM (std's Child::kill is SIGKILL): through kill(1), as a service manager would.
    let t = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if !st.success() {
        bail!("kill -TERM {pid} failed");
    }
    let mut child = operator.0.take().ok_or_else(|| anyhow!("operator gone"))?;
    let code = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t.elapsed() > PROCESS_BUDGET {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the operator did not stop within {PROCESS_BUDGET:?} of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let shutdown = t.elapsed();
    if !code.success() {
        bail!("the operator exited with {code} after SIGTERM");
    }

    // Stop the hosts: closing their stdin ends them.
    if let Some(mut c) = hosts_child.0.take() {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    drop(echo_child);
    Ok(RunResult {
        wall,
        hwm_kib,
        cpu,
        shutdown,
        health: health_figures,
    })
}

/// Rows of `/status` that are Running and healthy.
async fn healthy_rows(client: &reqwest::Client, listen: SocketAddr) -> Result<usize> {
    let body = client
        .get(format!("http://{listen}/status"))
        .send()
        .await?
        .bytes()
        .await?;
    let doc: StatusDocument = serde_json::from_slice(&body)?;
    Ok(doc
        .proxies
        .iter()
        .filter(|p| p.healthy() == Some(true))
        .count())
}

/// Polls `/status` until all `proxies` rows are healthy, within `budget` of `start`; returns
/// the time from `start` and the count.
async fn wait_healthy(
    client: &reqwest::Client,
    listen: SocketAddr,
    proxies: usize,
    start: Instant,
    budget: Duration,
) -> Result<(Duration, usize)> {
    let mut last = 0;
    loop {
        if let Ok(n) = healthy_rows(client, listen).await {
            last = n;
            if n == proxies {
                return Ok((start.elapsed(), n));
            }
        }
        if start.elapsed() > budget {
            bail!("only {last}/{proxies} healthy within {budget:?}");
        }
        // NB: /status of 1000 rows is ~1 MB; 1 s keeps the driver's load off the figure.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Current resident set (`VmRSS`, KiB) of process `pid`.
fn vm_rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// Peak resident set (`VmHWM`, KiB) of process `pid`.
fn vm_hwm_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmHWM in /proc/{pid}/status"))
}

/// User + system CPU time of process `pid` so far.
fn cpu_time(pid: u32) -> Result<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
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
    // NB: USER_HZ is 100 on every Linux ABI we run on (sysconf(_SC_CLK_TCK) needs libc).
    Ok(Duration::from_millis(ticks * 10))
}
