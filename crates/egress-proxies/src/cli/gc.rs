//! `egress-proxies gc --config FILE --proxies DIR [--dry-run] [--min-age DURATION]`: one
//! orphan-collection pass from the command line.
//!
//! Pipeline: load the config (offline; exit 2 on errors) → read DIR's manifests (offline) →
//! the live set is the UID of every Proxy in DIR → [`egress_core::gc::collect`] (network; each
//! listing and each deletion bounded by the GC module's budgets) → the report → exit 1 unless
//! the pass was clean.
//!
//! Guarantees (a wrong path must never look like "nothing is live"):
//! - a DIR that cannot be listed is refused (exit 2), as is a DIR with no manifest at all
//!   unless `--allow-empty` is given;
//! - a DIR with any bad manifest is refused (exit 2): the Proxies of a file that does not
//!   parse are unknown, so their instances would look orphaned;
//! - everything else the GC module guarantees (complete listings only, strict marks, derived
//!   names, minimum age; `--dry-run` deletes nothing).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use egress_provider::ProxyUid;

use super::{ConfigArg, EXIT_FAILED, EXIT_OK, UsageError, load_config};
use egress_core::config::installation::Installation;
use egress_core::gc::{self, Action, GcSettings};
use egress_core::providers;
use egress_standalone::manifests::ManifestStore;

