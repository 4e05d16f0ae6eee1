//! `egress-proxies check [--config FILE] [--json] [--no-probe] [--proxies DIR]`: the doctor a
//! new user runs first. With `--no-probe` it validates offline (config, SSH files, and the
//! manifests of `--proxies`) and contacts no host.
//!
//! Pipeline: load and validate the file (offline; every error with its field path → exit 2)
//! → build the registry (no I/O) → [`Provider::check`](egress_provider::Provider::check) on
//! every entry concurrently (network: each host's calls are bounded by the check options, the
//! whole round by [`CHECK_DEADLINE`]) → a table per entry, then the full error of every host
//! that is not Ready → exit 1 unless every host is Ready.
//!
//! Guarantees: read-only on every host (the check refreshes the pool's figures and nothing
//! else); every host of every entry appears exactly once in the output, even when the round
//! deadline expires (as `Timeout`); errors are the provider's redacted strings.
//!
//! One piece (about 600 lines before its tests, 490 of them code): one command read top to
//! bottom — the offline lint, the probe round and the table with its hints — whose stages
//! share the [`CheckedHost`] row and the exit-code rule; split, each part would be a file of
//! its own used by nothing but this command.

use std::time::Duration;

use egress_provider::{HostReport, HostState};
use futures_util::future::join_all;
use serde::Serialize;

use super::table::{self, Table};
use super::{EXIT_FAILED, EXIT_OK, UsageError, load_config};
use egress_core::config::installation::Installation;
use egress_core::providers::{self, ProviderHandle, Providers};

/// Deadline of the whole check, over every entry.
// NB: each entry's round is bounded by the check options' round timeout (60 s by default:
// one wave of 30 s dial + 20 s probe + slack); entries run concurrently, so 90 s only
// bites when a round overran its own bound.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(90);

/// Longest error shown in the table; the full text follows the table.
// NB: keeps a row within a 200-column terminal beside the other columns.
pub const TABLE_ERROR_CHARS: usize = 60;

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Provider configuration file (YAML; see examples/providers.yaml). Without it, the
    /// embedded default that `standalone` uses is checked (this machine's libvirtd).
    #[arg(long, short = 'c', value_name = "FILE", env = "EGRESS_PROXIES_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Print one JSON document (entries → hosts) instead of tables.
    #[arg(long)]
    json: bool,
    /// Validate offline: the config (and with --proxies the manifests) without contacting
    /// any host. Exit 2 on any error, 0 otherwise.
    #[arg(long)]
    no_probe: bool,
    /// Also validate the Proxy manifests in DIR (each file, and that its provider entry
    /// exists in the config).
    #[arg(long, value_name = "DIR")]
    proxies: Option<std::path::PathBuf>,
}

impl CheckArgs {
    /// The `-o` formats: every one with the probe (it prints a table per entry), no `wide`
    /// with `--no-probe` (two summary lines, no table).
    pub(super) fn accepts(&self) -> super::output::Accepts {
        use super::output::{ALL, Accepts, NO_TABLE};
        if self.no_probe {
            Accepts {
                command: "check --no-probe",
                formats: NO_TABLE,
                prints: "prints a summary, no table",
            }
        } else {
            Accepts {
                command: "check",
                formats: ALL,
                prints: "prints a table per provider entry",
            }
        }
    }
}

/// What `check --no-probe` found, as printed under `-o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OfflineReport {
    /// Provider entries in the config.
    pub entries: usize,
    /// Hosts over every entry.
    pub hosts: usize,
    /// Proxies read from --proxies (absent without it).
    pub proxies: Option<usize>,
}

