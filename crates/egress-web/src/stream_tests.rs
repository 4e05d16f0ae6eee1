//! Tests of the streamed `/status` and `/proxies` bodies ([`super::StatusBody`]): the bytes
//! equal `serde_json::to_vec` of the document built whole, for any chunk size and filter; a
//! frame never holds more than one chunk of rows; rows gone between chunks are left out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::Method;

use super::*;
use crate::status::{HostStatusRow, PoolMemberRow, PoolStatusRow};
use crate::{Routes, handle_request, handle_shared};
use egress_core::model::{HealthStatus, Phase};

fn uid(i: usize) -> ProxyUid {
    ProxyUid(uuid::Uuid::from_u128(0x1000 + i as u128))
}

/// `n` rows sorted by namespace/name, of varied shape (optional members absent or present,
/// strings that need escaping), plus hosts, a manifest error and a pool when `pools`.
fn fleet(n: usize, pools: bool) -> StatusDocument {
    let mut proxies: Vec<ProxyStatusRow> = (0..n)
        .map(|i| ProxyStatusRow {
            namespace: if i % 3 == 0 { "ns-b" } else { "ns-a" }.into(),
            // NB: not in UID order, so sorting matters.
            name: format!("p-{:05}", (i * 7919) % 100_000),
            uid: uid(i).canonical(),
            phase: if i % 4 == 0 {
                Phase::Pending
            } else {
                Phase::Running
            },
            host: (i % 5 != 0).then(|| format!("h{}", i % 2 + 1)),
            // NB: unique, so a lost row is a lost `/healthy.txt` line.
            ip: (i % 4 != 0).then(|| format!("10.0.{}.{}", i / 250, i % 250)),
            egress_address: if i % 11 == 0 {
                vec!["198.51.100.1".into()]
            } else {
                Vec::new()
            },
            provider_id: Some(format!("libvirt://local/h1/ep-{i}")),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: (i % 13 == 0).then(|| format!("said \"no\" ✗ \\ {i}")),
            conditions: vec![],
            port: (i % 17 != 0).then_some(3128),
            health: (i % 2 == 0).then(|| HealthStatus {
                healthy: Some(i % 8 == 2),
                ..HealthStatus::default()
            }),
            reputation: None,
        })
        .collect();
    proxies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    StatusDocument {
        generated_at: "2026-12-01T00:00:00Z".into(),
        proxies,
        hosts: ["h1", "h2"]
            .iter()
            .map(|h| HostStatusRow {
                entry: "local".into(),
                host: (*h).into(),
                state: "Ready".into(),
                latency_ms: Some(2),
                error: None,
                maintenance: None,
                addresses: Vec::new(),
                fenced: None,
            })
            .collect(),
        manifest_errors: vec!["bad.yaml: \"x\" is not a field".into()],
        pools: if pools {
            vec![PoolStatusRow {
                namespace: "ns-a".into(),
                name: "pool".into(),
                desired: 2,
                status: egress_core::pool::ProxyPoolStatus::default(),
                members: vec![PoolMemberRow {
                    name: "p-00000".into(),
                    host: Some("h1".into()),
                    phase: Phase::Running,
                    available: true,
                    template_hash: "t".into(),
                    created_at: String::new(),
                    quarantine: None,
                    deleting: false,
                    egress_address: Vec::new(),
                    draining_since: None,
                }],
                error: None,
            }]
        } else {
            Vec::new()
        },
    }
}

/// A driver with an outline: its rows are looked up by UID as each chunk is built.
struct Live {
    doc: Mutex<StatusDocument>,
    /// The rows of `doc` by UID.
    rows: Mutex<HashMap<String, ProxyStatusRow>>,
    /// The most UIDs one `status_rows` call was asked for.
    most_asked: AtomicUsize,
}

impl Live {
    fn new(doc: StatusDocument) -> Arc<Self> {
        let rows = doc
            .proxies
            .iter()
            .map(|p| (p.uid.clone(), p.clone()))
            .collect();
        Arc::new(Self {
            doc: Mutex::new(doc),
            rows: Mutex::new(rows),
            most_asked: AtomicUsize::new(0),
        })
    }

    fn remove(&self, gone: &HashSet<String>) {
        self.doc
            .lock()
            .unwrap()
            .proxies
            .retain(|p| !gone.contains(&p.uid));
        self.rows
            .lock()
            .unwrap()
            .retain(|uid, _| !gone.contains(uid));
    }
}

impl Endpoints for Live {
    fn status(&self) -> StatusDocument {
        self.doc.lock().unwrap().clone()
    }
    fn status_outline(&self) -> Option<(StatusDocument, Vec<ProxyUid>)> {
        let doc = self.doc.lock().unwrap();
        let uids = doc
            .proxies
            .iter()
            .map(|p| ProxyUid::parse_strict(&p.uid).unwrap())
            .collect();
        Some((
            StatusDocument {
                proxies: Vec::new(),
                ..doc.clone()
            },
            uids,
        ))
    }
    fn status_rows(&self, uids: &[ProxyUid]) -> Vec<ProxyStatusRow> {
        self.most_asked.fetch_max(uids.len(), Ordering::SeqCst);
        let rows = self.rows.lock().unwrap();
        uids.iter()
            .filter_map(|u| rows.get(&u.canonical()))
            .cloned()
            .collect()
    }
    fn metrics(&self, _: egress_core::metrics::MetricsFormat) -> String {
        String::new()
    }
    fn ready(&self) -> bool {
        true
    }
}

