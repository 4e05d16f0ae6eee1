//! A private libvirtd for tests that must hurt the daemon itself (kill -9, restart): never the
//! machine's shared one. It runs in a network namespace of its own and a mount namespace where
//! `/etc/libvirt` (the machine's `*.conf` files only), `/run/libvirt`, `/var/lib/libvirt`,
//! `/var/cache/libvirt` and `/var/log/libvirt` are directories under its temporary directory
//! (as `scripts/quickstart`'s private mode does); its socket is `DIR/run/libvirt-sock`.
//!
//! Guarantees: the namespace name and directory are unique (`eptest-…`, printed first); Drop
//! stops the daemon (TERM, then KILL after [`STOP_WAIT`]), deletes the namespace and the
//! directory, on every path; every wait has a deadline and panics past it. A run killed
//! before its Drop (SIGKILL, a timeout) leaves its daemon orphaned with its directory removed
//! or not: the next start kills every private libvirtd whose directory is gone
//! ([`kill_orphans`]), since such a daemon also keeps whatever descriptors it inherited
//! (e.g. a `flock` a test runner holds) open.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup::{keep_requested, unique_name};

/// Longest a private libvirtd may take to answer after it is started.
// NB: it answers in ~1 s here; 30 s covers a loaded 2-core machine.
pub const START_WAIT: Duration = Duration::from_secs(30);
/// Longest a TERM may take before the daemon is killed.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// Kills every private libvirtd (`libvirtd --pid-file /tmp/eptest-…/run/libvirtd.pid`)
/// whose directory no longer exists: the daemon of a run killed before its Drop. A running
/// test's daemon always has its directory. Returns how many were killed.
pub fn kill_orphans() -> usize {
    let tmp = std::env::temp_dir();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for e in procs.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_libvirtd = args
            .first()
            .is_some_and(|a| a.ends_with(b"libvirtd") && !a.ends_with(b"virtlogd"));
        let Some(pid_file) = args
            .windows(2)
            .find(|w| w.first() == Some(&&b"--pid-file"[..]))
            .and_then(|w| w.get(1))
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        else {
            continue;
        };
        let ours = pid_file.strip_prefix(&tmp).is_ok_and(|rest| {
            rest.components()
                .next()
                .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("eptest-"))
        });
        let dir_gone = pid_file
            .parent()
            .and_then(Path::parent)
            .is_some_and(|d| !d.exists());
        if is_libvirtd && ours && dir_gone {
            println!(
                "eptest: killing orphaned private libvirtd {pid} ({})",
                pid_file.display()
            );
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            killed += 1;
        }
    }
    killed
}