/// Validates the manifests of `dir` against `cfg` offline: every manifest error, and every
/// Proxy whose provider entry the config does not have. Returns (Proxies read, errors).
fn lint_manifests(
    dir: &std::path::Path,
    cfg: &egress_core::config::ProviderConfig,
) -> (usize, Vec<String>) {
    let mut store = egress_standalone::manifests::ManifestStore::new(dir);
    let desired = store.scan();
    let mut errors = desired.errors.clone();
    let entries: Vec<&str> = cfg
        .providers
        .iter()
        .map(|p| {
            let egress_core::config::ProviderEntry::Libvirt(e) = p;
            e.name.as_str()
        })
        .collect();
    for (p, _) in desired.proxies.values() {
        let Some(egress_core::config::ProviderEntry::Libvirt(entry)) = cfg.entry(&p.spec.provider)
        else {
            errors.push(format!(
                "{}: Proxy {}: spec.provider {:?} is not an entry of the provider config (entries: {})",
                p.file.display(),
                p.key(),
                p.spec.provider,
                entries.join(", ")
            ));
            continue;
        };
        // What the controller would refuse before creating anything: the namespace's
        // entitlement, the spec against the entry, and the guest config the entry's policy
        // renders (client networks within its caps, passwords of its minimum length).
        for e in proxy_errors(p, entry) {
            errors.push(format!("{}: Proxy {}: {e}", p.file.display(), p.key()));
        }
    }
    (desired.proxies.len(), errors)
}

/// Every error the controller would report for `p` on `entry` before creating anything, each
/// naming its field path.
fn proxy_errors(
    p: &egress_standalone::manifests::LoadedProxy,
    entry: &egress_provider::libvirt::config::LibvirtEntry,
) -> Vec<String> {
    use egress_core::controller::decide::{entitlement_errors, lifts_internal, spec_errors};
    let obj = egress_core::controller::ProxyObject {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid,
        generation: 1,
        spec: p.spec.clone(),
        deleting: false,
        credentials: p
            .credentials
            .as_ref()
            .map(|c| egress_core::controller::ProxyCredentials {
                username: c.username.clone(),
                password: c.password.clone(),
            }),
        namespace_labels: None,
        replaces: None,
    };
    let errs = entitlement_errors(&obj, entry);
    if !errs.is_empty() {
        return errs;
    }
    let errs = spec_errors(&obj, entry);
    if !errs.is_empty() {
        return errs;
    }
    let mut policy = entry.policy.clone();
    if !lifts_internal(&obj, entry) {
        policy.allowed_internal_cidrs.clear();
    }
    let rendered = egress_core::proxy_policy::GuestPolicy::for_proxy(
        &policy,
        &obj.spec.proxy.allowed_destinations,
        &[],
    )
    .map_err(|e| e.join("; "))
    .and_then(|g| {
        egress_core::controller::userdata::render(&obj.spec.proxy, obj.credentials.as_ref(), &g)
            .map_err(|e| e.to_string())
    });
    rendered.err().into_iter().collect()
}

/// One host's result as printed by `--json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckedHost {
    /// Provider entry.
    pub entry: String,
    /// Host name in the entry.
    pub host: String,
    /// The host's configured address.
    pub address: String,
    /// Ready, Degraded, Unreachable or Timeout.
    pub state: &'static str,
    /// Probe call latency in milliseconds.
    pub latency_ms: Option<f64>,
    /// The host's hostname.
    pub hostname: Option<String>,
    /// libvirt version.
    pub libvirt_version: Option<String>,
    /// Usable virt types.
    pub virt_types: Vec<String>,
    /// Whether a UEFI loader is available.
    pub uefi: bool,
    /// Free pool bytes after the reserve.
    pub pool_free_bytes: Option<u64>,
    /// The configured reserve in GiB.
    #[serde(rename = "poolReserveGiB")]
    pub pool_reserve_gib: u64,
    /// What is missing.
    pub missing: Vec<String>,
    /// The error, redacted.
    pub error: Option<String>,
    /// Usage of the host's declared-address pool, one per family (absent without a pool).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<AddressRow>,
}

/// One family of a host's declared-address pool as printed by `--json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressRow {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// Allocatable addresses in the pool's ranges.
    pub size: u128,
    /// Addresses held by instances.
    pub held: u64,
    /// Addresses free (`size - held`).
    pub free: u128,
}

