//! Anti-spoofing on a guest's NIC, proven with traffic from a real guest on the REAL
//! libvirtd: the Debian guest image of `scripts/build-guest-image` (built once by
//! `.ci/setup-host`; this test's own copy of it is the backing file) boots with the
//! provider's filter set on its NIC and the parameters the provider gives a DHCP guest, and
//! runs a script of ours that, every second, sends from its leased address (the control),
//! from a second address it adds to its NIC, from its leased address with the DHCP server
//! port, and an ARP reply claiming another address. A sniffer on the network's bridge (the
//! other side of the guest's tap) records what passed the filter: the control must arrive,
//! nothing forged may.
//!
//! Network isolation: the test re-executes itself inside the network namespace libvirtd
//! runs in (`.ci/setup-host`); the isolated network (no forward), its bridge, the guest's tap
//! and the sniffer all live there, and every packet stays on that bridge.
//!
//! Resources (finding M19): unique `eptest-…` names printed first; guards remove the
//! domain, its filters, the network, the pool and the temporary files on every path; a sweep
//! removes old leftovers. Fails, never skips, without libvirtd or the image.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::caps;
use egress_provider::libvirt::config::{
    Firmware, GuestSettings, ImageFormat, ProxyPolicy, VirtType,
};
use egress_provider::libvirt::domain_xml::{self, Backing, DiskSource, DomainSpec, Nic, NicAttach};
use egress_provider::libvirt::names;
use egress_provider::libvirt::nwfilter::{self, HostFilter};
use egress_provider::libvirt::seed::{self, SeedInput};
use ep_test_support::cleanup::{self, PoolFixture, now_secs, random_u32};
use ep_test_support::e2e::{
    EntryGuard, LIBVIRT_NETNS, NetGuard, build_image, reexec_in_netns, sweep,
};
use libvirt_remote::{Client, OpenOptions, transport};

const IN_NETNS_ENV: &str = "EPTEST_SPOOF_IN_NETNS";
/// The whole test, inside the namespace.
// NB: one TCG guest boots to cloud-init's final stage in ~40 s on a quiet machine and took
// up to ~5 min beside other suites' guests; 20 minutes is far above and inside CI's budget.
const TEST_BUDGET: Duration = Duration::from_secs(20 * 60);
/// From the domain's start to the guest's first control packet on the bridge.
const BOOT_BUDGET: Duration = Duration::from_secs(15 * 60);
/// Rounds of the guest's script seen after the first control packet before judging.
const ROUNDS: usize = 8;
/// The UDP port the guest sends its packets to (on the bridge's address).
const PORT: u16 = 9999;
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn test_name() -> &'static str {
    "a_guest_cannot_send_from_an_undeclared_address_claim_one_by_arp_or_answer_dhcp"
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

async fn client() -> Client {
    let t = transport::unix::connect(transport::DEFAULT_SOCKET, transport::DEFAULT_DIAL_TIMEOUT)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "libvirtd unreachable ({e}): run `bash .ci/setup-host`; these tests fail, not skip"
            )
        });
    Client::open(t, OpenOptions::default()).await.unwrap()
}

/// The guest's script: find the NIC with `mac`, wait for its DHCP address, then once a
/// second send four kinds of packet to the bridge (`gw`): `legit` from the lease, `alias`
/// from a second address added to the NIC, `dhcpd` from the lease with source port 67, and
/// an ARP reply claiming `victim` (sender MAC: the NIC's own).
fn guest_script(mac: &str, gw: &str, alias: &str, victim: &str) -> String {
    format!(
        r#"import fcntl, socket, struct, subprocess, time
MAC = "{mac}"
GW = "{gw}"
ALIAS = "{alias}"
VICTIM = "{victim}"
PORT = {PORT}

def nic():
    for name in socket.if_nameindex():
        try:
            with open("/sys/class/net/%s/address" % name[1]) as f:
                if f.read().strip() == MAC:
                    return name[1]
        except OSError:
            pass
    return None

def lease(ifname):
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", ifname],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if addr != ALIAS:
            return addr
    return None

def send_from(src, sport, tag):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((src, sport))
        s.sendto(tag.encode(), (GW, PORT))
    except OSError as e:
        print("send", tag, e, flush=True)
    finally:
        s.close()

def arp_reply(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((ifname, 0))
    mac = bytes.fromhex(MAC.replace(":", ""))
    eth = b"\xff" * 6 + mac + b"\x08\x06"
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) + mac + socket.inet_aton(VICTIM) \
        + b"\xff" * 6 + socket.inet_aton(VICTIM)
    s.send(eth + arp)
    s.close()

ifname = None
while ifname is None:
    ifname = nic()
    time.sleep(1)
addr = None
while addr is None:
    addr = lease(ifname)
    time.sleep(1)
subprocess.run(["ip", "addr", "add", ALIAS + "/32", "dev", ifname])
print("spoof: nic", ifname, "lease", addr, flush=True)
for _ in range(3600):
    send_from(addr, 0, "legit")
    send_from(ALIAS, 0, "alias")
    send_from(addr, 67, "dhcpd")
    arp_reply(ifname)
    time.sleep(1)
"#
    )
}