/// A private libvirtd (see the module doc).
#[derive(Debug)]
pub struct PrivateLibvirtd {
    /// Its state directory (and the parent of every path below).
    pub dir: PathBuf,
    /// Its network namespace.
    pub netns: String,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl PrivateLibvirtd {
    /// Starts one for `test` and waits until it answers.
    pub fn start(test: &str) -> Self {
        Self::start_named(unique_name("network namespace", test))
    }

    /// Like [`start`](Self::start), with network namespace `netns` (a name the caller made
    /// unique; it must not exist yet). Its directory is `/tmp/NETNS-…`, readable by the
    /// guests' QEMU (which runs as another user).
    pub fn start_named(netns: String) -> Self {
        kill_orphans();
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{netns}-"))
            .tempdir()
            .expect("a temporary directory");
        let dir = tmp.path().to_owned();
        // NB: QEMU (another user) must reach the pool and NVRAM below it.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        println!(
            "eptest: private libvirtd in {} (netns {netns})",
            dir.display()
        );
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()
            .expect("ip netns add");
        assert!(ok.success(), "ip netns add {netns} failed");
        let _ = Command::new("ip")
            .args(["-n", &netns, "link", "set", "lo", "up"])
            .status();
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
            .create(true)
            .open(dir.join("etc/qemu.conf"))
            .unwrap();
        writeln!(q, "\nstdio_handler = \"file\"").unwrap();
        let mut me = Self {
            dir,
            netns,
            child: None,
            _tmp: tmp,
        };
        me.launch();
        me
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("libvirtd.log"))
            .unwrap();
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "set -e; for m in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt \
                 cache:/var/cache/libvirt log:/var/log/libvirt; do mkdir -p \"${m#*:}\"; \
                 mount --bind \"$1/${m%%:*}\" \"${m#*:}\"; done; \
                 exec libvirtd --pid-file \"$1/run/libvirtd.pid\"",
            )
            .arg("sh")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start libvirtd");
        self.child = Some(child);
        let start = Instant::now();
        while !self.socket().exists() || !self.virsh(&["version"]).status.success() {
            assert!(
                start.elapsed() < START_WAIT,
                "the private libvirtd did not answer within {START_WAIT:?}: {}",
                std::fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("run/libvirt-sock")
    }

    /// `virsh -q -c qemu:///system?socket=… ARGS`, bounded by `timeout 30`.
    pub fn virsh(&self, args: &[&str]) -> Output {
        virsh_at(&self.socket(), args)
    }

    /// Like [`virsh`](Self::virsh), panicking unless it succeeds; its stdout.
    pub fn virsh_ok(&self, args: &[&str]) -> String {
        let o = self.virsh(args);
        assert!(
            o.status.success(),
            "virsh {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Kills the daemon with SIGKILL (as a crash would) and waits until it is gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the daemon (TERM, then KILL after [`STOP_WAIT`]) and waits until it is gone;
    /// its guests keep running, as when an administrator stops the service.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < STOP_WAIT {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the daemon process runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The QEMU pid libvirt recorded for `domain` (`DIR/run/qemu/DOMAIN.pid`), if any.
    pub fn qemu_pid(&self, domain: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("run/qemu").join(format!("{domain}.pid")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Starts the daemon again over the same state (after [`kill9`](Self::kill9)).
    pub fn restart(&mut self) {
        self.kill9();
        self.launch();
    }
}

/// `virsh` against the libvirtd listening on `socket`.
pub fn virsh_at(socket: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["30", "virsh", "-q", "-c"])
        .arg(format!("qemu:///system?socket={}", socket.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("virsh")
}

impl Drop for PrivateLibvirtd {
    fn drop(&mut self) {
        if keep_requested() {
            println!(
                "eptest: keeping the private libvirtd in {}",
                self.dir.display()
            );
            return;
        }
        self.stop();
        // NB: whatever is left in the namespace (a dnsmasq, a QEMU) goes with it.
        if let Ok(o) = Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .output()
        {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that looks like a private libvirtd of pid file `pid_file` (argv[0]
    /// `libvirtd`, then `--pid-file PID_FILE`), sleeping.
    fn lookalike(pid_file: &Path) -> Child {
        Command::new("bash")
            .arg0("libvirtd")
            .args(["-c", "sleep 600; :", "--pid-file"])
            .arg(pid_file)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    #[test]
    fn only_a_private_libvirtd_whose_directory_is_gone_is_killed() {
        let live = tempfile::Builder::new()
            .prefix(&unique_name("network namespace", "orphans"))
            .tempdir()
            .unwrap();
        let gone = std::env::temp_dir().join(format!("{}-gone", unique_name("x", "orphans")));
        let other = tempfile::tempdir().unwrap();
        let mut orphan = lookalike(&gone.join("run/libvirtd.pid"));
        let mut running = lookalike(&live.path().join("run/libvirtd.pid"));
        // Not ours: a directory gone, but not a test's (`eptest-`) one.
        let mut foreign = lookalike(&other.path().join("nope/run/libvirtd.pid"));
        std::thread::sleep(Duration::from_millis(200));
        assert!(kill_orphans() >= 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = orphan.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the orphan was not killed");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success());
        assert!(
            running.try_wait().unwrap().is_none(),
            "a live run's daemon was killed"
        );
        assert!(
            foreign.try_wait().unwrap().is_none(),
            "a foreign daemon was killed"
        );
        // Each in a group of its own: the group goes, with its `sleep`.
        for c in [&mut orphan, &mut running, &mut foreign] {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.wait();
        }
    }
}
