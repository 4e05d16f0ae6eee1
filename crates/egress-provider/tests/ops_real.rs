//! get, delete and list_owned against the REAL libvirtd on this machine, reached through a
//! real OpenSSH sshd on 127.0.0.1 (ep_test_support), with TCG domains that have no network
//! interface (nothing leaves the host) and volumes in a pool over a temporary directory.
//!
//! Every resource name is printed before it is created; guards remove domains (with every
//! metadata flag) and pools with `virsh` on every exit path; a sweep at the start removes
//! leftovers of killed runs older than [`SWEEP_AGE`] (finding M19). These tests fail, never
//! skip, when libvirtd or sshd is missing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::config::{HostConfig, VirtType};
use egress_provider::libvirt::ops::{delete, get, list};
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, InstanceState, ProviderId, ProxyUid};
use ep_test_support::cleanup::{
    names_from, now_secs, random_u32, remove_domain, remove_pool, virsh, virsh_ok,
};
use ep_test_support::sshd::Sshd;
use libvirt_remote::transport::ssh::{self, SshOptions};
use libvirt_remote::{Client, OpenOptions};

/// How long one test body may run before it fails (its guards then clean up).
// NB: each body makes a few dozen calls and a handful of virsh runs, a couple of seconds here;
// starting a TCG domain takes ~1 s. Two minutes leaves room on a loaded 2-core box.
const TEST_BUDGET: Duration = Duration::from_secs(120);
/// Leftovers older than this are swept.
// NB: a run takes well under a minute; 30 minutes never touches a run in progress.
const SWEEP_AGE: Duration = Duration::from_secs(30 * 60);
/// Prefix of the entries these tests use; domains are `ep-eptest-<secs>-<rand>-<uid>`.
const ENTRY_PREFIX: &str = "eptest-";

// ---------------------------------------------------------------- fixtures

/// A unique entry name: `eptest-<unix secs>-<random>`.
fn unique_entry() -> String {
    format!("{ENTRY_PREFIX}{}-{:08x}", now_secs(), random_u32())
}

/// The age of a resource named by these tests (domains `ep-eptest-<secs>-…`, pools and
/// directories `eptest-<secs>-…`).
fn age_of(name: &str) -> Option<Duration> {
    let rest = name.strip_prefix(names::PREFIX).unwrap_or(name);
    let secs: u64 = rest
        .strip_prefix(ENTRY_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()?;
    Some(Duration::from_secs(now_secs().saturating_sub(secs)))
}

/// Removes this suite's leftovers older than [`SWEEP_AGE`], once per process.
fn sweep_once() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        let old = |n: &str| age_of(n).is_some_and(|a| a > SWEEP_AGE);
        for d in names_from(&["list", "--all", "--name"]) {
            if d.starts_with(&format!("{}{ENTRY_PREFIX}", names::PREFIX)) && old(&d) {
                println!("eptest: sweeping leftover domain {d}");
                remove_domain(&d);
            }
        }
        for p in names_from(&["pool-list", "--all", "--name"]) {
            if p.starts_with(ENTRY_PREFIX) && old(&p) {
                println!("eptest: sweeping leftover pool {p}");
                remove_pool(&p);
            }
        }
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(ENTRY_PREFIX) && old(&n) {
                    println!("eptest: sweeping leftover {}", e.path().display());
                    let _ = std::fs::remove_dir_all(e.path());
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    });
}

/// Removes the domain when dropped.
struct DomainGuard(String);

