//! `scripts/quickstart` as a user runs it, in environments prepared so that it never touches
//! this machine's shared libvirtd (the one other suites use at `/run/libvirt/libvirt-sock`):
//!
//! - pointed (as its "machine's libvirtd") at a private libvirtd that the test starts in a
//!   mount and network namespace of its own, it refuses to move it while a fake `systemctl`
//!   says systemd manages libvirtd, and while that libvirtd has a domain the quickstart did not
//!   create — and changes nothing; with `EP_QUICKSTART_MOVE_LIBVIRTD=1` it goes on, asking
//!   systemd to stop its libvirt units first;
//! - in private mode (its own libvirtd, socket, state and network namespace), run with the
//!   test's binary and a blank guest image, it is interrupted (SIGINT to its process group, as
//!   Ctrl-C does; then SIGTERM to the script alone) while the operator runs: it starts
//!   stopping within a second, and afterwards no process it started is alive, its namespace
//!   is gone, and its libvirt state holds no domain and no volume but the cached base.
//!
//! Needs root, libvirtd, QEMU, qemu-img, iproute2, util-linux (`.ci/setup-host`).
// finding: M21
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
/// A refusal is a few local calls (systemctl, virsh): only catches a hang.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(60);
/// A private libvirtd creates its socket in ~1 s here.
const LIBVIRTD_START: Duration = Duration::from_secs(30);
/// From start to the operator's first domain: private libvirtd, pool, network, a 200 KiB
/// image download and one VM definition (~10 s here, debug binary).
const UNTIL_DOMAIN: Duration = Duration::from_secs(240);
/// What the issue asks: Ctrl-C is acted upon within a second.
const REACTION: Duration = Duration::from_secs(1);
/// The whole stop: the operator's graceful stop, gc deleting one VM, the servers, libvirtd
/// (a few seconds here); the script's own deadlines add up to more, this only bounds a hang.
const STOP_DEADLINE: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The machine's libvirtd (its pid file), to prove the tests leave it alone.
fn shared_libvirtd() -> Option<(u32, u64)> {
    let pid: u32 = std::fs::read_to_string("/run/libvirtd.pid")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some((pid, start_time(pid)?))
}

/// A process's start time (clock ticks since boot): with the pid, names one process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is 3rd, starttime 22nd.
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live (not zombie) processes whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    all_pids()
        .into_iter()
        .filter(|&p| !is_zombie(p))
        .map(|p| (p, cmdline(p)))
        .filter(|(_, c)| c.contains(needle))
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(false)
}

fn netns_pids(netns: &str) -> Vec<u32> {
    Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn netns_exists(netns: &str) -> bool {
    Path::new("/run/netns").join(netns).exists()
}

/// Kills, on every path, whatever a test started and may have left: processes naming the
/// test's directory, processes in its namespaces, the namespaces.
struct Sweep {
    dir: PathBuf,
    netns: Vec<String>,
    groups: Vec<i32>,
}
impl Drop for Sweep {
    fn drop(&mut self) {
        for g in &self.groups {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{g}")])
                .stderr(Stdio::null())
                .status();
        }
        let needle = self.dir.to_string_lossy().into_owned();
        let mut pids: Vec<u32> = processes_naming(&needle)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        for ns in &self.netns {
            pids.extend(netns_pids(ns));
        }
        for p in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(300));
        for ns in &self.netns {
            if netns_exists(ns) {
                let _ = Command::new("ip").args(["netns", "delete", ns]).status();
            }
        }
    }
}

