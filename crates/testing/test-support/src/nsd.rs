//! A real authoritative DNS server, NLnet Labs' `nsd` (Debian's package, installed by
//! `.ci/setup-host`), serving test blocklist zones on a private port of 127.0.0.1 (in the
//! caller's network namespace, or in a named one).
//!
//! ```ignore
//! let zone = TestZone::new("bl.test").list("192.0.2.1".parse()?, "127.0.0.2".parse()?);
//! let nsd = Nsd::start(None, &[zone]);       // blocking: waits for "nsd started"
//! // query nsd.addr() ...
//! ```
//!
//! Each instance has its own temporary directory (config, zone files, log, pid file), runs in
//! the foreground (`-d`) in a process group of its own, as root without chroot or privilege
//! drop, with remote control off. [`Nsd::serve`] rewrites the zones and restarts the server
//! on the same port. Dropping it stops the whole group (SIGTERM, then SIGKILL) and removes
//! the directory. Test-only code: it panics on setup failures, with nsd's log.

use std::fmt::Write as _;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nsd binary.
pub const NSD: &str = "/usr/sbin/nsd";
/// How long nsd may take to log that it started.
// NB: it starts in ~200 ms here; 20 s covers a loaded 2-core box.
const START_BUDGET: Duration = Duration::from_secs(20);
/// How long a stopped nsd may take to exit on SIGTERM before SIGKILL.
const STOP_BUDGET: Duration = Duration::from_secs(5);
/// Start attempts (a port picked as free can be taken by a parallel test first).
const START_ATTEMPTS: usize = 5;

/// One zone's records: owner names (relative to the zone) with their `A` answers.
#[derive(Debug, Clone)]
pub struct TestZone {
    /// The zone's name, e.g. `bl.test`.
    pub name: String,
    records: Vec<(String, Ipv4Addr)>,
    /// Extra zone-file lines, verbatim.
    extra: Vec<String>,
}

impl TestZone {
    /// An empty zone (only its SOA and NS): every address is not listed.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            records: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// Lists `ip` (IPv4 reversed octets, IPv6 reversed nibbles) with answer `code`; call
    /// again to give it several answers.
    pub fn list(mut self, ip: IpAddr, code: Ipv4Addr) -> Self {
        self.records.push((reversed(ip), code));
        self
    }

    /// An `A` record at `owner` (relative to the zone).
    pub fn record(mut self, owner: &str, code: Ipv4Addr) -> Self {
        self.records.push((owner.to_owned(), code));
        self
    }

    /// A raw zone-file line (relative names are under the zone).
    pub fn line(mut self, line: &str) -> Self {
        self.extra.push(line.to_owned());
        self
    }

    fn text(&self) -> String {
        let mut s = format!(
            "$ORIGIN {name}.\n$TTL 5\n@ IN SOA ns.{name}. admin.{name}. 1 3600 600 86400 5\n\
             @ IN NS ns.{name}.\nns IN A 127.0.0.1\n",
            name = self.name
        );
        for (owner, a) in &self.records {
            let _ = writeln!(s, "{owner} IN A {a}");
        }
        for l in &self.extra {
            let _ = writeln!(s, "{l}");
        }
        s
    }
}

/// The owner name of `ip` in a blocklist zone (without the zone).
pub fn reversed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{d}.{c}.{b}.{a}")
        }
        IpAddr::V6(v6) => {
            let mut parts = Vec::with_capacity(32);
            for byte in v6.octets().iter().rev() {
                parts.push(format!("{:x}", byte & 0x0f));
                parts.push(format!("{:x}", byte >> 4));
            }
            parts.join(".")
        }
    }
}

/// A running nsd.
#[derive(Debug)]
pub struct Nsd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    netns: Option<String>,
}