impl DomainGuard {
    /// Defines `xml` (named `name`), guarded from now on.
    fn define(name: &str, xml: &str) -> Self {
        println!("eptest: defining domain {name}");
        let g = Self(name.to_owned());
        let file = std::env::temp_dir().join(format!("{name}.xml"));
        std::fs::write(&file, xml).unwrap();
        let out = virsh(&["define", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "virsh define {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        g
    }
}

impl Drop for DomainGuard {
    fn drop(&mut self) {
        remove_domain(&self.0);
    }
}

/// A transient dir pool over a fresh temp directory; destroyed and removed when dropped.
struct PoolGuard {
    name: String,
    dir: PathBuf,
}

impl PoolGuard {
    fn create(entry: &str) -> Self {
        let name = format!("{entry}-pool");
        println!("eptest: creating pool {name}");
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let g = Self { name, dir };
        virsh_ok(&[
            "pool-create-as",
            &g.name,
            "dir",
            "--target",
            g.dir.to_str().unwrap(),
        ]);
        g
    }

    fn vol(&self, name: &str, format: &str) {
        virsh_ok(&["vol-create-as", &self.name, name, "1M", "--format", format]);
    }

    fn has(&self, name: &str) -> bool {
        let _ = virsh(&["pool-refresh", &self.name]);
        names_from(&["vol-list", &self.name])
            .iter()
            .any(|l| l.split_whitespace().next() == Some(name))
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        remove_pool(&self.name);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn host(pool: &str) -> HostConfig {
    HostConfig {
        name: "local".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: pool.into(),
        bridge: None,
        network: None,
        virt_type: VirtType::Qemu,
        pool_reserve_gib: 0,
        ssh_key_file: None,
        known_hosts_file: None,
        max_concurrent: 4,
        guest_cidr: Vec::new(),
        address_pool: None,
        maintenance: Default::default(),
        segment: None,
        fence: None,
        host_addresses: Vec::new(),
        capacity: Default::default(),
        access: None,
    }
}

fn uid(n: u8) -> ProxyUid {
    ProxyUid::parse_strict(&format!("3b241101-e2bb-4255-8caf-4136c566a9{n:02x}")).unwrap()
}

/// A mark as a hand edit could leave it: any UID text, any namespace.
fn raw_mark(ns: &str, uid_text: &str, entry: &str, created: &str) -> String {
    format!(
        "<x:instance xmlns:x=\"{ns}\"><x:managed>true</x:managed><x:uid>{uid_text}</x:uid>\
         <x:entry>{entry}</x:entry><x:createdAt>{created}</x:createdAt></x:instance>"
    )
}

/// A TCG domain with no NIC, a guest-agent channel, optional disks, and `metadata`.
fn domain_xml(name: &str, metadata: &str, disks: &str) -> String {
    format!(
        "<domain type='qemu'>\
           <name>{name}</name>\
           <memory unit='MiB'>64</memory>\
           <vcpu>1</vcpu>\
           <os><type arch='x86_64' machine='pc'>hvm</type></os>\
           <metadata>{metadata}</metadata>\
           <on_poweroff>destroy</on_poweroff>\
           <devices>\
             {disks}\
             <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
             <memballoon model='none'/>\
           </devices>\
         </domain>"
    )
}

/// An sshd on 127.0.0.1 and a client of the system libvirtd through it.
async fn connect() -> (Sshd, Client) {
    let sshd = Sshd::start();
    let t = ssh::connect(&sshd.target(), &SshOptions::default())
        .await
        .unwrap_or_else(|e| panic!("SSH connect failed: {e}\nsshd log:\n{}", sshd.log()));
    let c = Client::open(t, OpenOptions::default())
        .await
        .unwrap_or_else(|e| panic!("libvirt open through sshd failed: {e}"));
    (sshd, c)
}

async fn run<F: std::future::Future<Output = ()>>(what: &str, body: F) {
    sweep_once();
    println!("eptest: {what} through a real sshd to the system libvirtd");
    if tokio::time::timeout(TEST_BUDGET, body).await.is_err() {
        panic!("{what} did not finish within {TEST_BUDGET:?}; its guards cleaned up");
    }
}

fn id_of(entry: &str, h: &HostConfig, u: &ProxyUid) -> ProviderId {
    ProviderId {
        entry: entry.into(),
        host: h.name.clone(),
        name: names::domain(entry, u),
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_maps_a_real_domain_through_running_paused_stopped_and_vanished() {
    // finding: M1, H3, L6
    run("get state mapping", async {
        let entry = unique_entry();
        let u = uid(1);
        let name = names::domain(&entry, &u);
        let h = host("default");
        let id = id_of(&entry, &h, &u);
        let mut g = Some(DomainGuard::define(
            &name,
            &domain_xml(&name, &mark::render(&u, &entry, SystemTime::now()), ""),
        ));
        let (_sshd, c) = connect().await;

        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert!(
            matches!(inst.state, InstanceState::Stopped { .. }),
            "{:?}",
            inst.state
        );

        virsh_ok(&["start", &name]);
        // Running, agent channel present but no agent in the guest (libvirt: code 86).
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert_eq!(inst.state, InstanceState::Provisioning);
        assert_eq!(inst.ip, None);
        assert_eq!(inst.mac, names::mac(&entry, &u));

        virsh_ok(&["suspend", &name]);
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        let InstanceState::Paused { reason } = &inst.state else {
            panic!("a suspended domain must be Paused, got {:?}", inst.state);
        };
        assert!(reason.contains("user"), "{reason}");

        virsh_ok(&["destroy", &name]);
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert_eq!(
            inst.state,
            InstanceState::Stopped {
                reason: "shut off: destroyed".into()
            }
        );

        drop(g.take());
        let e = get::get(&c, &entry, None, &h, &id, &u).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::NotFound, "{e}");
        assert_eq!(e.libvirt_code, Some(42));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_a_real_domain_with_checkpoints_and_its_volumes_but_not_the_base() {
    // finding: L5, M3
    run("delete", async {
        let entry = unique_entry();
        let pool = PoolGuard::create(&entry);
        let h = host(&pool.name);
        let u = uid(2);
        let name = names::domain(&entry, &u);
        let (overlay, seed) = (names::overlay(&entry, &u), names::seed(&entry, &u));
        let base = format!(
            "{}img-test-{}.qcow2",
            names::base_prefix(&entry),
            "a".repeat(64)
        );
        println!("eptest: volumes {overlay}, {seed}, {base} in {}", pool.name);
        pool.vol(&base, "qcow2");
        pool.vol(&overlay, "qcow2");
        pool.vol(&seed, "raw");
        let disk = format!(
            "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
             <source file='{}'/><target dev='vda' bus='virtio'/></disk>",
            pool.dir.join(&overlay).display()
        );
        let _g = DomainGuard::define(
            &name,
            &domain_xml(&name, &mark::render(&u, &entry, SystemTime::now()), &disk),
        );
        // The seed's scenario: an admin's (or a backup tool's) checkpoint and snapshot
        // metadata, which make an undefine without those flags fail with code 55.
        let dump = virsh_ok(&["dumpxml", &name]);
        let cp = std::env::temp_dir().join(format!("{entry}-cp.xml"));
        std::fs::write(
            &cp,
            format!(
                "<domaincheckpoint><name>cp1</name><creationTime>1700000000</creationTime>\
                 <disks><disk name='vda' checkpoint='bitmap'/></disks>{dump}</domaincheckpoint>"
            ),
        )
        .unwrap();
        let out = virsh(&[
            "checkpoint-create",
            &name,
            cp.to_str().unwrap(),
            "--redefine",
        ]);
        let _ = std::fs::remove_file(&cp);
        assert!(
            out.status.success(),
            "checkpoint redefine: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let plain = virsh(&["undefine", &name]);
        assert!(
            !plain.status.success(),
            "precondition: a plain undefine must fail on a domain with checkpoints"
        );

        let (_sshd, c) = connect().await;
        delete::delete(&c, &entry, None, &h, &u).await.unwrap();
        assert!(
            !virsh(&["dominfo", &name]).status.success(),
            "the domain is still defined"
        );
        assert!(!pool.has(&overlay), "overlay left behind");
        assert!(!pool.has(&seed), "seed left behind");
        assert!(pool.has(&base), "the base was deleted");

        // No domain any more, volumes recreated (a failed create's leftovers): removed too.
        pool.vol(&overlay, "qcow2");
        pool.vol(&seed, "raw");
        delete::delete(&c, &entry, None, &h, &u).await.unwrap();
        assert!(!pool.has(&overlay) && !pool.has(&seed));
        assert!(pool.has(&base), "the base was deleted");
        // Idempotent.
        delete::delete(&c, &entry, None, &h, &u).await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_destroys_a_running_real_domain_before_undefining_it() {
    run("delete running", async {
        let entry = unique_entry();
        let pool = PoolGuard::create(&entry);
        let h = host(&pool.name);
        let u = uid(3);
        let name = names::domain(&entry, &u);
        let _g = DomainGuard::define(
            &name,
            &domain_xml(&name, &mark::render(&u, &entry, SystemTime::now()), ""),
        );
        virsh_ok(&["start", &name]);
        let (_sshd, c) = connect().await;
        delete::delete(&c, &entry, None, &h, &u).await.unwrap();
        assert!(!virsh(&["dominfo", &name]).status.success());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_refuses_a_real_domain_named_like_ours_with_another_uids_mark() {
    // finding: M2
    run("delete refuses", async {
        let entry = unique_entry();
        let pool = PoolGuard::create(&entry);
        let h = host(&pool.name);
        let u = uid(4);
        let name = names::domain(&entry, &u);
        let (overlay, seed) = (names::overlay(&entry, &u), names::seed(&entry, &u));
        pool.vol(&overlay, "qcow2");
        pool.vol(&seed, "raw");
        let _g = DomainGuard::define(
            &name,
            &domain_xml(
                &name,
                &mark::render(&uid(0xee), &entry, SystemTime::now()),
                "",
            ),
        );
        virsh_ok(&["start", &name]);
        let (_sshd, c) = connect().await;

        let e = get::get(&c, &entry, None, &h, &id_of(&entry, &h, &u), &u)
            .await
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::NotFound, "{e}");

        let e = delete::delete(&c, &entry, None, &h, &u).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{e}");
        assert!(e.message.contains("refusing to delete domain"), "{e}");
        let state = virsh_ok(&["domstate", &name]);
        assert_eq!(state.trim(), "running", "the foreign domain was touched");
        assert!(
            pool.has(&overlay) && pool.has(&seed),
            "its volumes were touched"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_owned_on_real_libvirt_skips_padded_and_foreign_namespace_marks() {
    // finding: E2, M18
    run("list_owned", async {
        let entry = unique_entry();
        let (a, b, f) = (uid(5), uid(6), uid(7));
        let t = "2026-11-29T10:00:00Z";
        let (na, nb, nf) = (
            names::domain(&entry, &a),
            names::domain(&entry, &b),
            names::domain(&entry, &f),
        );
        // Ours, dated in the future (reads as now).
        let _ga = DomainGuard::define(
            &na,
            &domain_xml(
                &na,
                &raw_mark(
                    mark::NAMESPACE,
                    &a.canonical(),
                    &entry,
                    "2099-01-01T00:00:00Z",
                ),
                "",
            ),
        );
        // A padded UID in our namespace (E2): libvirt keeps the text as written.
        let _gb = DomainGuard::define(
            &nb,
            &domain_xml(
                &nb,
                &raw_mark(mark::NAMESPACE, &format!("\n  {b} "), &entry, t),
                "",
            ),
        );
        // Our mark's content under a foreign namespace (M18).
        let _gf = DomainGuard::define(
            &nf,
            &domain_xml(
                &nf,
                &raw_mark("https://kvm.example/v1", &f.canonical(), &entry, t),
                "",
            ),
        );
        let padded = virsh_ok(&["metadata", &nb, mark::NAMESPACE]);
        assert!(
            padded.contains(&format!("\n  {b} ")),
            "libvirt changed the text: {padded}"
        );

        let (_sshd, c) = connect().await;
        let before = SystemTime::now();
        let got = list::list_owned(&c, &entry, None, "local").await.unwrap();
        let after = SystemTime::now();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].uid, a);
        assert_eq!(got[0].id.name, na);
        assert!(got[0].name_matches_uid);
        assert!(got[0].created_at >= before - Duration::from_secs(1) && got[0].created_at <= after);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_libvirt_keeps_the_restamp_of_a_future_mark_in_the_live_and_persistent_definition() {
    // finding: L9
    run("restamping future marks", async {
        let entry = unique_entry();
        let (a, r) = (uid(8), uid(9));
        let (na, nr) = (names::domain(&entry, &a), names::domain(&entry, &r));
        let far = "2099-01-01T00:00:00Z";
        let _ga = DomainGuard::define(
            &na,
            &domain_xml(
                &na,
                &raw_mark(mark::NAMESPACE, &a.canonical(), &entry, far),
                "",
            ),
        );
        let _gr = DomainGuard::define(
            &nr,
            &domain_xml(
                &nr,
                &raw_mark(mark::NAMESPACE, &r.canonical(), &entry, far),
                "",
            ),
        );
        virsh_ok(&["start", &nr]);
        let (_sshd, c) = connect().await;
        let got = list::list_owned(&c, &entry, None, "local").await.unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        let now = SystemTime::now();
        for (name, u, places) in [
            (&na, a, &["--config"][..]),
            (&nr, r, &["--config", "--live"][..]),
        ] {
            let listed = got.iter().find(|o| o.uid == u).unwrap().created_at;
            for place in places {
                let stored = virsh_ok(&["metadata", name, mark::NAMESPACE, place]);
                println!("eptest: {name} {place}: {stored}");
                let m = mark::parse(&stored, &entry, now)
                    .unwrap_or_else(|| panic!("not a mark after the restamp: {stored}"));
                assert_eq!(
                    (m.uid, m.recorded_at),
                    (u, listed),
                    "{name} {place}: {stored}"
                );
            }
        }
        // Restamped once: a later listing on a new connection reports the same times.
        let (_sshd2, c2) = connect().await;
        let again = list::list_owned(&c2, &entry, None, "local").await.unwrap();
        for o in &got {
            let same = again.iter().find(|x| x.uid == o.uid).unwrap();
            assert_eq!(same.created_at, o.created_at);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_libvirt_keeps_the_installation_rewrite_of_a_mark_without_one_and_never_writes_another_installations()
 {
    run("adopting marks without an installation ID", async {
        let entry = unique_entry();
        let (a, r, f) = (uid(10), uid(11), uid(12));
        let (na, nr, nf) = (
            names::domain(&entry, &a),
            names::domain(&entry, &r),
            names::domain(&entry, &f),
        );
        let t = "2026-11-29T10:00:00Z";
        // Marks in today's format (no installation), one domain running.
        let _ga = DomainGuard::define(
            &na,
            &domain_xml(
                &na,
                &raw_mark(mark::NAMESPACE, &a.canonical(), &entry, t),
                "",
            ),
        );
        let _gr = DomainGuard::define(
            &nr,
            &domain_xml(
                &nr,
                &raw_mark(mark::NAMESPACE, &r.canonical(), &entry, t),
                "",
            ),
        );
        // Another installation's mark.
        let theirs = mark::render_for(&f, &entry, Some("site-b"), SystemTime::now());
        let _gf = DomainGuard::define(&nf, &domain_xml(&nf, &theirs, ""));
        virsh_ok(&["start", &nr]);
        let their_before = virsh_ok(&["metadata", &nf, mark::NAMESPACE, "--config"]);

        let (_sshd, c) = connect().await;
        let got = list::list_owned(&c, &entry, Some("site-a"), "local")
            .await
            .unwrap();
        let mut uids: Vec<ProxyUid> = got.iter().map(|o| o.uid).collect();
        uids.sort();
        let mut want = vec![a, r];
        want.sort();
        assert_eq!(uids, want, "{got:?}");
        let now = SystemTime::now();
        let recorded = mark::parse(
            &raw_mark(mark::NAMESPACE, &a.canonical(), &entry, t),
            &entry,
            now,
        )
        .unwrap()
        .recorded_at;
        for (name, u, places) in [
            (&na, a, &["--config"][..]),
            (&nr, r, &["--config", "--live"][..]),
        ] {
            for place in places {
                let stored = virsh_ok(&["metadata", name, mark::NAMESPACE, place]);
                println!("eptest: {name} {place}: {stored}");
                let m = mark::parse(&stored, &entry, now)
                    .unwrap_or_else(|| panic!("not a mark after the rewrite: {stored}"));
                assert_eq!(
                    (m.uid, m.recorded_at, m.installation.as_deref()),
                    (u, recorded, Some("site-a")),
                    "{name} {place}: {stored}"
                );
            }
        }
        assert_eq!(
            virsh_ok(&["metadata", &nf, mark::NAMESPACE, "--config"]),
            their_before,
            "another installation's mark is never written"
        );
        // Our own now: a later listing on a new connection keeps the recorded age.
        let (_sshd2, c2) = connect().await;
        let again = list::list_owned(&c2, &entry, Some("site-a"), "local")
            .await
            .unwrap();
        assert!(again.iter().all(|o| o.created_at == recorded), "{again:?}");
    })
    .await;
}
