//! The provider's address, list and check paths against the REAL libvirtd on this machine,
//! reached through a real OpenSSH sshd on 127.0.0.1 (ep_test_support), for the behaviours that
//! were shown only against libvirt-fake: the address from a libvirt network's DHCP lease and
//! from the host's ARP table (only for our NIC's MAC), a link frozen or cut in the middle of
//! `list_owned` or of an address read (never a partial list, never "no address"), and the host
//! check while the pool is busy with a clone or an upload.
//!
//! No packet leaves the host: the networks are isolated (no `<forward>`, IPv4 only, in the
//! 198.18.0.0/15 benchmark range), every guest NIC has `<link state='down'/>` and no boot ROM,
//! and the guests have no disk (nothing boots). Leases are written where libvirt reads them
//! (`/var/lib/libvirt/dnsmasq/<bridge>.status`); neighbours are added as `stale` entries
//! (libvirt's ARP source keeps only STALE and REACHABLE ones), which sends nothing.
//!
//! Every name is printed before the resource exists; guards remove neighbours, lease files,
//! networks, domains, pools and directories with `ip`/`virsh` on every exit path; a sweep at
//! the start removes this suite's leftovers older than [`SWEEP_AGE`] (finding M19). These
//! tests fail, never skip, when libvirtd or sshd is missing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime};

use egress_provider::libvirt::check::check_host;
use egress_provider::libvirt::config::{HostConfig, LibvirtEntry, Timeouts, VirtType};
use egress_provider::libvirt::hostpool::{HostPool, PoolOptions, SshConnector};
use egress_provider::libvirt::ops::{address, get, list, trust};
use egress_provider::libvirt::{mark, names};
use egress_provider::{ErrorClass, HostState, InstanceState, ProviderId, ProxyUid};
use ep_test_support::cleanup::{
    self, PoolFixture, SWEEP_AGE, VIRSH_TIMEOUT_SECS, VIRSH_URI, age_of, name_at, names_from,
    now_secs, random_u32, virsh, virsh_ok,
};
use ep_test_support::relay::Relay;
use ep_test_support::sshd::Sshd;
use libvirt_remote::transport::ssh::{self, HostKeySource, SshOptions, SshTarget};
use libvirt_remote::{Client, ConnectionConfig, OpenOptions, UploadOptions};

/// How long one test body may run before it fails (its guards then clean up).
// NB: the slowest body defines and lists 150 domains (a few seconds) and waits out one call
// deadline per cut; the busy-pool body waits for a ~5 s clone. Three minutes leaves room on
// a loaded 2-core box.
const TEST_BUDGET: Duration = Duration::from_secs(180);
/// Call deadline of the clients whose link the tests freeze.
// NB: a frozen link fails every in-flight call at this deadline (or earlier, when keepalive
// gives up); 5 s keeps the tests short while being far above a healthy call here (~1 ms).
const CUT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Domains of the test's entry that `list_owned` must read (finding M15's scenario: a list
/// long enough that a link dying part-way would leave a partial one).
const LIST_DOMAINS: u8 = 150;
/// Calls the listing client must have sent before the link is frozen or cut: the domain
/// listing plus some mark reads, well short of the 150+ the list needs.
const CUT_AFTER_CALLS: u64 = 20;
/// Poll interval while waiting for that many calls (the list takes tens of milliseconds).
const CALL_POLL: Duration = Duration::from_millis(1);
/// Lifetime of the leases the tests write (libvirt skips expired ones).
const LEASE_SECS: u64 = 3600;
/// Subnets tried before a network is given up (parallel runs pick random /24s).
const SUBNET_ATTEMPTS: usize = 16;
/// Size of the sparse volume the busy-pool test clones.
// NB: libvirtd copies a sparse raw volume at ~0.4 GiB/s here (measured: 8 GiB in 20 s) and
// writes nothing for holes, so 2 GiB keeps the pool busy for ~5 s without using disk space,
// far longer than one check (~0.3 s).
const CLONE_SOURCE_BYTES: u64 = 2 << 30;
/// Poll interval while waiting for the clone to make libvirtd refuse refreshes.
const BUSY_POLL: Duration = Duration::from_millis(20);
/// Bytes of the upload kept in progress while the host is checked.
const UPLOAD_BYTES: usize = 1 << 20;
/// Where libvirt's network driver reads a bridge's DHCP leases.
const DNSMASQ_DIR: &str = "/var/lib/libvirt/dnsmasq";
/// The network namespace `.ci/setup-host` starts libvirtd in: its bridges (and so their
/// neighbour tables, which libvirt's ARP source reads) live there, not in ours.
const LIBVIRT_NETNS: &str = "egress-proxies";