impl Nsd {
    /// Starts nsd serving `zones` on a free port of 127.0.0.1, in network namespace `netns`
    /// (the caller's when `None`; in a named one, the port is picked there too). Blocks until
    /// nsd has logged that it started.
    pub fn start(netns: Option<&str>, zones: &[TestZone]) -> Self {
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port(netns);
            let mut nsd = Self {
                child: None,
                dir: tempfile::Builder::new()
                    .prefix("ep-nsd-")
                    .tempdir()
                    .expect("temp dir for nsd"),
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                netns: netns.map(str::to_owned),
            };
            match nsd.spawn(zones) {
                Ok(()) => return nsd,
                Err(log) => last_log = log,
            }
        }
        panic!("nsd did not start in {START_ATTEMPTS} attempts; last log:\n{last_log}");
    }

    /// Where it answers (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the zones: rewrites them and restarts nsd on the same port. Blocks until it
    /// has started again.
    pub fn serve(&mut self, zones: &[TestZone]) {
        self.stop();
        if let Err(log) = self.spawn(zones) {
            panic!("nsd did not restart on {}:\n{log}", self.addr);
        }
    }

    /// Stops nsd (it no longer answers; queries to its port get nothing back).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pgid = child.id();
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{pgid}")])
                .status();
            let deadline = Instant::now() + STOP_BUDGET;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    // The group's other processes (xfrd, the server) follow their parent.
                    let _ = Command::new("kill")
                        .args(["-KILL", "--", &format!("-{pgid}")])
                        .stderr(Stdio::null())
                        .status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
            let _ = child.wait();
        }
    }

    /// nsd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("nsd.log")).unwrap_or_default()
    }

    fn spawn(&mut self, zones: &[TestZone]) -> Result<(), String> {
        let d = self.dir.path();
        let _ = fs::remove_file(d.join("nsd.log"));
        let mut conf = format!(
            "server:\n  ip-address: {ip}@{port}\n  port: {port}\n  username: \"\"\n  \
             chroot: \"\"\n  zonesdir: \"{dir}\"\n  database: \"\"\n  zonelistfile: \
             \"{dir}/zone.list\"\n  pidfile: \"{dir}/nsd.pid\"\n  xfrdfile: \
             \"{dir}/xfrd.state\"\n  xfrdir: \"{dir}\"\n  logfile: \"{dir}/nsd.log\"\n  \
             server-count: 1\n  verbosity: 1\n  hide-version: yes\n\
             remote-control:\n  control-enable: no\n",
            ip = self.addr.ip(),
            port = self.addr.port(),
            dir = d.display()
        );
        for (i, z) in zones.iter().enumerate() {
            let file = d.join(format!("zone{i}"));
            fs::write(&file, z.text()).expect("write zone file");
            let _ = write!(
                conf,
                "zone:\n  name: {}\n  zonefile: {}\n",
                z.name,
                file.display()
            );
        }
        let conf_path = d.join("nsd.conf");
        fs::write(&conf_path, conf).expect("write nsd.conf");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, NSD]);
                c
            }
            None => Command::new(NSD),
        };
        cmd.arg("-d")
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::File::create(d.join("nsd.stderr")).expect("stderr file"),
            ))
            .process_group(0);
        let child = cmd
            .spawn()
            .expect("spawn nsd (is it installed? .ci/setup-host)");
        self.child = Some(child);
        let deadline = Instant::now() + START_BUDGET;
        loop {
            let log = self.log();
            if log.contains("nsd started") {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() > deadline {
                let stderr = fs::read_to_string(d.join("nsd.stderr")).unwrap_or_default();
                self.stop();
                return Err(format!("{log}\n{stderr}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU seconds (user + system) its processes used so far (the main process, xfrd and
    /// the server: its whole process group), from `/proc`.
    pub fn cpu_seconds(&self) -> f64 {
        let Some(pgid) = self.child.as_ref().map(Child::id) else {
            return 0.0;
        };
        let mut ticks = 0u64;
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // Fields after the command name (which may hold spaces) start after ") ".
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            // rest[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
            if f.get(2).and_then(|p| p.parse::<u32>().ok()) == Some(pgid) {
                ticks += f.get(11).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
                ticks += f.get(12).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        ticks as f64 / 100.0
    }

    /// The directory holding its files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Nsd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port free for both UDP and TCP on 127.0.0.1 (in `netns` when given: asked there with
/// python3, which the setup installs).
fn free_port(netns: Option<&str>) -> u16 {
    if let Some(ns) = netns {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c"])
            .arg(
                "import socket\n\
                 s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(('127.0.0.1',0))\n\
                 p=s.getsockname()[1]\n\
                 t=socket.socket(); t.bind(('127.0.0.1',p)); print(p)",
            )
            .output()
            .expect("pick a port in the namespace");
        if let Ok(p) = String::from_utf8_lossy(&out.stdout).trim().parse() {
            return p;
        }
    }
    for _ in 0..100 {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let port = udp.local_addr().expect("udp addr").port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP on 127.0.0.1");
}
