//! The fleet page as a pure function of its inputs: the rendered HTML is parsed (scraper) and
//! asserted on — rows, states, filters, escaping, CSP — never compared to a snapshot.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use hyper::{Method, StatusCode};
use scraper::{ElementRef, Html, Selector};

use super::filters::{Filters, MAX_FILTER_CHARS};
use super::history::{History, HistorySnapshot};
use super::page::{self, Fleet, PoolSummary};
use super::{Endpoints, Routes, handle, handle_request};
use crate::status::{HostStatusRow, ProxyStatusRow, StatusDocument};
use egress_core::host_health::HostHealth;
use egress_core::model::{Condition, ConditionStatus, HealthStatus, Phase};

const HOSTILE: &str = "<script>alert(1)</script>";
const HOSTILE_ATTR: &str = "h\"><img src=x onerror=alert(2)>";

fn host(entry: &str, name: &str, state: &str, error: Option<&str>) -> HostStatusRow {
    HostStatusRow {
        entry: entry.into(),
        host: name.into(),
        state: state.into(),
        latency_ms: Some(3),
        error: error.map(Into::into),
        maintenance: None,
        addresses: Vec::new(),
        fenced: None,
    }
}

fn proxy(name: &str, host: Option<&str>, phase: Phase) -> ProxyStatusRow {
    ProxyStatusRow {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        phase,
        host: host.map(Into::into),
        ip: host.map(|_| "192.0.2.10".into()),
        provider_id: host.map(|h| format!("libvirt://lab/{h}/ep-lab-{name}")),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_error: None,
        conditions: vec![],
        port: Some(3128),
        health: None,
        reputation: None,
        egress_address: Vec::new(),
    }
}

fn failing(mut p: ProxyStatusRow, reason: &str, message: &str) -> ProxyStatusRow {
    p.conditions.push(Condition {
        type_: "Provisioned".into(),
        status: ConditionStatus::False,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: "2026-01-01T00:00:00Z".into(),
        observed_generation: 1,
    });
    p.last_error = Some(message.into());
    p
}

fn healthy(mut p: ProxyStatusRow, egress: &str) -> ProxyStatusRow {
    p.health = Some(HealthStatus {
        healthy: Some(true),
        egress_ip: Some(egress.into()),
        latency_ms: Some(42),
        ..HealthStatus::default()
    });
    p
}

/// `p` with `203.0.113.7` listed in `zone` (a hostile zone text stays text).
fn listed(mut p: ProxyStatusRow, zone: &str) -> ProxyStatusRow {
    use egress_core::reputation::engine::status::ListingStatus;
    p.reputation = Some(egress_core::reputation::ProxyReputation {
        addresses: vec!["203.0.113.7".into()],
        listed: vec![ListingStatus {
            address: "203.0.113.7".into(),
            zone: zone.into(),
            since: "2026-01-01T01:00:00Z".into(),
            codes: vec!["SBL".into()],
        }],
        failed: vec![],
        last_check: Some("2026-01-01T02:00:00Z".into()),
    });
    p
}

fn document() -> StatusDocument {
    StatusDocument {
        generated_at: "2026-01-01T02:03:04Z".into(),
        proxies: vec![
            healthy(proxy("alpha", Some("h1"), Phase::Running), "203.0.113.7"),
            listed(
                proxy("bravo", Some("h1"), Phase::Provisioning),
                "zen.example",
            ),
            failing(
                proxy("charlie", Some("h2"), Phase::Failed),
                "CreateFailed",
                &format!("guest said {HOSTILE}"),
            ),
            proxy("delta", None, Phase::Pending),
        ],
        hosts: vec![
            host("lab", "h1", "Ready", None),
            host(
                "lab",
                "h2",
                "Unreachable",
                Some(&format!("dial failed: {HOSTILE}")),
            ),
            host("other", HOSTILE_ATTR, "Degraded", None),
        ],
        manifest_errors: vec![],
        pools: vec![],
    }
}

fn details() -> Vec<HostHealth> {
    vec![HostHealth {
        libvirt_version: Some("11.3.0".into()),
        pool_free_bytes: Some(5 << 30),
        missing: vec![format!("free space in storage pool p: {HOSTILE}")],
        ..HostHealth::unknown("lab", "h1")
    }]
}

fn render(doc: &StatusDocument, filters: &Filters) -> Html {
    let hosts = details();
    let history = HistorySnapshot::default();
    Html::parse_document(&page::render_page(
        &Fleet {
            doc,
            hosts: &hosts,
            pools: &[],
            history: &history,
        },
        filters,
    ))
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

fn all<'a>(h: &'a Html, s: &str) -> Vec<ElementRef<'a>> {
    h.select(&sel(s)).collect()
}

