//! Benchmark (run by `scripts/bench reputation`, never a timed test): check rounds of
//! ADDRESSES addresses in ZONES zones against a real nsd on a private port of 127.0.0.1,
//! CONCURRENCY queries in flight, each round building the query names, querying, classifying
//! and recording every verdict in a [`Book`] and building every address's status view, as
//! the operator's worker does. Prints per round: wall time, queries per second, this
//! process's CPU (user + system) and nsd's, and this process's peak RSS (VmHWM) at the end.
//!
//! A tenth of the addresses are listed (127.0.0.2), a hundredth answer 127.255.255.254 (the
//! open-resolver refusal); a twentieth are IPv6. Needs nsd (.ci/setup-host).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use egress_reputation::book::Book;
use egress_reputation::config::{RawReputation, validate};
use egress_reputation::status::ProxyReputation;
use egress_reputation::{Resolver, run_round};
use ep_test_support::nsd::{Nsd, TestZone};
use tokio::time::Instant;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// CPU seconds of this process so far.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let (_, rest) = stat.rsplit_once(") ").unwrap();
    let f: Vec<&str> = rest.split_whitespace().collect();
    (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64 / 100.0
}

fn vm_hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: ?")
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ")
}

fn address(i: usize) -> IpAddr {
    if i % 20 == 19 {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            0,
            0,
            0,
            0,
            (i >> 16) as u16,
            i as u16,
        ))
    } else {
        // 100.64.0.0/10 as a stand-in space of 4 M addresses.
        IpAddr::V4(Ipv4Addr::from(0x6440_0000u32 + i as u32))
    }
}

fn main() {
    let addresses = arg("--addresses", 10_000);
    let zones = arg("--zones", 2);
    let concurrency = arg("--concurrency", 32);
    let runs = arg("--runs", 3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let addrs: Vec<IpAddr> = (0..addresses).map(address).collect();
    let mut test_zones = Vec::new();
    for z in 0..zones {
        let mut zone = TestZone::new(&format!("bl{z}.test"));
        for (i, a) in addrs.iter().enumerate() {
            if i % 10 == z % 10 {
                zone = zone.list(*a, Ipv4Addr::new(127, 0, 0, 2));
            } else if i % 100 == 55 {
                zone = zone.list(*a, Ipv4Addr::new(127, 255, 255, 254));
            }
        }
        test_zones.push(zone);
    }
    let nsd = Nsd::start(None, &test_zones);
    let yaml = format!(
        "resolvers: ['{}']\nconcurrency: {concurrency}\ntimeout: 5s\nzones:\n{}",
        nsd.addr(),
        (0..zones)
            .map(|z| format!("- name: bl{z}.test\n"))
            .collect::<String>()
    );
    let raw: RawReputation = serde_saphyr::from_str(&yaml).unwrap();
    let settings = validate(&raw).0.unwrap();
    println!(
        "== reputation: {addresses} addresses x {zones} zones = {} queries per round, \
         concurrency {concurrency}, nsd {} (1 server process), {} cores",
        addresses * zones,
        nsd.addr(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "== load: {}",
        std::fs::read_to_string("/proc/loadavg").unwrap().trim()
    );
    rt.block_on(async {
        let resolver =
            Resolver::new(&settings.resolvers, settings.timeout, settings.concurrency).unwrap();
        let mut book = Book::new(settings.zones.iter().map(|z| z.zone.clone()).collect());
        for run in 1..=runs {
            let (cpu0, nsd0) = (own_cpu(), nsd.cpu_seconds());
            let started = std::time::Instant::now();
            let now = SystemTime::now();
            let mut changes = 0u64;
            let report = run_round(
                &resolver,
                &settings.zones,
                addrs.iter().copied(),
                settings.concurrency,
                Instant::now() + Duration::from_secs(3600),
                |a, z, v| {
                    if book.record(a, z, v, now).is_some() {
                        changes += 1;
                    }
                },
            )
            .await;
            // Every address's status view, as the worker publishes them.
            let mut listed_views = 0;
            for a in &addrs {
                if ProxyReputation::from_book(&book, std::slice::from_ref(a))
                    .is_some_and(|r| !r.listed.is_empty())
                {
                    listed_views += 1;
                }
            }
            let wall = started.elapsed().as_secs_f64();
            let (cpu, nsd_cpu) = (own_cpu() - cpu0, nsd.cpu_seconds() - nsd0);
            println!(
                "run {run}: {:.2} s wall, {:.0} queries/s, CPU {:.2} s ({:.1} us/query), nsd CPU \
                 {:.2} s; listed {} failed {} not listed {} skipped {}; {} changes, {} listed \
                 addresses",
                wall,
                report.queries as f64 / wall,
                cpu,
                cpu * 1e6 / report.queries.max(1) as f64,
                nsd_cpu,
                report.listed,
                report.failed,
                report.not_listed,
                report.skipped,
                changes,
                listed_views
            );
        }
    });
    println!("peak RSS (VmHWM): {}", vm_hwm());
}