/// Arguments of `gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Directory of Proxy manifests: every Proxy in it is live and never collected.
    #[arg(long, value_name = "DIR")]
    proxies: PathBuf,
    /// Print what would be deleted, and why, without deleting anything.
    #[arg(long)]
    dry_run: bool,
    /// Keep anything younger than this (e.g. 10m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "10m")]
    min_age: Duration,
    /// Run even though DIR holds no manifest (everything of ours is then an orphan).
    #[arg(long)]
    allow_empty: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The live set from `dir`, refusing an unreadable directory, bad manifests, and (unless
/// `allow_empty`) an empty directory.
pub fn live_set(dir: &std::path::Path, allow_empty: bool) -> Result<HashSet<ProxyUid>, UsageError> {
    let mut store = ManifestStore::new(dir);
    let desired = store.scan();
    if !desired.directory_ok {
        return Err(UsageError::new(format!(
            "refusing to collect: {}",
            desired.errors.join("; ")
        )));
    }
    if !desired.errors.is_empty() {
        return Err(UsageError::new(format!(
            "refusing to collect while {} manifest error(s) make some Proxies unknown (their \
             instances would look orphaned); fix them first:\n  {}",
            desired.errors.len(),
            desired.errors.join("\n  ")
        )));
    }
    if desired.proxies.is_empty() && !allow_empty {
        return Err(UsageError::new(format!(
            "refusing to collect: {} holds no Proxy manifest, so every instance of ours would \
             count as an orphan. Check the path; if no Proxy should exist, pass --allow-empty",
            dir.display()
        )));
    }
    Ok(desired.proxies.keys().copied().collect())
}

/// The installation `gc` collects for: the standalone operator's that runs on the same
/// `--config` and `--proxies` (the same [`Installation`], so the same ID, as
/// `standalone`'s [`egress_standalone::StandaloneOptions::installation`]).
pub fn installation(a: &GcArgs) -> Installation {
    Installation::Standalone {
        config_path: Some(a.config.config.clone()),
        proxies_dir: a.proxies.clone(),
    }
}

/// Runs `gc`.
pub async fn run(a: GcArgs) -> anyhow::Result<u8> {
    super::output::format(a.json); // failures print as JSON under --json too
    let cfg = load_config(&a.config.config)?;
    let live = live_set(&a.proxies, a.allow_empty)?;
    // A key file that is missing is the config's problem (exit 2), not a failed listing.
    super::check::missing_ssh_files(&cfg)?;
    // The standalone operator's installation (the same ID file), so its marks are ours here.
    let providers =
        providers::open(&cfg, &installation(&a)).map_err(|e| UsageError::new(e.to_string()))?;
    // NB: cached base images are `images gc`'s job: this command's live set is a
    // directory of manifests, which says nothing about which bases the hosts use.
    let settings = GcSettings {
        min_age: a.min_age,
        dry_run: a.dry_run,
        bases: None,
    };
    let report = gc::collect(&providers, &live, &settings, SystemTime::now()).await;
    if let Some(doc) = super::output::document(&report, super::output::format(a.json))? {
        println!("{doc}");
    } else {
        print!("{}", super::messages::plain_report(&report.to_string()));
        for e in &report.entries {
            if let Some(err) = &e.instances_error {
                println!(
                    "entry {}: instances not listed, nothing collected: {}",
                    e.entry,
                    super::messages::plain(err)
                );
            }
            if let Some(err) = &e.volumes_error {
                println!(
                    "entry {}: volumes not listed, none collected: {}",
                    e.entry,
                    super::messages::plain(err)
                );
            }
        }
        let n = |x| report.with_action(x).count();
        println!(
            "{} live Proxies; {}{} deleted, {} would be deleted, {} kept, {} failed",
            live.len(),
            if a.dry_run { "dry run: " } else { "" },
            n(Action::Deleted),
            n(Action::WouldDelete),
            n(Action::Kept),
            n(Action::Failed)
        );
    }
    Ok(if report.is_clean() {
        EXIT_OK
    } else {
        EXIT_FAILED
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_standalone::manifests::uid_for;

    #[test]
    fn the_example_manifest_directory_is_a_valid_live_set() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/proxies");
        let live = live_set(&dir, false).map_err(|e| e.0);
        assert_eq!(
            live.as_ref()
                .map(|l| l.contains(&uid_for("default", "web-egress"))),
            Ok(true),
            "{live:?}"
        );
    }

    /// The command as `egress-proxies ARGS…` parses it.
    fn parse(args: &[&std::ffi::OsStr]) -> super::super::Command {
        let argv =
            std::iter::once(std::ffi::OsStr::new("egress-proxies")).chain(args.iter().copied());
        match <super::super::Cli as clap::Parser>::try_parse_from(argv) {
            Ok(cli) => cli.command,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn gc_and_standalone_derive_the_same_installation_id_from_the_same_config() {
        #![allow(clippy::unwrap_used, clippy::panic)]
        let dir = tempfile::tempdir().unwrap();
        let example =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/providers.yaml");
        // Twice: with the operator run first and with gc run first, each time a fresh
        // installation (no ID file yet, none in the config).
        for (round, standalone_first) in [(0, true), (1, false)] {
            let home = dir.path().join(format!("site-{round}"));
            let proxies = dir.path().join(format!("proxies-{round}"));
            std::fs::create_dir_all(&home).unwrap();
            std::fs::create_dir_all(&proxies).unwrap();
            let cfg_path = home.join("providers.yaml");
            std::fs::copy(&example, &cfg_path).unwrap();
            let cfg = load_config(&cfg_path).unwrap();
            assert_eq!(
                cfg.installation, None,
                "the example sets no installation.id"
            );
            let args = |cmd: &'static str| {
                parse(&[
                    cmd.as_ref(),
                    "--config".as_ref(),
                    cfg_path.as_os_str(),
                    "--proxies".as_ref(),
                    proxies.as_os_str(),
                ])
            };
            let standalone_id = || match args("standalone") {
                super::super::Command::Standalone(a) => super::super::standalone::options(a)
                    .unwrap()
                    .installation()
                    .id(&cfg)
                    .unwrap(),
                other => panic!("{other:?}"),
            };
            let gc_id = || match args("gc") {
                super::super::Command::Gc(a) => installation(&a).id(&cfg).unwrap(),
                other => panic!("{other:?}"),
            };
            let (first, second) = if standalone_first {
                (standalone_id(), gc_id())
            } else {
                (gc_id(), standalone_id())
            };
            assert!(first.is_some());
            assert_eq!(
                first, second,
                "gc would see the operator's instances as foreign"
            );
            let file =
                std::fs::read_to_string(home.join(egress_core::config::installation::FILE_NAME))
                    .unwrap();
            assert_eq!(Some(file.trim_end()), first.as_deref());
        }
    }

    #[test]
    fn an_empty_directory_is_refused_unless_allowed() {
        let dir = std::env::temp_dir().join(format!("eptest-gc-empty-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let refused = live_set(&dir, false).is_err();
        let allowed = live_set(&dir, true).map(|l| l.is_empty()).unwrap_or(false);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(refused && allowed);
    }
}