fn user_data(script: &str) -> String {
    let mut out = String::from(
        "#cloud-config\nwrite_files:\n  - path: /root/spoof.py\n    permissions: '0700'\n    content: |\n",
    );
    for l in script.lines() {
        out.push_str("      ");
        out.push_str(l);
        out.push('\n');
    }
    out.push_str("runcmd:\n  - [sh, -c, 'nohup python3 /root/spoof.py >/root/spoof.log 2>&1 &']\n");
    out
}

/// The sniffer on the bridge: one line per frame from `mac`: `udp SRC SPORT TAG` or
/// `arp OP SENDER`.
const SNIFFER: &str = r#"import socket, struct, sys
bridge, mac = sys.argv[1], bytes.fromhex(sys.argv[2].replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
s.bind((bridge, 0))
while True:
    f = s.recv(2048)
    if f[6:12] != mac:
        continue
    t = struct.unpack("!H", f[12:14])[0]
    if t == 0x0806:
        op = struct.unpack("!H", f[20:22])[0]
        print("arp", op, socket.inet_ntoa(f[28:32]), flush=True)
    elif t == 0x0800 and f[23] == 17:
        ihl = (f[14] & 15) * 4
        sport, dport = struct.unpack("!HH", f[14 + ihl:18 + ihl])
        if dport == PORT:
            print("udp", socket.inet_ntoa(f[26:30]), sport, f[22 + ihl:].decode(errors="replace"), flush=True)
"#;

#[test]
fn a_guest_cannot_send_from_an_undeclared_address_claim_one_by_arp_or_answer_dhcp() {
    if std::env::var_os(IN_NETNS_ENV).is_none() {
        reexec_in_netns(
            LIBVIRT_NETNS,
            test_name(),
            TEST_BUDGET + Duration::from_secs(60),
            &[(IN_NETNS_ENV, "1".into())],
        );
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(TEST_BUDGET, inside())
            .await
            .expect("test body exceeded its budget; guards cleaned up");
    });
}

