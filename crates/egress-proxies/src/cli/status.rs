//! `egress-proxies status [--server URL] [--json] [--watch] [--phase P] [--host H] [--entry E]
//! [--pool P] [--health H]`: what a running `egress-proxies standalone` reports at
//! `GET /status`, as a table: phase, host, address, whether traffic through the proxy works
//! (HEALTHY: `yes`, `no`, `?` before the health engine decided, `-` when health checks are
//! off), the EGRESS IP the check target saw, the declared EGRESS ADDRESS and LISTED (the DNS
//! blocklist zones an egress address is listed in; see
//! [`egress_web::status::ProxyStatusRow::listed_cell`]). The filters are the server's own
//! ([`Filters`], sent as the query of `/status`, so a large fleet sends only the rows asked
//! for) and are applied again to what comes back (a server that ignores them still gives the
//! right rows); the exit status is computed over the rows shown: 1 when a shown Proxy is
//! `Failed` or `Paused` or when the server lists a rejected manifest, 0 otherwise.
//!
//! Guarantees: one HTTP GET to the given server and nothing else (no libvirt host is
//! contacted); bounded by [`STATUS_CONNECT_TIMEOUT`] and [`STATUS_TIMEOUT`]; a body larger
//! than [`MAX_STATUS_BYTES`] is refused; when nothing listens at the address the message says
//! so and how to fix it (exit 1).
//!
//! One piece: the fetch, the filters and the proxies table are one command's path; most of
//! the length is the table's tests, one per column's meaning.

use std::time::{Duration, SystemTime};

use super::table::{self, Table};
use super::{EXIT_FAILED, EXIT_OK, UsageError};
use egress_core::model::Phase;
use egress_web::filters::Filters;
use egress_web::status::StatusDocument;

/// Where `standalone` serves by default.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:9464";
/// Connect bound.
// NB: the server is local or on a LAN; a connect that takes seconds means it is not there.
pub const STATUS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the whole request, body included.
// NB: the document for 1000 proxies is ~2 MB, built from memory: well under a second.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest status document accepted.
// NB: ~2 KiB per Proxy with its conditions; 64 MiB is 30 000 proxies, far above one process.
pub const MAX_STATUS_BYTES: usize = 64 << 20;
/// Longest LAST ERROR shown in the table.
// NB: keeps a row within ~160 columns next to the other columns.
pub const TABLE_ERROR_CHARS: usize = 60;

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Base URL of a running `egress-proxies standalone` (its --listen address).
    #[arg(long, value_name = "URL", default_value = DEFAULT_SERVER,
          env = "EGRESS_PROXIES_SERVER")]
    server: String,
    /// Print the server's JSON document (the rows the filters keep).
    #[arg(long)]
    json: bool,
    /// Refresh until Ctrl-C (or SIGTERM): the output again every --interval, the screen
    /// cleared first on a terminal. The exit status is the last refresh's.
    #[arg(long, short = 'w')]
    watch: bool,
    /// Time between two refreshes with --watch (at least 1s; e.g. 2s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = watch_interval)]
    interval: Duration,
    /// Only Proxies in this phase.
    #[arg(long, value_parser = ["Pending", "Provisioning", "Running", "Paused", "Failed", "Terminating"])]
    phase: Option<String>,
    /// Only Proxies (and host rows) on this host.
    #[arg(long)]
    host: Option<String>,
    /// Only Proxies (and host rows) of this provider entry.
    #[arg(long)]
    entry: Option<String>,
    /// Only Proxies of this pool (`namespace/name` or `name`).
    #[arg(long)]
    pool: Option<String>,
    /// Only Proxies whose health is this.
    #[arg(long, value_parser = ["Healthy", "Unhealthy", "Unchecked"])]
    health: Option<String>,
}