// ---------------------------------------------------------------- names and sweep

/// A unique entry name `eptest-<test>-<secs>-<random>`, printed.
fn unique_entry(test: &str) -> String {
    let e = name_at(test, now_secs());
    println!("eptest: entry {e}");
    e
}

/// The entry of a domain named `ep-<entry>-<uid>` by these tests.
fn entry_of_domain(name: &str) -> Option<&str> {
    name.strip_prefix(names::PREFIX)?
        .rsplit_once('-')
        .map(|(e, _)| e)
}

/// Removes this suite's leftover networks and domains older than [`SWEEP_AGE`] (plus the
/// shared sweep of pools and directories), once per process.
fn sweep_once() {
    static SWEEP: Once = Once::new();
    cleanup::sweep_once();
    SWEEP.call_once(|| {
        let old = |n: &str| age_of(n).is_some_and(|a| a > SWEEP_AGE);
        for n in names_from(&["net-list", "--all", "--name"]) {
            if n.starts_with(cleanup::PREFIX) && old(&n) {
                println!("eptest: sweeping leftover network {n}");
                let _ = virsh(&["net-destroy", &n]);
                let _ = virsh(&["net-undefine", &n]);
            }
        }
        for d in cleanup::domain_names() {
            if entry_of_domain(&d).is_some_and(old) {
                println!("eptest: sweeping leftover domain {d}");
                cleanup::remove_domain(&d);
            }
        }
    });
}

async fn run<F: std::future::Future<Output = ()>>(what: &str, body: F) {
    sweep_once();
    println!("eptest: {what} through a real sshd to the system libvirtd");
    if tokio::time::timeout(TEST_BUDGET, body).await.is_err() {
        panic!("{what} did not finish within {TEST_BUDGET:?}; its guards cleaned up");
    }
}

// ---------------------------------------------------------------- guards

/// An isolated, transient libvirt network `eptest-…` on bridge `eptbr<hex>` with a DHCP range
/// in 198.18.0.0/15; on drop: its neighbours and lease file removed, the network destroyed.
struct NetGuard {
    name: String,
    bridge: String,
    /// The first three octets of the /24.
    prefix: [u8; 3],
    neighbours: Vec<Ipv4Addr>,
}

