//! The `egress-proxies` binary as a user runs it: exit codes, messages, and `check` / `images
//! prefetch` / `images gc` against the REAL libvirtd through a real sshd on 127.0.0.1.
//!
//! Real resources: a transient `eptest-` dir pool per test (its directory, and so every base
//! volume imported into it, is removed by the pool fixture's Drop on every path) and unique
//! `eptest-` provider entry names; both are printed before use. No domain is ever created
//! (`images gc` is shown a volume made by hand on a base instead).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../../egress-provider/tests/image_support/mod.rs"]
mod image_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ep_test_support::cleanup::{PoolFixture, unique_name};
use ep_test_support::sshd::Sshd;
use image_support::{ImageServer, Route, sha};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies");

/// Longest a single CLI run may take in these tests.
// NB: the slowest run imports a 200 KiB image through sshd (about a second); a check of an
// unreachable host fails on connection refused at once. 180 s only catches a hang.
const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// Runs the binary with `args`, killing it after [`RUN_DEADLINE`].
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("EGRESS_PROXIES_CONFIG")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            panic!("egress-proxies {args:?} did not finish within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    println!(
        "$ egress-proxies {}\n[exit {:?}]\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Like [`run`], off the async runtime's worker threads.
async fn run_async(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&a)
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// One host entry through the test sshd to the local libvirtd, using `pool`.
fn host_yaml(name: &str, address: &str, pool: &str, sshd: &Sshd) -> String {
    host_yaml_kh(name, address, pool, sshd, &sshd.known_hosts_path)
}

/// [`host_yaml`] with another known_hosts file.
fn host_yaml_kh(name: &str, address: &str, pool: &str, sshd: &Sshd, kh: &Path) -> String {
    format!(
        "      - name: {name}\n        address: \"{address}\"\n        user: root\n        \
         pool: {pool}\n        virtType: qemu\n        poolReserveGiB: 0\n        \
         sshKeyFile: {}\n        knownHostsFile: {}\n",
        sshd.client_key_path.display(),
        kh.display()
    )
}

#[test]
fn version_prints_the_version_and_protocol_without_touching_the_network() {
    let o = run(&["version"]);
    assert_eq!(o.status.code(), Some(0));
    let s = stdout(&o);
    assert!(
        s.starts_with(&format!("egress-proxies {}\n", env!("CARGO_PKG_VERSION"))),
        "{s}"
    );
    assert!(s.contains("commit: "), "{s}");
    assert!(s.contains("remote program 0x20008086 version 1"), "{s}");
}

#[test]
fn version_names_the_git_commit_the_binary_was_built_from() {
    let s = stdout(&run(&["version"]));
    let commit = s
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line: {s}"));
    let checkout = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !checkout {
        // Built from a tree without git: it says so instead of inventing a commit.
        assert!(commit.starts_with("unknown"), "{commit}");
        return;
    }
    assert!(
        commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "a commit hash, not {commit:?}"
    );
    // The checkout knows that commit (built from this tree).
    let known = Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(known.success(), "{commit} is not a commit of this checkout");
}

#[test]
fn an_unknown_command_is_a_usage_error_with_exit_code_2() {
    let o = run(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("frobnicate"), "{}", stderr(&o));
}

#[test]
fn check_on_an_invalid_config_prints_every_field_path_and_exits_2() {
    // finding: M16, M17, L12
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "bad.yaml",
        "providers:\n  - name: Home_1\n    type: libvirt\n    hosts:\n      - name: h1\n        \
         address: \"host:99999\"\n        pool: \"bad pool\"\n        sshKeyFile: /k\n        \
         knownHostsFile: /kh\n    images:\n      deb:\n        url: http://mirror.example/x.qcow2\n",
    );
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    for path in [
        "providers[0].name",
        "providers[0].hosts[0].address",
        "providers[0].hosts[0].pool",
        "providers[0].images.deb",
    ] {
        assert!(e.contains(path), "{path} missing from:\n{e}");
    }
    // The bad values are named too.
    assert!(e.contains("Home_1") && e.contains("99999"), "{e}");
    assert!(stdout(&o).is_empty(), "nothing probed: {}", stdout(&o));
}

