//! Benchmark of the proxy health engine (issue 6): N proxies on loopback — N listening ports
//! served by in-process HTTP CONNECT proxies (ep_operator_fixtures::health_proxies) — in front of the real echo
//! target; R full rounds at concurrency C. Prints each round's wall time and the process's CPU
//! time during the round (engine + proxies + echo: an upper bound for the engine alone), then
//! the CPU used while idle between rounds.
//!
//! Usage: bench_health [--proxies N] [--concurrency C] [--rounds R] [--idle SECS]
//! Everything listens and connects on 127.0.0.1 only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ep_operator_fixtures::health_proxies as health_support;

use std::time::{Duration, Instant};

use egress_core::health::probe::{CheckTarget, ProxyEndpoint};
use egress_core::health::{HealthEngine, HealthSettings, HealthState, ProbeTarget};
use egress_core::model::ProxyProtocol;
use egress_provider::ProxyUid;
use health_support::{ProxyBehaviour, serve, start_echo};

/// CPU seconds (user + system) of this process so far, from /proc/self/stat.
fn cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // NB: USER_HZ is 100 on Linux x86-64 (sysconf(_SC_CLK_TCK) needs unsafe libc).
    ticks / 100.0
}

fn arg(name: &str, default: usize) -> usize {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1))
        .map_or(default, |v| v.parse().unwrap())
}

fn main() {
    let n = arg("--proxies", 1000);
    let c = arg("--concurrency", 64);
    let rounds = arg("--rounds", 5);
    let idle = arg("--idle", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (echo, _e) = start_echo().await;
        let mut proxies = Vec::with_capacity(n);
        for _ in 0..n {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            proxies.push(serve(l, ProxyBehaviour::default(), false));
        }
        let mut s = HealthSettings::new(CheckTarget::parse(&format!("http://{echo}/")).unwrap());
        s.concurrency = c;
        s.interval = Duration::from_secs(3600);
        let engine = HealthEngine::new(s);
        let targets: Vec<ProbeTarget> = proxies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&(i as u64).to_be_bytes());
                ProbeTarget {
                    uid: ProxyUid(uuid::Uuid::from_bytes(b)),
                    key: format!("bench/p{i}"),
                    entry: "bench".into(),
                    host: format!("h{}", i % 10),
                    endpoint: ProxyEndpoint {
                        addr: p.addr,
                        protocol: ProxyProtocol::Http,
                        credentials: None,
                    },
                    expected_egress: None,
                    declared: Vec::new(),
                }
            })
            .collect();
        println!(
            "== health engine: {n} proxies (loopback CONNECT proxies), concurrency {c}, {} cores",
            std::thread::available_parallelism().map_or(0, |p| p.get())
        );
        let mut walls = Vec::new();
        for r in 1..=rounds {
            let cpu0 = cpu_secs();
            let t0 = Instant::now();
            let rep = engine.round(targets.clone()).await;
            let wall = t0.elapsed();
            let cpu = cpu_secs() - cpu0;
            walls.push(wall.as_secs_f64());
            println!(
                "round {r}: {}/{} ok, wall {:.3} s, cpu {:.2} s ({:.0}% of one core)",
                rep.succeeded,
                rep.probed,
                wall.as_secs_f64(),
                cpu,
                100.0 * cpu / wall.as_secs_f64()
            );
        }
        let healthy = targets
            .iter()
            .filter(|t| engine.get(&t.uid).is_some_and(|h| h.state == HealthState::Healthy))
            .count();
        walls.sort_by(f64::total_cmp);
        println!(
            "wall per round: min {:.3} s, median {:.3} s, max {:.3} s; healthy after {rounds} rounds: {healthy}/{n}",
            walls[0],
            walls[walls.len() / 2],
            walls[walls.len() - 1]
        );
        let cpu0 = cpu_secs();
        tokio::time::sleep(Duration::from_secs(idle as u64)).await;
        println!(
            "idle between rounds: {:.3} s cpu over {idle} s",
            cpu_secs() - cpu0
        );
    });
}
