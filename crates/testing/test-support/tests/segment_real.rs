//! The two-host segment on the real tools: two private libvirtds, each in its own network
//! namespace with its own sshd, on one bridge segment. From the test's namespace each host's
//! sshd answers on its segment address, `virsh` reaches each daemon over SSH (the way the
//! operator does), each host has its storage pool and bridge; dropping the segment leaves no
//! namespace, process or directory of it. No guest is booted (the failover test does that).
//!
//! Needs root, libvirtd, OpenSSH and iproute2 (`.ci/setup-host`). The test re-executes itself
//! inside a network namespace it creates (the segment's bridge goes there).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ep_test_support::cleanup::unique_name;
use ep_test_support::e2e::{env, reexec_in_netns, run_ok};
use ep_test_support::segment::{HOST_BRIDGE, HOST_POOL, Segment, remove_leftovers};

const IN_NETNS_ENV: &str = "EPTEST_SEGMENT_IN_NETNS";
const NAME_ENV: &str = "EPTEST_SEGMENT_NAME";
/// Two daemons and two sshds start in a few seconds; 5 minutes covers a loaded machine.
const BUDGET: Duration = Duration::from_secs(300);

#[test]
fn two_hosts_on_one_segment_answer_over_ssh_and_leave_nothing_behind() {
    if std::env::var_os(IN_NETNS_ENV).is_none() {
        let ns = unique_name("network namespace", "segment");
        run_ok(Command::new("ip").args(["netns", "add", &ns]));
        let run = std::panic::catch_unwind(|| {
            reexec_in_netns(
                &ns,
                "two_hosts_on_one_segment_answer_over_ssh_and_leave_nothing_behind",
                BUDGET,
                &[env(IN_NETNS_ENV, "1"), env(NAME_ENV, &ns)],
            );
        });
        remove_leftovers(&ns);
        let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
        if let Err(e) = run {
            std::panic::resume_unwind(e);
        }
        return;
    }
    let name = std::env::var(NAME_ENV).unwrap();
    let seg = Segment::create_named(name.clone(), 2);
    let mut dirs = Vec::new();
    for h in &seg.hosts {
        // NB: through the host's sshd, as the operator goes; virsh runs on the host side.
        let out = Command::new("timeout")
            .args(["60", "ssh", "-o", "BatchMode=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                h.sshd.known_hosts_path.display()
            ))
            .arg("-i")
            .arg(&h.sshd.client_key_path)
            .args(["-p", &h.sshd.port.to_string()])
            .arg(format!("root@{}", h.ip))
            .arg(format!(
                "virsh -q -c 'qemu:///system?socket={}' pool-list --name",
                h.socket().display()
            ))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let pools = String::from_utf8_lossy(&out.stdout).into_owned();
        println!(
            "host {} ({}): pools over SSH {pools:?} {}",
            h.index,
            h.ip,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "virsh over SSH to host {}", h.index);
        assert!(pools.lines().any(|l| l.trim() == HOST_POOL), "{pools}");
        let links = h.exec_ok("ip", &["-o", "link", "show", HOST_BRIDGE]);
        assert!(links.contains("UP"), "{links}");
        assert!(h.domains().is_empty());
        dirs.push(h.libvirtd.dir.clone());
    }
    // The hosts see each other on the segment.
    let a = &seg.hosts[0];
    let b = &seg.hosts[1];
    a.exec_ok(
        "bash",
        &["-c", &format!("exec 3<>/dev/tcp/{}/{}", b.ip, b.sshd.port)],
    );
    drop(seg);
    for d in &dirs {
        assert!(!d.exists(), "{} left", d.display());
    }
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{name}-h")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    assert!(!Path::new("/sys/class/net").join("eps").exists());
}