impl AddressRow {
    fn of(u: &egress_provider::model::AddressUsage) -> Self {
        Self {
            family: u.family,
            size: u.size,
            held: u.held,
            free: u
                .size
                .saturating_sub(u128::from(u.held))
                .saturating_sub(u128::from(u.retired)),
        }
    }

    /// `IPv4 3/14 held`, with `(exhausted)` when none is free; a size of 2^20 or more that
    /// is a power of two as `2^N`.
    fn human(&self) -> String {
        let size = if self.size >= 1 << 20 && self.size.is_power_of_two() {
            format!("2^{}", self.size.trailing_zeros())
        } else {
            self.size.to_string()
        };
        let full = if self.free == 0 { " (exhausted)" } else { "" };
        format!("{} {}/{size} held{full}", self.family, self.held)
    }
}

/// A state's name.
pub fn state_name(s: HostState) -> &'static str {
    match s {
        HostState::Ready => "Ready",
        HostState::Unreachable => "Unreachable",
        HostState::Timeout => "Timeout",
        HostState::Degraded => "Degraded",
    }
}

/// Refuses (a [`UsageError`], exit 2) a config naming an SSH key or known_hosts file that
/// cannot be read, or a private key others may read (OpenSSH's rule), for every host reached
/// over SSH (not `address: local`), listing each with its field path: a missing file is the
/// configuration's problem, not an unreachable host.
pub(crate) fn missing_ssh_files(
    cfg: &egress_core::config::ProviderConfig,
) -> Result<(), UsageError> {
    let mut errs = Vec::new();
    for (i, entry) in cfg.providers.iter().enumerate() {
        let egress_core::config::ProviderEntry::Libvirt(e) = entry;
        for (j, h) in e.hosts.iter().enumerate() {
            if h.address == egress_core::providers::LOCAL_ADDRESS {
                continue;
            }
            for (field, path) in [
                ("sshKeyFile", &h.ssh_key_file),
                ("knownHostsFile", &h.known_hosts_file),
            ] {
                if let Some(p) = path
                    && let Err(err) = std::fs::File::open(p)
                {
                    errs.push(format!(
                        "providers[{i}].hosts[{j}].{field}: cannot read {}: {err}",
                        p.display()
                    ));
                } else if field == "sshKeyFile"
                    && let Some(p) = path
                    && let Err(why) = egress_provider::libvirt::hostpool::check_private_key_file(p)
                {
                    errs.push(format!("providers[{i}].hosts[{j}].{field}: {why}"));
                }
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(UsageError::new(format!(
            "the provider config names SSH files that cannot be read or are unsafe:\n  {}",
            errs.join("\n  ")
        )))
    }
}

/// Runs `check`.
pub async fn run(a: CheckArgs) -> anyhow::Result<u8> {
    super::output::format(a.json); // failures print as JSON under --json too
    let cfg = match &a.config {
        Some(p) => load_config(p)?,
        None => {
            let cfg =
                egress_standalone::load_config(None).map_err(|e| UsageError::new(e.to_string()))?;
            // NB: stderr, so stdout stays the result alone (valid JSON under --json).
            eprintln!("checking the embedded default config (pass --config FILE for yours)");
            for w in &cfg.warnings {
                eprintln!("warning: {w}");
            }
            cfg
        }
    };
    missing_ssh_files(&cfg)?;
    // NB: a check writes no ownership mark and creates no ID file: the config's own ID, if any.
    let providers = providers::open(&cfg, &Installation::ConfigOnly)
        .map_err(|e| UsageError::new(e.to_string()))?;
    let manifests = a.proxies.as_deref().map(|d| lint_manifests(d, &cfg));
    if let Some((_, errors)) = &manifests
        && !errors.is_empty()
    {
        return Err(UsageError::new(format!(
            "{} manifest error(s):\n  {}",
            errors.len(),
            errors.join("\n  ")
        ))
        .into());
    }
    if a.no_probe {
        let report = OfflineReport {
            entries: cfg.providers.len(),
            hosts: cfg
                .providers
                .iter()
                .map(|p| {
                    let egress_core::config::ProviderEntry::Libvirt(e) = p;
                    e.hosts.len()
                })
                .sum(),
            proxies: manifests.as_ref().map(|(n, _)| *n),
        };
        match super::output::document(&report, super::output::format(a.json))? {
            Some(doc) => println!("{doc}"),
            None => {
                println!(
                    "config OK: {} provider entr{}, {} host(s) (not contacted: --no-probe)",
                    report.entries,
                    if report.entries == 1 { "y" } else { "ies" },
                    report.hosts
                );
                if let Some(n) = report.proxies {
                    println!("manifests OK: {n} Proxy manifest(s)");
                }
            }
        }
        return Ok(EXIT_OK);
    }
    let rows = check_all(&providers).await;
    let fmt = super::output::format(a.json);
    match super::output::document(&rows, fmt)? {
        Some(doc) => println!("{doc}"),
        None => print!(
            "{}",
            render(&rows, fmt == super::output::OutputFormat::Wide)
        ),
    }
    let ready = rows.iter().filter(|r| r.state == "Ready").count();
    if ready == rows.len() {
        if fmt.is_human() {
            println!("all {} host(s) Ready", rows.len());
        }
        Ok(EXIT_OK)
    } else {
        if fmt.is_human() {
            println!("{} of {} host(s) not Ready", rows.len() - ready, rows.len());
        }
        Ok(EXIT_FAILED)
    }
}

/// Checks every entry concurrently; one row per configured host, in config order.
pub async fn check_all(providers: &Providers) -> Vec<CheckedHost> {
    let work = join_all(providers.iter().map(|h| async move {
        let reports = h.provider.check().await;
        (h, reports)
    }));
    // An expired deadline leaves no reports: every host then shows as Timeout.
    let results = tokio::time::timeout(CHECK_DEADLINE, work)
        .await
        .unwrap_or_default();
    let mut rows = Vec::new();
    for h in providers.iter() {
        let reports = results
            .iter()
            .find(|(p, _)| p.config.name == h.config.name)
            .map(|(_, r)| r.as_slice())
            .unwrap_or_default();
        for host in &h.config.hosts {
            rows.push(row(
                h,
                &host.name,
                reports.iter().find(|r| r.host == host.name),
            ));
        }
    }
    rows
}

fn row(h: &ProviderHandle, host: &str, report: Option<&HostReport>) -> CheckedHost {
    let cfg = h.host(host);
    let address = cfg.map(|c| c.address.clone()).unwrap_or_default();
    let pool_reserve_gib = cfg.map(|c| c.pool_reserve_gib).unwrap_or_default();
    let Some(r) = report else {
        return CheckedHost {
            entry: h.config.name.clone(),
            host: host.to_owned(),
            address,
            state: state_name(HostState::Timeout),
            latency_ms: None,
            hostname: None,
            libvirt_version: None,
            virt_types: Vec::new(),
            uefi: false,
            pool_free_bytes: None,
            pool_reserve_gib,
            missing: Vec::new(),
            error: Some(format!(
                "no report within {CHECK_DEADLINE:?} (the check round did not finish)"
            )),
            addresses: Vec::new(),
        };
    };
    CheckedHost {
        entry: h.config.name.clone(),
        host: host.to_owned(),
        address,
        state: state_name(r.state),
        latency_ms: r.latency.map(|d| d.as_secs_f64() * 1000.0),
        hostname: r.hostname.clone(),
        libvirt_version: r.libvirt_version.clone(),
        virt_types: r.virt_types.clone(),
        uefi: r.uefi,
        pool_free_bytes: r.pool_free_bytes,
        pool_reserve_gib,
        missing: r.missing.clone(),
        error: r.error.as_deref().map(super::messages::plain),
        addresses: r.addresses.iter().map(AddressRow::of).collect(),
    }
}

/// The human form: a table per entry, then the full error of each host not Ready. `wide`
/// adds each host's HOSTNAME (what the host calls itself) and shows ERROR whole.
pub fn render(rows: &[CheckedHost], wide: bool) -> String {
    let mut out = String::new();
    let mut entries: Vec<&str> = Vec::new();
    for r in rows {
        if !entries.contains(&r.entry.as_str()) {
            entries.push(&r.entry);
        }
    }
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("provider entry {e}\n"));
        let mut header = vec!["HOST", "ADDRESS"];
        if wide {
            header.push("HOSTNAME");
        }
        header.extend([
            "STATE",
            "LATENCY",
            "LIBVIRT",
            "VIRT",
            "UEFI",
            "POOL FREE",
            "ADDRESSES",
            "MISSING",
            "ERROR",
        ]);
        let mut t = Table::new(&header);
        for r in rows.iter().filter(|r| r.entry == *e) {
            let mut row = vec![r.host.clone(), r.address.clone()];
            if wide {
                row.push(r.hostname.clone().unwrap_or_else(|| "-".into()));
            }
            row.extend([
                r.state.to_owned(),
                r.latency_ms
                    .map_or_else(|| "-".into(), |ms| format!("{ms:.1}ms")),
                r.libvirt_version.clone().unwrap_or_else(|| "-".into()),
                dash_join(&r.virt_types),
                if r.libvirt_version.is_none() {
                    "-".into()
                } else if r.uefi {
                    "yes".into()
                } else {
                    "no".into()
                },
                r.pool_free_bytes.map_or_else(
                    || "-".into(),
                    |b| format!("{} (reserve {} GiB)", table::bytes(b), r.pool_reserve_gib),
                ),
                if r.addresses.is_empty() {
                    "-".into()
                } else {
                    r.addresses
                        .iter()
                        .map(AddressRow::human)
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                dash_join(&r.missing),
                r.error.as_deref().map_or_else(
                    || "-".into(),
                    |e| {
                        if wide {
                            e.to_owned()
                        } else {
                            egress_core::model::truncate(e, TABLE_ERROR_CHARS)
                        }
                    },
                ),
            ]);
            t.row(row);
        }
        out.push_str(&t.render());
    }
    let failing: Vec<&CheckedHost> = rows.iter().filter(|r| r.state != "Ready").collect();
    if !failing.is_empty() {
        out.push('\n');
        for r in failing {
            let why = match (&r.error, r.missing.is_empty()) {
                (Some(e), _) => e.clone(),
                (None, false) => format!("missing: {}", r.missing.join(", ")),
                (None, true) => "no detail reported".to_owned(),
            };
            out.push_str(&format!("{}/{} is {}: {why}\n", r.entry, r.host, r.state));
            for m in &r.missing {
                if let Some(h) = hint(m) {
                    out.push_str(&format!("  hint: {h}\n"));
                }
            }
        }
    }
    out
}

/// A fix for a missing thing the check names (`storage pool NAME (...)`, `network NAME
/// (...)`, `storage pool NAME is not active (...)`), as the commands to run on the host.
fn hint(missing: &str) -> Option<String> {
    let word = |prefix: &str| {
        missing
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
    };
    if missing.contains(" is not active ") {
        let p = word("storage pool ")?;
        return Some(format!("virsh pool-start {p} && virsh pool-autostart {p}"));
    }
    if let Some(p) = word("storage pool ") {
        return Some(format!(
            "create it on the host: virsh pool-define-as {p} dir --target /var/lib/{p} && \
             virsh pool-build {p} && virsh pool-start {p} && virsh pool-autostart {p}"
        ));
    }
    if let Some(n) = word("network ") {
        return Some(format!(
            "start it on the host (virsh net-start {n} && virsh net-autostart {n}), or set \
             the host's network/bridge to one that exists"
        ));
    }
    None
}

fn dash_join(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(entry: &str, host: &str, state: &'static str, error: Option<&str>) -> CheckedHost {
        CheckedHost {
            entry: entry.into(),
            host: host.into(),
            address: "127.0.0.1:22".into(),
            state,
            latency_ms: Some(1.25),
            hostname: None,
            libvirt_version: Some("11.3.0".into()),
            virt_types: vec!["qemu".into()],
            uefi: true,
            pool_free_bytes: Some(10 << 30),
            pool_reserve_gib: 5,
            missing: vec![],
            error: error.map(str::to_owned),
            addresses: vec![],
        }
    }

    #[test]
    fn each_hosts_address_pool_usage_is_printed_per_family() {
        let usage = |family, size, held| egress_provider::model::AddressUsage {
            family,
            size,
            held,
            retired: 0,
        };
        let mut h1 = r("home", "h1", "Ready", None);
        h1.addresses = vec![
            AddressRow::of(&usage("IPv4", 14, 3)),
            AddressRow::of(&usage("IPv6", 1 << 64, 3)),
        ];
        let mut h2 = r("home", "h2", "Ready", None);
        h2.addresses = vec![AddressRow::of(&usage("IPv4", 2, 2))];
        let out = render(&[h1, h2, r("home", "h3", "Ready", None)], false);
        assert!(out.contains("ADDRESSES"), "{out}");
        assert!(out.contains("IPv4 3/14 held, IPv6 3/2^64 held"), "{out}");
        assert!(out.contains("IPv4 2/2 held (exhausted)"), "{out}");
        let json = serde_json::to_value(AddressRow::of(&usage("IPv4", 14, 3))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"family": "IPv4", "size": 14, "held": 3, "free": 11})
        );
    }

    #[test]
    fn each_entry_gets_a_table_and_failing_hosts_get_their_full_error() {
        let long = "x".repeat(200);
        let rows = [
            r("home", "h1", "Ready", None),
            r("home", "h2", "Unreachable", Some(&long)),
            r("lab", "h1", "Ready", None),
        ];
        let out = render(&rows, false);
        assert!(out.contains("provider entry home\n"), "{out}");
        assert!(out.contains("provider entry lab\n"), "{out}");
        assert!(out.contains("10.0 GiB (reserve 5 GiB)"), "{out}");
        assert!(out.contains("1.2ms") || out.contains("1.3ms"), "{out}");
        // Truncated in the table, whole below it.
        assert!(
            out.contains(&format!("home/h2 is Unreachable: {long}\n")),
            "{out}"
        );
        assert_eq!(out.matches(&long).count(), 1, "{out}");
        assert!(!out.contains("HOSTNAME"), "{out}");
        // Wide: the host's own name, and the error whole in the table too.
        let mut named = rows;
        if let Some(h1) = named.first_mut() {
            h1.hostname = Some("kvm-01.example".into());
        }
        let wide = render(&named, true);
        assert!(
            wide.contains("HOST  ADDRESS       HOSTNAME        STATE"),
            "{wide}"
        );
        assert!(wide.contains("kvm-01.example"), "{wide}");
        assert_eq!(wide.matches(&long).count(), 2, "{wide}");
    }

    #[test]
    fn a_missing_pool_or_network_comes_with_the_command_that_fixes_it() {
        let mut row = r("local", "local", "Degraded", None);
        row.missing = vec![
            "storage pool egress-proxies (hosts[local].pool)".into(),
            "network default (hosts[local].network)".into(),
        ];
        let out = render(&[row], false);
        assert!(
            out.contains("hint: create it on the host: virsh pool-define-as egress-proxies dir"),
            "{out}"
        );
        assert!(out.contains("virsh net-start default"), "{out}");
        assert_eq!(
            hint("storage pool p1 is not active (hosts[h].pool)").as_deref(),
            Some("virsh pool-start p1 && virsh pool-autostart p1")
        );
        assert_eq!(hint("virt type kvm (hosts[h].virtType)"), None);
    }
}
