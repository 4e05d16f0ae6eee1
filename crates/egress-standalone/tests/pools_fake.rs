//! ProxyPools in standalone mode against libvirt-fake hosts: a `kind: ProxyPool` manifest
//! keeps `replicas` members Running, spread over the hosts; scaling, a template change, a
//! quarantine file and removing the manifest act on the members; a restart adopts the
//! members' existing VMs (no new VM) and reuses the generated credentials file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use egress_core::model::Phase;
use egress_provider::libvirt::names;
use egress_standalone::pool::member_uid;
use egress_web::status::{PoolStatusRow, StatusDocument};
use ep_operator_fixtures::{
    Dhcp, FakeHosts, GIB, get, qcow2_image, standalone_options, start_standalone, status,
    wait_status,
};
use image_support::{ImageServer, Route, qcow2, sha};
use libvirt_fake::FakeLibvirt;

const ENTRY: &str = "fk";
/// Bound on every wait (convergence takes seconds).
const WAIT: Duration = Duration::from_secs(90);

struct World {
    fakes: BTreeMap<String, FakeLibvirt>,
    hosts: FakeHosts,
    _server: ImageServer,
    dir: tempfile::TempDir,
    _dhcp: Dhcp,
}

async fn world(host_names: &[&str]) -> World {
    let server = ImageServer::start().await;
    let image = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    let hosts = FakeHosts::new(ENTRY, host_names).image("tiny", qcow2_image(url, sha(&image)));
    World {
        fakes: hosts.fakes().clone(),
        _dhcp: hosts.start_dhcp(Duration::from_millis(50)),
        hosts,
        _server: server,
        dir: tempfile::tempdir().unwrap(),
    }
}

/// Writes `DIR/NAME.yaml`: a pool of `replicas` members of `memory` MiB, generated
/// credentials, `extra` appended under `spec`.
fn write_pool(dir: &Path, name: &str, replicas: u32, memory: u32, extra: &str) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {name}\n\
             spec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: {ENTRY}\n      \
             image: tiny\n      resources: {{diskGiB: 4, memoryMiB: {memory}}}\n  \
             credentials: {{generate: true}}\n{extra}"
        ),
    )
    .unwrap();
}

fn pool<'a>(d: &'a StatusDocument, name: &str) -> Option<&'a PoolStatusRow> {
    d.pools.iter().find(|p| p.name == name)
}

/// The pool's members that are not being deleted nor quarantined.
fn live(d: &StatusDocument, name: &str) -> Vec<String> {
    pool(d, name).map_or_else(Vec::new, |p| {
        p.members
            .iter()
            .filter(|m| !m.deleting && m.quarantine.is_none())
            .map(|m| m.name.clone())
            .collect()
    })
}

/// Exactly `n` members, all Running and available, nothing else left (no member being
/// deleted), and the status agreeing.
fn settled(name: &str, n: usize) -> impl Fn(&StatusDocument) -> bool + '_ {
    move |d| {
        pool(d, name).is_some_and(|p| {
            p.members.len() == n
                && p.members
                    .iter()
                    .all(|m| m.phase == Phase::Running && m.available && !m.deleting)
                && p.status.available_replicas as usize == n
        })
    }
}

fn domains(w: &World) -> BTreeSet<String> {
    w.fakes
        .values()
        .flat_map(|f| f.domains())
        .map(|d| d.name)
        .collect()
}

fn member_domains(members: &[String]) -> BTreeSet<String> {
    members
        .iter()
        .map(|m| names::domain(ENTRY, &member_uid("default", "web", m)))
        .collect()
}

