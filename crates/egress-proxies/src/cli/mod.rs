//! The `egress-proxies` command line: argument definitions (clap derive), one module per
//! command, a plain table printer and progress bars. `main.rs` only parses and calls [`run`].
//!
//! Guarantees:
//! - **Exit codes mean one thing each**: [`EXIT_OK`] (0) all is well; [`EXIT_FAILED`] (1)
//!   something is unhealthy or failed (a host not Ready, a prefetch that failed, a server not
//!   answering); [`EXIT_USAGE`] (2) the command line or the configuration is wrong (clap uses 2
//!   for its own usage errors too). Nothing else is returned.
//! - **Readable errors**: every failure is printed once, to stderr, as `error: ...` with its
//!   causes; configuration errors list every violation with its field path (redacted by the
//!   loader). Results go to stdout, logs and progress bars to stderr.
//! - **No surprise side effects**: `version` and `status` never contact a libvirt host;
//!   `check` only reads; `images prefetch` only adds verified bases; `images gc` removes
//!   only bases nothing on their host uses; `gc` deletes nothing without the orphan rules of
//!   [`egress_core::gc`].

mod addresses;
mod check;
mod completions;
mod crds;
mod echo;
mod gateway;
mod gc;
mod hosts;
mod images;
mod images_gc;
mod kube_client;
mod kubernetes;
mod messages;
mod output;
mod pools;
mod progress;
mod standalone;
mod status;
mod status_pools;
mod table;
mod version;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code: everything checked is healthy, the command did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: something is unhealthy or failed (see the command's help).
pub const EXIT_FAILED: u8 = 1;
/// Exit code: the command line or the configuration is invalid; nothing was changed.
pub const EXIT_USAGE: u8 = 2;

const AFTER_HELP: &str = "\
Exit codes: 0 ok; 1 something is unhealthy or failed; 2 usage or configuration error.
Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug or RUST_LOG=egress_provider=trace) to see more.

Start here: `egress-proxies check --config providers.yaml` validates the file and probes every host.";

/// Runs egress-proxy VMs on libvirt hosts reached over SSH.
#[derive(Debug, Parser)]
#[command(name = "egress-proxies", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Log format on stderr: `text` (coloured only when stderr is a terminal) or `json` (one
    /// JSON object per line, for log collectors).
    #[arg(long, global = true, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text,
          env = "EGRESS_PROXIES_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Result format: `text` (tables and lines), `wide` (the tables of `status` and `check`
    /// with more columns), `json` or `yaml` (one document on stdout, camelCase keys; errors
    /// too). A command that cannot print the format asked for refuses it (exit 2) before doing
    /// anything. A command's `--json` is the same as `-o json`.
    #[arg(short = 'o', long = "output", global = true, value_enum, value_name = "FORMAT",
          default_value_t = output::OutputFormat::Text)]
    pub output: output::OutputFormat,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colour only when stderr is a terminal (never in
    /// `kubectl logs` or a file).
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `spans`); never coloured.
    Json,
}