#[test]
fn check_on_a_missing_config_file_is_a_usage_error() {
    let o = run(&["check", "--config", "/nonexistent/eptest-providers.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/eptest-providers.yaml"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn check_reports_a_real_host_through_sshd_as_ready_and_exits_0() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-check");
    let entry = unique_name("provider entry", "cc");
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}",
            host_yaml("h1", &format!("127.0.0.1:{}", sshd.port), &pool.name, &sshd)
        ),
    );
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(s.contains(&format!("provider entry {entry}")), "{s}");
    let row = s.lines().find(|l| l.starts_with("h1 ")).unwrap();
    assert!(row.contains(" Ready "), "{row}");
    assert!(row.contains("qemu"), "virt types: {row}");
    assert!(row.contains("(reserve 0 GiB)"), "pool free: {row}");
    assert!(s.contains("all 1 host(s) Ready"), "{s}");

    // The same as JSON.
    let o = run(&["check", "--config", cfg.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["state"], "Ready");
    assert_eq!(v[0]["entry"], entry.as_str());
    assert!(v[0]["latencyMs"].as_f64().is_some(), "{v}");
}

#[test]
fn check_reaches_a_local_address_host_through_the_unix_socket() {
    let pool = PoolFixture::create("cli-local");
    let entry = unique_name("provider entry", "cl");
    let dir = tempfile::tempdir().unwrap();
    // `address: local`: no SSH; the key paths are required by the loader but never opened.
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n      - name: here\n        \
             address: local\n        pool: {}\n        virtType: qemu\n        \
             sshKeyFile: /nonexistent/key\n        knownHostsFile: /nonexistent/known_hosts\n",
            pool.name
        ),
    );
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    let row = s.lines().find(|l| l.starts_with("here ")).unwrap();
    assert!(row.contains(" local ") && row.contains(" Ready "), "{row}");
}

#[test]
fn check_with_an_unreachable_host_exits_1_and_names_the_host() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-unreach");
    let entry = unique_name("provider entry", "cu");
    // A port nothing listens on: bind, read the port, close.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    // The closed port's host key is known, so the failure is the connection itself.
    let kh = write(
        dir.path(),
        "known_hosts",
        &format!("[127.0.0.1]:{closed} {}\n", sshd.host_ed25519),
    );
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}{}",
            host_yaml(
                "good",
                &format!("127.0.0.1:{}", sshd.port),
                &pool.name,
                &sshd
            ),
            host_yaml_kh(
                "gone",
                &format!("127.0.0.1:{closed}"),
                &pool.name,
                &sshd,
                &kh
            )
        ),
    );
    let o = run(&["check", "--config", cfg.to_str().unwrap()]);
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    let good = s.lines().find(|l| l.starts_with("good ")).unwrap();
    assert!(good.contains(" Ready "), "{good}");
    let gone = s.lines().find(|l| l.starts_with("gone ")).unwrap();
    assert!(gone.contains(" Unreachable "), "{gone}");
    assert!(
        s.contains(&format!("{entry}/gone is Unreachable: ")),
        "the full reason names the host: {s}"
    );
    assert!(s.contains(&format!("127.0.0.1:{closed}")), "{s}");
    assert!(
        s.to_lowercase().contains("refused"),
        "the cause is said: {s}"
    );
    assert!(s.contains("1 of 2 host(s) not Ready"), "{s}");
}

/// A real qcow2 image of `size` virtual bytes (sparse: a few hundred KiB).
fn qcow2_image(size: &str, dir: &Path) -> Vec<u8> {
    let path = dir.join("img.qcow2");
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&path).unwrap()
}