/// A driver without an outline (like the Kubernetes one): the default trait methods.
struct Whole(StatusDocument);

impl Endpoints for Whole {
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

/// Every frame of `body`, polled to its end (the body never waits).
fn frames<B>(mut body: B) -> Vec<Bytes>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    while let Some(f) =
        futures_util::FutureExt::now_or_never(body.frame()).expect("the body never waits")
    {
        out.push(f.unwrap().into_data().unwrap());
    }
    out
}

/// Rows in a frame (each has one `uid`).
fn rows_in(frame: &Bytes) -> usize {
    frame.windows(6).filter(|w| w == b"\"uid\":").count()
}

fn joined(frames: &[Bytes]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.iter().copied()).collect()
}

/// What the document built whole serializes to, for `view` and `f`.
fn expected(doc: &StatusDocument, view: View, f: &Filters) -> Vec<u8> {
    let doc = if f.is_empty() {
        doc.clone()
    } else {
        doc.filtered(f)
    };
    match view {
        View::Status => serde_json::to_vec(&doc).unwrap(),
        View::Proxies => serde_json::to_vec(&doc.proxies).unwrap(),
    }
}

const QUERIES: [Option<&str>; 5] = [
    None,
    Some("phase=Running"),
    Some("host=h2&health=Healthy"),
    Some("entry=local&state=Pending"),
    Some("phase=Failed"),
];

#[test]
fn the_streamed_json_is_the_whole_documents_json_for_any_chunk_size_and_filter() {
    for pools in [true, false] {
        let doc = fleet(700, pools);
        for chunk in [1, 7, 64, 255, 256, 699, 700, 701, CHUNK_ROWS] {
            for q in QUERIES {
                let f = Filters::from_query(q);
                for view in [View::Status, View::Proxies] {
                    let want = expected(&doc, view, &f);
                    let live = Live::new(doc.clone());
                    let ep: Arc<dyn Endpoints> = live.clone();
                    let body = StatusBody::live(ep, view, &f)
                        .unwrap()
                        .with_chunk_rows(chunk);
                    let got = frames(body);
                    let ctx = format!("pools {pools}, chunk {chunk}, {q:?}, {view:?}");
                    assert_eq!(
                        String::from_utf8(joined(&got)).unwrap(),
                        String::from_utf8(want.clone()).unwrap(),
                        "{ctx}"
                    );
                    assert!(live.most_asked.load(Ordering::SeqCst) <= chunk, "{ctx}");
                    for frame in &got {
                        let rows = rows_in(frame);
                        assert!(rows <= chunk, "{ctx}: a frame of {rows} rows");
                    }
                    if f.is_empty() {
                        // head, one frame per chunk, tail
                        assert_eq!(got.len(), 2 + 700_usize.div_ceil(chunk), "{ctx}");
                    }
                    // The whole-document source writes the same bytes.
                    let whole = StatusBody::from_document(doc.clone(), view, &f)
                        .unwrap()
                        .with_chunk_rows(chunk);
                    let whole = frames(whole);
                    assert_eq!(joined(&whole), want, "{ctx}, whole document");
                    assert!(
                        whole.iter().all(|f| rows_in(f) <= chunk),
                        "{ctx}, whole document"
                    );
                }
            }
        }
    }
}

#[test]
fn an_empty_fleet_streams_empty_lists() {
    let doc = fleet(0, false);
    for view in [View::Status, View::Proxies] {
        let f = Filters::default();
        let body = StatusBody::live(Live::new(doc.clone()), view, &f).unwrap();
        assert_eq!(joined(&frames(body)), expected(&doc, view, &f), "{view:?}");
    }
}

#[test]
fn rows_gone_between_chunks_are_left_out_and_the_json_stays_whole() {
    let doc = fleet(300, true);
    let at = |i: usize| doc.proxies[i].uid.clone();
    for view in [View::Status, View::Proxies] {
        for q in [None, Some("phase=Running")] {
            let f = Filters::from_query(q);
            let live = Live::new(doc.clone());
            let mut body = StatusBody::live(live.clone(), view, &f)
                .unwrap()
                .with_chunk_rows(50);
            // Before any row is written: the whole first chunk goes (the first row written
            // then comes from the second chunk, with no comma before it).
            let first: HashSet<String> = (0..50).map(at).collect();
            live.remove(&first);
            let mut got = Vec::new();
            for _ in 0..2 {
                // head, then the second chunk
                let f = futures_util::FutureExt::now_or_never(body.frame()).unwrap();
                got.push(f.unwrap().unwrap().into_data().unwrap());
            }
            // Between chunks: the next chunk's first row, a whole chunk, the last row.
            let later: HashSet<String> = [100]
                .into_iter()
                .chain(150..200)
                .chain([299])
                .map(at)
                .collect();
            live.remove(&later);
            got.extend(frames(body));
            let mut want_doc = doc.clone();
            want_doc
                .proxies
                .retain(|p| !first.contains(&p.uid) && !later.contains(&p.uid));
            let want = expected(&want_doc, view, &f);
            assert_eq!(
                String::from_utf8(joined(&got)).unwrap(),
                String::from_utf8(want).unwrap(),
                "{view:?} {q:?}"
            );
        }
    }
}