/// One `egress-proxies` command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version, the build's git commit and the libvirt protocol spoken. No network.
    Version,
    /// Validate a provider config and probe every host: the doctor to run first.
    ///
    /// Prints every configuration error with its field path (exit 2), then a table per
    /// provider entry: host state, probe latency, libvirt version, usable virt types, UEFI,
    /// free pool space after the reserve, what is missing, and the error. Exit 1 when any
    /// host is not Ready.
    #[command(after_help = AFTER_HELP)]
    Check(check::CheckArgs),
    /// Manage the base-image cache on the hosts.
    #[command(subcommand)]
    Images(images::ImagesCommand),
    /// Run the operator without Kubernetes: Proxy manifests from a directory, status over HTTP.
    ///
    /// Reconciles every Proxy manifest in --proxies against the hosts of the provider config,
    /// serves /status, /proxies, /hosts, /healthy.txt, /metrics, /healthz and /readyz on
    /// --listen (with --health-target, every proxy is checked through itself and /healthy.txt
    /// lists the healthy ones as ip:port), and stops gracefully on
    /// SIGTERM or SIGINT (exit 0). A rejected config or manifest directory is exit 2.
    #[command(after_help = AFTER_HELP)]
    Standalone(standalone::StandaloneArgs),
    /// Quarantine or release a member of a standalone ProxyPool (edits the pool's
    /// quarantine file beside its manifest; the running operator acts on its next round).
    #[command(subcommand)]
    Pools(pools::PoolsCommand),
    /// Declare a host of a standalone operator dead, or take it back (edits the `fenced-hosts`
    /// file in the manifest directory; the running operator acts after its next host check).
    #[command(subcommand)]
    Hosts(hosts::HostsCommand),
    /// Show the Proxies of a running `standalone` as a table.
    ///
    /// Reads GET /status from --server. Exit 1 when nothing answers there or a Proxy is
    /// Failed or Paused.
    #[command(after_help = AFTER_HELP)]
    Status(status::StatusArgs),
    /// List the declared egress addresses of a running operator: allocated, retired, free.
    ///
    /// Reads GET /status from --server (`standalone` or `kubernetes`): each address allocated
    /// to a Proxy (and its pool), each address retired from its host's address pool after a
    /// blocklist listing (the pool and member it was retired from, why, until when), and per
    /// host how many addresses are free. Exit 1 when nothing answers there.
    Addresses(addresses::AddressesArgs),
    /// Delete instances and volumes of ours that no Proxy in --proxies owns (orphans).
    ///
    /// An instance goes only if its ownership mark parses strictly, its UID is not one of
    /// DIR's Proxies, its name is the one derived from that UID, and it is older than
    /// --min-age. Refuses (exit 2) an empty or unreadable DIR (unless --allow-empty) and a DIR
    /// with bad manifests. Exit 1 when a listing or a deletion failed.
    #[command(after_help = AFTER_HELP)]
    Gc(gc::GcArgs),
    /// Serve the health check target: answers every GET with the caller's IP on one line.
    ///
    /// Run it where the proxies can reach it and give its URL to `standalone
    /// --health-target`; the health engine then reports the egress IP of every proxy.
    #[command(after_help = AFTER_HELP)]
    Echo(echo::EchoArgs),
    /// Print the Proxy, ProxyPool and ProviderHealth CustomResourceDefinitions. No network.
    ///
    /// Without --dir, all three go to stdout as one multi-document YAML stream (`kubectl apply
    /// -f -`); `-o json` or `-o yaml` prints them as one `List` document instead. With --dir,
    /// each is written to DIR/<name>.yaml (how deploy/crds/ is generated).
    Crds(crds::CrdsArgs),
    /// Run the operator in a Kubernetes cluster: Proxy resources, ProviderHealth, leader election.
    #[command(after_help = AFTER_HELP)]
    Kubernetes(kubernetes::KubernetesArgs),
    /// Serve the pool gateways in a Kubernetes cluster: one front proxy per ProxyPool that
    /// declares `spec.gateway`.
    ///
    /// Reads ProxyPools, their member Proxies and the credentials Secrets (read-only, no
    /// leader: run as many replicas as needed); listens on each pool's ports on
    /// --bind-address; serves /metrics, /healthz and /readyz on --listen; writes one access-log
    /// line per connection. SIGTERM/SIGINT stop accepting and give open connections
    /// --gateway-shutdown-grace (exit 0). See docs/gateway.md.
    #[command(after_help = AFTER_HELP)]
    Gateway(gateway::GatewayArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell). No network.
    ///
    /// E.g. `egress-proxies completions bash > /etc/bash_completion.d/egress-proxies`.
    Completions(completions::CompletionsArgs),
    /// Print the manual page (roff) of egress-proxies and its commands. No network.
    ///
    /// E.g. `egress-proxies man > /usr/local/share/man/man1/egress-proxies.1`, and
    /// `egress-proxies man standalone` for one command's page.
    Man(completions::ManArgs),
}

/// Whether a failure is the user's input (exit 2) rather than the world (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl UsageError {
    /// A usage error with this message.
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

/// The path argument shared by commands that read a provider config.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArg {
    /// Provider configuration file (YAML; see examples/providers.yaml).
    #[arg(long, short = 'c', value_name = "FILE", env = "EGRESS_PROXIES_CONFIG")]
    pub config: PathBuf,
}

/// Runs `cli` to completion and returns the process exit code. Installs the tracing
/// subscriber (stderr, `RUST_LOG`) first; prints any failure to stderr.
pub fn run(cli: Cli) -> ExitCode {
    init_tracing(default_log_level(&cli.command), cli.log_format);
    output::set_global(cli.output);
    egress_core::metrics::set_build_info(
        env!("CARGO_PKG_VERSION"),
        option_env!("EGRESS_PROXIES_GIT_COMMIT").unwrap_or("unknown"),
    );
    // A format the command cannot print is refused before anything runs.
    let res = match output::refuse(cli.output, accepts(&cli.command)) {
        Err(e) => Err(e.into()),
        Ok(()) => {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::from(EXIT_FAILED);
                }
            };
            let res = rt.block_on(dispatch(cli.command));
            // NB: background connection tasks may still be parked on sockets; do not wait
            // for them.
            rt.shutdown_background();
            res
        }
    };
    match res {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = if e.downcast_ref::<UsageError>().is_some() {
                EXIT_USAGE
            } else {
                EXIT_FAILED
            };
            match output::error_document(&format!("{e:#}"), code) {
                Some(doc) => println!("{doc}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::from(code)
        }
    }
}

