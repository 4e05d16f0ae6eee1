//! Pool failover when a host dies, in standalone mode, through the real `egress-proxies
//! standalone` binary on two libvirt-fake hosts (unix sockets; guest addresses given by the
//! fixtures' DHCP loop).
//!
//! What it proves, through the user's path (`/status`, `/hosts`, `/metrics`):
//! - a pool of 2 spread over h1 and h2; h1 is frozen (libvirt-fake's freeze fault: nothing is
//!   answered, not even keepalive), its row turns `Timeout`/`Unreachable`;
//! - the member on h1 is not replaced before `autohealing.hostDeadAfter` (10 s here) has
//!   passed since the row turned dead, and is replaced on h2 within that + the check interval
//!   + the standalone pool loop's tick;
//! - the old member and its domain on h1 stay while h1 is frozen (never deleted before), and
//!   the pool's status names it (`lostMembers`, `ReplicaFailure` `HostLost`);
//! - once h1 answers again, the old copy is deleted (its domain gone from h1), counted under
//!   `cause="host-lost"`;
//! - the pool, left with both members on h2, is spread again (`placement.rebalance`, on by
//!   default): once h1 has been Ready for `hostDeadAfter`, never before, one member moves back
//!   to h1 (a replacement there first, then the member on h2 goes: `cause="rebalance"`),
//!   while the available members never drop below `replicas`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use standalone_support::{FakeHosts, Operator, free_port, get, host_rows, write};

const ENTRY: &str = "eptest-hostlost";
const IMAGE: &str = "tiny";
const HOSTS: [&str; 2] = ["h1", "h2"];
const REPLICAS: usize = 2;
/// Hang guard of every wait (fake hosts answer in microseconds).
const DEADLINE: Duration = Duration::from_secs(120);

/// The pool's look at `/status`.
async fn look(addr: SocketAddr) -> standalone_support::Look {
    standalone_support::look(addr, "web").await
}

/// Each host's `state` in `/hosts` ("-" when absent).
async fn host_states(addr: SocketAddr) -> BTreeMap<String, String> {
    host_rows(addr, "state").await
}