async fn inside() {
    sweep("eptest-");
    let image = build_image(&repo_root());
    let g = EntryGuard {
        entry: format!("eptest-{}-{:08x}", now_secs(), random_u32()),
    };
    println!("eptest: entry {}", g.entry);
    let c = client().await;
    let net = NetGuard::create("spoof");
    let pool = PoolFixture::create("spoof");
    let tmp = tempfile::tempdir().unwrap();

    // Our own copy of the image as the backing file (never a file another test reads).
    let base = pool.file("base.qcow2");
    std::fs::copy(&image.path, &base).unwrap();
    let root = pool.file("root.qcow2");
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&base)
        .arg(&root)
        .arg("4G")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let u = ProxyUid(uuid::Uuid::new_v4());
    let mac = names::mac(&g.entry, &u);
    let (gw, alias, victim) = (net.ip(1), net.ip(250), net.ip(251));
    let script = guest_script(
        &mac,
        &gw.to_string(),
        &alias.to_string(),
        &victim.to_string(),
    );
    let ud = user_data(&script);
    let guest = GuestSettings {
        install_guest_agent: false,
        vendor_data: None,
    };
    let seed_img = seed::build(&SeedInput {
        instance_id: &u,
        hostname: "spoof",
        user_data: &ud,
        network_config: None,
        guest: &guest,
    })
    .unwrap();
    let seed_path = pool.file("seed.iso");
    std::fs::write(&seed_path, &seed_img.image).unwrap();

    // The provider's filter set, as a create defines it for a DHCP guest on this network.
    let fname = names::nwfilter(&g.entry, None);
    let resolvers = [std::net::IpAddr::V4(gw)];
    let set = nwfilter::render_set(
        &fname,
        &HostFilter {
            policy: &ProxyPolicy::default(),
            host_addresses: &[],
            resolvers: &resolvers,
        },
    );
    nwfilter::ensure_set(&c, "local", &set).await.unwrap();
    let params = nwfilter::nic_params(&mac, &[], &[]);

    let hc = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
        .await
        .unwrap();
    let dom_name = names::domain(&g.entry, &u);
    println!(
        "eptest: domain {dom_name} (MAC {mac}) on network {}",
        net.name
    );
    let root_s = root.to_str().unwrap().to_owned();
    let base_s = base.to_str().unwrap().to_owned();
    let seed_s = seed_path.to_str().unwrap().to_owned();
    let dxml = domain_xml::build(
        &DomainSpec {
            name: &dom_name,
            uuid: None,
            vcpus: 1,
            memory_mib: 768,
            firmware: Firmware::Uefi,
            root: DiskSource::File(&root_s),
            backing: Some(Backing {
                path: &base_s,
                format: ImageFormat::Qcow2,
                below: None,
            }),
            seed: DiskSource::File(&seed_s),
            nic: Some(Nic {
                attach: NicAttach::Network(&net.name),
                mac: &mac,
                filter: Some(&fname),
                filter_params: &params,
            }),
            uid: &u,
            entry: &g.entry,
            created_at: SystemTime::now(),
            installation: None,
            addresses: &[],
        },
        &hc,
    )
    .unwrap();
    assert!(
        dxml.contains("<parameter name=\"CTRL_IP_LEARNING\" value=\"dhcp\"/>")
            || dxml.contains("<parameter name='CTRL_IP_LEARNING' value='dhcp'/>"),
        "{dxml}"
    );

    // The sniffer first, so the first packets are seen.
    let sniffer = tmp.path().join("sniff.py");
    std::fs::write(&sniffer, SNIFFER.replace("PORT", &PORT.to_string())).unwrap();
    let mut sniff = Command::new("python3")
        .arg(&sniffer)
        .args([&net.bridge, &mac])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = sniff.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(lines).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });

    let dom = c.domain_define_xml(&dxml, 0).await.unwrap();
    c.domain_create(&dom).await.unwrap();
    let t0 = Instant::now();

    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut lease: Option<String> = None;
    let mut rounds = 0usize;
    while rounds < ROUNDS {
        let left = BOOT_BUDGET.saturating_sub(t0.elapsed());
        assert!(
            !left.is_zero(),
            "no control packet from the guest's lease within {BOOT_BUDGET:?}; seen: {seen:?}"
        );
        let Ok(l) = rx.recv_timeout(left.min(Duration::from_secs(5))) else {
            continue;
        };
        *seen.entry(l.clone()).or_default() += 1;
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&"udp") && f.get(3) == Some(&"legit") {
            if lease.is_none() {
                println!(
                    "eptest: timing: first control packet {:?} after start",
                    t0.elapsed()
                );
                lease = f.get(1).map(|s| (*s).to_owned());
            }
            rounds += 1;
        }
    }
    let _ = sniff.kill();
    let _ = sniff.wait();
    let lease = lease.unwrap();
    println!("eptest: the guest's lease {lease}; frames seen: {seen:?}");

    // The control: the guest's own traffic passes (also its ARP for its lease).
    assert!(
        seen.keys()
            .any(|k| k.starts_with("arp ") && k.ends_with(&format!(" {lease}"))),
        "the guest's own ARP passes: {seen:?}"
    );
    // Nothing forged does.
    for k in seen.keys() {
        assert!(
            !k.contains("alias"),
            "a packet from the undeclared {alias} passed: {k}"
        );
        assert!(!k.contains("dhcpd"), "a DHCP-server packet passed: {k}");
        assert!(
            !k.ends_with(&format!(" {victim}")),
            "an ARP reply claiming {victim} passed: {k}"
        );
        assert!(
            !k.starts_with("udp ") || k.starts_with(&format!("udp {lease} ")),
            "a packet from an address other than the lease passed: {k}"
        );
    }
    c.domain_destroy(&dom, 0).await.unwrap();
    c.close();
    drop(tmp);
    drop(pool);
    drop(net);
    drop(g);
    let _ = cleanup::keep_requested();
}
