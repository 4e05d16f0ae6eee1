//! The container image, built and run here: `scripts/build-image` assembles it (OCI layout,
//! umoci) around the binary cargo built; the test unpacks it with umoci and runs its
//! entrypoint the way the chart runs the pod: the image's filesystem as root, mounted
//! read-only, as its user (uid/gid 65532, a real non-root uid), with only /tmp writable and
//! the config mounted read-only under /etc/egress-proxies. It does so in a private mount
//! namespace (`unshare --mount` + `chroot --userspec`), so nothing is mounted on the machine.
//! `version` succeeds; `kubernetes` against the fake API server over HTTPS (generated CA,
//! bearer token) takes the Lease, serves /readyz and releases the Lease on SIGTERM; without
//! any cluster configuration it exits 1 saying so. Needs root (mounts) and umoci
//! (.ci/setup-host installs it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod kube_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube_support::{ApiServer, LEASE_NAMESPACE, SocketHosts, TOKEN};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The image's user and group (the chart's runAsUser / runAsGroup).
const NONROOT: u32 = 65532;

/// Longest the image build (no cargo build: the binary is given) may take.
// NB: measured ~2 s (copy, compress ~90 MB of debug binary); 120 s is the CI budget.
const BUILD_DEADLINE: Duration = Duration::from_secs(120);
/// Longest `version` or a failing start may take inside the image.
// NB: both take milliseconds; 60 s only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// Longest the operator in the image may take to lead and be ready.
// NB: the Lease is taken in one round trip and readiness follows the first listing; seconds
// on a loaded machine. 60 s catches a hang.
const READY_DEADLINE: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` to completion within `deadline`, killing it otherwise.
fn run(mut cmd: Command, deadline: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    finish(child, deadline)
}

fn finish(mut child: Child, deadline: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "did not finish within {deadline:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    println!(
        "[exit {:?}]\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The image built by scripts/build-image and unpacked by umoci: (bundle dir, its OCI
/// runtime config). The bundle is a scratch copy of the image's filesystem.
struct Image {
    dir: tempfile::TempDir,
    config: Value,
}

impl Image {
    fn build() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("eptest-image-")
            .tempdir()
            .unwrap();
        let out = dir.path().join("out");
        let mut build = Command::new(repo().join("scripts/build-image"));
        build.arg("--binary").arg(BIN).arg("--out").arg(&out);
        let t = Instant::now();
        let o = run(build, BUILD_DEADLINE);
        assert!(o.status.success(), "scripts/build-image failed");
        println!("image built in {:?}", t.elapsed());
        let archive = out.join(format!("egress-proxies-{VERSION}.oci.tar"));
        assert!(archive.is_file(), "no OCI archive");
        let bundle = dir.path().join("bundle");
        let mut unpack = Command::new("umoci");
        unpack
            .args(["unpack", "--image"])
            .arg(format!("{}:{VERSION}", out.join("oci").display()))
            .arg(&bundle);
        let o = run(unpack, RUN_DEADLINE);
        assert!(o.status.success(), "umoci unpack failed");
        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap())
                .unwrap();
        Self { dir, config }
    }

    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("bundle/rootfs")
    }

    /// The entrypoint and default arguments the image declares.
    fn args(&self) -> Vec<String> {
        self.config["process"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    }

    /// A command running `args` (the first is the program, a path inside the image) with the
    /// image's filesystem as a read-only root, /tmp a small tmpfs, /proc mounted, each
    /// (host dir, image path) of `binds` mounted read-only, as uid/gid 65532.
    fn command(&self, args: &[String], binds: &[(&Path, &str)]) -> Command {
        let root = self.rootfs();
        // Mount points are made in the scratch bundle before the root turns read-only, as a
        // container runtime does.
        for d in ["proc", "dev", "tmp"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut script = String::from(
            "R=$1; shift\n\
             mount --bind \"$R\" \"$R\"\n\
             mount -o remount,bind,ro \"$R\"\n\
             mount -t tmpfs -o size=1m,mode=1777 eptest-tmp \"$R/tmp\"\n\
             mount -t proc proc \"$R/proc\"\n\
             mount --rbind /dev \"$R/dev\"\n",
        );
        for (i, (_, inside)) in binds.iter().enumerate() {
            std::fs::create_dir_all(root.join(inside.trim_start_matches('/'))).unwrap();
            script.push_str(&format!(
                "mount --bind \"$B{i}\" \"$R{inside}\"\nmount -o remount,bind,ro \"$R{inside}\"\n"
            ));
        }
        script.push_str(&format!(
            "exec chroot --userspec={NONROOT}:{NONROOT} \"$R\" \"$@\"\n"
        ));
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
            .arg(script)
            .arg("sh")
            .arg(&root)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("RUST_LOG", "info");
        for (i, (host, _)) in binds.iter().enumerate() {
            c.env(format!("B{i}"), host);
        }
        c
    }
}

/// Makes `dir` and everything in it readable (and sockets connectable) by the image's user.
fn share_with_nonroot(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let mode = if p.is_dir() {
            share_with_nonroot(&p);
            0o755
        } else if p.extension().is_some_and(|x| x == "sock") {
            0o777
        } else {
            0o644
        };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

#[test]
fn the_image_declares_its_entrypoint_nonroot_user_and_no_shell() {
    let img = Image::build();
    let args = img.args();
    assert_eq!(args[0], "/usr/local/bin/egress-proxies");
    assert_eq!(
        args[1..],
        [
            "kubernetes",
            "--config=/etc/egress-proxies/config/providers.yaml"
        ]
    );
    assert_eq!(img.config["process"]["user"]["uid"], NONROOT);
    assert_eq!(img.config["process"]["user"]["gid"], NONROOT);
    let root = img.rootfs();
    for absent in ["bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/apt"] {
        assert!(!root.join(absent).exists(), "{absent} in the image");
    }
    assert!(root.join("etc/ssl/certs/ca-certificates.crt").is_file());
}

#[test]
fn version_runs_in_the_image_as_nonroot_on_a_read_only_root() {
    let img = Image::build();
    let mut args = vec![img.args()[0].clone(), "version".into()];
    let o = run(img.command(&args, &[]), RUN_DEADLINE);
    assert!(o.status.success(), "version failed in the image");
    assert!(String::from_utf8_lossy(&o.stdout).contains(VERSION));
    // The root really is read-only to it: writing files into the image fails.
    args = vec![
        img.args()[0].clone(),
        "crds".into(),
        "--dir".into(),
        "/etc/egress-proxies".into(),
    ];
    let o = run(img.command(&args, &[]), RUN_DEADLINE);
    assert!(!o.status.success(), "wrote into the image's root");
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    assert!(
        err.contains("read-only") || err.contains("permission denied"),
        "{err}"
    );
}

#[test]
fn kubernetes_in_the_image_without_any_cluster_configuration_exits_1_saying_so() {
    let img = Image::build();
    let hosts_dir = tempfile::tempdir().unwrap();
    let cfg_dir = hosts_dir.path().join("config");
    std::fs::create_dir(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("providers.yaml"),
        "providers:\n  - name: eptest-img\n    type: libvirt\n    hosts:\n      - name: h1\n        \
         address: local\n        socket: /nonexistent/libvirt-sock\n        pool: eptest-none\n",
    )
    .unwrap();
    share_with_nonroot(hosts_dir.path());
    let mut args = img.args();
    args.push("--listen=127.0.0.1:0".into());
    let mut c = img.command(&args, &[(&cfg_dir, "/etc/egress-proxies/config")]);
    c.env("POD_NAMESPACE", LEASE_NAMESPACE)
        .env("POD_NAME", "eptest-image");
    let o = run(c, RUN_DEADLINE);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot configure a Kubernetes client"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_in_the_image_leads_over_https_and_releases_the_lease_on_sigterm() {
    let img = tokio::task::spawn_blocking(Image::build).await.unwrap();
    let server = ApiServer::start().await;
    server.apply_committed_crds().await;
    let hosts = SocketHosts::start(1).await;
    // The provider config as the pod sees it: the hosts' sockets at /run/hosts.
    let cfg_dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(hosts.config())
        .unwrap()
        .replace(&hosts.dir.path().display().to_string(), "/run/hosts");
    std::fs::write(cfg_dir.path().join("providers.yaml"), text).unwrap();
    // The kubeconfig as the pod sees it: the CA at its mounted path.
    let kube_dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        server.dir.path().join("ca.crt"),
        kube_dir.path().join("ca.crt"),
    )
    .unwrap();
    kube_support::write_kubeconfig(
        &kube_dir.path().join("kubeconfig"),
        &server.url,
        Path::new("/etc/egress-proxies/kube/ca.crt"),
        TOKEN,
    );
    for d in [cfg_dir.path(), kube_dir.path(), hosts.dir.path()] {
        share_with_nonroot(d);
    }
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, kube_support::free_port()));
    let mut args = img.args();
    args.extend([
        format!("--listen={listen}"),
        "--kubeconfig=/etc/egress-proxies/kube/kubeconfig".into(),
    ]);
    let mut c = img.command(
        &args,
        &[
            (cfg_dir.path(), "/etc/egress-proxies/config"),
            (kube_dir.path(), "/etc/egress-proxies/kube"),
            (hosts.dir.path(), "/run/hosts"),
        ],
    );
    c.env("POD_NAMESPACE", LEASE_NAMESPACE)
        .env("POD_NAME", "eptest-image")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(kube_support::HTTP_TIMEOUT)
        .build()
        .unwrap();
    let start = Instant::now();
    loop {
        let ready = client
            .get(format!("http://{listen}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() == 200);
        if ready && server.lease_holder().as_deref() == Some("eptest-image") {
            break;
        }
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the operator in the image exited ({st}):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if start.elapsed() > READY_DEADLINE {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "not leading and ready within {READY_DEADLINE:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(kube_support::POLL).await;
    }
    // unshare and chroot exec into the binary: the child's pid is the operator's, and it
    // runs as the image's user (a real uid, not a mapped one).
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    for key in ["Uid:", "Gid:"] {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        assert!(
            line.split_whitespace()
                .skip(1)
                .all(|id| id == NONROOT.to_string()),
            "{line}"
        );
    }
    let exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
    assert!(exe.ends_with("usr/local/bin/egress-proxies"), "{exe:?}");
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let out = tokio::task::spawn_blocking(move || finish(child, kube_support::EXIT_DEADLINE))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "SIGTERM is a clean stop");
    assert_eq!(server.lease_holder(), None, "the Lease was released");
}