impl NetGuard {
    fn create(test: &str) -> Self {
        for _ in 0..SUBNET_ATTEMPTS {
            let name = name_at(test, now_secs());
            let bridge = format!("eptbr{:08x}", random_u32());
            let r = random_u32();
            let prefix = [198, 18 + (r & 1) as u8, (r >> 8) as u8];
            let [a, b, c] = prefix;
            println!("eptest: creating network {name} (bridge {bridge}, {a}.{b}.{c}.0/24)");
            let xml = format!(
                "<network><name>{name}</name><bridge name='{bridge}' stp='off'/>\
                 <ip address='{a}.{b}.{c}.1' netmask='255.255.255.0'>\
                 <dhcp><range start='{a}.{b}.{c}.10' end='{a}.{b}.{c}.200'/></dhcp></ip>\
                 </network>"
            );
            let file = std::env::temp_dir().join(format!("{name}.xml"));
            std::fs::write(&file, xml).unwrap();
            let g = Self {
                name,
                bridge,
                prefix,
                neighbours: Vec::new(),
            };
            let out = virsh(&["net-create", file.to_str().unwrap()]);
            let _ = std::fs::remove_file(&file);
            if out.status.success() {
                return g;
            }
            // NB: most likely the /24 is in use by a parallel run; try another.
            println!(
                "eptest: network {} not created: {}",
                g.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        panic!("no isolated network could be created in {SUBNET_ATTEMPTS} attempts");
    }

    fn ip(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, host)
    }

    fn lease_file(&self) -> PathBuf {
        PathBuf::from(DNSMASQ_DIR).join(format!("{}.status", self.bridge))
    }

    /// Replaces the network's leases (as libvirt's leases helper writes them).
    fn set_leases(&self, leases: &[(Ipv4Addr, &str)]) {
        let expiry = now_secs() + LEASE_SECS;
        let items: Vec<String> = leases
            .iter()
            .map(|(ip, mac)| {
                format!(
                    "{{\"ip-address\":\"{ip}\",\"mac-address\":\"{mac}\",\"hostname\":\"eptest\",\
                     \"client-id\":\"01:{mac}\",\"expiry-time\":{expiry}}}"
                )
            })
            .collect();
        std::fs::write(self.lease_file(), format!("[{}]\n", items.join(","))).unwrap();
    }

    /// Adds a STALE neighbour `ip → mac` on the bridge (no packet is sent).
    fn add_neighbour(&mut self, ip: Ipv4Addr, mac: &str) {
        println!("eptest: neighbour {ip} lladdr {mac} dev {}", self.bridge);
        self.neighbours.push(ip);
        ip_ok(&[
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            mac,
            "dev",
            &self.bridge,
            "nud",
            "stale",
        ]);
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        for ip in &self.neighbours {
            let _ = ip_cmd(&["neigh", "del", &ip.to_string(), "dev", &self.bridge]);
        }
        let _ = std::fs::remove_file(self.lease_file());
        let _ = virsh(&["net-destroy", &self.name]);
        let _ = virsh(&["net-undefine", &self.name]);
    }
}

/// Runs `ip` in libvirtd's network namespace (where its bridges are) when `.ci/setup-host`
/// created it, else in ours (a libvirtd started by hand in the root namespace).
fn ip_cmd(args: &[&str]) -> std::process::Output {
    let in_ns: &[&str] = if std::path::Path::new("/run/netns")
        .join(LIBVIRT_NETNS)
        .exists()
    {
        &["-n", LIBVIRT_NETNS]
    } else {
        &[]
    };
    Command::new("timeout")
        .args([VIRSH_TIMEOUT_SECS, "ip"])
        .args(in_ns)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip (iproute2)")
}

fn ip_ok(args: &[&str]) {
    let out = ip_cmd(args);
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Domains undefined (all in a few `virsh` runs) when dropped.
struct DomainsGuard(Vec<String>);

impl DomainsGuard {
    fn push(&mut self, name: &str) {
        self.0.push(name.to_owned());
    }
}

impl Drop for DomainsGuard {
    fn drop(&mut self) {
        // NB: virsh runs every `;`-separated command even when one fails.
        for chunk in self.0.chunks(50) {
            let script = chunk
                .iter()
                .map(|d| {
                    format!(
                        "destroy {d}; undefine {d} --managed-save --snapshots-metadata \
                         --checkpoints-metadata --nvram"
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            let _ = virsh(&[&script]);
        }
    }
}

/// A child process of this test, waited for (never killed) on drop.
struct Waited(Child);

impl Drop for Waited {
    fn drop(&mut self) {
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------- fixtures

fn host(network: Option<&str>) -> HostConfig {
    HostConfig {
        name: "local".into(),
        address: "127.0.0.1:22".into(),
        user: "root".into(),
        socket: "/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        bridge: None,
        network: network.map(str::to_owned),
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
    ProxyUid::parse_strict(&format!("6f1c2a90-5b7d-4e3a-9c11-0a4b5c6d7e{n:02x}")).unwrap()
}

fn id_of(entry: &str, h: &HostConfig, u: &ProxyUid) -> ProviderId {
    ProviderId {
        entry: entry.into(),
        host: h.name.clone(),
        name: names::domain(entry, u),
    }
}

/// A MAC that is not ours (locally administered, fixed per test).
fn other_mac(n: u8) -> String {
    format!("52:54:00:ee:ee:{n:02x}")
}

/// A TCG domain with our mark, a guest-agent channel, no disk, and one NIC per MAC on
/// `network`, each with its link down and no boot ROM: nothing is ever sent on them.
fn nic_domain_xml(name: &str, marked: &str, network: &str, macs: &[&str]) -> String {
    let nics: String = macs
        .iter()
        .map(|m| {
            format!(
                "<interface type='network'><source network='{network}'/>\
                 <mac address='{m}'/><model type='virtio'/><link state='down'/>\
                 <rom enabled='no'/></interface>"
            )
        })
        .collect();
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>\
         <metadata>{marked}</metadata><on_poweroff>destroy</on_poweroff>\
         <devices>{nics}\
         <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         <memballoon model='none'/></devices></domain>"
    )
}

/// A TCG domain with our mark and no device worth the name (never started).
fn bare_domain_xml(name: &str, marked: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os><metadata>{marked}</metadata>\
         <devices><memballoon model='none'/></devices></domain>"
    )
}

/// Defines `xml` with virsh and starts it; the returned guard removes it.
fn define_and_start(name: &str, xml: &str) -> cleanup::DomainGuard {
    println!("eptest: defining domain {name}");
    let g = cleanup::DomainGuard {
        name: name.to_owned(),
    };
    let file = std::env::temp_dir().join(format!("{name}.xml"));
    std::fs::write(&file, xml).unwrap();
    let out = virsh(&["define", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "virsh define {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    virsh_ok(&["start", name]);
    g
}

fn open_options(call_timeout: Duration) -> OpenOptions {
    OpenOptions {
        connection: ConnectionConfig {
            call_timeout,
            ..ConnectionConfig::default()
        },
        ..OpenOptions::default()
    }
}

async fn open(sshd: &Sshd, target: SshTarget, call_timeout: Duration) -> Client {
    let t = ssh::connect(&target, &SshOptions::default())
        .await
        .unwrap_or_else(|e| panic!("SSH connect failed: {e}\nsshd log:\n{}", sshd.log()));
    Client::open(t, open_options(call_timeout))
        .await
        .unwrap_or_else(|e| panic!("libvirt open through sshd failed: {e}"))
}

/// The sshd's target reached through `relay` (known_hosts names the relay's port).
fn through(sshd: &Sshd, relay: &Relay) -> SshTarget {
    let kh = sshd.write_file(
        &format!("known_hosts_relay_{}", relay.port()),
        &format!(
            "[127.0.0.1]:{p} {}\n[127.0.0.1]:{p} {}\n",
            sshd.host_ed25519,
            sshd.host_rsa,
            p = relay.port()
        ),
    );
    SshTarget {
        host_keys: HostKeySource::KnownHostsFile(kh),
        ..sshd.target().with_port(relay.port())
    }
}

/// A client of the system libvirtd through `sshd` behind a fresh relay.
async fn relayed(sshd: &Sshd) -> (Relay, Client) {
    let relay = Relay::start(sshd.addr).await;
    let c = open(sshd, through(sshd, &relay), CUT_CALL_TIMEOUT).await;
    (relay, c)
}

/// Waits until `c` has sent `n` calls more than `base`.
async fn wait_for_calls(c: &Client, base: u64, n: u64) -> u64 {
    loop {
        let now = c.connection().stats().calls;
        if now >= base + n {
            return now;
        }
        tokio::time::sleep(CALL_POLL).await;
    }
}

// ---------------------------------------------------------------- address: DHCP lease

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_our_nics_address_from_the_real_networks_dhcp_lease_and_ignores_other_macs() {
    // finding: M14, H3, M22
    run("address from a DHCP lease", async {
        let net = NetGuard::create("paths-lease");
        let entry = unique_entry("paths-lease");
        let u = uid(1);
        let name = names::domain(&entry, &u);
        let ours = names::mac(&entry, &u);
        let other = other_mac(1);
        assert_ne!(ours, other);
        let _d = define_and_start(
            &name,
            &nic_domain_xml(
                &name,
                &mark::render(&u, &entry, SystemTime::now()),
                &net.name,
                &[&other, &ours],
            ),
        );
        let h = host(Some(&net.name));
        let id = id_of(&entry, &h, &u);
        let sshd = Sshd::start();
        let (relay, c) = relayed(&sshd).await;

        // No lease at all (agent channel present, no agent: code 86): no address yet.
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert_eq!(inst.state, InstanceState::Provisioning);
        assert_eq!(inst.ip, None);

        // A lease for the domain's OTHER NIC on the same network is not our address (M14).
        net.set_leases(&[(net.ip(55), &other)]);
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert_eq!(inst.ip, None, "the other NIC's lease was taken: {inst:?}");
        assert_eq!(inst.state, InstanceState::Provisioning);

        // Our MAC's lease, listed after the other one.
        net.set_leases(&[(net.ip(55), &other), (net.ip(66), &ours)]);
        let inst = get::get(&c, &entry, None, &h, &id, &u).await.unwrap();
        assert_eq!(inst.ip, Some(IpAddr::V4(net.ip(66))), "{inst:?}");
        assert!(
            matches!(inst.state, InstanceState::Running),
            "{:?}",
            inst.state
        );

        // The real network's subnets come from its XML (the test network's /24) ...
        let (subnets, cacheable) = trust::read(&c, &h).await;
        assert!(cacheable, "the network's XML was not read: {subnets:?}");
        let [a, b, cc] = net.prefix;
        assert_eq!(
            subnets.network,
            Some(vec![format!("{a}.{b}.{cc}.0/24").parse().unwrap()])
        );
        // ... and guestCidr narrows them: a lease outside it is not our address.
        let mut narrowed = h.clone();
        narrowed.guest_cidr = vec![format!("{}/32", net.ip(77))];
        let inst = get::get(&c, &entry, None, &narrowed, &id, &u)
            .await
            .unwrap();
        assert_eq!(
            inst.ip, None,
            "a lease outside guestCidr was taken: {inst:?}"
        );

        // The link freezes while the address is read: Transient, never "no address" (H3).
        let dom = c.domain_lookup_by_name(&name).await.unwrap();
        relay.freeze();
        let e = address::address(&c, &dom, &ours, &h).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{e}");
        assert!(e.message.contains(&name), "{e}");
        let e = get::get(&c, &entry, None, &h, &id, &u).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{e}");

        // The link is cut (relay gone, sockets closed) while the address is read (H3).
        let (relay2, c2) = relayed(&sshd).await;
        let dom = c2.domain_lookup_by_name(&name).await.unwrap();
        assert_eq!(
            address::address(&c2, &dom, &ours, &h).await.unwrap(),
            Some(IpAddr::V4(net.ip(66)))
        );
        drop(relay2);
        let e = address::address(&c2, &dom, &ours, &h).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{e}");
        drop(relay);
    })
    .await;
}

// ---------------------------------------------------------------- address: ARP

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_falls_back_to_the_hosts_arp_table_for_our_mac_only_on_the_real_daemon() {
    // finding: M14
    run("address from ARP", async {
        let mut net = NetGuard::create("paths-arp");
        let entry = unique_entry("paths-arp");
        let u = uid(2);
        let name = names::domain(&entry, &u);
        let ours = names::mac(&entry, &u);
        let other = other_mac(2);
        let _d = define_and_start(
            &name,
            &nic_domain_xml(
                &name,
                &mark::render(&u, &entry, SystemTime::now()),
                &net.name,
                &[&other, &ours],
            ),
        );
        // The network has no lease for anyone: the lease source answers, empty.
        net.set_leases(&[]);
        let on_network = host(Some(&net.name));
        let on_bridge = host(None);
        let id = id_of(&entry, &on_network, &u);
        let sshd = Sshd::start();
        let c = open(&sshd, sshd.target(), CUT_CALL_TIMEOUT).await;

        // Only the other NIC's neighbour is known: not our address.
        net.add_neighbour(net.ip(77), &other);
        for h in [&on_network, &on_bridge] {
            let inst = get::get(&c, &entry, None, h, &id, &u).await.unwrap();
            assert_eq!(
                inst.ip, None,
                "the other NIC's neighbour was taken: {inst:?}"
            );
            assert_eq!(inst.state, InstanceState::Provisioning);
        }

        net.add_neighbour(net.ip(88), &ours);
        for h in [&on_network, &on_bridge] {
            let inst = get::get(&c, &entry, None, h, &id, &u).await.unwrap();
            assert_eq!(inst.ip, Some(IpAddr::V4(net.ip(88))), "{inst:?}");
            assert!(matches!(inst.state, InstanceState::Running), "{inst:?}");
        }
    })
    .await;
}

// ---------------------------------------------------------------- list cut mid-way

/// Defines [`LIST_DOMAINS`] marked domains of `entry` through `c`, guarded by `g`.
async fn define_many(c: &Client, entry: &str, g: &mut DomainsGuard) {
    let now = SystemTime::now();
    for n in 0..LIST_DOMAINS {
        let u = uid(n);
        let name = names::domain(entry, &u);
        g.push(&name);
        c.domain_define_xml(&bare_domain_xml(&name, &mark::render(&u, entry, now)), 0)
            .await
            .unwrap_or_else(|e| panic!("defining {name}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_owned_fails_as_a_whole_when_the_real_link_freezes_or_is_cut_mid_list() {
    // finding: M15
    run("list cut mid-way", async {
        let entry = unique_entry("paths-list");
        println!(
            "eptest: defining {LIST_DOMAINS} domains {}…",
            names::domain(&entry, &uid(0))
        );
        let mut g = DomainsGuard(Vec::new());
        let sshd = Sshd::start();
        let direct = open(&sshd, sshd.target(), CUT_CALL_TIMEOUT).await;
        define_many(&direct, &entry, &mut g).await;

        // Precondition: through the relay, the whole list.
        let (relay, c) = relayed(&sshd).await;
        let all = list::list_owned(&c, &entry, None, "local").await.unwrap();
        assert_eq!(all.len(), usize::from(LIST_DOMAINS));
        assert!(all.iter().all(|i| i.name_matches_uid));

        // Frozen after the listing and some mark reads.
        for cut in [false, true] {
            let (relay, c) = relayed(&sshd).await;
            let base = c.connection().stats().calls;
            let task = tokio::spawn({
                let (c, entry) = (c.clone(), entry.clone());
                async move { list::list_owned(&c, &entry, None, "local").await }
            });
            let sent = wait_for_calls(&c, base, CUT_AFTER_CALLS).await;
            if cut {
                drop(relay);
            } else {
                relay.freeze();
            }
            println!(
                "eptest: link {} after {} calls",
                if cut { "cut" } else { "frozen" },
                sent - base
            );
            match task.await.unwrap() {
                Ok(v) => panic!(
                    "a list over a link {} mid-way returned Ok with {} of {LIST_DOMAINS}",
                    if cut { "cut" } else { "frozen" },
                    v.len()
                ),
                Err(e) => {
                    assert_eq!(e.class, ErrorClass::Transient, "{e}");
                    assert!(e.message.contains("local"), "{e}");
                }
            }
            let total = c.connection().stats().calls - base;
            assert!(
                total < 1 + u64::from(LIST_DOMAINS),
                "the list had finished ({total} calls) before the link was {}",
                if cut { "cut" } else { "frozen" }
            );
        }
        drop(relay);

        // The host itself is fine: a fresh link lists everything again.
        let again = list::list_owned(&direct, &entry, None, "local")
            .await
            .unwrap();
        assert_eq!(again.len(), usize::from(LIST_DOMAINS));
    })
    .await;
}

// ---------------------------------------------------------------- check while the pool is busy

fn entry_for(sshd: &Sshd, pool: &str) -> LibvirtEntry {
    let t = Timeouts::default();
    let h = HostConfig {
        name: "h1".into(),
        address: format!("127.0.0.1:{}", sshd.port),
        pool: pool.into(),
        ssh_key_file: Some(sshd.client_key_path.clone()),
        known_hosts_file: Some(sshd.known_hosts_path.clone()),
        ..host(None)
    };
    LibvirtEntry {
        name: "paths".into(),
        hosts: vec![h],
        images: BTreeMap::new(),
        url_images: Default::default(),
        max_image_bytes: 1 << 30,
        guest: Default::default(),
        timeouts: t,
        defaults: Default::default(),
        limits: Default::default(),
        policy: Default::default(),
        access: None,
        quotas: Default::default(),
    }
}

fn host_pool(sshd: &Sshd, pool: &str) -> HostPool {
    let e = entry_for(sshd, pool);
    let t = e.timeouts.clone();
    HostPool::new(e, Arc::new(SshConnector::new(&t)), PoolOptions::default()).unwrap()
}

/// Whether the pool's refresh is refused because jobs run in it (code 1, "asynchronous jobs").
async fn refresh_refused(c: &Client, pool: &libvirt_remote::proto::StoragePool) -> bool {
    match c.pool_refresh(pool).await {
        Ok(()) => false,
        Err(e) => {
            let r = e.remote().unwrap_or_else(|| panic!("refresh failed: {e}"));
            assert_eq!(r.code, 1, "{e}");
            assert!(r.message.contains("asynchronous jobs"), "{e}");
            true
        }
    }
}

/// Slack on top of the check's call deadline before the frozen-host assertion fails.
// NB: a loaded 2-core box; small next to the 30 s keepalive and 120 s inactivity fallbacks.
const REPORT_SLACK: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_host_whose_ssh_path_freezes_is_reported_by_the_next_check_within_its_call_deadline()
{
    // finding: M20 — the operator's part of the dead-host budget: a check round that starts
    // after the freeze reports the host within one check call's deadline (10 s), whatever
    // the keepalives have or have not noticed yet.
    run("check of a frozen host", async {
        let pool = PoolFixture::create("paths-frozen");
        let sshd = Sshd::start();
        let relay = Relay::start(sshd.addr).await;
        let mut e = entry_for(&sshd, &pool.name);
        let target = through(&sshd, &relay);
        if let HostKeySource::KnownHostsFile(kh) = &target.host_keys {
            e.hosts[0].known_hosts_file = Some(kh.clone());
        }
        e.hosts[0].address = format!("127.0.0.1:{}", relay.port());
        let t = e.timeouts.clone();
        let hp = HostPool::new(e, Arc::new(SshConnector::new(&t)), PoolOptions::default()).unwrap();
        let before = check_host(&hp, "h1").await;
        assert_eq!(before.state, HostState::Ready, "{before:?}");

        relay.freeze();
        let start = std::time::Instant::now();
        let budget = egress_provider::libvirt::check::DEFAULT_CHECK_CALL_TIMEOUT + REPORT_SLACK;
        let r = tokio::time::timeout(budget, check_host(&hp, "h1"))
            .await
            .unwrap_or_else(|_| panic!("the check of a frozen host took more than {budget:?}"));
        let took = start.elapsed();
        println!(
            "eptest: frozen host reported {:?} after {took:?}: {r:?}",
            r.state
        );
        assert!(
            matches!(r.state, HostState::Timeout | HostState::Unreachable),
            "{r:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_keeps_a_real_host_ready_with_its_last_pool_figures_while_a_clone_blocks_refresh() {
    run("check while the pool is busy", async {
        let pool = PoolFixture::create("paths-busy");
        let src = pool.file("src.img");
        std::fs::File::create(&src)
            .unwrap()
            .set_len(CLONE_SOURCE_BYTES)
            .unwrap();
        virsh_ok(&["pool-refresh", &pool.name]);
        let sshd = Sshd::start();
        let direct = open(&sshd, sshd.target(), CUT_CALL_TIMEOUT).await;
        let sp = direct.pool_lookup_by_name(&pool.name).await.unwrap();
        let hp = host_pool(&sshd, &pool.name);

        // Before: Ready with figures.
        let before = check_host(&hp, "h1").await;
        assert_eq!(before.state, HostState::Ready, "{before:?}");

        // A clone (a libvirt async job, as when an image is published) in progress.
        println!("eptest: cloning src.img to dst.img in {}", pool.name);
        let mut clone = Waited(
            Command::new("timeout")
                .args([VIRSH_TIMEOUT_SECS, "virsh", "-q", "-c", VIRSH_URI])
                .args(["vol-clone", "src.img", "dst.img", "--pool", &pool.name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        while !refresh_refused(&direct, &sp).await {
            if let Some(st) = clone.0.try_wait().unwrap() {
                panic!("the clone ended ({st}) before libvirtd refused a refresh");
            }
            tokio::time::sleep(BUSY_POLL).await;
        }
        let r = check_host(&hp, "h1").await;
        // The clone still runs after the check, so every refresh during it was refused.
        assert!(
            refresh_refused(&direct, &sp).await,
            "the clone ended during the check; raise CLONE_SOURCE_BYTES"
        );
        println!("eptest: check while busy: {r:?}");
        assert_eq!(r.state, HostState::Ready, "{r:?}");
        assert_eq!(r.error, None, "{r:?}");
        assert!(r.missing.is_empty(), "{r:?}");
        assert!(r.pool_free_bytes.is_some_and(|b| b > 0), "{r:?}");
        drop(clone);
        let _ = direct.pool_refresh(&sp).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_keeps_a_real_host_ready_while_an_upload_into_its_pool_is_in_progress() {
    run("check during an upload", async {
        let pool = PoolFixture::create("paths-upload");
        virsh_ok(&[
            "vol-create-as",
            &pool.name,
            "up.img",
            "8M",
            "--format",
            "raw",
        ]);
        let sshd = Sshd::start();
        let bulk = open(&sshd, sshd.target(), CUT_CALL_TIMEOUT).await;
        let direct = open(&sshd, sshd.target(), CUT_CALL_TIMEOUT).await;
        let sp = direct.pool_lookup_by_name(&pool.name).await.unwrap();
        let vol = bulk.vol_lookup_by_name(&sp, "up.img").await.unwrap();
        let hp = host_pool(&sshd, &pool.name);

        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        let upload = tokio::spawn({
            let (bulk, vol) = (bulk.clone(), vol.clone());
            async move {
                bulk.vol_upload(&vol, 0, 0, rx, &UploadOptions::default())
                    .await
            }
        });
        // Part of the data is on its way (the duplex holds 64 KiB, so the upload has read
        // the rest); the stream stays open.
        tokio::io::AsyncWriteExt::write_all(&mut tx, &vec![0x5a; UPLOAD_BYTES])
            .await
            .unwrap();
        let refused = refresh_refused(&direct, &sp).await;
        println!("eptest: libvirtd refuses a refresh during an upload: {refused}");
        let r = check_host(&hp, "h1").await;
        println!("eptest: check during the upload: {r:?}");
        assert!(!upload.is_finished(), "the upload ended before the check");
        assert_eq!(r.state, HostState::Ready, "{r:?}");
        assert_eq!(r.error, None, "{r:?}");
        assert!(r.pool_free_bytes.is_some_and(|b| b > 0), "{r:?}");
        drop(tx);
        let sent = upload.await.unwrap().unwrap();
        assert_eq!(sent, UPLOAD_BYTES as u64);
    })
    .await;
}