async fn wait_domains(w: &World, want: &BTreeSet<String>, what: &str) {
    let t0 = Instant::now();
    while domains(w) != *want {
        assert!(
            t0.elapsed() < WAIT,
            "{what}: domains {:?}, want {want:?}",
            domains(w)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_its_replicas_publishes_them_scales_rolls_and_its_removal_deletes_them() {
    let w = world(&["h1", "h2", "h3"]).await;
    write_pool(w.dir.path(), "web", 3, 256, "");
    let r = start_standalone(standalone_options(w.dir.path()), w.hosts.providers()).await;
    wait_status(r.addr, "3 members Running", WAIT, settled("web", 3)).await;
    let d = status(r.addr).await;
    let p = pool(&d, "web").unwrap();
    // Spread: one member per host.
    let hosts: BTreeSet<_> = p.members.iter().map(|m| m.host.clone().unwrap()).collect();
    assert_eq!(hosts.len(), 3, "{p:#?}");
    let first = live(&d, "web");
    assert!(first.iter().all(|m| m.starts_with("web-")), "{first:?}");
    wait_domains(&w, &member_domains(&first), "one VM per member").await;
    // Members are Proxies in the document, and healthy.txt lists each one's ip:port.
    let mut want: Vec<String> = first
        .iter()
        .map(|m| {
            let row = d.proxies.iter().find(|p| &p.name == m).unwrap();
            format!("{}:{}", row.ip.as_ref().unwrap(), row.port.unwrap())
        })
        .collect();
    want.sort();
    let (code, body) = get(r.addr, "/pools/web/healthy.txt").await;
    assert_eq!(code, 200);
    assert_eq!(body.lines().collect::<Vec<_>>(), want);
    assert_eq!(get(r.addr, "/pools/nope/healthy.txt").await.0, 404);
    // The generated credentials: a 0600 file beside the manifest.
    let creds = w.dir.path().join("default.web.credentials");
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(
        std::fs::read_to_string(&creds)
            .unwrap()
            .starts_with("pool-web:")
    );
    let (_, metrics) = get(r.addr, "/metrics").await;
    assert!(
        metrics.contains("pool_available_replicas{pool=\"default/web\"} 3"),
        "{metrics}"
    );

    // Scale up, then down: the oldest go first.
    write_pool(w.dir.path(), "web", 5, 256, "");
    wait_status(r.addr, "5 members Running", WAIT, settled("web", 5)).await;
    write_pool(w.dir.path(), "web", 2, 256, "");
    wait_status(r.addr, "2 members left", WAIT, settled("web", 2)).await;
    let two = live(&status(r.addr).await, "web");
    wait_domains(&w, &member_domains(&two), "scale-in deletes the VMs").await;

    // A template change replaces every member.
    write_pool(w.dir.path(), "web", 2, 384, "");
    let t0 = Instant::now();
    loop {
        let d = status(r.addr).await;
        let now = live(&d, "web");
        if settled("web", 2)(&d) && now.iter().all(|m| !two.contains(m)) {
            assert_eq!(pool(&d, "web").unwrap().status.updated_replicas, 2);
            wait_domains(&w, &member_domains(&now), "old members' VMs deleted").await;
            break;
        }
        assert!(t0.elapsed() < WAIT, "no rollout: {:#?}", pool(&d, "web"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (_, metrics) = get(r.addr, "/metrics").await;
    for series in [
        "egress_proxies_pool_members{pool=\"default/web\",state=\"available\"} 2",
        "egress_proxies_pool_replacements_total{pool=\"default/web\",cause=\"scale-in\"} 3",
        "egress_proxies_pool_replacements_total{pool=\"default/web\",cause=\"template\"} 2",
        "egress_proxies_pool_member_ready_seconds_count{pool=\"default/web\"} 7",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }

    // Removing the manifest deletes every member, then the pool.
    std::fs::remove_file(w.dir.path().join("web.yaml")).unwrap();
    wait_status(r.addr, "the pool gone", WAIT, |d| {
        d.pools.is_empty() && d.proxies.is_empty()
    })
    .await;
    wait_domains(&w, &BTreeSet::new(), "no VM left").await;
    assert!(creds.exists(), "the credentials file is the user's; kept");
    assert!(
        !w.dir.path().join(".default.web.pool-members.json").exists(),
        "the member file goes with the pool"
    );
    let (_, metrics) = get(r.addr, "/metrics").await;
    assert!(!metrics.contains("pool=\"default/web\""), "{metrics}");
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_adopts_the_members_vms_and_reuses_the_generated_credentials() {
    let w = world(&["h1", "h2"]).await;
    write_pool(w.dir.path(), "web", 3, 256, "");
    let r = start_standalone(standalone_options(w.dir.path()), w.hosts.providers()).await;
    wait_status(r.addr, "3 members Running", WAIT, settled("web", 3)).await;
    let before = live(&status(r.addr).await, "web");
    let doms = domains(&w);
    assert_eq!(doms, member_domains(&before));
    let creds = std::fs::read_to_string(w.dir.path().join("default.web.credentials")).unwrap();
    r.stop(WAIT).await;

    let r = start_standalone(standalone_options(w.dir.path()), w.hosts.providers()).await;
    let t0 = Instant::now();
    loop {
        // Never a new VM, at any moment of the restart.
        assert_eq!(domains(&w), doms, "a restart made or removed a VM");
        let d = status(r.addr).await;
        if settled("web", 3)(&d) {
            assert_eq!(live(&d, "web"), before, "the same members");
            break;
        }
        assert!(t0.elapsed() < WAIT, "not adopted: {:#?}", pool(&d, "web"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few more rounds: still nothing new.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(domains(&w), doms);
    assert_eq!(
        std::fs::read_to_string(w.dir.path().join("default.web.credentials")).unwrap(),
        creds,
        "the credentials file is reused, never rewritten"
    );
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_generated_credentials_rolls_the_members_and_each_namespace_has_its_own_file() {
    let w = world(&["h1", "h2"]).await;
    write_pool(w.dir.path(), "web", 2, 256, "");
    // A pool of the same name in another namespace: its own credentials file.
    std::fs::write(
        w.dir.path().join("team-web.yaml"),
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n  \
             namespace: team\nspec:\n  replicas: 1\n  template:\n    spec:\n      \
             provider: {ENTRY}\n      image: tiny\n      resources: {{diskGiB: 4, memoryMiB: 256}}\n  \
             credentials: {{generate: true}}\n"
        ),
    )
    .unwrap();
    let r = start_standalone(standalone_options(w.dir.path()), w.hosts.providers()).await;
    let team_settled = |d: &StatusDocument| {
        d.pools.iter().any(|p| {
            p.namespace == "team"
                && p.members.len() == 1
                && p.members.iter().all(|m| m.available && !m.deleting)
        })
    };
    wait_status(r.addr, "both pools Running", WAIT, |d| {
        settled("web", 2)(d) && team_settled(d)
    })
    .await;
    let ours = w.dir.path().join("default.web.credentials");
    let theirs = w.dir.path().join("team.web.credentials");
    let (a, b) = (
        std::fs::read_to_string(&ours).unwrap(),
        std::fs::read_to_string(&theirs).unwrap(),
    );
    assert_ne!(
        a, b,
        "two namespaces' pools of one name never share credentials"
    );
    let before = live(&status(r.addr).await, "web");

    // New credentials written by the user: every member of that pool is replaced (through
    // the update budget), the other namespace's pool is left alone.
    std::fs::write(&ours, "pool-web:an-entirely-new-password-0123456789\n").unwrap();
    let t0 = Instant::now();
    loop {
        let d = status(r.addr).await;
        let now = live(&d, "web");
        if settled("web", 2)(&d) && now.iter().all(|m| !before.contains(m)) {
            break;
        }
        assert!(t0.elapsed() < WAIT, "no roll: {:#?}", pool(&d, "web"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&ours).unwrap(),
        "pool-web:an-entirely-new-password-0123456789\n",
        "the user's file is never rewritten"
    );
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), b);
    r.stop(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_member_leaves_publication_is_replaced_kept_and_deleted_when_released() {
    let w = world(&["h1", "h2"]).await;
    write_pool(w.dir.path(), "web", 2, 256, "");
    let r = start_standalone(standalone_options(w.dir.path()), w.hosts.providers()).await;
    wait_status(r.addr, "2 members Running", WAIT, settled("web", 2)).await;
    let d = status(r.addr).await;
    let members = live(&d, "web");
    let victim = members[0].clone();
    let victim_ip = d
        .proxies
        .iter()
        .find(|p| p.name == victim)
        .unwrap()
        .ip
        .clone()
        .unwrap();
    let victim_domain = names::domain(ENTRY, &member_uid("default", "web", &victim));
    std::fs::write(
        w.dir.path().join("default.web.quarantine"),
        format!("# held for inspection\n{victim} banned by example.com\n"),
    )
    .unwrap();
    let t0 = Instant::now();
    loop {
        let d = status(r.addr).await;
        let p = pool(&d, "web").unwrap();
        let replaced = live(&d, "web").len() == 2 && !live(&d, "web").contains(&victim);
        let q = p.members.iter().find(|m| m.name == victim);
        if replaced
            && p.status.available_replicas == 2
            && q.is_some_and(|m| m.quarantine.as_deref() == Some("banned by example.com"))
        {
            assert_eq!(p.status.quarantined, vec![victim.clone()]);
            break;
        }
        assert!(t0.elapsed() < WAIT, "not replaced: {p:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = get(r.addr, "/pools/web/healthy.txt").await;
    assert!(!body.contains(&format!("{victim_ip}:")), "{body}");
    assert_eq!(body.lines().count(), 2, "{body}");
    assert!(domains(&w).contains(&victim_domain), "its VM is kept");
    // Released: deleted.
    std::fs::write(w.dir.path().join("default.web.quarantine"), "").unwrap();
    let t0 = Instant::now();
    while domains(&w).contains(&victim_domain) {
        assert!(t0.elapsed() < WAIT, "the released member was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_status(r.addr, "2 members", WAIT, settled("web", 2)).await;
    r.stop(WAIT).await;
}

/// One fake host `h1` with the `tiny` image (served by `server`) and an IPv4 address pool of
/// ten addresses, 203.0.113.10–19.
fn one_host_with_an_address_pool(server: &ImageServer) -> FakeHosts {
    use egress_provider::libvirt::address_pool::{AddressPool, FamilyPool};
    let image = qcow2(2 * GIB, 4096);
    let url = server.route("/tiny.qcow2", Route::new(image.clone()));
    FakeHosts::new(ENTRY, &["h1"])
        .image("tiny", qcow2_image(url, sha(&image)))
        .address_pool(AddressPool {
            ipv4: Some(FamilyPool {
                prefix: "203.0.113.0/24".into(),
                gateway: "203.0.113.1".into(),
                ranges: vec!["203.0.113.10-203.0.113.19".into()],
            }),
            ipv6: None,
            dns: vec!["203.0.113.53".into()],
            access: None,
            hold_released: egress_provider::libvirt::address_pool::DEFAULT_HOLD_RELEASED,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_member_row_lists_the_declared_egress_address_its_vm_holds() {
    let server = ImageServer::start().await;
    let hosts = one_host_with_an_address_pool(&server);
    let _dhcp = hosts.start_dhcp(Duration::from_millis(50));
    let dir = tempfile::tempdir().unwrap();
    write_pool(dir.path(), "web", 2, 256, "");
    let r = start_standalone(standalone_options(dir.path()), hosts.providers()).await;
    wait_status(
        r.addr,
        "2 members Running, each with its address",
        WAIT,
        |d| {
            settled("web", 2)(d)
                && pool(d, "web")
                    .is_some_and(|p| p.members.iter().all(|m| !m.egress_address.is_empty()))
        },
    )
    .await;
    let d = status(r.addr).await;
    let p = pool(&d, "web").unwrap();
    let mut held = BTreeSet::new();
    for m in &p.members {
        // The member row says what the member Proxy's own row (its status) says.
        let row = d.proxies.iter().find(|x| x.name == m.name).unwrap();
        assert_eq!(m.egress_address, row.egress_address, "{p:#?}");
        assert_eq!(m.egress_address.len(), 1, "{p:#?}");
        assert!(m.egress_address[0].starts_with("203.0.113.1"), "{p:#?}");
        held.insert(m.egress_address[0].clone());
    }
    assert_eq!(held.len(), 2, "one address per member: {p:#?}");
    r.stop(WAIT).await;
}

/// `rotation.egressAddress: Keep`: a template change replaces every member one at a time and
/// each replacement comes back at the address of the member it replaced (with the default,
/// `Fresh`, the allocator would hand out never-used addresses first: .12 and .13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_brings_each_replacement_back_at_the_address_of_the_member_it_replaced() {
    let server = ImageServer::start().await;
    let hosts = one_host_with_an_address_pool(&server);
    let _dhcp = hosts.start_dhcp(Duration::from_millis(50));
    let dir = tempfile::tempdir().unwrap();
    let keep =
        "  rotation:\n    egressAddress: Keep\n  update:\n    maxSurge: 0\n    maxUnavailable: 1\n";
    write_pool(dir.path(), "web", 2, 256, keep);
    let r = start_standalone(standalone_options(dir.path()), hosts.providers()).await;
    let with_addresses = |d: &StatusDocument| {
        settled("web", 2)(d)
            && pool(d, "web")
                .is_some_and(|p| p.members.iter().all(|m| !m.egress_address.is_empty()))
    };
    wait_status(r.addr, "2 members with addresses", WAIT, with_addresses).await;
    let d = status(r.addr).await;
    let before: BTreeMap<String, Vec<String>> = pool(&d, "web")
        .unwrap()
        .members
        .iter()
        .map(|m| (m.name.clone(), m.egress_address.clone()))
        .collect();
    let held: BTreeSet<Vec<String>> = before.values().cloned().collect();
    assert_eq!(held.len(), 2, "{before:?}");

    // A template change: both members are replaced, and the addresses stay with the pool.
    write_pool(dir.path(), "web", 2, 384, keep);
    let t0 = Instant::now();
    loop {
        let d = status(r.addr).await;
        let p = pool(&d, "web").unwrap();
        // Never more than `replicas` members at once (the one being deleted included): Keep
        // does not surge.
        assert!(p.members.len() <= 2, "Keep never surges: {p:#?}");
        if with_addresses(&d) && p.members.iter().all(|m| !before.contains_key(&m.name)) {
            let after: BTreeSet<Vec<String>> =
                p.members.iter().map(|m| m.egress_address.clone()).collect();
            assert_eq!(after, held, "replacements keep the addresses: {p:#?}");
            break;
        }
        assert!(t0.elapsed() < WAIT, "no roll: {p:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.stop(WAIT).await;
}
