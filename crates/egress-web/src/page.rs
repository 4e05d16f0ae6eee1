//! The fleet page served at `/`: hosts, ProxyPools (when there are any) and proxies at a
//! glance, with filters and sparklines of the last hour, rendered on the server.
//!
//! Guarantees:
//! - **One source**: the page is a pure function of a [`Fleet`] (the [`StatusDocument`]
//!   `/status` serves, the host checks `/hosts` serves, and the [`HistorySnapshot`]) and the
//!   [`Filters`]. No I/O, no clock: ages are measured against the document's `generatedAt`.
//! - **Escaping**: every string from the document goes through maud's escaping (text and
//!   attribute values); host errors, guest replies and names are hostile input. The only
//!   unescaped insertions are this module's own constants ([`STYLE`], [`SCRIPT`]) and numbers.
//! - **Strict CSP**: no external asset, no inline `style=` attribute, no inline event
//!   handler; the one `<style>` and the one `<script>` are allowed by their SHA-256 hashes
//!   ([`content_security_policy`]), everything else is refused (`default-src 'none'`).
//! - **Useful without JavaScript**: the whole page is rendered on the server and the filters
//!   are a GET form; the script only re-fetches [`render_fleet`]'s fragment from
//!   `/fleet.json` every [`REFRESH_INTERVAL`] and swaps it in.
//! - **Bounded input**: at most [`MAX_QUERY_PAIRS`] query pairs are read, each filter value is
//!   cut to [`MAX_FILTER_CHARS`](crate::filters::MAX_FILTER_CHARS).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use sha2::{Digest, Sha256};

use crate::filters::{Filters, HEALTH_STATES, HOST_STATES, PHASES, health_label};
use crate::history::{HistorySnapshot, Sample, is_ready, proxy_counts};
use crate::sparkline::{Subject, sparkline};
use crate::status::{HostStatusRow, ProxyStatusRow, StatusDocument, entry_of};
use egress_core::host_health::HostHealth;
use egress_core::model::ConditionStatus;