fn text(e: &ElementRef<'_>) -> String {
    e.text().collect()
}

fn attrs<'a>(h: &'a Html, s: &str, a: &str) -> Vec<&'a str> {
    all(h, s)
        .into_iter()
        .filter_map(|e| e.value().attr(a))
        .collect()
}

#[test]
fn the_page_has_one_row_per_host_and_per_proxy_with_their_states() {
    let h = render(&document(), &Filters::default());
    assert_eq!(
        attrs(&h, "#hosts tbody tr[data-host]", "data-state"),
        ["Ready", "Unreachable", "Degraded"]
    );
    assert_eq!(
        attrs(&h, "#proxies tbody tr[data-proxy]", "data-proxy"),
        [
            "default/alpha",
            "default/bravo",
            "default/charlie",
            "default/delta"
        ]
    );
    assert_eq!(
        attrs(&h, "#proxies tbody tr[data-proxy]", "data-phase"),
        ["Running", "Provisioning", "Failed", "Pending"]
    );
    let alpha = &all(&h, "tr[data-proxy='default/alpha'] td")
        .iter()
        .map(text)
        .collect::<Vec<_>>();
    assert_eq!(alpha[0], "default/alpha");
    assert_eq!(alpha[2], "lab/h1");
    assert_eq!(alpha[3], "192.0.2.10:3128");
    assert_eq!(alpha[4], "Healthy 42 ms");
    assert_eq!(alpha[5], "203.0.113.7");
    assert_eq!(alpha[6], "—", "not checked: no listing shown");
    assert_eq!(alpha[7], "2h3m", "age against the document's generatedAt");
    let bravo = all(&h, "tr[data-proxy='default/bravo'] td.listed span");
    assert_eq!(text(&bravo[0]), "zen.example");
    assert_eq!(
        bravo[0].value().attr("title"),
        Some("203.0.113.7 in zen.example (SBL) since 2026-01-01T01:00:00Z")
    );
    let charlie = all(&h, "tr[data-proxy='default/charlie'] td.err");
    assert_eq!(
        text(&charlie[0]),
        format!("CreateFailed: guest said {HOSTILE}"),
        "the last error with its reason"
    );
    let h1: Vec<String> = all(&h, "tr[data-host='h1'] td").iter().map(text).collect();
    assert_eq!(h1[3], "3 ms");
    assert_eq!(h1[4], "11.3.0");
    assert_eq!(h1[5], "5.0 GiB");
    assert_eq!(h1[7], "1 / 2", "alpha ready of alpha and bravo");
    assert_eq!(
        attrs(&h, "a[href^='/proxies/']", "href"),
        [
            "/proxies/default/alpha",
            "/proxies/default/bravo",
            "/proxies/default/charlie",
            "/proxies/default/delta"
        ]
    );
    assert_eq!(
        text(&all(&h, "#summary")[0]),
        "3 hosts (1 Ready) · 4 proxies (1 ready)"
    );
    assert!(
        all(&h, "#pools").is_empty(),
        "no pools in the document, no section"
    );
}

#[test]
fn hostile_strings_in_host_errors_proxy_errors_and_names_stay_text() {
    let doc = document();
    let h = render(&doc, &Filters::default());
    // Only the page's own script element exists, and no element came from a name.
    let scripts = all(&h, "script");
    assert_eq!(scripts.len(), 1);
    assert_eq!(text(&scripts[0]), page::SCRIPT);
    assert!(all(&h, "img").is_empty(), "an attribute value broke out");
    let h2_error = text(&all(&h, "tr[data-host='h2'] td.err").last().unwrap().clone());
    assert_eq!(h2_error, format!("dial failed: {HOSTILE}"));
    let missing = text(&all(&h, "tr[data-host='h1'] td.err")[0]);
    assert!(missing.ends_with(HOSTILE), "{missing}");
    let charlie = text(&all(&h, "tr[data-proxy='default/charlie'] td.err")[0]);
    assert!(charlie.ends_with(HOSTILE), "{charlie}");
    assert_eq!(
        attrs(&h, "#hosts tbody tr[data-host]", "data-host")[2],
        HOSTILE_ATTR
    );
    // The same holds for the fragment the script swaps in.
    let hosts = details();
    let history = HistorySnapshot::default();
    let frag = page::fragment(
        &Fleet {
            doc: &doc,
            hosts: &hosts,
            pools: &[],
            history: &history,
        },
        &Filters::default(),
    );
    let f = Html::parse_fragment(&frag.html);
    assert!(all(&f, "script").is_empty() && all(&f, "img").is_empty());
    assert!(!frag.html.contains(HOSTILE));
}

