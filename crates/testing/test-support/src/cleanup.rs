//! Unique resource names, Drop guards and the sweep of leftovers (finding M19).
//!
//! Guarantees:
//! - every name is `eptest-<test>-<unix seconds>-<random>`, printed before the resource exists,
//!   so a killed run leaves names a human can find, and the sweep can tell their age;
//! - guards remove their resource with `virsh` (never with the client under test, which may be
//!   the thing that failed) on every exit path, panics and timeouts included;
//! - [`sweep_once`] runs at the start of the suite in every process and removes `eptest-`
//!   domains, pools and temporary directories older than [`SWEEP_AGE`]; younger ones may
//!   belong to a run in progress and are left alone.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Prefix of every resource these suites create.
pub const PREFIX: &str = "eptest-";

/// Leftovers older than this are swept.
// NB: the longest test runs ~2 minutes and a full suite ~3; 30 minutes never touches a run in
// progress (including one in another process) and still clears a killed run the same hour.
pub const SWEEP_AGE: Duration = Duration::from_secs(30 * 60);

/// Deadline for one `virsh` invocation (passed to coreutils `timeout`).
// NB: virsh answers in well under a second here; destroying a wedged QEMU can take ~10 s.
pub const VIRSH_TIMEOUT_SECS: &str = "60";

/// The URI `virsh` manages.
pub const VIRSH_URI: &str = "qemu:///system";

/// Set to a true value (`1`, `true`, `yes`, `on`) to keep what the tests create, for
/// debugging; false values (`0`, `false`, `no`, `off`, empty) and absence remove it. The
/// sweep still collects kept resources once they are older than [`SWEEP_AGE`].
pub const KEEP_ENV: &str = "EPTEST_KEEP";

/// Parses a boolean environment value strictly: `None` for anything that is not clearly true
/// or false (finding L25: `KEEP=0` must never mean "keep").
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Whether [`KEEP_ENV`] asks to keep resources; an unparsable value fails the test loudly
/// rather than guessing.
pub fn keep_requested() -> bool {
    match std::env::var(KEEP_ENV) {
        Err(_) => false,
        Ok(v) => parse_bool(&v)
            .unwrap_or_else(|| panic!("{KEEP_ENV}={v:?} is not a boolean (use 1/0, true/false)")),
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random-enough u32 for unique names (per process and call).
pub fn random_u32() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    (h.finish() & 0xffff_ffff) as u32
}

/// A name for a resource of `kind` created by `test`, created at `secs` (Unix time).
pub fn name_at(test: &str, secs: u64) -> String {
    format!("{PREFIX}{test}-{secs}-{:08x}", random_u32())
}

/// A fresh unique name for a resource of `kind` created by `test`; printed first.
pub fn unique_name(kind: &str, test: &str) -> String {
    let name = name_at(test, now_secs());
    println!("eptest: creating {kind} {name}");
    name
}

/// How old an `eptest-` name is, from the timestamp it carries; `None` for names that do not
/// follow the format (those are never swept).
pub fn age_of(name: &str) -> Option<Duration> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut parts = rest.rsplitn(3, '-');
    let _random = parts.next()?;
    let secs: u64 = parts.next()?.parse().ok()?;
    let _test = parts.next()?;
    Some(Duration::from_secs(now_secs().saturating_sub(secs)))
}

/// Runs `virsh ARGS` against the system daemon, bounded by [`VIRSH_TIMEOUT_SECS`].
pub fn virsh(args: &[&str]) -> Output {
    Command::new("timeout")
        .args([VIRSH_TIMEOUT_SECS, "virsh", "-q", "-c", VIRSH_URI])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run virsh (is libvirt-clients installed?)")
}