fn pool_files(pool: &PoolFixture) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&pool.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_prefetch_warms_the_base_once_and_a_second_run_reuses_it() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-prefetch");
    let entry = unique_name("provider entry", "cp");
    let server = ImageServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let img = qcow2_image("1G", dir.path());
    let url = server.route("/tiny.qcow2", Route::new(img.clone()));
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}    images:\n      \
             tiny:\n        url: {url}\n        sha256: {}\n        format: qcow2\n",
            host_yaml("h1", &format!("127.0.0.1:{}", sshd.port), &pool.name, &sshd),
            sha(&img)
        ),
    );
    let cfg = cfg.to_str().unwrap().to_owned();
    let args = |k: &str| -> Vec<String> {
        ["images", "prefetch", "--config", &cfg, k]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    };

    let o = run_async(args("tiny")).await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(s.contains(&format!("{entry}/h1: ready: imported")), "{s}");
    assert_eq!(server.gets("/tiny.qcow2"), 1);
    let files = pool_files(&pool);
    println!("eptest: pool {} now holds {files:?}", pool.name);
    // Published: the base and its marker (the base is an overlay onto the verified part,
    // which therefore stays).
    let prefix = format!("ep-{entry}-base-");
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(&prefix) && f.ends_with(".qcow2")),
        "a base of this entry: {files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(&prefix) && f.ends_with(".marker")),
        "its marker: {files:?}"
    );

    let o = run_async(args("tiny")).await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(
        s.contains(&format!("{entry}/h1: ready: already cached")),
        "{s}"
    );
    assert_eq!(
        server.gets("/tiny.qcow2"),
        1,
        "the second run downloads nothing"
    );
    assert_eq!(pool_files(&pool), files, "nothing added or removed");

    // An unknown key is a usage error that lists the catalogue.
    let o = run_async(args("nope")).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("tiny"), "{}", stderr(&o));
    // `pool` (Drop) removes the pool and its directory, base included.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_prefetch_exits_1_when_a_host_fails_and_says_why() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-prefetch-fail");
    let entry = unique_name("provider entry", "cf");
    let server = ImageServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let img = qcow2_image("1G", dir.path());
    let url = server.route("/tiny.qcow2", Route::new(img.clone()));
    // The pinned digest does not match the bytes served.
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}    images:\n      \
             tiny:\n        url: {url}\n        sha256: {}\n",
            host_yaml("h1", &format!("127.0.0.1:{}", sshd.port), &pool.name, &sshd),
            "0".repeat(64)
        ),
    );
    let o = run_async(vec![
        "images".into(),
        "prefetch".into(),
        "--config".into(),
        cfg.to_str().unwrap().into(),
        "tiny".into(),
    ])
    .await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(s.contains(&format!("{entry}/h1: FAILED: ")), "{s}");
    assert!(s.contains("sha256"), "the reason names the digest: {s}");
    let files = pool_files(&pool);
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with(&format!("ep-{entry}-")) && !f.contains(".part-")),
        "no base or marker published: {files:?}"
    );
}

/// `virsh vol-list POOL` on the shared libvirtd, names only.
fn vol_list(pool: &PoolFixture) -> Vec<String> {
    let out = Command::new("timeout")
        .args([
            "60",
            "virsh",
            "-q",
            "-c",
            "qemu:///system",
            "vol-list",
            &pool.name,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_gc_removes_only_bases_nothing_uses_and_lists_the_pool_before_and_after() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-images-gc");
    let entry = unique_name("provider entry", "cg");
    let server = ImageServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2_image("1G", dir.path());
    let b = qcow2_image("2G", dir.path());
    let (ua, ub) = (
        server.route("/a.qcow2", Route::new(a.clone())),
        server.route("/b.qcow2", Route::new(b.clone())),
    );
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}    images:\n      \
             a:\n        url: {ua}\n        sha256: {}\n        format: qcow2\n      \
             b:\n        url: {ub}\n        sha256: {}\n        format: qcow2\n",
            host_yaml("h1", &format!("127.0.0.1:{}", sshd.port), &pool.name, &sshd),
            sha(&a),
            sha(&b)
        ),
    );
    let cfg = cfg.to_str().unwrap().to_owned();
    let cli = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["images".to_owned()];
        v.extend(args.iter().map(|s| (*s).to_owned()));
        v.extend(["--config".to_owned(), cfg.clone()]);
        v
    };
    for k in ["a", "b"] {
        let o = run_async(cli(&["prefetch", k])).await;
        assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    }
    let base_of = |k: &str| {
        let prefix = format!("ep-{entry}-base-img-{k}-");
        pool_files(&pool)
            .into_iter()
            .find(|f| f.starts_with(&prefix) && f.ends_with(".qcow2"))
            .unwrap()
    };
    let (base_a, base_b) = (base_of("a"), base_of("b"));
    // A live overlay on a's base (made by hand, no domain): it keeps a in use.
    let overlay = "eptest-overlay-on-a.qcow2";
    let path_a = pool.file(&base_a);
    let made = Command::new("timeout")
        .args(["60", "virsh", "-q", "-c", "qemu:///system", "vol-create-as"])
        .args([
            &pool.name,
            overlay,
            "1G",
            "--format",
            "qcow2",
            "--backing-vol",
        ])
        .arg(&path_a)
        .args(["--backing-vol-format", "qcow2"])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let before = vol_list(&pool);
    println!("eptest: pool {} before: {before:#?}", pool.name);
    let line = |s: &str, base: &str| -> String {
        s.lines()
            .find(|l| l.contains(base))
            .unwrap_or_else(|| panic!("no line for {base}: {s}"))
            .to_owned()
    };

    // A dry run with no grace: b would go, a is in use by the overlay; nothing changes.
    let o = run_async(cli(&["gc", "--dry-run", "--grace", "0s"])).await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(line(&s, &base_b).contains("base: would delete"), "{s}");
    let la = line(&s, &base_a);
    assert!(la.contains("base: kept") && la.contains(overlay), "{la}");
    assert_eq!(vol_list(&pool), before, "a dry run removes nothing");

    // The default grace (60 minutes from the upload): b was uploaded just now, it stays.
    let o = run_async(cli(&["gc"])).await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(line(&s, &base_b).contains("less than the grace"), "{s}");
    assert_eq!(vol_list(&pool), before);

    // No grace: b goes with its marker and data volume; a and its overlay stay.
    let o = run_async(cli(&["gc", "--grace", "0s"])).await;
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert!(line(&s, &base_b).contains("base: deleted"), "{s}");
    let after = vol_list(&pool);
    println!("eptest: pool {} after: {after:#?}", pool.name);
    let data_b = before
        .iter()
        .find(|v| v.starts_with(&format!("ep-{entry}-base-img-b-")) && v.contains(".part-"))
        .unwrap();
    for gone in [&base_b, &format!("{base_b}.marker"), data_b] {
        assert!(!after.contains(gone), "{gone} removed: {after:?}");
    }
    let b_volumes: Vec<&String> = before
        .iter()
        .filter(|v| v.starts_with(&format!("ep-{entry}-base-img-b-")))
        .collect();
    assert_eq!(b_volumes.len(), 3, "base, marker, data volume: {before:?}");
    assert_eq!(after.len(), before.len() - 3, "{after:?}");
    assert!(after.contains(&base_a) && after.contains(&overlay.to_owned()));

    // The overlay goes: a is unused now and goes too; only foreign volumes are left.
    let del = Command::new("timeout")
        .args([
            "60",
            "virsh",
            "-q",
            "-c",
            "qemu:///system",
            "vol-delete",
            overlay,
        ])
        .args(["--pool", &pool.name])
        .output()
        .unwrap();
    assert!(
        del.status.success(),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    let o = run_async(cli(&["gc", "--grace", "0s"])).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let last = vol_list(&pool);
    println!("eptest: pool {} at the end: {last:#?}", pool.name);
    assert!(
        !last.iter().any(|v| v.starts_with(&format!("ep-{entry}-"))),
        "{last:?}"
    );
}