const BUDGET: Duration = Duration::from_secs(10);
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The standalone pool loop decides every pool at least this often.
const POOL_TICK: Duration = Duration::from_secs(2);
/// How long h1 stays frozen once the pool is whole on h2 (more than the pool's 10 s look at
/// its lost members and a member reconcile's 5 s).
const HOLD: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_replaces_a_member_on_a_dead_host_after_the_budget_deletes_it_on_return_and_spreads_again()
 {
    let work = tempfile::tempdir().unwrap();
    let fakes = FakeHosts::start(work.path(), ENTRY, IMAGE, &HOSTS).await;

    let cfg = work.path().join("providers.yaml");
    fakes.write_config(&cfg, ENTRY, IMAGE, "");
    let dir = work.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(
        &dir,
        "web.yaml",
        &format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n\
             spec:\n  replicas: {REPLICAS}\n  update: {{maxSurge: 1, maxUnavailable: 0}}\n  \
             autohealing: {{hostDeadAfter: {}s}}\n  \
             template:\n    spec:\n      provider: {ENTRY}\n      image: {IMAGE}\n      proxy:\n        \
             allowedClientCidrs: [10.0.0.0/8]\n  credentials: {{generate: true}}\n",
            BUDGET.as_secs()
        ),
    );
    let log = work.path().join("operator.log");
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        &format!("{}s", CHECK_INTERVAL.as_secs()),
        [] as [&str; 0],
        log,
        40,
    );

    // Settled: one available member on each host.
    let t0 = Instant::now();
    let settled = loop {
        let l = look(listen).await;
        if l.available() == REPLICAS && l.on("h1") == 1 && l.on("h2") == 1 {
            break l;
        }
        op.assert_running();
        assert!(
            t0.elapsed() < DEADLINE,
            "not settled after {DEADLINE:?}: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let old = settled
        .members
        .iter()
        .find(|(_, (h, _))| h == "h1")
        .map(|(n, _)| n.clone())
        .unwrap();
    assert_eq!((fakes.domains("h1"), fakes.domains("h2")), (1, 1));
    println!(
        "eptest: settled after {:.1} s; {old} on h1; freezing h1",
        t0.elapsed().as_secs_f64()
    );

    // Freeze h1: its row turns dead, then the budget runs, then the replacement lands on h2.
    fakes.fakes["h1"].faults().freeze();
    let t_freeze = Instant::now();
    let mut t_dead: Option<Instant> = None;
    let t_replaced = loop {
        let l = look(listen).await;
        let states = host_states(listen).await;
        let h1 = states.get("h1").cloned().unwrap_or_default();
        if t_dead.is_none() && (h1 == "Timeout" || h1 == "Unreachable") {
            t_dead = Some(Instant::now());
            println!(
                "eptest: h1 {h1} {:.1} s after the freeze",
                t_freeze.elapsed().as_secs_f64()
            );
        }
        // Never deleted while h1 is dead.
        assert!(
            l.members.contains_key(&old),
            "{old} deleted while h1 is dead: {l:?}"
        );
        assert_eq!(
            fakes.domains("h1"),
            1,
            "{old}'s domain deleted while h1 is dead"
        );
        if l.on("h2") == REPLICAS {
            let dead = t_dead.expect("a replacement before h1 was reported dead");
            break Instant::now().duration_since(dead);
        }
        if let Some(dead) = t_dead {
            // Not before the budget has run since the row turned dead (the row and the
            // clock are set by the same check round; 0.5 s for this loop's own look).
            assert!(
                l.on("h2") == 1 || dead.elapsed() + Duration::from_millis(500) >= BUDGET,
                "replaced before the budget: {l:?}"
            );
        }
        assert!(
            t_freeze.elapsed() < DEADLINE,
            "not replaced within {DEADLINE:?}: {l:?} {states:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let bound = BUDGET + CHECK_INTERVAL + POOL_TICK + Duration::from_secs(1);
    println!(
        "eptest: replaced on h2 {:.1} s after h1 was reported dead (budget {BUDGET:?}, bound \
         {bound:?})",
        t_replaced.as_secs_f64()
    );
    assert!(
        t_replaced + Duration::from_millis(500) >= BUDGET,
        "replaced {t_replaced:?} after h1 was reported dead, before the budget {BUDGET:?}"
    );
    assert!(
        t_replaced <= bound,
        "replaced {t_replaced:?} after h1 was reported dead, later than {bound:?}"
    );
    // The status names the lost member and its host.
    let lost = look(listen).await.status;
    assert_eq!(lost["lostMembers"][0]["member"], old.as_str(), "{lost}");
    assert_eq!(lost["lostMembers"][0]["host"], "h1", "{lost}");
    let rf = lost["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ReplicaFailure")
        .cloned()
        .unwrap();
    assert_eq!(rf["reason"], "HostLost", "{rf}");
    assert!(
        rf["message"]
            .as_str()
            .unwrap()
            .contains(&format!("h1 ({old})")),
        "{rf}"
    );

    // Still frozen a while longer: the old copy stays, also once its replacement is
    // available (the pool is whole without it) and past the pool's 10 s look at lost members.
    let hold = Instant::now();
    let mut whole: Option<Instant> = None;
    while whole.is_none_or(|t| t.elapsed() < HOLD) {
        assert!(
            hold.elapsed() < DEADLINE,
            "the replacement never became available"
        );
        if whole.is_none()
            && look(listen)
                .await
                .members
                .iter()
                .filter(|(n, (h, a))| *n != &old && h == "h2" && *a)
                .count()
                == REPLICAS
        {
            whole = Some(Instant::now());
        }
        let l = look(listen).await;
        assert!(
            l.members.contains_key(&old),
            "{old} deleted while h1 is dead"
        );
        assert_eq!(
            fakes.domains("h1"),
            1,
            "{old}'s domain deleted while h1 is dead"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // h1 answers again: the old copy goes.
    fakes.fakes["h1"].faults().thaw();
    let t_thaw = Instant::now();
    loop {
        let l = look(listen).await;
        if !l.members.contains_key(&old) && fakes.domains("h1") == 0 {
            assert_eq!(l.on("h2"), REPLICAS, "{l:?}");
            assert!(l.status["lostMembers"].is_null(), "{}", l.status);
            break;
        }
        assert!(
            t_thaw.elapsed() < DEADLINE,
            "{old} not deleted {DEADLINE:?} after h1 returned: {l:?}, {} domain(s) on h1\n{}",
            fakes.domains("h1"),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "eptest: {old} and its domain on h1 deleted {:.1} s after h1 was thawed",
        t_thaw.elapsed().as_secs_f64()
    );
    let metrics = get(listen, "/metrics").await.unwrap_or_default();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("egress_proxies_pool_replacements_total") && l.contains("host-lost")
        })
        .unwrap_or_default()
        .to_owned();
    assert!(line.ends_with(" 1"), "{line:?}");

    // Spread again: one member back on h1 once h1 has been Ready for the budget, never
    // before; never fewer than `replicas` available meanwhile.
    let t_spread = loop {
        let l = look(listen).await;
        let since = t_thaw.elapsed();
        if l.on("h1") == 1
            && l.on("h2") == 1
            && l.available() == REPLICAS
            && l.status["rebalancing"].is_null()
        {
            break since;
        }
        if l.on("h1") > 0 {
            assert!(
                since + Duration::from_millis(500) >= BUDGET,
                "a member moved to h1 {since:?} after it was thawed, before the budget \
                 {BUDGET:?}: {l:?}"
            );
        }
        assert!(
            l.available() >= REPLICAS,
            "the move took available members below replicas: {l:?}"
        );
        assert!(
            since < DEADLINE,
            "not spread again {DEADLINE:?} after h1 returned: {l:?}\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "eptest: spread again (one member on each host) {:.1} s after h1 was thawed",
        t_spread.as_secs_f64()
    );
    assert_eq!((fakes.domains("h1"), fakes.domains("h2")), (1, 1));
    let metrics = get(listen, "/metrics").await.unwrap_or_default();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("egress_proxies_pool_replacements_total") && l.contains("rebalance")
        })
        .unwrap_or_default()
        .to_owned();
    assert!(line.ends_with(" 1"), "{line:?}");
}