async fn dispatch(cmd: Command) -> anyhow::Result<u8> {
    match cmd {
        Command::Version => Ok(version::run()),
        Command::Check(a) => check::run(a).await,
        Command::Images(c) => images::run(c).await,
        Command::Standalone(a) => standalone::run(a).await,
        Command::Status(a) => status::run(a).await,
        Command::Addresses(a) => addresses::run(a).await,
        Command::Pools(c) => pools::run(c),
        Command::Hosts(c) => hosts::run(c).await,
        Command::Gc(a) => gc::run(a).await,
        Command::Echo(a) => echo::run(a).await,
        Command::Crds(a) => crds::run(a),
        Command::Kubernetes(a) => kubernetes::run(a).await,
        Command::Gateway(a) => gateway::run(a).await,
        Command::Completions(a) => completions::completions(&a),
        Command::Man(a) => completions::man(&a),
    }
}

/// The `-o` formats `cmd` can print, and what it prints when it cannot print another.
fn accepts(cmd: &Command) -> output::Accepts {
    use output::{ALL, Accepts, NO_TABLE, TEXT_ONLY};
    let (command, formats, prints) = match cmd {
        Command::Version => ("version", NO_TABLE, "prints no table"),
        Command::Check(a) => return a.accepts(),
        Command::Images(images::ImagesCommand::Prefetch(_)) => (
            "images prefetch",
            NO_TABLE,
            "prints one line per host, no table",
        ),
        Command::Images(images::ImagesCommand::Gc(_)) => {
            ("images gc", NO_TABLE, "prints a report, no table")
        }
        Command::Standalone(_) => (
            "standalone",
            NO_TABLE,
            "prints no table (for JSON logs: --log-format json)",
        ),
        Command::Status(_) => ("status", ALL, "prints a table"),
        Command::Addresses(_) => ("addresses", NO_TABLE, "prints two tables, no wider one"),
        Command::Pools(_) => ("pools", NO_TABLE, "prints one line, no table"),
        Command::Hosts(_) => ("hosts", NO_TABLE, "prints one line, no table"),
        Command::Gc(_) => ("gc", NO_TABLE, "prints a report, no table"),
        Command::Echo(_) => (
            "echo",
            NO_TABLE,
            "prints the address it listens on, no table",
        ),
        Command::Crds(a) => return a.accepts(),
        Command::Kubernetes(_) => (
            "kubernetes",
            NO_TABLE,
            "prints no table (for JSON logs: --log-format json)",
        ),
        Command::Gateway(_) => (
            "gateway",
            NO_TABLE,
            "prints no table (for JSON logs: --log-format json; the access log is JSON lines)",
        ),
        Command::Completions(_) => ("completions", TEXT_ONLY, "prints a shell script"),
        Command::Man(_) => ("man", TEXT_ONLY, "prints a manual page (roff)"),
    };
    Accepts {
        command,
        formats,
        prints,
    }
}

