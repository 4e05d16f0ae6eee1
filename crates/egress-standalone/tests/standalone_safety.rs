//! Standalone mode's safety rules against libvirt-fake: GC follows the `gc` command's
//! empty-set rule (no collection while no Proxy manifest is known, unless allowed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use egress_core::gc::GcSettings;
use egress_provider::ProxyUid;
use egress_provider::libvirt::{mark, names};
use ep_operator_fixtures::{FakeHosts, get, standalone_options, start_standalone};
use libvirt_fake::DomainSpec;

const ENTRY: &str = "fk";
/// Bound on every wait in these tests; far above what adoption and a GC pass take (ms).
const WAIT: Duration = Duration::from_secs(60);
/// GC interval in these tests: many passes fit in [`PASSES`].
const GC_EVERY: Duration = Duration::from_millis(200);
/// How long the refusing run is watched: ten GC intervals.
const PASSES: Duration = Duration::from_secs(2);

/// One fake host holding a domain with a valid mark of a Proxy nobody declares.
fn host_with_orphan() -> (FakeHosts, String) {
    let hosts = FakeHosts::new(ENTRY, &["h1"]);
    let uid = ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-7086772895aa").unwrap();
    let xml = format!(
        "<instance xmlns=\"{}\">\n  <managed>true</managed>\n  <uid>{}</uid>\n  \
         <entry>{ENTRY}</entry>\n  <createdAt>2020-01-01T00:00:00Z</createdAt>\n</instance>",
        mark::NAMESPACE,
        uid.canonical()
    );
    let name = names::domain(ENTRY, &uid);
    hosts
        .fake("h1")
        .add_domain(DomainSpec::new(name.clone()).metadata(mark::NAMESPACE, xml))
        .unwrap();
    (hosts, name)
}

async fn wait_ready(addr: std::net::SocketAddr) {
    let t0 = Instant::now();
    while get(addr, "/readyz").await.0 != 200 {
        assert!(t0.elapsed() < WAIT, "standalone never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_in_standalone_deletes_nothing_while_the_manifest_directory_is_empty_unless_allowed() {
    for allow_empty in [false, true] {
        let (hosts, orphan) = host_with_orphan();
        let dir = tempfile::tempdir().unwrap();
        let mut o = standalone_options(dir.path());
        o.gc_interval = GC_EVERY;
        o.gc = GcSettings {
            min_age: Duration::ZERO,
            dry_run: false,
            ..GcSettings::default()
        };
        o.gc_allow_empty = allow_empty;
        let r = start_standalone(o, hosts.providers()).await;
        wait_ready(r.addr).await;
        let f = hosts.fake("h1");
        if allow_empty {
            let t0 = Instant::now();
            while f.domain(&orphan).is_some() {
                assert!(
                    t0.elapsed() < WAIT,
                    "GC with the empty set allowed never collected"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            tokio::time::sleep(PASSES).await;
            assert!(
                f.domain(&orphan).is_some(),
                "GC collected with no Proxy manifest known"
            );
        }
        r.stop(WAIT).await;
    }
}
