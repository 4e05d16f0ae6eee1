//! N hypervisor hosts on one bridge segment, for tests that kill a host: each host is a
//! [`PrivateLibvirtd`] in a network namespace of its own, with an [`Sshd`] in that namespace
//! (the operator's way in), a `dir` storage pool, and a bridge `br0` whose uplink is a veth
//! into the segment bridge of the **current** network namespace (the test's: its operator,
//! echo and clients run there). A guest bridged to `br0` on any host is on the segment, one L2
//! hop from the test and from the other hosts' guests.
//!
//! Addresses: the segment is a random /24 of 198.18.0.0/15; the segment bridge holds `.1`
//! (the guests' gateway and the test's own address), host `i` (from 0) holds `.(10 + i)` on its
//! `br0`. Guests get their addresses from the hosts' declared address pools (no DHCP on the
//! segment); [`Segment::guest_range`] gives each host a disjoint range.
//!
//! Call [`Segment::create`] inside a network namespace the test made for itself (never the
//! machine's own): it adds a bridge there. Guarantees: every name is unique (namespaces
//! `NAME-hI`, bridge and veths `eps<hex>…`) and printed first; Drop stops each host (sshd, the
//! daemon, whatever else runs in its namespace, QEMU included), deletes its namespace and
//! directory, and deletes the segment bridge, on every path; [`remove_leftovers`] does the
//! same by name for a run that died before its Drop. Every wait has a deadline.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use crate::cleanup::{keep_requested, random_u32, unique_name};
use crate::e2e::run_ok;
use crate::libvirtd::PrivateLibvirtd;
use crate::sshd::Sshd;

/// A host's bridge for its guests (inside its namespace).
pub const HOST_BRIDGE: &str = "br0";
/// A host's uplink to the segment (inside its namespace).
pub const HOST_UPLINK: &str = "up0";
/// The storage pool every host has.
pub const HOST_POOL: &str = "eptest-seg";
/// The nftables table (netdev family, in a host's namespace) of [`SegmentHost::freeze`].
pub const FREEZE_TABLE: &str = "eptest_freeze";
/// The nftables table (arp family, in the test's namespace) of [`Segment::watch_announcements`].
pub const ANNOUNCE_TABLE: &str = "eptest_announce";

/// One host of a [`Segment`].
#[derive(Debug)]
pub struct SegmentHost {
    /// Its index (0-based); `h{index + 1}` is a natural config name.
    pub index: usize,
    /// Its address on the segment (sshd listens there).
    pub ip: Ipv4Addr,
    /// Its sshd (root login with [`Sshd::client_key_path`], [`Sshd::known_hosts_path`]).
    pub sshd: Sshd,
    /// Its libvirtd (namespace, directory, socket, `virsh`).
    pub libvirtd: PrivateLibvirtd,
    /// The segment end of its uplink (in the test's namespace).
    pub veth: String,
}

impl SegmentHost {
    /// Its network namespace.
    pub fn netns(&self) -> &str {
        &self.libvirtd.netns
    }

    /// The libvirt socket path the operator should use over SSH.
    pub fn socket(&self) -> PathBuf {
        self.libvirtd.socket()
    }

    /// Runs `cmd ARGS` inside the host's network namespace, panicking unless it succeeds.
    pub fn exec_ok(&self, cmd: &str, args: &[&str]) -> String {
        run_ok(
            Command::new("timeout")
                .args(["30", "ip", "netns", "exec", self.netns(), cmd])
                .args(args),
        )
    }

    /// The domains the host's libvirtd lists (all of them, running or not); empty while its
    /// daemon is stopped.
    pub fn domains(&self) -> Vec<String> {
        if !self.libvirtd.running() {
            return Vec::new();
        }
        names(&self.libvirtd.virsh(&["list", "--all", "--name"]).stdout)
    }

    /// Freezes the host: a DROP rule on the ingress of its uplink (nftables table
    /// [`FREEZE_TABLE`] in its namespace) swallows every packet into it, its SSH and its
    /// guests' traffic alike, as a hung or cut-off host; [`thaw`](Self::thaw) removes it.
    pub fn freeze(&self) {
        self.exec_ok("nft", &["add", "table", "netdev", FREEZE_TABLE]);
        self.exec_ok(
            "nft",
            &[
                "add",
                "chain",
                "netdev",
                FREEZE_TABLE,
                "in",
                &format!(
                    "{{ type filter hook ingress device {HOST_UPLINK} priority 0 ; policy drop ; }}"
                ),
            ],
        );
    }