impl StatusArgs {
    /// The filters the flags ask for.
    fn filters(&self) -> Filters {
        Filters {
            entry: self.entry.clone(),
            host: self.host.clone(),
            pool: self.pool.clone(),
            state: None,
            phase: self.phase.clone(),
            health: self.health.clone(),
        }
    }
}

/// Shortest `--interval`: one GET per second is the most a watching terminal needs.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Parses `--interval`: a humantime duration of at least [`MIN_WATCH_INTERVAL`].
fn watch_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < MIN_WATCH_INTERVAL {
        return Err(format!(
            "must be at least {}s",
            MIN_WATCH_INTERVAL.as_secs()
        ));
    }
    Ok(d)
}

/// Runs `status`: once, or with `--watch` every `--interval` until SIGINT/SIGTERM (each
/// refresh bounded by the request timeouts; a signal ends the wait at once).
pub async fn run(a: StatusArgs) -> anyhow::Result<u8> {
    super::output::format(a.json); // failures print as JSON under --json too
    if !a.watch {
        return once(&a).await;
    }
    let stop = egress_core::background::signals::shutdown_on_signals();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        if tty {
            // Clear the screen and go home, as `watch` does.
            print!("\x1b[2J\x1b[H");
        }
        let code = tokio::select! {
            () = stop.cancelled() => return Ok(EXIT_OK),
            r = once(&a) => r?,
        };
        tokio::select! {
            () = stop.cancelled() => return Ok(code),
            () = tokio::time::sleep(a.interval) => {}
        }
    }
}

/// One `status`: fetch, print, exit status.
async fn once(a: &StatusArgs) -> anyhow::Result<u8> {
    let base = url::Url::parse(&server_url(&a.server))
        .ok()
        .filter(|u| u.scheme() == "http" && u.host().is_some())
        .ok_or_else(|| {
            UsageError::new(format!(
                "--server {:?} is not an http:// URL or a host:port (e.g. {DEFAULT_SERVER})",
                a.server
            ))
        })?;
    let mut url = base
        .join("/status")
        .map_err(|e| UsageError::new(format!("--server {}: {e}", a.server)))?;
    let filters = a.filters();
    if !filters.is_empty() {
        url.set_query(Some(&filters.to_query()));
    }
    let body = match fetch(&url).await {
        Ok(b) => b,
        Err(msg) => {
            super::output::print_error(&msg, EXIT_FAILED);
            return Ok(EXIT_FAILED);
        }
    };
    let mut doc: StatusDocument = serde_json::from_slice(&body).map_err(|e| {
        anyhow::anyhow!("{url} did not answer with a status document ({e}); is it egress-proxies?")
    })?;
    if !filters.is_empty() {
        doc = doc.filtered(&filters);
    }
    let fmt = super::output::format(a.json);
    if fmt == super::output::OutputFormat::Json && filters.is_empty() {
        println!("{}", String::from_utf8_lossy(&body));
    } else if let Some(text) = super::output::document(&doc, fmt)? {
        println!("{text}");
    } else {
        let wide = fmt == super::output::OutputFormat::Wide;
        print!("{}", render(&doc, SystemTime::now(), wide));
    }
    // A rejected manifest is a Proxy the user asked for and does not get: a failure too.
    let unhealthy = !doc.manifest_errors.is_empty()
        || doc
            .proxies
            .iter()
            .any(|p| matches!(p.phase, Phase::Failed | Phase::Paused));
    Ok(if unhealthy { EXIT_FAILED } else { EXIT_OK })
}

/// `server` as a URL: `host:port` (no scheme) means `http://host:port`, as `--listen` prints
/// it; anything with a scheme is taken as written (and refused unless it is `http`).
pub(super) fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_owned()
    } else {
        format!("http://{server}")
    }
}