#[test]
fn filters_by_entry_host_state_and_pool_keep_only_matching_rows() {
    let doc = document();
    let f = |q: &str| render(&doc, &Filters::from_query(Some(q)));

    let h = f("entry=lab");
    assert_eq!(attrs(&h, "tr[data-host]", "data-host"), ["h1", "h2"]);
    assert_eq!(
        attrs(&h, "tr[data-proxy]", "data-proxy"),
        ["default/alpha", "default/bravo", "default/charlie"],
        "an unplaced proxy has no entry"
    );
    assert_eq!(
        attrs(&h, "select[name=entry] option[selected]", "value"),
        ["lab"]
    );

    let h = f("host=h1");
    assert_eq!(attrs(&h, "tr[data-host]", "data-host"), ["h1"]);
    assert_eq!(
        attrs(&h, "tr[data-proxy]", "data-proxy"),
        ["default/alpha", "default/bravo"]
    );

    let h = f("state=Failed");
    assert_eq!(
        attrs(&h, "tr[data-proxy]", "data-proxy"),
        ["default/charlie"]
    );
    assert_eq!(
        all(&h, "tr[data-host]").len(),
        3,
        "a phase does not filter hosts"
    );
    assert_eq!(
        attrs(&h, "select[name=state] option[selected]", "value"),
        ["Failed"]
    );

    let h = f("state=Healthy");
    assert_eq!(attrs(&h, "tr[data-proxy]", "data-proxy"), ["default/alpha"]);

    let h = f("state=Unreachable");
    assert_eq!(attrs(&h, "tr[data-host]", "data-host"), ["h2"]);
    assert_eq!(
        all(&h, "tr[data-proxy]").len(),
        4,
        "a host state does not filter proxies"
    );

    let h = f("pool=web");
    assert!(
        all(&h, "tr[data-proxy]").is_empty(),
        "no proxy is in a pool yet"
    );
    assert!(
        text(&all(&h, "#proxies tbody")[0]).contains("No proxy matches"),
        "an empty result says so"
    );

    // Without filters every select offers "all" selected, and there is no pool select.
    let h = f("");
    assert_eq!(
        attrs(&h, "form#filters[method=get] select", "name"),
        ["entry", "host", "state"]
    );
    assert_eq!(all(&h, "option[selected]").len(), 3);
}

#[test]
fn filter_values_are_bounded_and_round_trip_through_the_query() {
    let long = "x".repeat(10_000);
    let f = Filters::from_query(Some(&format!("entry={long}&host=h%201&state=&bogus=1")));
    assert_eq!(
        f.entry.as_deref().map(|e| e.chars().count()),
        Some(MAX_FILTER_CHARS)
    );
    assert_eq!(f.host.as_deref(), Some("h 1"));
    assert_eq!(f.state, None, "an empty value is no filter");
    assert_eq!(Filters::from_query(Some(&f.to_query())), f);
}

#[test]
fn the_pools_section_appears_only_when_the_fleet_has_pools() {
    let doc = document();
    let hosts = details();
    let history = HistorySnapshot::default();
    let pools = [PoolSummary {
        namespace: "default".into(),
        name: HOSTILE.into(),
        ready: 2,
        desired: 3,
    }];
    let html = page::render_page(
        &Fleet {
            doc: &doc,
            hosts: &hosts,
            pools: &pools,
            history: &history,
        },
        &Filters::default(),
    );
    let h = Html::parse_document(&html);
    let rows = all(&h, "#pools tbody tr");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0]
            .select(&sel("td"))
            .take(2)
            .map(|td| td.text().collect::<String>())
            .collect::<Vec<_>>()
            .concat(),
        format!("default/{HOSTILE}2 / 3")
    );
    // No history yet: the sparkline is the state now, 2 of 3 available.
    let title = rows[0]
        .select(&sel("svg.spark title"))
        .next()
        .unwrap()
        .text()
        .collect::<String>();
    assert_eq!(
        title,
        "available members now 2/3; all available in 0 of 1 samples"
    );
    assert_eq!(all(&h, "select[name=pool] option").len(), 2);
    assert_eq!(all(&h, "script").len(), 1);
}