/// How often the page's script re-fetches the fleet fragment.
// NB: host checks run every 30 s and the manifest poller every 2 s; 5 s shows a new proxy or a
// phase change while the user is still looking, for one small request per open page.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
/// The page's style sheet (allowed by its hash).
pub const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}\
header,main,footer{padding:0 1.2rem}\
header{display:flex;gap:1rem;align-items:baseline;flex-wrap:wrap;border-bottom:1px solid #d9dde3;background:#fff}\
h1{font-size:1.2rem;margin:.7rem 0}h2{font-size:1rem;margin:1.2rem 0 .4rem}\
.summary{color:#4a5566}#live{margin-left:auto;font-size:.85rem;color:#4a5566}#live.bad{color:#b3261e}\
form{display:flex;gap:.8rem;flex-wrap:wrap;align-items:end;margin:.8rem 0}\
label{display:flex;flex-direction:column;font-size:.8rem;color:#4a5566}\
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #d9dde3}\
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eceef1;vertical-align:top}\
th{font-size:.8rem;color:#4a5566;background:#fafbfc}\
td.err{max-width:28rem;overflow-wrap:anywhere;color:#8a1c16}.muted{color:#8b95a5}\
.badge{display:inline-block;padding:0 .4rem;border-radius:.6rem;font-size:.8rem;background:#e8eaee}\
.s-Ready,.s-Running,.s-Healthy{background:#d7f2df;color:#14532d}\
.s-Degraded,.s-Pending,.s-Provisioning,.s-Paused,.s-Unchecked,.s-Unknown{background:#fdf0c8;color:#6b4e00}\
.s-Unreachable,.s-Timeout,.s-Failed,.s-Unhealthy,.s-Terminating{background:#fbdcda;color:#8a1c16}\
svg.spark polyline{fill:none;stroke:#2563eb;stroke-width:1.5}svg.spark circle{fill:#2563eb}\
svg.spark rect.up{fill:#86d19b}svg.spark rect.down{fill:#e8837c}\
.manifest-errors{background:#fbdcda;padding:.5rem 1rem;border-radius:.3rem}\
footer{margin:1.5rem 0;font-size:.85rem;color:#4a5566}code{font-size:.85rem}";

/// The page's script: every [`REFRESH_INTERVAL`] it fetches `/fleet.json` with the page's own
/// query, swaps `#fleet`'s content and updates `#summary` (allowed by its hash).
// NB: `innerHTML` receives the server's already-escaped fragment; no data is interpolated on
// the client. Failures are shown in `#live`, not thrown (no console noise while the operator
// restarts).
pub const SCRIPT: &str = "\
(function(){var f=document.getElementById('fleet'),l=document.getElementById('live'),\
s=document.getElementById('summary');if(!f||!l||!s)return;var ms=parseInt(f.getAttribute('data-refresh-ms'),10)||5000;\
document.documentElement.setAttribute('data-live','on');l.textContent='live';\
function tick(){fetch('/fleet.json'+location.search,{cache:'no-store'})\
.then(function(r){if(!r.ok)throw new Error('HTTP '+r.status);return r.json();})\
.then(function(j){f.innerHTML=j.html;s.textContent=j.summary;l.className='';l.textContent='live, updated '+j.generatedAt;})\
.catch(function(e){l.className='bad';l.textContent='live refresh failed ('+e.message+'); retrying';})\
.then(function(){setTimeout(tick,ms);});}\
setTimeout(tick,ms);})();";

fn sha256_source(s: &str) -> String {
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s.as_bytes()))
    )
}

static CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; style-src {}; script-src {}; connect-src 'self'; img-src data:; \
         form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        sha256_source(STYLE),
        sha256_source(SCRIPT)
    )
});

/// The `Content-Security-Policy` the page is served with: nothing but this page's own style
/// and script (by hash), fetches to its own origin, and forms to its own origin.
pub fn content_security_policy() -> &'static str {
    CSP.as_str()
}

/// A pool's line on the page, from the status document's pool rows. The section and the pool
/// filter appear only when a [`Fleet`] carries some.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSummary {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Members available (Running, healthy when health checks run, not quarantined).
    pub ready: u32,
    /// Members wanted.
    pub desired: u32,
}

/// Everything the page shows.
#[derive(Debug, Clone, Copy)]
pub struct Fleet<'a> {
    /// What `/status` serves.
    pub doc: &'a StatusDocument,
    /// What `/hosts` serves (the details of each host's last check).
    pub hosts: &'a [HostHealth],
    /// One per ProxyPool of the status document (none without pools).
    pub pools: &'a [PoolSummary],
    /// The last hour.
    pub history: &'a HistorySnapshot,
}

/// The path of a proxy's own JSON (`/proxies/{namespace}/{name}`, each segment
/// percent-encoded).
pub fn proxy_path(namespace: &str, name: &str) -> String {
    format!(
        "/proxies/{}/{}",
        encode_segment(namespace),
        encode_segment(name)
    )
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}

/// A compact age: `45s`, `12m`, `3h20m`, `5d4h`.
pub fn age(from: &str, now: &str) -> Option<String> {
    let d = parse_time(now)?.duration_since(parse_time(from)?).ok()?;
    let s = d.as_secs();
    Some(match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    })
}

fn gib(bytes: u64) -> String {
    // NB: display only; f64 is exact far beyond any pool size.
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.1} GiB")
}

/// The reason and message of a proxy's last error: the first False condition with a message.
fn last_error(p: &ProxyStatusRow) -> Option<(&str, &str)> {
    if let Some(c) = p
        .conditions
        .iter()
        .find(|c| c.status == ConditionStatus::False && !c.message.is_empty())
    {
        return Some((c.reason.as_str(), c.message.as_str()));
    }
    p.last_error.as_deref().map(|m| ("", m))
}

fn badge(state: &str) -> Markup {
    // NB: the class only takes known state names; anything else gets the neutral badge.
    let known = HOST_STATES.contains(&state)
        || HEALTH_STATES.contains(&state)
        || PHASES.iter().any(|p| p.as_str() == state);
    html! {
        @if known {
            span class=(format!("badge s-{state}")) { (state) }
        } @else {
            span.badge { (state) }
        }
    }
}

/// The host's sample right now (drawn after the recorded history).
fn current_sample(doc: &StatusDocument, h: &HostStatusRow, ready: u32, total: u32) -> Sample {
    Sample {
        at_unix: parse_time(&doc.generated_at)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
        up: h.state == "Ready",
        ready,
        total,
    }
}

fn hosts_section(f: &Fleet<'_>, filters: &Filters) -> Markup {
    let counts = proxy_counts(f.doc);
    let details: BTreeMap<(&str, &str), &HostHealth> = f
        .hosts
        .iter()
        .map(|d| ((d.entry.as_str(), d.host.as_str()), d))
        .collect();
    let rows: Vec<(&HostStatusRow, Option<&HostHealth>, Sample, Vec<Sample>)> = f
        .doc
        .hosts
        .iter()
        .filter(|h| filters.keeps_host(h))
        .map(|h| {
            let detail = details.get(&(h.entry.as_str(), h.host.as_str())).copied();
            let (ready, total) = counts
                .get(&(h.entry.clone(), h.host.clone()))
                .copied()
                .unwrap_or((0, 0));
            let now = current_sample(f.doc, h, ready, total);
            let mut samples = f.history.host(&h.entry, &h.host).to_vec();
            samples.push(now);
            (h, detail, now, samples)
        })
        .collect();
    html! {
        section #hosts {
            h2 { "Hosts " span.muted { (rows.len()) " of " (f.doc.hosts.len()) } }
            table {
                thead { tr {
                    th { "Entry" } th { "Host" } th { "State" } th { "Latency" }
                    th { "libvirt" } th { "Pool free above reserve" } th { "Missing" }
                    th { "Ready proxies" } th { "Last hour" } th { "Error" }
                } }
                tbody {
                    @for (h, detail, now, samples) in &rows {
                        tr data-entry=(h.entry) data-host=(h.host) data-state=(h.state) {
                            td { (h.entry) }
                            td { (h.host) }
                            td { (badge(&h.state)) }
                            td { @if let Some(l) = h.latency_ms { (l) " ms" } @else { span.muted { "—" } } }
                            td { @match detail.and_then(|d| d.libvirt_version.as_deref()) {
                                Some(v) => (v),
                                None => span.muted { "—" },
                            } }
                            td { @match detail.and_then(|d| d.pool_free_bytes) {
                                Some(b) => (gib(b)),
                                None => span.muted { "—" },
                            } }
                            td.err { @if let Some(d) = detail {
                                @for (i, m) in d.missing.iter().enumerate() {
                                    @if i > 0 { br; }
                                    (m)
                                }
                            } }
                            td { (now.ready) " / " (now.total) }
                            td { (sparkline(samples, Subject::Host)) }
                            td.err { @if let Some(e) = &h.error { (e) } }
                        }
                    }
                    @if rows.is_empty() {
                        tr { td colspan="10" .muted { "No host matches the filters." } }
                    }
                }
            }
        }
    }
}