pub(super) async fn fetch(url: &url::Url) -> Result<Vec<u8>, String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(STATUS_CONNECT_TIMEOUT)
        .timeout(STATUS_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let origin = url.origin().ascii_serialization();
    let mut resp = client.get(url.as_str()).send().await.map_err(|e| {
        if e.is_connect() {
            format!(
                "nothing is listening at {origin} ({}). Is `egress-proxies standalone` \
                 running, and does its --listen address match --server?",
                root_cause(&e)
            )
        } else if e.is_timeout() {
            format!("{origin} did not answer within {STATUS_TIMEOUT:?}")
        } else {
            format!("GET {url} failed: {}", root_cause(&e))
        }
    })?;
    if !resp.status().is_success() {
        return Err(format!("GET {url} answered {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("reading {url}: {e}"))?
    {
        if body.len() + chunk.len() > MAX_STATUS_BYTES {
            return Err(format!(
                "{url} sent more than {MAX_STATUS_BYTES} bytes; refusing it"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The innermost cause of `e` (reqwest's own text only says "error sending request").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The columns `-o wide` adds before LAST ERROR (which it does not truncate).
pub const WIDE_COLUMNS: [&str; 5] = ["PORT", "LATENCY", "CHECKED", "FAILURES", "PROVIDER ID"];

/// The table of proxies, then host problems and manifest errors. `wide` adds
/// [`WIDE_COLUMNS`] and shows LAST ERROR whole.
pub fn render(doc: &StatusDocument, now: SystemTime, wide: bool) -> String {
    let mut header = vec![
        "NAMESPACE/NAME",
        "PHASE",
        "HOST",
        "IP",
        "HEALTHY",
        "EGRESS IP",
        "EGRESS ADDRESS",
        "LISTED",
        "AGE",
    ];
    if wide {
        header.extend(WIDE_COLUMNS);
    }
    header.push("LAST ERROR");
    let mut t = Table::new(&header);
    let since = |at: &str| {
        humantime::parse_rfc3339_weak(at)
            .ok()
            .and_then(|c| now.duration_since(c).ok())
            .map_or_else(|| "-".to_owned(), table::age)
    };
    for p in &doc.proxies {
        let age = since(&p.created_at);
        let mut row = vec![
            format!("{}/{}", p.namespace, p.name),
            p.phase.as_str().to_owned(),
            p.host.clone().unwrap_or_else(|| "-".into()),
            p.ip.clone().unwrap_or_else(|| "-".into()),
            match (&p.health, p.healthy()) {
                (None, _) => "-".into(),
                (Some(_), None) => "?".into(),
                (Some(_), Some(true)) => "yes".into(),
                (Some(_), Some(false)) => "no".into(),
            },
            p.health
                .as_ref()
                .and_then(|h| {
                    if h.egress_ips.is_empty() {
                        h.egress_ip.clone()
                    } else {
                        Some(h.egress_ips.join(","))
                    }
                })
                .unwrap_or_else(|| "-".into()),
            if p.egress_address.is_empty() {
                "-".into()
            } else {
                p.egress_address.join(",")
            },
            p.listed_cell(),
            age,
        ];
        if wide {
            let h = p.health.as_ref();
            row.extend([
                p.port.map_or_else(|| "-".into(), |port| port.to_string()),
                h.and_then(|h| h.latency_ms)
                    .map_or_else(|| "-".into(), |ms| format!("{ms}ms")),
                h.and_then(|h| h.last_check.as_deref())
                    .map_or_else(|| "-".into(), |at| format!("{} ago", since(at))),
                h.map_or_else(|| "-".into(), |h| h.consecutive_failures.to_string()),
                p.provider_id.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        row.push(p.last_error.as_deref().map_or_else(
            || "-".into(),
            |e| {
                if wide {
                    e.to_owned()
                } else {
                    egress_core::model::truncate(e, TABLE_ERROR_CHARS)
                }
            },
        ));
        t.row(row);
    }
    let mut out = if doc.proxies.is_empty() {
        "no Proxies\n".to_owned()
    } else {
        t.render()
    };
    out.push_str(&super::status_pools::render(doc, now, wide));
    out.push_str(&host_lines(doc));
    for e in &doc.manifest_errors {
        out.push_str(&format!("manifest error: {e}\n"));
    }
    out
}

/// One line per host that is not `Ready`, under maintenance or declared dead: its state,
/// maintenance progress and last error, then, indented, the declaration that it is dead
/// (reason and what the operator did with it).
pub fn host_lines(doc: &StatusDocument) -> String {
    let mut out = String::new();
    for h in doc
        .hosts
        .iter()
        .filter(|h| h.state != "Ready" || h.maintenance.is_some() || h.fenced.is_some())
    {
        out.push_str(&format!(
            "host {}/{} is {}{}{}\n",
            h.entry,
            h.host,
            h.state,
            h.maintenance
                .as_deref()
                .map(|m| format!(", {m}"))
                .unwrap_or_default(),
            h.error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
        if let Some(f) = &h.fenced {
            out.push_str(&format!("  {}\n", f.describe()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_web::status::{HostStatusRow, ProxyStatusRow};

    #[test]
    fn the_table_shows_age_and_a_truncated_last_error_and_names_unready_hosts() {
        let now =
            humantime::parse_rfc3339("2026-01-01T02:00:00Z").unwrap_or(SystemTime::UNIX_EPOCH);
        let long = "e".repeat(300);
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![ProxyStatusRow {
                namespace: "default".into(),
                name: "p1".into(),
                uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
                phase: Phase::Provisioning,
                host: Some("h1".into()),
                ip: None,
                provider_id: None,
                created_at: "2026-01-01T00:00:00Z".into(),
                last_error: Some(long.clone()),
                conditions: vec![],
                port: Some(3128),
                health: None,
                reputation: None,
                egress_address: Vec::new(),
            }],
            hosts: vec![HostStatusRow {
                entry: "home".into(),
                host: "h2".into(),
                state: "Unreachable".into(),
                latency_ms: None,
                error: Some("connection refused".into()),
                maintenance: None,
                addresses: Vec::new(),
                fenced: None,
            }],
            manifest_errors: vec!["a.yaml: bad".into()],
            pools: vec![],
        };
        let out = render(&doc, now, false);
        let row = out.lines().nth(1).unwrap_or_default();
        assert!(
            row.starts_with(
                "default/p1      Provisioning  h1    -   -        -          -               -       2h   eee"
            ),
            "{out}"
        );
        assert!(!out.contains(&long), "truncated: {out}");
        assert!(
            out.contains("host home/h2 is Unreachable: connection refused"),
            "{out}"
        );
        assert!(out.contains("manifest error: a.yaml: bad"), "{out}");
    }

    #[test]
    fn host_lines_name_maintenance_progress_and_a_declaration_that_the_host_is_dead() {
        use egress_core::host_health::{FENCE_APPLIED, HostFence};
        let row = |host: &str, state: &str| HostStatusRow {
            entry: "home".into(),
            host: host.into(),
            state: state.into(),
            latency_ms: None,
            error: None,
            maintenance: None,
            addresses: Vec::new(),
            fenced: None,
        };
        let mut draining = row("h1", "Ready");
        draining.maintenance = Some("Draining (1 left)".into());
        let mut dead = row("h2", "Timeout");
        dead.error = Some("no answer within 10s".into());
        dead.fenced = Some(HostFence {
            reason: "rack 4 unplugged".into(),
            state: FENCE_APPLIED.into(),
            applied_at: Some("2026-01-01T01:00:00Z".into()),
            freed: vec!["203.0.113.10".into()],
            message: None,
        });
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![],
            hosts: vec![row("h0", "Ready"), draining, dead],
            manifest_errors: vec![],
            pools: vec![],
        };
        assert_eq!(
            host_lines(&doc),
            "host home/h1 is Ready, Draining (1 left)\n\
             host home/h2 is Timeout: no answer within 10s\n  \
             declared dead: rack 4 unplugged (Applied at 2026-01-01T01:00:00Z, freed \
             203.0.113.10)\n"
        );
        let out = render(&doc, SystemTime::UNIX_EPOCH, false);
        assert!(out.ends_with(&host_lines(&doc)), "{out}");
        assert!(
            !out.contains("home/h0"),
            "a Ready host in service has no line: {out}"
        );
    }

    #[test]
    fn wide_adds_port_latency_last_check_failures_and_the_provider_id_and_keeps_the_whole_error() {
        use egress_core::model::HealthStatus;
        let now =
            humantime::parse_rfc3339("2026-01-01T02:00:00Z").unwrap_or(SystemTime::UNIX_EPOCH);
        let long = format!("{}END", "e".repeat(200));
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![ProxyStatusRow {
                namespace: "default".into(),
                name: "p1".into(),
                uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
                phase: Phase::Running,
                host: Some("h1".into()),
                ip: Some("192.0.2.1".into()),
                provider_id: Some("libvirt://home/h1/ep-home-x".into()),
                created_at: "2026-01-01T00:00:00Z".into(),
                last_error: Some(long.clone()),
                conditions: vec![],
                port: Some(3128),
                health: Some(HealthStatus {
                    healthy: Some(false),
                    latency_ms: Some(42),
                    last_check: Some("2026-01-01T01:59:30Z".into()),
                    consecutive_failures: 3,
                    ..HealthStatus::default()
                }),
                reputation: None,
                egress_address: Vec::new(),
            }],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![],
        };
        let text = render(&doc, now, false);
        let wide = render(&doc, now, true);
        let head = |s: &str| s.lines().next().unwrap_or_default().to_owned();
        for c in WIDE_COLUMNS {
            assert!(!head(&text).contains(c), "{text}");
        }
        assert!(
            head(&wide).contains("AGE  PORT  LATENCY  CHECKED  FAILURES  PROVIDER ID"),
            "{wide}"
        );
        assert!(head(&wide).ends_with("LAST ERROR"), "{wide}");
        let row = wide.lines().nth(1).unwrap_or_default();
        assert!(
            row.contains("2h   3128  42ms     30s ago  3         libvirt://home/h1/ep-home-x"),
            "{wide}"
        );
        assert!(row.ends_with(&long), "the whole error: {wide}");
        assert!(!text.contains("END"), "truncated in text: {text}");
    }

    #[test]
    fn the_filter_flags_become_the_servers_query() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: StatusArgs,
        }
        let cli = Cli::try_parse_from([
            "status",
            "--phase",
            "Running",
            "--host",
            "h1",
            "--entry",
            "e",
            "--pool",
            "web",
            "--health",
            "Unhealthy",
        ])
        .map_err(|e| e.to_string());
        let f = cli.map(|c| c.a.filters());
        assert_eq!(
            f.as_ref().map(Filters::to_query).as_deref(),
            Ok("entry=e&host=h1&pool=web&phase=Running&health=Unhealthy")
        );
        assert_eq!(
            f.map(|f| Filters::from_query(Some(&f.to_query())) == f),
            Ok(true),
            "the server reads back the same filters"
        );
        assert!(Cli::try_parse_from(["status", "--phase", "running"]).is_err());
        assert!(Cli::try_parse_from(["status", "--health", "ok"]).is_err());
    }

    #[test]
    fn the_table_shows_health_and_the_egress_ip() {
        use egress_core::model::HealthStatus;
        let row = |name: &str, healthy: Option<bool>| ProxyStatusRow {
            namespace: "default".into(),
            name: name.into(),
            uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            phase: Phase::Running,
            host: Some("h1".into()),
            ip: Some("192.0.2.1".into()),
            provider_id: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: None,
            conditions: vec![],
            port: Some(3128),
            health: Some(HealthStatus {
                healthy,
                egress_ip: Some("203.0.113.7".into()),
                ..HealthStatus::default()
            }),
            reputation: None,
            egress_address: Vec::new(),
        };
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![row("a", Some(true)), row("b", Some(false)), row("c", None)],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![],
        };
        let out = render(&doc, SystemTime::UNIX_EPOCH, false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines
                .first()
                .is_some_and(|l| l.contains("HEALTHY  EGRESS IP")),
            "{out}"
        );
        for (line, want) in lines.iter().skip(1).zip(["yes", "no", "?"]) {
            assert!(line.contains(&format!("192.0.2.1  {want}")), "{out}");
            assert!(line.contains("203.0.113.7"), "{out}");
        }
    }

    #[test]
    fn the_table_shows_the_declared_egress_address_next_to_the_observed_one() {
        use egress_core::model::HealthStatus;
        let row = ProxyStatusRow {
            namespace: "default".into(),
            name: "a".into(),
            uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            phase: Phase::Running,
            host: Some("h1".into()),
            ip: Some("192.0.2.1".into()),
            provider_id: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: None,
            conditions: vec![],
            port: Some(3128),
            health: Some(HealthStatus {
                healthy: Some(false),
                egress_ip: Some("198.51.100.9".into()),
                egress_ips: vec!["198.51.100.9".into(), "2001:db8::7".into()],
                ..HealthStatus::default()
            }),
            reputation: None,
            egress_address: vec!["203.0.113.7".into(), "2001:db8::7".into()],
        };
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![row],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![],
        };
        let out = render(&doc, SystemTime::UNIX_EPOCH, false);
        assert!(out.contains("EGRESS IP"), "{out}");
        assert!(out.contains("EGRESS ADDRESS"), "{out}");
        assert!(
            out.contains("198.51.100.9,2001:db8::7  203.0.113.7,2001:db8::7"),
            "observed, then declared: {out}"
        );
    }

    #[test]
    fn the_listed_column_names_the_zones_and_never_calls_a_failed_check_clean() {
        use egress_core::reputation::ProxyReputation;
        use egress_core::reputation::engine::status::{FailedCheck, ListingStatus};
        let row = |r: Option<ProxyReputation>| ProxyStatusRow {
            namespace: "default".into(),
            name: "a".into(),
            uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            phase: Phase::Running,
            host: Some("h1".into()),
            ip: Some("192.0.2.1".into()),
            provider_id: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: None,
            conditions: vec![],
            port: Some(3128),
            health: None,
            reputation: r,
            egress_address: vec!["203.0.113.7".into()],
        };
        let checked = ProxyReputation {
            addresses: vec!["203.0.113.7".into()],
            last_check: Some("2026-01-01T01:00:00Z".into()),
            ..ProxyReputation::default()
        };
        let listing = |zone: &str| ListingStatus {
            address: "203.0.113.7".into(),
            zone: zone.into(),
            since: "2026-01-01T00:30:00Z".into(),
            codes: vec!["SBL".into()],
        };
        let listed = ProxyReputation {
            listed: vec![
                listing("zen.example"),
                listing("bl.example"),
                listing("bl.example"),
            ],
            ..checked.clone()
        };
        let failing = ProxyReputation {
            failed: vec![FailedCheck {
                address: "203.0.113.7".into(),
                zone: "zen.example".into(),
                since: "2026-01-01T00:30:00Z".into(),
                reason: "error_answer".into(),
                message: "127.255.255.254".into(),
            }],
            ..checked.clone()
        };
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![
                row(None),
                row(Some(checked)),
                row(Some(listed)),
                row(Some(failing)),
            ],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![],
        };
        let out = render(&doc, SystemTime::UNIX_EPOCH, false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("EGRESS ADDRESS  LISTED"), "{out}");
        for (line, want) in lines.iter().skip(1).zip([
            "203.0.113.7     -  ",
            "203.0.113.7     no  ",
            "203.0.113.7     bl.example,zen.example  ",
            "203.0.113.7     ?  ",
        ]) {
            assert!(line.contains(want), "{want:?} in {out}");
        }
    }
}
