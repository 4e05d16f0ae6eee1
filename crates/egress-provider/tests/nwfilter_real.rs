//! The guest NIC's network filter on the REAL libvirtd: the provider's filter document is
//! accepted, read back by `virsh nwfilter-dumpxml` as rendered (so an unchanged filter is
//! never redefined) and replaced in place when the policy changes; a domain built by
//! `domain_xml::build` with the filter on its NIC starts on a test network, and libvirt
//! instantiates the rules on its tap (iptables/ip6tables in libvirtd's namespace); the error
//! codes the fake copies (no filter, UUID clash, in use) are the daemon's.
//!
//! The traffic itself (a compromised guest refused, its replies and the allowed network
//! passing) is proven by the real-guest e2e (`egress-proxies` tests, `e2e_real_guest`).
//!
//! Resources (finding M19): unique `eptest-<secs>-…` names printed first; guards remove the
//! entry's domains and filters, the network and the pool on every path; a sweep removes old
//! leftovers. Fails, never skips, without libvirtd.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;
use egress_provider::libvirt::caps;
use egress_provider::libvirt::config::{Firmware, ProxyPolicy, VirtType};
use egress_provider::libvirt::domain_xml::{self, DiskSource, DomainSpec, Nic, NicAttach};
use egress_provider::libvirt::names;
use egress_provider::libvirt::nwfilter::{self, Ensured, HostFilter};
use ep_test_support::cleanup::{self, PoolFixture, now_secs, random_u32, virsh_ok};
use ep_test_support::e2e::{EntryGuard, LIBVIRT_NETNS, NetGuard, sweep};
use libvirt_remote::{Client, OpenOptions, transport};

/// Bound on one test body (a few calls, one TCG domain started and stopped).
// NB: a TCG start answers in ~1 s here; 120 s absorbs a loaded 2-core box.
const BUDGET: Duration = Duration::from_secs(120);
/// Per-call deadline for the capability probe.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A unique entry, guarded (its domains and filters are removed on drop).
fn entry() -> EntryGuard {
    sweep("eptest-");
    let entry = format!("eptest-{}-{:08x}", now_secs(), random_u32());
    println!("eptest: entry {entry}");
    EntryGuard { entry }
}

fn lifting(cidrs: &[&str]) -> ProxyPolicy {
    ProxyPolicy {
        allowed_internal_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
        ..ProxyPolicy::default()
    }
}