fn pools_section(f: &Fleet<'_>, filters: &Filters) -> Markup {
    let at_unix = parse_time(&f.doc.generated_at)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    html! {
        @if !f.pools.is_empty() {
            section #pools {
                h2 { "Pools" }
                table {
                    thead { tr { th { "Pool" } th { "Ready / desired" } th { "Last hour" } } }
                    tbody {
                        @for p in f.pools.iter().filter(|p| filters.keeps_pool(&p.namespace, &p.name)) {
                            tr data-pool=(format!("{}/{}", p.namespace, p.name)) {
                                td { (p.namespace) "/" (p.name) }
                                td { (p.ready) " / " (p.desired) }
                                td { (sparkline(&pool_samples(f, p, at_unix), Subject::Pool)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A pool's recorded hour, then its state now (drawn last).
fn pool_samples(f: &Fleet<'_>, p: &PoolSummary, at_unix: u64) -> Vec<Sample> {
    let mut samples = f.history.pool(&p.namespace, &p.name).to_vec();
    samples.push(Sample {
        at_unix,
        up: p.ready >= p.desired,
        ready: p.ready,
        total: p.desired,
    });
    samples
}

/// The listings of `p`, one per line (the `Listed` cell's tooltip).
fn listed_title(p: &ProxyStatusRow) -> String {
    p.reputation
        .as_ref()
        .map(|r| {
            r.listed
                .iter()
                .map(|l| {
                    format!(
                        "{} in {} ({}) since {}",
                        l.address,
                        l.zone,
                        l.codes.join(", "),
                        l.since
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn proxies_section(f: &Fleet<'_>, filters: &Filters) -> Markup {
    let rows: Vec<&ProxyStatusRow> = f
        .doc
        .proxies
        .iter()
        .filter(|p| filters.keeps_proxy(p))
        .collect();
    html! {
        section #proxies {
            h2 { "Proxies " span.muted { (rows.len()) " of " (f.doc.proxies.len()) } }
            table {
                thead { tr {
                    th { "Proxy" } th { "Phase" } th { "Host" } th { "Address" } th { "Health" }
                    th { "Egress address" } th { "Listed" } th { "Age" } th { "Last error" }
                } }
                tbody {
                    @for p in &rows {
                        tr data-proxy=(format!("{}/{}", p.namespace, p.name)) data-phase=(p.phase.as_str())
                            data-health=(health_label(p)) {
                            td { a href=(proxy_path(&p.namespace, &p.name)) { (p.namespace) "/" (p.name) } }
                            td { (badge(p.phase.as_str())) }
                            td {
                                @if let Some(h) = &p.host {
                                    @if let Some(e) = entry_of(p) { span.muted { (e) "/" } }
                                    (h)
                                } @else { span.muted { "not placed" } }
                            }
                            td { @match (&p.ip, p.port) {
                                (Some(ip), Some(port)) if ip.contains(':') => { "[" (ip) "]:" (port) }
                                (Some(ip), Some(port)) => { (ip) ":" (port) }
                                (Some(ip), None) => (ip),
                                (None, _) => span.muted { "—" },
                            } }
                            td {
                                (badge(health_label(p)))
                                @if let Some(ms) = p.health.as_ref().and_then(|h| h.latency_ms) { " " (ms) " ms" }
                            }
                            td { @match p.health.as_ref().and_then(|h| h.egress_ip.as_deref()) {
                                Some(ip) => code { (ip) },
                                None => span.muted { "—" },
                            } }
                            td.listed { @match p.listed_cell().as_str() {
                                "-" => span.muted { "—" },
                                "no" => span.muted { "no" },
                                "?" => span title="some blocklist checks failed" { "?" },
                                zones => span.s-Failed title=(listed_title(p)) { (zones) },
                            } }
                            td { @match age(&p.created_at, &f.doc.generated_at) {
                                Some(a) => span title=(p.created_at) { (a) },
                                None => span.muted { "—" },
                            } }
                            td.err {
                                @if let Some((reason, msg)) = last_error(p) {
                                    @if !reason.is_empty() { strong { (reason) } ": " }
                                    (msg)
                                }
                                @if let Some(e) = p.health.as_ref().and_then(|h| h.last_error.as_deref()) {
                                    div { strong { "health" } ": " (e) }
                                }
                            }
                        }
                    }
                    @if rows.is_empty() {
                        tr { td colspan="9" .muted { "No proxy matches the filters." } }
                    }
                }
            }
        }
    }
}

/// The part of the page the script swaps: hosts, pools and proxies under `filters`.
pub fn render_fleet(f: &Fleet<'_>, filters: &Filters) -> String {
    html! {
        @if !f.doc.manifest_errors.is_empty() {
            section.manifest-errors #manifest-errors {
                h2 { "Manifest errors" }
                ul { @for e in &f.doc.manifest_errors { li { (e) } } }
            }
        }
        (hosts_section(f, filters))
        (pools_section(f, filters))
        (proxies_section(f, filters))
        p.muted #generated { "Status generated at " (f.doc.generated_at) "." }
    }
    .into_string()
}

fn select(name: &str, label: &str, choices: &[Markup], chosen: Option<&str>) -> Markup {
    html! {
        label { (label)
            select name=(name) {
                option value="" selected[chosen.is_none()] { "all" }
                @for c in choices { (c) }
            }
        }
    }
}

fn option(value: &str, chosen: Option<&str>) -> Markup {
    html! { option value=(value) selected[chosen == Some(value)] { (value) } }
}

fn filter_form(f: &Fleet<'_>, filters: &Filters) -> Markup {
    let entries: BTreeSet<&str> = f.doc.hosts.iter().map(|h| h.entry.as_str()).collect();
    let hosts: BTreeSet<&str> = f
        .doc
        .hosts
        .iter()
        .map(|h| h.host.as_str())
        .chain(f.doc.proxies.iter().filter_map(|p| p.host.as_deref()))
        .collect();
    let pools: BTreeSet<String> = f
        .pools
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let entry_opts: Vec<Markup> = entries
        .iter()
        .map(|e| option(e, filters.entry.as_deref()))
        .collect();
    let host_opts: Vec<Markup> = hosts
        .iter()
        .map(|h| option(h, filters.host.as_deref()))
        .collect();
    let pool_opts: Vec<Markup> = pools
        .iter()
        .map(|p| option(p, filters.pool.as_deref()))
        .collect();
    let st = filters.state.as_deref();
    html! {
        form #filters method="get" action="/" {
            (select("entry", "Entry", &entry_opts, filters.entry.as_deref()))
            (select("host", "Host", &host_opts, filters.host.as_deref()))
            @if !f.pools.is_empty() || filters.pool.is_some() {
                (select("pool", "Pool", &pool_opts, filters.pool.as_deref()))
            }
            label { "State"
                select name="state" {
                    option value="" selected[st.is_none()] { "all" }
                    optgroup label="Proxy phase" { @for p in PHASES { (option(p.as_str(), st)) } }
                    optgroup label="Proxy health" { @for h in HEALTH_STATES { (option(h, st)) } }
                    optgroup label="Host state" { @for h in HOST_STATES { (option(h, st)) } }
                }
            }
            button type="submit" { "Filter" }
            @if !filters.is_empty() { a href="/" { "clear" } }
        }
    }
}

/// The totals line of the header: hosts (Ready) and proxies (ready).
pub fn summary(doc: &StatusDocument) -> String {
    let ready_hosts = doc.hosts.iter().filter(|h| h.state == "Ready").count();
    let ready_proxies = doc
        .proxies
        .iter()
        .filter(|p| is_ready(p.phase, p.health.as_ref().and_then(|h| h.healthy)))
        .count();
    format!(
        "{} hosts ({ready_hosts} Ready) · {} proxies ({ready_proxies} ready)",
        doc.hosts.len(),
        doc.proxies.len()
    )
}

/// The whole page: header with the totals, the filter form, [`render_fleet`], and links to
/// the JSON views.
pub fn render_page(f: &Fleet<'_>, filters: &Filters) -> String {
    let refresh_ms = u64::try_from(REFRESH_INTERVAL.as_millis()).unwrap_or(5000);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // NB: an empty icon, so the browser does not ask for /favicon.ico (a 404 in
                // its console).
                link rel="icon" href="data:,";
                title { "egress-proxies fleet" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { "egress-proxies fleet" }
                    span.summary #summary { (summary(f.doc)) }
                    span #live { "reload the page for fresh data" }
                }
                main {
                    (filter_form(f, filters))
                    div #fleet data-refresh-ms=(refresh_ms) {
                        (PreEscaped(render_fleet(f, filters)))
                    }
                }
                footer {
                    "The same facts as JSON: "
                    a href="/status" { "/status" } ", " a href="/hosts" { "/hosts" } ", "
                    a href="/proxies" { "/proxies" } ", " a href="/healthy.txt" { "/healthy.txt" } ", "
                    a href="/metrics" { "/metrics" } "."
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
    .into_string()
}

/// The body of `/fleet.json`: the fragment [`render_fleet`] renders, and when its document was
/// generated.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetFragment {
    /// The document's `generatedAt`.
    pub generated_at: String,
    /// The escaped HTML of `#fleet`.
    pub html: String,
    /// The header's totals ([`summary`]), set as text.
    pub summary: String,
}

/// [`FleetFragment`] for `f` under `filters`.
pub fn fragment(f: &Fleet<'_>, filters: &Filters) -> FleetFragment {
    FleetFragment {
        generated_at: f.doc.generated_at.clone(),
        html: render_fleet(f, filters),
        summary: summary(f.doc),
    }
}