#[test]
fn a_pools_sparkline_draws_its_recorded_hour_plus_the_current_state() {
    use crate::status::PoolStatusRow;
    let history = History::new();
    for (i, available) in [1u32, 3, 3].into_iter().enumerate() {
        let mut d = document();
        d.pools = vec![PoolStatusRow {
            namespace: "team".into(),
            name: "web".into(),
            desired: 3,
            status: egress_core::pool::ProxyPoolStatus {
                available_replicas: available,
                ..Default::default()
            },
            members: vec![],
            error: None,
        }];
        history.record(
            &d,
            SystemTime::UNIX_EPOCH + Duration::from_secs(60 * i as u64),
        );
    }
    let snapshot = history.snapshot();
    let doc = document();
    let hosts = details();
    let pools = [PoolSummary {
        namespace: "team".into(),
        name: "web".into(),
        ready: 2,
        desired: 3,
    }];
    let h = Html::parse_document(&page::render_page(
        &Fleet {
            doc: &doc,
            hosts: &hosts,
            pools: &pools,
            history: &snapshot,
        },
        &Filters::default(),
    ));
    let svg = &all(&h, "tr[data-pool='team/web'] svg.spark")[0];
    let cells: Vec<&str> = svg
        .select(&sel("rect"))
        .filter_map(|r| r.value().attr("class"))
        .collect();
    assert_eq!(
        cells,
        ["down", "up", "up", "down"],
        "three samples, then now"
    );
    let title = svg
        .select(&sel("title"))
        .next()
        .unwrap()
        .text()
        .collect::<String>();
    assert_eq!(
        title,
        "available members now 2/3; all available in 2 of 4 samples"
    );
}

#[test]
fn sparklines_draw_the_recorded_hour_plus_the_current_state() {
    let doc = document();
    let history = History::new();
    for i in 0..5u64 {
        let mut d = doc.clone();
        // h1 was down in the first two samples.
        d.hosts[0].state = if i < 2 { "Unreachable" } else { "Ready" }.into();
        // The third host is new: no samples yet.
        d.hosts.truncate(2);
        history.record(&d, SystemTime::UNIX_EPOCH + Duration::from_secs(60 * i));
    }
    let hosts = details();
    let snapshot = history.snapshot();
    let h = Html::parse_document(&page::render_page(
        &Fleet {
            doc: &doc,
            hosts: &hosts,
            pools: &[],
            history: &snapshot,
        },
        &Filters::default(),
    ));
    let svg = &all(&h, "tr[data-host='h1'] svg.spark")[0];
    let cells: Vec<&str> = svg
        .select(&sel("rect"))
        .filter_map(|r| r.value().attr("class"))
        .collect();
    assert_eq!(cells, ["down", "down", "up", "up", "up", "up"]);
    let points = svg
        .select(&sel("polyline"))
        .next()
        .unwrap()
        .value()
        .attr("points")
        .unwrap();
    assert_eq!(points.split(' ').count(), 6, "5 samples and now: {points}");
    // A host with no history yet still gets its current point.
    let other = &all(&h, "tr[data-host] svg.spark")[2];
    assert_eq!(other.select(&sel("circle")).count(), 1);
}

#[test]
fn the_csp_admits_exactly_the_page_style_and_script_and_nothing_inline_else() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let h = render(&document(), &Filters::default());
    let csp = page::content_security_policy();
    for (tag, directive) in [("style", "style-src"), ("script", "script-src")] {
        let body = text(&all(&h, tag)[0]);
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(body));
        let d = csp
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with(directive))
            .unwrap();
        assert_eq!(d, format!("{directive} 'sha256-{hash}'"), "{csp}");
    }
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    for e in all(&h, "*") {
        for (name, _) in e.value().attrs() {
            assert!(
                name != "style" && !name.starts_with("on"),
                "inline {name} on <{}>",
                e.value().name()
            );
        }
        for a in ["src", "href", "action"] {
            if let Some(v) = e.value().attr(a) {
                assert!(
                    v.starts_with('/') || v == "data:,",
                    "{a}={v}: only this origin"
                );
            }
        }
    }
}

#[test]
fn the_page_is_a_pure_function_of_the_document() {
    let doc = document();
    let a = render(&doc, &Filters::default()).html();
    let b = render(&doc, &Filters::default()).html();
    assert_eq!(a, b);
    let mut changed = doc.clone();
    changed.proxies[1].phase = Phase::Running;
    let c = render(&changed, &Filters::default());
    assert_eq!(
        attrs(&c, "tr[data-proxy='default/bravo']", "data-phase"),
        ["Running"]
    );
}

