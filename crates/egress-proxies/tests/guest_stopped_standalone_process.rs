//! A Proxy whose guest stopped is re-created at once, through the real `egress-proxies
//! standalone` binary: one Proxy on a libvirt-fake host, its guest address served by a real
//! tinyproxy, in a fresh network namespace (`unshare -n`) where 10.0.0.0/8 is local (as in
//! `gateway_standalone_process.rs`; the child must have run exactly this test), health checks
//! every second.
//!
//! What it proves: once the Proxy is Running and Healthy, its domain is shut off and its
//! proxy stops answering (as when a guest's QEMU dies); the health round that turns it
//! Unhealthy has it reconciled at once, so the reconcile reads the stopped instance and
//! re-creates it in place (a new domain running) well before the periodic read of a Running
//! Proxy (a minute by default): within [`BOUND`] of the stop.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod standalone_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ep_operator_fixtures::real_members::echo;
use libvirt_fake::domain_state;
use standalone_support::{
    FakeHosts, LOOPBACK_POLICY, MEMBER_PORT, MEMBER_PW, MEMBER_USER, Operator, SLOTS, free_port,
    json, manifest_dir, tinyproxies, write,
};

const TEST: &str = "a_proxy_whose_guest_stopped_is_re_created_before_its_periodic_read";
/// Set in the re-run inside the namespace.
const INNER: &str = "EPTEST_GUEST_STOPPED_STANDALONE_NETNS";
const ENTRY: &str = "eptest-gst";
const IMAGE: &str = "tiny";
/// Hang guard of the wait for the Proxy to be Running and Healthy.
const DEADLINE: Duration = Duration::from_secs(90);
/// The re-create must start within this of the stop: the health round that decides (a
/// second's interval, two failed checks) and one reconcile, far below the minute of the
/// periodic read.
const BOUND: Duration = Duration::from_secs(20);
/// How long the test waits for the re-create at most (past the periodic read, so a run
/// without the immediate reconcile shows how long it took).
const WAIT: Duration = Duration::from_secs(75);

/// Proxy `name`'s phase, provider ID, address, and whether its `Healthy` condition is True.
async fn proxy(addr: SocketAddr, name: &str) -> Option<(String, String, String, bool)> {
    let doc = json(addr, "/status").await;
    let p = doc["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?;
    let healthy = p["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Healthy" && c["status"] == "True");
    Some((
        p["phase"].as_str().unwrap_or("-").to_owned(),
        p["providerId"].as_str().unwrap_or("-").to_owned(),
        p["ip"].as_str().unwrap_or("-").to_owned(),
        healthy,
    ))
}

#[test]
fn a_proxy_whose_guest_stopped_is_re_created_before_its_periodic_read() {
    if std::env::var_os(INNER).is_some() {
        standalone_support::block_on(inside());
        return;
    }
    standalone_support::rerun_in_netns(TEST, INNER);
}

async fn inside() {
    let work = tempfile::tempdir().unwrap();
    let hosts = FakeHosts::start(work.path(), ENTRY, IMAGE, &["h1"]).await;
    let e = echo().await;
    let mut daemons = tinyproxies(SLOTS, MEMBER_PORT, MEMBER_USER, MEMBER_PW).await;
    let fake = &hosts.fakes["h1"];

    let cfg = work.path().join("providers.yaml");
    hosts.write_config(&cfg, ENTRY, IMAGE, LOOPBACK_POLICY);
    let dir = manifest_dir(work.path(), &[("p.cred", MEMBER_USER, MEMBER_PW)]);
    for name in ["p1", "p2"] {
        write(
            &dir,
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
                 spec:\n  provider: {ENTRY}\n  image: {IMAGE}\n  proxy:\n    port: {MEMBER_PORT}\n    \
                 credentialsRef: p.cred\n"
            ),
        );
    }
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let mut op = Operator::start(
        &cfg,
        &dir,
        listen,
        "1s",
        [
            "--health-target",
            &format!("http://{}/", e.addr),
            "--health-interval",
            "1s",
        ],
        work.path().join("operator.log"),
        60,
    );

    // Both Running and Healthy.
    let t0 = Instant::now();
    let mut up = Vec::new();
    for name in ["p1", "p2"] {
        let (provider_id, ip) = loop {
            let p = proxy(listen, name).await;
            if let Some((phase, id, ip, true)) = &p
                && phase == "Running"
            {
                break (id.clone(), ip.parse::<Ipv4Addr>().unwrap());
            }
            op.assert_running();
            assert!(
                t0.elapsed() < DEADLINE,
                "{name} is {p:?} after {DEADLINE:?}\n{}",
                op.tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let domain = provider_id.rsplit('/').next().unwrap().to_owned();
        let old = fake.domain(&domain).expect("its domain on the host");
        println!(
            "eptest: {name} Running and Healthy after {:.1} s ({domain} at {ip})",
            t0.elapsed().as_secs_f64()
        );
        up.push((domain, old, ip));
    }
    let [(domain, old, ip), (domain2, old2, ip2)] = <[_; 2]>::try_from(up).unwrap();

    // p2's proxy stops answering while its guest runs: it turns Unhealthy, its reconcile reads
    // the running instance and leaves it.
    drop(daemons.remove(&ip2));
    let t1 = Instant::now();
    loop {
        if let Some((_, _, _, false)) = proxy(listen, "p2").await {
            break;
        }
        op.assert_running();
        assert!(t1.elapsed() < DEADLINE, "p2 never Unhealthy\n{}", op.tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now2 = fake.domain(&domain2).expect("p2's domain stays");
    assert_eq!(
        (now2.uuid, now2.state),
        (old2.uuid, domain_state::RUNNING),
        "a running guest whose proxy is down is left as it is\n{}",
        op.tail()
    );
    assert!(
        matches!(proxy(listen, "p2").await, Some((ref phase, _, _, false)) if phase == "Running"),
        "p2 stays Running (Unhealthy)"
    );

    // Its guest dies: the domain is shut off and its proxy stops answering.
    let killed = Instant::now();
    fake.set_domain_state(&domain, domain_state::SHUTOFF, 1)
        .unwrap();
    drop(daemons.remove(&ip));

    // A new domain runs in its place (p2's is not it).
    assert_ne!(domain, domain2);
    let took = loop {
        // Re-created in place: the same domain name, a new domain.
        let replaced = fake
            .domain(&domain)
            .is_some_and(|d| d.uuid != old.uuid && d.state == domain_state::RUNNING);
        if replaced {
            break killed.elapsed();
        }
        op.assert_running();
        assert!(
            killed.elapsed() < WAIT,
            "no new domain {WAIT:?} after the stop: {:?}\n{}",
            fake.domains()
                .iter()
                .map(|d| (&d.name, d.state))
                .collect::<Vec<_>>(),
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "eptest: the stopped guest was re-created {:.1} s after the stop",
        took.as_secs_f64()
    );
    assert!(
        took < BOUND,
        "re-created {took:?} after the stop, not within {BOUND:?}\n{}",
        op.tail()
    );
}