/// A libvirtd of the test's own, as "this machine's libvirtd" for the refusal paths: in a
/// mount namespace where /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and
/// /var/log/libvirt are directories under `dir`, inside network namespace `netns`.
struct PrivateLibvirtd {
    dir: PathBuf,
    child: Child,
}
impl PrivateLibvirtd {
    fn start(dir: &Path, netns: &str) -> Self {
        run("ip", &["netns", "add", netns]);
        for d in ["etc", "run", "lib", "cache", "log"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        for e in std::fs::read_dir("/etc/libvirt").unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "conf") {
                std::fs::copy(&p, dir.join("etc").join(p.file_name().unwrap())).unwrap();
            }
        }
        let mut q = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("etc/qemu.conf"))
            .unwrap();
        writeln!(q, "\nstdio_handler = \"file\"").unwrap();
        let log = std::fs::File::create(dir.join("libvirtd.log")).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                "unshare",
                "--mount",
                "--propagation",
                "private",
            ])
            .args(["sh", "-c"])
            .arg(
                "set -e; for m in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt \
                 cache:/var/cache/libvirt log:/var/log/libvirt; do mkdir -p \"${m#*:}\"; \
                 mount --bind \"$1/${m%%:*}\" \"${m#*:}\"; done; \
                 exec libvirtd --pid-file \"$1/run/libvirtd.pid\"",
            )
            .arg("sh")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap();
        let me = Self {
            dir: dir.to_owned(),
            child,
        };
        let start = Instant::now();
        while !me.virsh(&["version"]).status.success() {
            assert!(
                start.elapsed() < LIBVIRTD_START,
                "the test's libvirtd did not answer: {}",
                std::fs::read_to_string(dir.join("libvirtd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        me
    }
    fn socket(&self) -> PathBuf {
        self.dir.join("run/libvirt-sock")
    }
    fn pidfile(&self) -> PathBuf {
        self.dir.join("run/libvirtd.pid")
    }
    fn virsh(&self, args: &[&str]) -> Output {
        virsh(&self.socket(), args)
    }
}
impl Drop for PrivateLibvirtd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn virsh(socket: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["20", "virsh", "-q", "-c"])
        .arg(format!("qemu:///system?socket={}", socket.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A `systemctl` that says every unit is active and logs how it was called.
fn fake_systemctl(dir: &Path) -> PathBuf {
    let bin = dir.join("fakebin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("systemctl");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >>{}\ncase \"$1\" in is-active) exit 0 ;; esac\nexit 0\n",
            dir.join("systemctl.log").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The quickstart with the test's binary and no host setup (the machine is prepared).
///
/// It starts through `env --default-signal` so that it gets the signals a user's shell gives
/// it: a test suite run in the background (`nohup`, `&` in a script) inherits SIGINT ignored,
/// and bash cannot trap a signal that was ignored when it started.
fn quickstart(state: &Path, netns: &str) -> Command {
    let mut c = Command::new("env");
    c.arg("--default-signal=INT,TERM,HUP")
        .arg(repo().join("scripts/quickstart"));
    c.env("EP_QUICKSTART_SETUP", "0")
        .env("EP_QUICKSTART_BIN", BIN)
        .env("EP_QUICKSTART_DIR", state)
        .env("EP_QUICKSTART_NETNS", netns)
        .env_remove("EP_QUICKSTART_LIBVIRTD")
        .env_remove("EP_QUICKSTART_MOVE_LIBVIRTD")
        .env_remove("LIBVIRT_DEFAULT_URI")
        .stdin(Stdio::null());
    c
}

fn run_with_deadline(mut cmd: Command, deadline: Duration) -> (ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            panic!("the quickstart did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn unique(tag: &str) -> String {
    format!("epqs{}{tag}", std::process::id())
}

#[test]
fn refuses_to_move_a_libvirtd_that_systemd_manages_or_that_has_domains_and_changes_nothing() {
    let shared = shared_libvirtd();
    let tmp = tempfile::tempdir().unwrap();
    let lv_ns = unique("lv");
    let target_ns = unique("to");
    let _sweep = Sweep {
        dir: tmp.path().to_owned(),
        netns: vec![lv_ns.clone(), target_ns.clone()],
        groups: vec![],
    };
    let lv = PrivateLibvirtd::start(&tmp.path().join("lv"), &lv_ns);
    let lv_pid = std::fs::read_to_string(lv.pidfile())
        .unwrap()
        .trim()
        .to_owned();
    let state = tmp.path().join("state");
    let against_lv = |extra_path: Option<&Path>| {
        let mut c = quickstart(&state, &target_ns);
        c.env("EP_QUICKSTART_LIBVIRTD_SOCKET", lv.socket())
            .env("EP_QUICKSTART_LIBVIRTD_PIDFILE", lv.pidfile());
        if let Some(p) = extra_path {
            c.env("PATH", path_with(p));
        }
        run_with_deadline(c, REFUSAL_DEADLINE)
    };
    let unchanged = |what: &str| {
        assert_eq!(
            std::fs::read_to_string(lv.pidfile()).unwrap().trim(),
            lv_pid,
            "{what}: libvirtd was restarted"
        );
        assert!(
            start_time(lv_pid.parse().unwrap()).is_some(),
            "{what}: libvirtd was stopped"
        );
        assert!(
            !netns_exists(&target_ns),
            "{what}: the target namespace was created"
        );
        assert!(
            !state.exists(),
            "{what}: the quickstart's state directory was created"
        );
        assert_eq!(
            shared_libvirtd(),
            shared,
            "{what}: the machine's shared libvirtd changed"
        );
    };

    // systemd manages libvirtd (a fake systemctl says so): refused, and systemctl was only asked.
    let fake = fake_systemctl(tmp.path());
    let (status, out) = against_lv(Some(&fake));
    assert_eq!(status.code(), Some(3), "systemd: {out}");
    for want in [
        "systemd manages it",
        "libvirtd.service",
        "would stop this machine's libvirtd (pid",
        "Nothing has been changed",
        "EP_QUICKSTART_LIBVIRTD=private",
        "EP_QUICKSTART_MOVE_LIBVIRTD=1",
    ] {
        assert!(out.contains(want), "systemd: no {want:?} in:\n{out}");
    }
    let calls = std::fs::read_to_string(tmp.path().join("systemctl.log")).unwrap();
    assert!(
        calls.lines().all(|l| l.starts_with("is-active ")),
        "systemctl was asked to act: {calls}"
    );
    unchanged("systemd");

    // No systemd, but the libvirtd has a domain the quickstart did not create: refused.
    let dom = unique("foreign");
    let xml = tmp.path().join("dom.xml");
    std::fs::write(
        &xml,
        format!(
            "<domain type='qemu'><name>{dom}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64' machine='q35'>hvm</type></os></domain>"
        ),
    )
    .unwrap();
    let d = lv.virsh(&["define", xml.to_str().unwrap()]);
    assert!(
        d.status.success(),
        "define: {}",
        String::from_utf8_lossy(&d.stderr)
    );
    let (status, out) = against_lv(None);
    assert_eq!(status.code(), Some(3), "domains: {out}");
    for want in [
        "has domains the quickstart did not create",
        &dom,
        "EP_QUICKSTART_LIBVIRTD=private",
    ] {
        assert!(out.contains(want), "domains: no {want:?} in:\n{out}");
    }
    unchanged("domains");
    let list = String::from_utf8_lossy(&lv.virsh(&["list", "--all", "--name"]).stdout).into_owned();
    assert!(
        list.lines().any(|l| l.trim() == dom),
        "the domain is gone: {list}"
    );

    // EP_QUICKSTART_MOVE_LIBVIRTD=1 goes on: systemd's units are stopped first. (A missing
    // guest image then ends the run before it creates anything.)
    let mut c = quickstart(&state, &target_ns);
    c.env("EP_QUICKSTART_LIBVIRTD_SOCKET", lv.socket())
        .env("EP_QUICKSTART_LIBVIRTD_PIDFILE", lv.pidfile())
        .env("EP_QUICKSTART_MOVE_LIBVIRTD", "1")
        .env(
            "EP_QUICKSTART_IMAGE",
            tmp.path().join("no-such-image.qcow2"),
        )
        .env("PATH", path_with(&fake));
    let (status, out) = run_with_deadline(c, REFUSAL_DEADLINE);
    assert_ne!(status.code(), Some(3), "move: refused anyway:\n{out}");
    assert!(
        out.contains("EP_QUICKSTART_MOVE_LIBVIRTD=1: moving libvirtd although"),
        "move: {out}"
    );
    let calls = std::fs::read_to_string(tmp.path().join("systemctl.log")).unwrap();
    let stop = calls
        .lines()
        .find(|l| l.starts_with("stop "))
        .unwrap_or_default();
    assert!(
        stop.contains("libvirtd.service") && stop.contains("libvirtd.socket"),
        "move: {calls}"
    );
    assert!(
        !netns_exists(&target_ns),
        "move: the target namespace was created"
    );
}

/// The quickstart running in private mode, its stderr in a file the test reads as it grows.
struct Running {
    child: Child,
    log: PathBuf,
}
impl Running {
    fn start(state: &Path, netns: &str, image: &Path, fake: &Path, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = quickstart(state, netns)
            .env("EP_QUICKSTART_LIBVIRTD", "private")
            .env("EP_QUICKSTART_IMAGE", image)
            .env("PATH", path_with(fake))
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap();
        Self { child, log }
    }
    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Waits for `until`, failing if the script ends first or the deadline passes.
    fn wait_for(&mut self, what: &str, deadline: Duration, mut until: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        while !until(self) {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!(
                    "the quickstart ended ({st}) before {what}:\n{}",
                    self.text()
                );
            }
            assert!(
                start.elapsed() < deadline,
                "no {what} within {deadline:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    /// Sends `signal` to `target` and returns (time until "stopping", time until exit, status).
    fn interrupt(&mut self, signal: &str, target: &str) -> (Duration, Duration, ExitStatus) {
        let before = self.text().matches("[quickstart] stopping").count();
        let t0 = Instant::now();
        run("kill", &[signal, "--", target]);
        let mut reacted = None;
        loop {
            if reacted.is_none() && self.text().matches("[quickstart] stopping").count() > before {
                reacted = Some(t0.elapsed());
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                let reacted = reacted.or_else(|| {
                    self.text()
                        .contains("[quickstart] stopping")
                        .then(|| t0.elapsed())
                });
                return (reacted.expect("no `stopping` line"), t0.elapsed(), st);
            }
            assert!(
                t0.elapsed() < STOP_DEADLINE,
                "not stopped within {STOP_DEADLINE:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The script's own lines from `stopping` on (shown with `--nocapture`).
fn stop_lines(text: &str) -> String {
    let from = text.rfind("[quickstart] stopping\n").unwrap_or(0);
    text.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("[quickstart]"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every process (pid, start time, command line) the running quickstart may have started:
/// its descendants, whatever names its directory, whatever runs in its namespace.
fn started_by(root: u32, needle: &str, netns: &str) -> Vec<(u32, u64, String)> {
    let parent = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(") ")?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let mut pids: Vec<u32> = all_pids()
        .into_iter()
        .filter(|&p| {
            let mut q = p;
            for _ in 0..64 {
                if q == root {
                    return true;
                }
                match parent(q) {
                    Some(pp) if pp > 1 => q = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect();
    pids.extend(processes_naming(needle).into_iter().map(|(p, _)| p));
    pids.extend(netns_pids(netns));
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter(|&p| p != root)
        .filter_map(|p| Some((p, start_time(p)?, cmdline(p))))
        .collect()
}

fn assert_left_nothing(
    what: &str,
    procs: &[(u32, u64, String)],
    needle: &str,
    netns: &str,
    state: &Path,
) {
    let alive: Vec<_> = procs
        .iter()
        .filter(|(p, st, _)| start_time(*p) == Some(*st) && !is_zombie(*p))
        .collect();
    assert!(alive.is_empty(), "{what}: processes left: {alive:#?}");
    let naming = processes_naming(needle);
    assert!(
        naming.is_empty(),
        "{what}: processes naming the quickstart's directory: {naming:#?}"
    );
    assert!(
        !netns_exists(netns),
        "{what}: network namespace {netns} left"
    );
    // Its libvirt state: no domain defined or running, no volume but the cached base.
    for d in ["libvirt/etc/qemu", "libvirt/run/qemu"] {
        let xmls: Vec<_> = std::fs::read_dir(state.join(d))
            .map(|r| {
                r.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".xml"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(xmls.is_empty(), "{what}: domains left in {d}: {xmls:?}");
    }
    let vols: Vec<String> = std::fs::read_dir(state.join("pool"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    // The base: its qcow2, its marker and the part that became its data volume.
    assert!(
        vols.iter().all(|v| v.starts_with("ep-local-base-")),
        "{what}: volumes left besides the cached base: {vols:?}"
    );
}

#[test]
fn interrupted_it_stops_within_a_second_and_leaves_no_process_domain_volume_or_namespace() {
    let shared = shared_libvirtd();
    let tmp = tempfile::tempdir().unwrap();
    // QEMU runs as its own user and must reach the pool inside.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let needle = tmp.path().to_string_lossy().into_owned();
    let netns = unique("qs");
    let mut sweep = Sweep {
        dir: tmp.path().to_owned(),
        netns: vec![netns.clone()],
        groups: vec![],
    };
    let state = tmp.path().join("state");
    let image = tmp.path().join("blank.qcow2");
    run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", image.to_str().unwrap(), "1G"],
    );
    // Private mode never looks at the machine's libvirtd, whatever systemd says.
    let fake = fake_systemctl(tmp.path());
    let socket = state.join("libvirt/run/libvirt-sock");

    // 1. Ctrl-C (SIGINT to the process group) while the operator runs and has made a VM.
    let mut qs = Running::start(&state, &netns, &image, &fake, tmp.path().join("run1.log"));
    let pgid = qs.child.id();
    sweep.groups.push(pgid as i32);
    qs.wait_for("a domain", UNTIL_DOMAIN, |_| {
        socket.exists()
            && !String::from_utf8_lossy(&virsh(&socket, &["list", "--all", "--name"]).stdout)
                .trim()
                .is_empty()
    });
    let procs = started_by(pgid, &needle, &netns);
    for want in [
        "libvirtd",
        "http.server",
        "echo --listen",
        "standalone",
        "dnsmasq",
    ] {
        assert!(
            procs.iter().any(|(_, _, c)| c.contains(want)),
            "no {want} among {procs:#?}"
        );
    }
    let (reacted, stopped, status) = qs.interrupt("-INT", &format!("-{pgid}"));
    eprintln!("SIGINT: stopping after {reacted:?}, all stopped after {stopped:?}");
    eprintln!("{}", stop_lines(&qs.text()));
    assert!(
        reacted <= REACTION,
        "SIGINT: `stopping` only after {reacted:?}:\n{}",
        qs.text()
    );
    assert_eq!(status.code(), Some(130), "SIGINT:\n{}", qs.text());
    assert!(
        qs.text().contains("deleting the quickstart's proxy VMs"),
        "{}",
        qs.text()
    );
    // Each process was stopped in order, none needed the namespace's last sweep.
    assert!(
        !qs.text().contains("stopping what is left"),
        "SIGINT:\n{}",
        qs.text()
    );
    assert_left_nothing("SIGINT", &procs, &needle, &netns, &state);

    // 2. A re-run on the same state, SIGTERM to the script alone, once the operator started.
    let mut qs = Running::start(&state, &netns, &image, &fake, tmp.path().join("run2.log"));
    let pgid = qs.child.id();
    sweep.groups.push(pgid as i32);
    qs.wait_for("the operator", UNTIL_DOMAIN, |r| {
        r.text().contains("egress-proxies standalone --proxies")
    });
    std::thread::sleep(Duration::from_secs(2));
    let procs = started_by(pgid, &needle, &netns);
    let (reacted, stopped, status) = qs.interrupt("-TERM", &pgid.to_string());
    eprintln!("SIGTERM: stopping after {reacted:?}, all stopped after {stopped:?}");
    eprintln!("{}", stop_lines(&qs.text()));
    assert!(
        reacted <= REACTION,
        "SIGTERM: `stopping` only after {reacted:?}:\n{}",
        qs.text()
    );
    assert_eq!(status.code(), Some(143), "SIGTERM:\n{}", qs.text());
    // Each process was stopped in order, none needed the namespace's last sweep.
    assert!(
        !qs.text().contains("stopping what is left"),
        "SIGTERM:\n{}",
        qs.text()
    );
    assert_left_nothing("SIGTERM", &procs, &needle, &netns, &state);

    assert_eq!(
        shared_libvirtd(),
        shared,
        "the machine's shared libvirtd changed"
    );
}