/// `info` for the long-running commands (their log is their output), `warn` for the rest.
fn default_log_level(cmd: &Command) -> &'static str {
    match cmd {
        Command::Standalone(_)
        | Command::Echo(_)
        | Command::Kubernetes(_)
        | Command::Gateway(_) => "info",
        _ => "warn",
    }
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (falling back to `default` when unset or
/// invalid). Text is coloured only when stderr is a terminal.
fn init_tracing(default: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

/// The settings both drivers (`standalone`, `kubernetes`) take, defined once so the two
/// commands cannot drift apart: orphan GC (with dry run), host checks, the provisioning
/// deadline, the shutdown grace and proxy health checks.
#[derive(Debug, Clone, clap::Args)]
pub struct DriverArgs {
    /// Interval between orphan-collection passes (e.g. 10m).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "10m")]
    pub gc_interval: std::time::Duration,
    /// GC keeps anything younger than this.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "10m")]
    pub gc_min_age: std::time::Duration,
    /// GC only reports what it would delete.
    #[arg(long)]
    pub gc_dry_run: bool,
    /// Interval between host checks.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "30s")]
    pub check_interval: std::time::Duration,
    /// How long a Proxy may take from create to reporting an address.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "15m")]
    pub provisioning_deadline: std::time::Duration,
    /// Time given to creates and deletes in flight at shutdown [default: 60s in standalone;
    /// 20s in kubernetes, within a pod's termination grace with time left to release the
    /// Lease].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Option<std::time::Duration>,
    /// Proxy health checks (through each proxy, to an echo target).
    #[command(flatten)]
    pub health: HealthArgs,
}

/// Proxy health-check arguments (shared by the drivers' commands).
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Check every proxy through itself against this target (an `egress-proxies echo`, or any
    /// http:// URL answering the caller's IP as plain text or JSON `{"ip": ...}`); without it
    /// proxy health checks are off.
    #[arg(long, value_name = "URL", env = "EGRESS_PROXIES_HEALTH_TARGET")]
    pub health_target: Option<String>,
    /// Probe the egress of a proxy's declared IPv6 address against this target, one the proxy
    /// can reach only over IPv6 (an IPv6 literal such as http://[2001:db8::53]:8080/, or a
    /// name with only AAAA records); without it IPv6 addresses are probed against
    /// --health-target (then an IPv6 address is verified only if that target is IPv6).
    #[arg(
        long,
        value_name = "URL",
        env = "EGRESS_PROXIES_HEALTH_TARGET_IPV6",
        requires = "health_target"
    )]
    pub health_target_ipv6: Option<String>,
    /// Time from one health round's start to the next's (a random jitter of up to 10% is
    /// added; a round that takes longer is followed at once). A failed check is re-checked
    /// at once and two failures unpublish a proxy: with 5s, a proxy that stopped answering is
    /// unpublished within 10 s.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          default_value = "5s")]
    pub health_interval: std::time::Duration,
    /// Health probes in flight at once.
    #[arg(long, value_name = "N", default_value_t = egress_core::health::DEFAULT_CONCURRENCY)]
    pub health_concurrency: usize,
}

impl HealthArgs {
    /// The engine settings, `None` when no target is given; a bad URL or a zero concurrency
    /// is a usage error.
    pub fn settings(&self) -> Result<Option<egress_core::health::HealthSettings>, UsageError> {
        let Some(url) = &self.health_target else {
            return Ok(None);
        };
        let target = egress_core::health::probe::CheckTarget::parse(url)
            .map_err(|e| UsageError::new(format!("--health-target: {e}")))?;
        if self.health_concurrency == 0 {
            return Err(UsageError::new("--health-concurrency must be at least 1"));
        }
        let mut s = egress_core::health::HealthSettings::new(target);
        s.target_ipv6 = self
            .health_target_ipv6
            .as_deref()
            .map(egress_core::health::probe::CheckTarget::parse)
            .transpose()
            .map_err(|e| UsageError::new(format!("--health-target-ipv6: {e}")))?;
        s.interval = self.health_interval;
        s.jitter = self.health_interval / 10;
        s.concurrency = self.health_concurrency;
        Ok(Some(s))
    }
}

/// Loads and validates the provider config at `path`: warnings go to stderr; a rejected file
/// becomes a [`UsageError`] listing every error with its field path.
pub(crate) fn load_config(
    path: &std::path::Path,
) -> anyhow::Result<egress_core::config::ProviderConfig> {
    match egress_core::config::load(path) {
        Ok(cfg) => {
            for w in &cfg.warnings {
                eprintln!("warning: {w}");
            }
            Ok(cfg)
        }
        Err(errs) => Err(UsageError::new(errs.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(v6: Option<&str>) -> HealthArgs {
        HealthArgs {
            health_target: Some("http://192.0.2.1:8080/".into()),
            health_target_ipv6: v6.map(str::to_owned),
            health_interval: std::time::Duration::from_secs(30),
            health_concurrency: 4,
        }
    }

    #[test]
    fn the_ipv6_health_target_reaches_the_engine_settings() {
        let s = args(Some("http://[2001:db8::53]:8080/ip"))
            .settings()
            .unwrap()
            .unwrap();
        let v6 = s.target_ipv6.unwrap();
        assert_eq!(
            (v6.host.as_str(), v6.port, v6.path.as_str()),
            ("[2001:db8::53]", 8080, "/ip")
        );
        assert_eq!(s.target.host, "192.0.2.1");
        assert!(
            args(None)
                .settings()
                .unwrap()
                .unwrap()
                .target_ipv6
                .is_none()
        );
        let e = args(Some("https://[2001:db8::53]/"))
            .settings()
            .unwrap_err();
        assert!(e.to_string().contains("--health-target-ipv6"), "{e}");
    }
}