struct Fixed(StatusDocument);
impl Endpoints for Fixed {
    fn status(&self) -> StatusDocument {
        self.0.clone()
    }
    fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
        String::new()
    }
    fn ready(&self) -> bool {
        true
    }
}

fn body(r: hyper::Response<crate::stream::Body>) -> String {
    use http_body_util::BodyExt as _;
    let b = futures_util::FutureExt::now_or_never(r.into_body().collect())
        .unwrap()
        .unwrap()
        .to_bytes();
    String::from_utf8(b.to_vec()).unwrap()
}

#[test]
fn the_routes_serve_the_page_its_fragment_and_each_proxy_as_json() {
    let ep = Fixed(document());
    let r = handle(&ep, &Method::GET, "/");
    assert_eq!(r.status(), StatusCode::OK);
    let hd = r.headers();
    assert_eq!(hd["content-type"], "text/html; charset=utf-8");
    assert_eq!(
        hd["content-security-policy"],
        page::content_security_policy()
    );
    assert_eq!(hd["x-content-type-options"], "nosniff");
    assert!(body(r).contains("data-proxy=\"default/alpha\""));

    let r = handle_request(
        &ep,
        None,
        Routes::All,
        &Method::GET,
        "/fleet.json",
        Some("host=h2"),
    );
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body(r)).unwrap();
    assert_eq!(v["generatedAt"], "2026-01-01T02:03:04Z");
    assert_eq!(v["summary"], "3 hosts (1 Ready) · 4 proxies (1 ready)");
    let f = Html::parse_fragment(v["html"].as_str().unwrap());
    assert_eq!(
        attrs(&f, "tr[data-proxy]", "data-proxy"),
        ["default/charlie"]
    );

    let r = handle(&ep, &Method::GET, "/proxies/default/charlie");
    assert_eq!(r.status(), StatusCode::OK);
    let row: ProxyStatusRow = serde_json::from_str(&body(r)).unwrap();
    assert_eq!(row, document().proxies[2]);
    for missing in [
        "/proxies/default/nope",
        "/proxies/default/",
        "/proxies/a/b/c",
    ] {
        assert_eq!(
            handle(&ep, &Method::GET, missing).status(),
            StatusCode::NOT_FOUND,
            "{missing}"
        );
    }
    assert_eq!(
        handle(&ep, &Method::GET, "/proxies").status(),
        StatusCode::OK,
        "the list is still served"
    );
    assert_eq!(
        handle_request(&ep, None, Routes::Probes, &Method::GET, "/", None).status(),
        StatusCode::NOT_FOUND,
        "a probes-only listener shows no page"
    );
    for path in ["/", "/fleet.json", "/proxies/default/alpha"] {
        assert_eq!(
            handle_request(&ep, None, Routes::Status, &Method::GET, path, None).status(),
            StatusCode::OK,
            "Kubernetes mode's status listener serves {path}"
        );
    }
    assert_eq!(
        handle(&ep, &Method::POST, "/").status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[test]
fn a_proxy_link_finds_its_row_whatever_its_name_holds() {
    let mut doc = document();
    doc.proxies[0].namespace = "ns x".into();
    doc.proxies[0].name = "a/b?c".into();
    let path = page::proxy_path("ns x", "a/b?c");
    assert_eq!(path, "/proxies/ns%20x/a%2Fb%3Fc");
    let r = handle(&Fixed(doc), &Method::GET, &path);
    assert_eq!(r.status(), StatusCode::OK);
}

#[test]
fn ages_are_compact_and_measured_against_the_document() {
    let t0 = "2026-01-01T00:00:00Z";
    assert_eq!(
        page::age(t0, "2026-01-01T00:00:45Z").as_deref(),
        Some("45s")
    );
    assert_eq!(
        page::age(t0, "2026-01-01T00:12:00Z").as_deref(),
        Some("12m")
    );
    assert_eq!(
        page::age(t0, "2026-01-03T04:00:00Z").as_deref(),
        Some("2d4h")
    );
    assert_eq!(page::age(t0, "garbage"), None);
    assert_eq!(
        page::age("2026-01-02T00:00:00Z", t0),
        None,
        "a future creation"
    );
}

#[tokio::test]
async fn the_history_sampler_stops_when_the_server_is_dropped() {
    use std::sync::Arc;
    let ep = Arc::new(Fixed(document()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let never = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(super::serve(
        l,
        Arc::clone(&ep) as Arc<dyn Endpoints>,
        never,
    ));
    // The server and its sampler each hold the endpoints.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&ep) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sampler never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.abort();
    let _ = server.await;
    while Arc::strong_count(&ep) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sampler outlived its server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