/// Runs `virsh ARGS` and returns its stdout; panics with its stderr when it fails.
pub fn virsh_ok(args: &[&str]) -> String {
    let out = virsh(args);
    assert!(
        out.status.success(),
        "virsh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The non-empty trimmed lines `virsh ARGS` prints (names, volume lists).
pub fn names_from(args: &[&str]) -> Vec<String> {
    let out = virsh(args);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Domain names known to the daemon (all states), as `virsh` sees them.
pub fn domain_names() -> Vec<String> {
    names_from(&["list", "--all", "--name"])
}

/// Pool names known to the daemon (all states), as `virsh` sees them.
pub fn pool_names() -> Vec<String> {
    names_from(&["pool-list", "--all", "--name"])
}

/// Stops and undefines a domain with every metadata flag; errors (already gone) are ignored.
pub fn remove_domain(name: &str) {
    let _ = virsh(&["destroy", name]);
    let _ = virsh(&[
        "undefine",
        name,
        "--managed-save",
        "--snapshots-metadata",
        "--checkpoints-metadata",
        "--nvram",
    ]);
}

/// Stops (and, if persistent, undefines) a pool; errors (already gone) are ignored.
pub fn remove_pool(name: &str) {
    let _ = virsh(&["pool-destroy", name]);
    let _ = virsh(&["pool-undefine", name]);
}

/// Removes the domain `name` when dropped.
#[derive(Debug)]
pub struct DomainGuard {
    /// The domain's name.
    pub name: String,
}

impl DomainGuard {
    /// A new unique domain name for `test`, guarded from now on.
    pub fn new(test: &str) -> Self {
        Self {
            name: unique_name("domain", test),
        }
    }
}

impl Drop for DomainGuard {
    fn drop(&mut self) {
        if keep_requested() {
            println!("eptest: keeping domain {} ({KEEP_ENV})", self.name);
            return;
        }
        remove_domain(&self.name);
    }
}

/// A transient `dir` pool over a fresh directory under the system temp dir; destroyed and its
/// directory removed when dropped.
#[derive(Debug)]
pub struct PoolFixture {
    /// The pool's name (also the directory's name).
    pub name: String,
    /// The pool's target directory.
    pub dir: PathBuf,
}

impl PoolFixture {
    /// Creates the directory and the pool (`virsh pool-create-as NAME dir --target DIR`).
    pub fn create(test: &str) -> Self {
        Self::create_named(unique_name("pool", test))
    }

    /// Like [`create`](Self::create) with a given name (already printed by the caller).
    pub fn create_named(name: String) -> Self {
        let dir = std::env::temp_dir().join(&name);
        let me = Self { name, dir };
        std::fs::create_dir_all(&me.dir).expect("create the pool directory");
        let dir = me.dir.to_str().expect("utf-8 temp dir");
        virsh_ok(&["pool-create-as", &me.name, "dir", "--target", dir]);
        me
    }

    /// The path of a volume of this pool.
    pub fn file(&self, vol: &str) -> PathBuf {
        self.dir.join(vol)
    }
}

impl Drop for PoolFixture {
    fn drop(&mut self) {
        if keep_requested() {
            println!("eptest: keeping pool {} ({KEEP_ENV})", self.name);
            return;
        }
        remove_pool(&self.name);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn old(name: &str, max_age: Duration) -> bool {
    age_of(name).is_some_and(|a| a > max_age)
}

/// What a sweep removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// Domains destroyed and undefined.
    pub domains: Vec<String>,
    /// Pools destroyed.
    pub pools: Vec<String>,
    /// Directories removed.
    pub dirs: Vec<PathBuf>,
}

/// Removes `eptest-` domains, pools and temp directories older than `max_age`.
pub fn sweep_older_than(max_age: Duration) -> Swept {
    let mut swept = Swept::default();
    for d in domain_names() {
        if old(&d, max_age) {
            println!("eptest: sweeping leftover domain {d}");
            remove_domain(&d);
            swept.domains.push(d);
        }
    }
    for p in pool_names() {
        if old(&p, max_age) {
            println!("eptest: sweeping leftover pool {p}");
            remove_pool(&p);
            swept.pools.push(p);
        }
    }
    swept.dirs = sweep_dirs(&std::env::temp_dir(), max_age);
    swept
}

fn sweep_dirs(base: &Path, max_age: Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if old(&name, max_age) && e.path().is_dir() {
            println!("eptest: sweeping leftover directory {}", e.path().display());
            let _ = std::fs::remove_dir_all(e.path());
            removed.push(e.path());
        }
    }
    removed
}

/// Runs the sweep with [`SWEEP_AGE`] once per process, before the first test body.
pub fn sweep_once() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        let s = sweep_older_than(SWEEP_AGE);
        println!(
            "eptest: start-of-suite sweep removed {} domains, {} pools, {} directories",
            s.domains.len(),
            s.pools.len(),
            s.dirs.len()
        );
    });
}