fn in_netns(cmd: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", LIBVIRT_NETNS])
        .args(cmd)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_filter_is_defined_once_read_back_as_rendered_and_replaced_in_place() {
    tokio::time::timeout(BUDGET, async {
        let g = entry();
        let c = client().await;
        let name = names::nwfilter(&g.entry, Some("inst-a"));
        println!("eptest: network filter {name}");
        let host: IpAddr = "203.0.113.9".parse().unwrap();
        let dns: IpAddr = "10.0.0.53".parse().unwrap();
        let policy = lifting(&["10.5.0.0/16"]);
        let set = nwfilter::render_set(
            &name,
            &HostFilter {
                policy: &policy,
                host_addresses: &[host],
                resolvers: &[dns],
            },
        );

        // Missing: the daemon's code, as the fake returns it.
        let e = c.nwfilter_lookup_by_name(&name).await.unwrap_err();
        let r = e.remote().unwrap();
        assert_eq!((r.code, r.domain), (62, 33), "{e}");

        assert_eq!(
            nwfilter::ensure_set(&c, "local", &set).await.unwrap(),
            Ensured::Defined
        );
        // libvirt prints what we rendered, children and root: the second ensure changes
        // nothing.
        for (n, x) in &set {
            assert_eq!(
                nwfilter::ensure(&c, "local", n, x).await.unwrap(),
                Ensured::Unchanged,
                "{n} reads back otherwise than rendered:\n{x}\n{}",
                virsh_ok(&["nwfilter-dumpxml", n])
            );
        }
        let xml = &set.iter().find(|(n, _)| *n == name).unwrap().1;
        let dumped = virsh_ok(&["nwfilter-dumpxml", &name]);
        println!("{dumped}");
        for rule in [
            "<filterref filter='NAME-mac'/>",
            "<udp dstipaddr='10.0.0.53' state='NEW' dstportstart='53'/>",
            "<all-ipv6 dstipaddr='64:ff9b::' dstipmask='96' state='NEW,INVALID'/>",
            "<all state='ESTABLISHED,RELATED'/>",
            "<all dstipaddr='10.5.0.0' dstipmask='16' state='NEW'/>",
            "<all dstipaddr='10.0.0.0' dstipmask='8' state='NEW,INVALID'/>",
            "<all dstipaddr='169.254.0.0' dstipmask='16' state='NEW,INVALID'/>",
            "<all dstipaddr='203.0.113.9' dstipmask='32' state='NEW,INVALID'/>",
            "<all-ipv6 dstipaddr='fc00::' dstipmask='7' state='NEW,INVALID'/>",
        ] {
            let rule = rule.replace("NAME", &name);
            assert!(dumped.contains(&rule), "{rule} missing:\n{dumped}");
        }
        let uuid = nwfilter::uuid(&name).hyphenated().to_string();
        assert!(dumped.contains(&format!("<uuid>{uuid}</uuid>")), "{dumped}");

        // A changed policy replaces the filter in place (same name, same UUID).
        let policy2 = lifting(&["10.6.0.0/16"]);
        let xml2 = nwfilter::render(
            &name,
            &HostFilter {
                policy: &policy2,
                host_addresses: &[host],
                resolvers: &[dns],
            },
        );
        assert_ne!(&xml2, xml);
        assert_eq!(
            nwfilter::ensure(&c, "local", &name, &xml2).await.unwrap(),
            Ensured::Defined
        );
        let dumped = virsh_ok(&["nwfilter-dumpxml", &name]);
        assert!(
            dumped.contains("dstipaddr='10.6.0.0'") && !dumped.contains("dstipaddr='10.5.0.0'")
        );
        assert!(dumped.contains(&uuid));

        // Another document under the name with another UUID: refused (code 9), as the fake.
        let clash = xml2.replace(&uuid, "11111111-2222-4333-8444-555555555555");
        let e = c.nwfilter_define_xml(&clash).await.unwrap_err();
        assert_eq!(e.libvirt_code(), Some(9), "{e}");

        // Another installation's filter is another name.
        assert_ne!(names::nwfilter(&g.entry, Some("inst-b")), name);
        for (n, _) in set.iter().rev() {
            let f = c.nwfilter_lookup_by_name(n).await.unwrap();
            c.nwfilter_undefine(&f).await.unwrap();
        }
        c.close();
    })
    .await
    .expect("test body exceeded its budget; guards cleaned up");
}

#[tokio::test]
async fn a_started_domain_gets_the_filter_on_its_tap_and_the_filter_is_then_in_use() {
    tokio::time::timeout(BUDGET, async {
        let g = entry();
        let c = client().await;
        let net = NetGuard::create("nwf");
        let gateway = net.ip(1);
        let pool = PoolFixture::create("nwf");
        let root = pool.file("root.qcow2");
        let seed = pool.file("seed.iso");
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&root)
            .arg("64M")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::write(&seed, vec![0u8; 1 << 20]).unwrap();

        let name = names::nwfilter(&g.entry, None);
        let policy = lifting(&[&format!("{gateway}/32")]);
        let set = nwfilter::render_set(
            &name,
            &HostFilter {
                policy: &policy,
                host_addresses: &[],
                resolvers: &[],
            },
        );
        nwfilter::ensure_set(&c, "local", &set).await.unwrap();

        let hc = caps::probe(&c, "local", VirtType::Qemu, CALL_TIMEOUT)
            .await
            .unwrap();
        let u = ProxyUid(uuid::Uuid::new_v4());
        let dom_name = names::domain(&g.entry, &u);
        println!("eptest: domain {dom_name} on network {}", net.name);
        let mac = names::mac(&g.entry, &u);
        // A declared address: the whole set is instantiated at once (a DHCP guest's waits
        // for its lease, which this guest without an OS never asks for).
        let declared = IpAddr::V4(net.ip(50));
        let params = nwfilter::nic_params(&mac, &[declared], &[]);
        let dxml = domain_xml::build(
            &DomainSpec {
                name: &dom_name,
                uuid: None,
                vcpus: 1,
                memory_mib: 64,
                firmware: Firmware::Bios,
                root: DiskSource::File(root.to_str().unwrap()),
                backing: None,
                seed: DiskSource::File(seed.to_str().unwrap()),
                nic: Some(Nic {
                    attach: NicAttach::Network(&net.name),
                    mac: &mac,
                    filter: Some(&name),
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
        let dom = c.domain_define_xml(&dxml, 0).await.unwrap();
        let back = virsh_ok(&["dumpxml", &dom_name]);
        assert!(
            back.contains(&format!("<filterref filter='{name}'>")),
            "{back}"
        );
        c.domain_create(&dom).await.unwrap();

        let bindings = virsh_ok(&["nwfilter-binding-list"]);
        let tap = bindings
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name.as_str()))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no binding of {name}: {bindings}"))
            .to_owned();
        println!("eptest: {name} bound to {tap}");
        // From the guest (FI- forwarded, HI- to the host): replies first, the lifted
        // gateway, then the internal networks rejected for new connections.
        for chain in [format!("FI-{tap}"), format!("HI-{tap}")] {
            let rules = in_netns(&["iptables", "-S", &chain]);
            println!("{rules}");
            let at = |s: &str| {
                rules
                    .lines()
                    .position(|l| l.contains(s))
                    .unwrap_or_else(|| panic!("{s} missing in {chain}:\n{rules}"))
            };
            let est = at("--ctstate RELATED,ESTABLISHED -j RETURN");
            let lifted = at(&format!("-d {gateway}/32"));
            let denied = at("-d 198.18.0.0/15 -m conntrack --ctstate INVALID,NEW -j REJECT");
            at("-d 169.254.0.0/16 -m conntrack --ctstate INVALID,NEW -j REJECT");
            assert!(est < lifted && lifted < denied, "{rules}");
        }
        let v6 = in_netns(&["ip6tables", "-S", &format!("FI-{tap}")]);
        assert!(
            v6.contains("-d fc00::/7 -m conntrack --ctstate INVALID,NEW -j REJECT"),
            "{v6}"
        );
        // Anti-spoofing on the tap (ebtables): only its MAC, only its address.
        let l2 = in_netns(&["ebtables", "-t", "nat", "-L", "--Lc"]);
        println!("{l2}");
        let ll = nwfilter::spoof::link_local(&mac).unwrap();
        for want in [
            format!("-s {mac} -j RETURN"),
            format!("--ip6-src {ll} -j RETURN"),
            "--ip6-icmp-type router-advertisement -j DROP".to_owned(),
            "--ip-proto udp --ip-sport 67 -j DROP".to_owned(),
            format!("--ip-src {declared}"),
            format!("--arp-ip-src {declared}"),
        ] {
            assert!(
                l2.to_lowercase().contains(&want.to_lowercase()),
                "{want} missing:\n{l2}"
            );
        }
        // Nothing toward the guest is filtered: clients and probes connect in.
        let to_guest = in_netns(&["iptables", "-S", &format!("FO-{tap}")]);
        assert!(
            !to_guest.contains("DROP") && !to_guest.contains("REJECT"),
            "{to_guest}"
        );

        // In use: the daemon refuses to undefine it (code 55), as the fake does.
        let f = c.nwfilter_lookup_by_name(&name).await.unwrap();
        let e = c.nwfilter_undefine(&f).await.unwrap_err();
        assert_eq!(e.libvirt_code(), Some(55), "{e}");
        c.domain_destroy(&dom, 0).await.unwrap();
        cleanup::remove_domain(&dom_name);
        c.nwfilter_undefine(&f).await.unwrap();
        for (n, _) in set.iter().rev().filter(|(n, _)| *n != name) {
            let f = c.nwfilter_lookup_by_name(n).await.unwrap();
            c.nwfilter_undefine(&f).await.unwrap();
        }
        c.close();
    })
    .await
    .expect("test body exceeded its budget; guards cleaned up");
}