    /// Undoes [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.exec_ok("nft", &["delete", "table", "netdev", FREEZE_TABLE]);
    }

    /// The MAC of domain `domain`'s first interface (`virsh domiflist`), lower case.
    pub fn guest_mac(&self, domain: &str) -> Option<String> {
        let o = self.libvirtd.virsh(&["domiflist", domain]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .flat_map(str::split_whitespace)
            .find(|w| is_mac(w))
            .map(str::to_ascii_lowercase)
    }

    /// The volumes of the host's pool.
    pub fn volumes(&self) -> Vec<String> {
        if !self.libvirtd.running() {
            return Vec::new();
        }
        let o = self.libvirtd.virsh(&["vol-list", HOST_POOL]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }
}

fn is_mac(w: &str) -> bool {
    let parts: Vec<&str> = w.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn names(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// N hosts on one segment (see the module doc).
#[derive(Debug)]
pub struct Segment {
    /// The name every namespace of the segment starts with.
    pub name: String,
    /// The segment bridge (in the test's namespace).
    pub bridge: String,
    /// The hosts (dropped before the bridge).
    pub hosts: Vec<SegmentHost>,
    prefix: [u8; 3],
}

impl Segment {
    /// Creates `n` hosts for `test` (see the module doc); panics on any failure, after
    /// removing what it made.
    pub fn create(test: &str, n: usize) -> Self {
        Self::create_named(unique_name("segment", test), n)
    }

    /// Like [`create`](Self::create) with the segment's name chosen by the caller (unique, an
    /// `eptest-` name: a parent process that made it can [`remove_leftovers`] by it).
    pub fn create_named(name: String, n: usize) -> Self {
        assert!((1..=7).contains(&n), "1 to 7 hosts");
        let tag = format!("{:08x}", random_u32());
        let bridge = format!("eps{tag}");
        let r = random_u32();
        let prefix = [198, 18 + (r & 1) as u8, (r >> 8) as u8];
        let [a, b, c] = prefix;
        println!(
            "eptest: segment {name}: bridge {bridge}, {a}.{b}.{c}.0/24, {n} host(s) in \
             namespaces {name}-h0…"
        );
        run_ok(Command::new("ip").args([
            "link",
            "add",
            &bridge,
            "type",
            "bridge",
            "stp_state",
            "0",
        ]));
        let mut seg = Self {
            name,
            bridge,
            hosts: Vec::new(),
            prefix,
        };
        run_ok(Command::new("ip").args([
            "addr",
            "add",
            &format!("{}/24", seg.ip(1)),
            "dev",
            &seg.bridge,
        ]));
        run_ok(Command::new("ip").args(["link", "set", &seg.bridge, "up"]));
        let _ = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status();
        for i in 0..n {
            let lv = PrivateLibvirtd::start_named(format!("{}-h{i}", seg.name));
            let ns = lv.netns.clone();
            let veth = format!("eps{tag}{i}");
            let ip = seg.ip(10 + i as u8);
            run_ok(Command::new("ip").args([
                "link",
                "add",
                &veth,
                "type",
                "veth",
                "peer",
                "name",
                HOST_UPLINK,
                "netns",
                &ns,
            ]));
            run_ok(Command::new("ip").args(["link", "set", &veth, "master", &seg.bridge]));
            run_ok(Command::new("ip").args(["link", "set", &veth, "up"]));
            let inside = |args: &[&str]| {
                run_ok(Command::new("ip").args(["-n", &ns]).args(args));
            };
            inside(&[
                "link",
                "add",
                HOST_BRIDGE,
                "type",
                "bridge",
                "stp_state",
                "0",
            ]);
            inside(&["link", "set", HOST_UPLINK, "master", HOST_BRIDGE]);
            inside(&["link", "set", HOST_UPLINK, "up"]);
            inside(&["addr", "add", &format!("{ip}/24"), "dev", HOST_BRIDGE]);
            inside(&["link", "set", HOST_BRIDGE, "up"]);
            // NB: sshd's start waits (with its deadline) until its port answers over the segment.
            let sshd = Sshd::builder().in_netns(&ns, ip).start();
            let pool_dir = lv.dir.join("pool");
            std::fs::create_dir_all(&pool_dir).unwrap();
            lv.virsh_ok(&[
                "pool-define-as",
                HOST_POOL,
                "dir",
                "--target",
                pool_dir.to_str().unwrap(),
            ]);
            lv.virsh_ok(&["pool-start", HOST_POOL]);
            println!(
                "eptest: host {i}: namespace {ns}, {ip}, sshd port {}, socket {}",
                sshd.port,
                lv.socket().display()
            );
            seg.hosts.push(SegmentHost {
                index: i,
                ip,
                sshd,
                libvirtd: lv,
                veth,
            });
        }
        seg
    }

    /// Address `.host` of the segment (`.1` is the test's, `.10 + i` host `i`'s).
    pub fn ip(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, host)
    }

    /// The segment's prefix, `a.b.c.0/24`.
    pub fn cidr(&self) -> String {
        format!("{}/24", self.ip(0))
    }

    /// The segment bridge's neighbour entry for `ip`: (MAC, state), e.g. `("52:54:…",
    /// "STALE")`; `None` without an entry or without a MAC (`INCOMPLETE`, `FAILED`).
    pub fn neighbour(&self, ip: Ipv4Addr) -> Option<(String, String)> {
        let o = Command::new("ip")
            .args(["neigh", "show", &ip.to_string(), "dev", &self.bridge])
            .output()
            .ok()?;
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let words: Vec<&str> = out.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        let mac = words.get(at + 1)?.to_ascii_lowercase();
        let state = words.last().map(|w| (*w).to_owned()).unwrap_or_default();
        Some((mac, state))
    }

    /// Starts recording who announces `ip` on the segment: an nftables table
    /// [`ANNOUNCE_TABLE`] (arp family, input hook of the test's namespace, where the segment
    /// bridge delivers broadcasts) adds the sender MAC of every gratuitous ARP for `ip`
    /// (request or reply whose sender and target address are both `ip`) to a set. Only a
    /// guest announcing itself sends those: ordinary resolution has the asker's address as
    /// sender. The bridge also takes a new neighbour entry from a gratuitous ARP
    /// (`arp_accept=1`, as a gateway configured for it does; by default Linux only updates an
    /// entry it has), so [`neighbour`](Self::neighbour) shows what the announcement alone
    /// taught it. Replaces an earlier watch; removed with the test's namespace.
    pub fn watch_announcements(&self, ip: Ipv4Addr) {
        run_ok(Command::new("sysctl").args([
            "-qw",
            &format!("net.ipv4.conf.{}.arp_accept=1", self.bridge),
        ]));
        let _ = Command::new("nft")
            .args(["delete", "table", "arp", ANNOUNCE_TABLE])
            .output();
        let rules = format!(
            "table arp {ANNOUNCE_TABLE} {{\n  set announced {{ type ether_addr; flags dynamic; }}\n  \
             chain in {{ type filter hook input priority 0; policy accept;\n    \
             arp saddr ip {ip} arp daddr ip {ip} update @announced {{ arp saddr ether }} counter\n  \
             }}\n}}\n"
        );
        let path = std::env::temp_dir().join(format!("{}-announce.nft", self.name));
        std::fs::write(&path, rules).unwrap();
        run_ok(Command::new("nft").arg("-f").arg(&path));
        let _ = std::fs::remove_file(&path);
    }

    /// The MACs that announced the address of [`watch_announcements`](Self::watch_announcements)
    /// so far (lower case).
    pub fn announced(&self) -> Vec<String> {
        let o = Command::new("nft")
            .args(["list", "set", "arp", ANNOUNCE_TABLE, "announced"])
            .output();
        let Ok(o) = o else { return Vec::new() };
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
            .filter(|w| is_mac(w))
            .map(str::to_ascii_lowercase)
            .collect()
    }

    /// A range of guest addresses for host `i`, disjoint from every other host's:
    /// `.(100 + 20i)`–`.(119 + 20i)` for up to 7 hosts, as `first-last`.
    pub fn guest_range(&self, i: usize) -> String {
        assert!(i < 7, "guest ranges exist for 7 hosts");
        let first = 100 + 20 * i as u8;
        format!("{}-{}", self.ip(first), self.ip(first + 19))
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if keep_requested() {
            println!("eptest: keeping segment {}", self.name);
            return;
        }
        // NB: each host's Drop stops sshd and libvirtd, kills the rest of its namespace
        // (QEMU) and deletes it, which removes its uplink's peer too.
        self.hosts.clear();
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .status();
    }
}

/// A network namespace a test made for itself (the segment lives in it), deleted when dropped
/// with whatever a dead child left in it and in its hosts' namespaces ([`remove_leftovers`]
/// by its name: the test names its segment after it).
#[derive(Debug)]
pub struct OwnNetns(pub String);

impl OwnNetns {
    /// Creates network namespace `unique_name("network namespace", test)`.
    pub fn create(test: &str) -> Self {
        let ns = unique_name("network namespace", test);
        run_ok(Command::new("ip").args(["netns", "add", &ns]));
        Self(ns)
    }
}

impl Drop for OwnNetns {
    fn drop(&mut self) {
        if keep_requested() {
            println!("eptest: keeping namespace {}", self.0);
            return;
        }
        remove_leftovers(&self.0);
        if let Ok(o) = Command::new("ip").args(["netns", "pids", &self.0]).output() {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// Removes what a segment named `name` left (a run killed before its Drop): every process in
/// the namespaces `NAME-h*` is killed, the namespaces deleted, and the hosts' directories
/// `/tmp/NAME-h*-*` removed. The segment bridge lived in the run's own namespace and goes
/// with it.
pub fn remove_leftovers(name: &str) {
    let prefix = format!("{name}-h");
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let ns = e.file_name().to_string_lossy().into_owned();
        if !ns.starts_with(&prefix) {
            continue;
        }
        println!("eptest: removing leftover namespace {ns}");
        if let Ok(o) = Command::new("ip").args(["netns", "pids", &ns]).output() {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