#[test]
fn a_driver_without_an_outline_streams_its_whole_document() {
    let doc = fleet(300, true);
    for q in QUERIES {
        let f = Filters::from_query(q);
        for view in [View::Status, View::Proxies] {
            let ep: Arc<dyn Endpoints> = Arc::new(Whole(doc.clone()));
            let got = frames(StatusBody::live(ep, view, &f).unwrap());
            assert_eq!(joined(&got), expected(&doc, view, &f), "{q:?} {view:?}");
            if f.is_empty() {
                assert_eq!(got.len(), 2 + 300_usize.div_ceil(CHUNK_ROWS), "{q:?}");
            }
        }
    }
}

#[test]
fn the_routes_answer_the_streamed_json_with_its_content_type() {
    let doc = fleet(600, true);
    let live: Arc<dyn Endpoints> = Live::new(doc.clone());
    for (path, view) in [("/status", View::Status), ("/proxies", View::Proxies)] {
        for q in QUERIES {
            let want = expected(&doc, view, &Filters::from_query(q));
            let shared = handle_shared(&live, None, Routes::All, &Method::GET, path, q);
            let plain = handle_request(live.as_ref(), None, Routes::All, &Method::GET, path, q);
            for r in [shared, plain] {
                assert_eq!(r.status(), hyper::StatusCode::OK, "{path} {q:?}");
                assert_eq!(
                    r.headers()[hyper::header::CONTENT_TYPE],
                    "application/json",
                    "{path}"
                );
                assert_eq!(joined(&frames(r.into_body())), want, "{path} {q:?}");
            }
        }
        let probes = handle_shared(&live, None, Routes::Probes, &Method::GET, path, None);
        assert_eq!(probes.status(), hyper::StatusCode::NOT_FOUND, "{path}");
        let post = handle_shared(&live, None, Routes::All, &Method::POST, path, None);
        assert_eq!(
            post.status(),
            hyper::StatusCode::METHOD_NOT_ALLOWED,
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_server_sends_the_streamed_status_over_loopback() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let doc = fleet(700, true);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(crate::serve(l, Live::new(doc.clone()), stop.clone()));
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    // De-chunk: `size-hex\r\ndata\r\n` ... `0\r\n\r\n`.
    let mut rest = &raw[split + 4..];
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
        rest = &rest[eol + 2..];
        if size == 0 {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
    assert_eq!(body, serde_json::to_vec(&doc).unwrap());
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

#[test]
fn healthy_txt_built_a_chunk_at_a_time_is_the_whole_documents_list() {
    let doc = fleet(700, true);
    let want = crate::healthy_list(&doc);
    assert!(want.lines().count() > 50, "{want}");
    let live = Live::new(doc.clone());
    assert_eq!(crate::healthy_list_of(live.as_ref()), want);
    assert!(live.most_asked.load(Ordering::SeqCst) <= CHUNK_ROWS);
    assert_eq!(crate::healthy_list_of(&Whole(doc)), want);
    let r = handle_shared(
        &(live as Arc<dyn Endpoints>),
        None,
        Routes::All,
        &Method::GET,
        "/healthy.txt",
        None,
    );
    assert_eq!(joined(&frames(r.into_body())), want.as_bytes());
}

#[test]
fn the_history_sample_read_a_chunk_at_a_time_is_the_whole_documents() {
    use crate::history::{sample, samples_of};
    let doc = fleet(700, true);
    let at = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(600);
    let want = samples_of(&doc, at);
    // One series per host, counted from the rows, and one for the pool, from its status row.
    assert_eq!(want.len(), 3);
    let (hosts, pools): (Vec<_>, Vec<_>) = want
        .iter()
        .partition(|(k, _)| matches!(k, crate::history::SeriesKey::Host(..)));
    assert!(
        hosts.len() == 2 && hosts.iter().all(|(_, s)| s.total > 200 && s.ready > 50),
        "{want:?}"
    );
    assert_eq!(pools.len(), 1, "{want:?}");
    let live = Live::new(doc.clone());
    assert_eq!(sample(live.as_ref(), at), want);
    assert!(live.most_asked.load(Ordering::SeqCst) <= CHUNK_ROWS);
    assert_eq!(sample(&Whole(doc), at), want);
}