/// A 127.0.0.1 port nothing listens on (bound, read, closed).
#[test]
fn pools_quarantine_and_release_edit_the_pools_file_and_refuse_an_unknown_member() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".default.web.pool-members.json"),
        r#"{"members":[{"name":"web-a","host":"h1","templateHash":"x","created":"2026-01-01T00:00:00Z"}]}"#,
    )
    .unwrap();
    let file = || std::fs::read_to_string(dir.path().join("default.web.quarantine")).unwrap();
    let d = dir.path().to_str().unwrap();
    let o = run(&[
        "pools",
        "quarantine",
        "--proxies",
        d,
        "web",
        "web-a",
        "--reason",
        "inspect it",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("quarantined (inspect it)"),
        "{}",
        stdout(&o)
    );
    assert_eq!(file(), "web-a inspect it\n");
    let o = run(&[
        "-o",
        "json",
        "pools",
        "release",
        "--proxies",
        d,
        "web",
        "web-a",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["changed"], true);
    assert_eq!(doc["quarantined"], false);
    assert_eq!(file(), "");
    let o = run(&["pools", "quarantine", "--proxies", d, "web", "web-z"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no member \"web-z\" (its members: web-a)"),
        "{}",
        stderr(&o)
    );
    let o = run(&["pools", "release", "--proxies", d, "nope", "web-a"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("pool default/nope has no members"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "-o",
        "wide",
        "pools",
        "release",
        "--proxies",
        d,
        "web",
        "web-a",
    ]);
    assert_eq!(o.status.code(), Some(2), "no table: wide refused");
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn status_with_nothing_listening_says_so_and_exits_1() {
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let o = run(&["status", "--server", &server]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("nothing is listening at {server}")),
        "{e}"
    );
    assert!(
        e.contains("egress-proxies standalone"),
        "says what to start: {e}"
    );
    assert!(e.to_lowercase().contains("refused"), "the cause: {e}");
    assert!(stdout(&o).is_empty());
}

#[test]
fn status_rejects_a_server_that_is_not_an_http_url() {
    let o = run(&["status", "--server", "https://127.0.0.1:9464"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an http:// URL"), "{}", stderr(&o));
}

#[test]
fn status_takes_a_server_given_as_host_and_port_without_http() {
    let port = free_port();
    let o = run(&["status", "--server", &format!("127.0.0.1:{port}")]);
    assert_eq!(o.status.code(), Some(1), "dialled, found nothing listening");
    assert!(
        stderr(&o).contains(&format!("nothing is listening at http://127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
}

/// A valid config whose only host is a closed port: GC must refuse before contacting it.
/// A config whose one host is an address nothing listens on, with SSH files that exist (a
/// missing one is a configuration error before any pass) but hold no usable key.
fn closed_host_config(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let key = write(dir, "id_none", "not a key\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let kh = write(dir, "known_hosts", "");
    write(
        dir,
        "providers.yaml",
        &format!(
            "providers:\n  - name: eptest-gc\n    type: libvirt\n    hosts:\n      - name: h1\n        \
             address: \"127.0.0.1:{}\"\n        pool: eptest-none\n        sshKeyFile: {}\n        \
             knownHostsFile: {}\n",
            free_port(),
            key.display(),
            kh.display()
        ),
    )
}

#[test]
fn gc_refuses_an_empty_manifest_directory_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = closed_host_config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("holds no Proxy manifest") && e.contains("--allow-empty"),
        "{e}"
    );
    assert!(stdout(&o).is_empty(), "no pass ran: {}", stdout(&o));

    // A path that does not exist is refused the same way.
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        dir.path().join("typo").to_str().unwrap(),
        "--dry-run",
        "--allow-empty",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot list"), "{}", stderr(&o));

    // With --allow-empty the pass runs; the host is unreachable, so its listing fails, nothing
    // is collected, and the exit code says the pass was not clean.
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
        "--dry-run",
        "--allow-empty",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let s = stdout(&o);
    assert!(
        s.contains("entry eptest-gc: instances not listed, nothing collected"),
        "{s}"
    );
    assert!(s.contains("0 live Proxies; dry run: 0 deleted"), "{s}");
}

#[test]
fn gc_refuses_a_directory_with_a_bad_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = closed_host_config(dir.path());
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    write(&proxies, "broken.yaml", "apiVersion: [unclosed\n");
    let o = run(&[
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--proxies",
        proxies.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("broken.yaml") && e.contains("refusing to collect"),
        "{e}"
    );
}

#[test]
fn gc_rejects_a_bad_min_age_as_a_usage_error() {
    let o = run(&[
        "gc",
        "--config",
        "/x.yaml",
        "--proxies",
        "/tmp",
        "--min-age",
        "soon",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--min-age"), "{}", stderr(&o));
}

#[test]
fn standalone_serves_status_and_stops_cleanly_on_sigterm() {
    let sshd = Sshd::start();
    let pool = PoolFixture::create("cli-standalone");
    let entry = unique_name("provider entry", "cs");
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "providers.yaml",
        &format!(
            "providers:\n  - name: {entry}\n    type: libvirt\n    hosts:\n{}",
            host_yaml("h1", &format!("127.0.0.1:{}", sshd.port), &pool.name, &sshd)
        ),
    );
    let proxies = dir.path().join("proxies");
    std::fs::create_dir(&proxies).unwrap();
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let child = Command::new(BIN)
        .args(["standalone", "--config", cfg.to_str().unwrap(), "--proxies"])
        .arg(&proxies)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    println!("eptest: started standalone pid {}", child.id());
    // Killed on every path (a failed assertion included).
    struct Kill(Option<std::process::Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            if let Some(c) = &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let pid = child.id();
    let mut guard = Kill(Some(child));

    // Wait until it serves.
    let start = Instant::now();
    let status = loop {
        let o = run(&["status", "--server", &server]);
        if o.status.code() == Some(0) {
            break o;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "standalone did not serve /status within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        stdout(&status).contains("no Proxies"),
        "{}",
        stdout(&status)
    );
    let o = run(&["status", "--server", &server, "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["proxies"].as_array().unwrap().is_empty(), "{v}");

    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut child = guard.0.take().unwrap();
    let deadline = Instant::now() + RUN_DEADLINE;
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("standalone did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    println!(
        "--- standalone stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(code, Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("egress-proxies standalone starting"),
        "the start is logged at info by default"
    );
}
