//! `GET /status` and `GET /proxies` as a body produced a chunk of rows at a time
//! ([`StatusBody`]): the JSON is the one `serde_json::to_vec` writes for the
//! [`StatusDocument`] (or its `proxies` list), byte for byte, but it is never held whole.
//!
//! Two sources of rows:
//! - live ([`StatusBody::live`], what the server uses): the driver hands over the document
//!   without its rows and the UIDs of the rows in the document's order
//!   ([`Endpoints::status_outline`]); each chunk of [`CHUNK_ROWS`] rows is built
//!   ([`Endpoints::status_rows`]) and serialized when the body is polled, so a request holds
//!   the UIDs plus one chunk, not the fleet. A row whose Proxy is gone by the time its chunk
//!   is built is left out; one added meanwhile is not listed (it was not in the snapshot).
//! - a whole document ([`StatusBody::from_document`], and the live source's fallback for a
//!   driver without an outline, the Kubernetes one): the rows exist already; only their
//!   serialization is chunked (no second, serialized copy of the fleet).
//!
//! Guarantees: every frame holds at most [`CHUNK_ROWS`] rows (or the chunk size a test set);
//! filters ([`Filters`]) apply to the rows as they are built and to the host and pool rows as
//! [`StatusDocument::filtered`] does; polling never waits (each poll builds one chunk under
//! the driver's short locks and returns it), and holds no lock after it returns. A row that
//! cannot be encoded ends the body with an error (the connection is cut rather than a
//! truncated document sent as if whole).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use egress_provider::model::ProxyUid;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Bytes, Frame};

use crate::endpoints::Endpoints;
use crate::filters::Filters;
use crate::status::{ProxyStatusRow, StatusDocument};

/// Rows built and serialized per frame.
// NB: a row is ~0.5–1 KiB of JSON: 256 rows keep a frame at a few hundred KiB (a fraction of
// the 10,000-row document's ~8 MB) while a 10,000-row answer is 40 frames, not thousands.
pub const CHUNK_ROWS: usize = 256;

/// The body of every answer of the HTTP endpoint: whole ([`full`]) or streamed
/// ([`StatusBody`]). Its only error is a row that cannot be encoded.
pub type Body = BoxBody<Bytes, serde_json::Error>;

/// `bytes` as a [`Body`] sent in one frame.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Which JSON a [`StatusBody`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The whole [`StatusDocument`] (`/status`).
    Status,
    /// Its `proxies` list only (`/proxies`).
    Proxies,
}

enum Rows {
    Live {
        ep: Arc<dyn Endpoints>,
        uids: Vec<ProxyUid>,
        next: usize,
    },
    Owned(std::vec::IntoIter<ProxyStatusRow>),
}

/// A `/status` or `/proxies` body that builds and serializes [`CHUNK_ROWS`] rows per frame.
pub struct StatusBody {
    /// Everything before the first row (`{"generatedAt":…,"proxies":[` or `[`).
    head: Option<Bytes>,
    rows: Rows,
    filters: Filters,
    /// Whether a row was written (the next one is preceded by a comma).
    wrote_row: bool,
    /// Everything after the last row (`],"hosts":…}` or `]`).
    tail: Option<Bytes>,
    chunk_rows: usize,
}

impl std::fmt::Debug for StatusBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBody")
            .field("filters", &self.filters)
            .field("chunk_rows", &self.chunk_rows)
            .finish_non_exhaustive()
    }
}

impl StatusBody {
    /// The `view` of `ep`'s status restricted to `filters`, its rows built a chunk at a time
    /// from the driver's state ([`Endpoints::status_outline`]), or serialized a chunk at a
    /// time from the whole document when the driver has no outline. O(rows) for the UIDs,
    /// then O(chunk) per frame.
    pub fn live(
        ep: Arc<dyn Endpoints>,
        view: View,
        filters: &Filters,
    ) -> Result<Self, serde_json::Error> {
        match ep.status_outline() {
            Some((outline, uids)) => {
                Self::new(outline, Rows::Live { ep, uids, next: 0 }, view, filters)
            }
            None => Self::from_document(ep.status(), view, filters),
        }
    }

    /// The `view` of `doc` restricted to `filters`, serialized a chunk of rows at a time.
    pub fn from_document(
        mut doc: StatusDocument,
        view: View,
        filters: &Filters,
    ) -> Result<Self, serde_json::Error> {
        let rows = std::mem::take(&mut doc.proxies);
        Self::new(doc, Rows::Owned(rows.into_iter()), view, filters)
    }

    /// Sets the rows per frame (at least 1; [`CHUNK_ROWS`] by default).
    pub fn with_chunk_rows(mut self, rows: usize) -> Self {
        self.chunk_rows = rows.max(1);
        self
    }

    fn new(
        mut outline: StatusDocument,
        rows: Rows,
        view: View,
        filters: &Filters,
    ) -> Result<Self, serde_json::Error> {
        outline.proxies.clear();
        let (head, tail) = match view {
            View::Proxies => (Bytes::from_static(b"["), Bytes::from_static(b"]")),
            View::Status => {
                if !filters.is_empty() {
                    outline = outline.filtered(filters);
                }
                split_around_rows(serde_json::to_vec(&outline)?)?
            }
        };
        Ok(Self {
            head: Some(head),
            rows,
            filters: filters.clone(),
            wrote_row: false,
            tail: Some(tail),
            chunk_rows: CHUNK_ROWS,
        })
    }

    /// The next chunk's rows (before filtering); `None` once every row was taken.
    fn next_rows(&mut self) -> Option<Vec<ProxyStatusRow>> {
        match &mut self.rows {
            Rows::Live { ep, uids, next } => {
                if *next >= uids.len() {
                    return None;
                }
                let end = next.saturating_add(self.chunk_rows).min(uids.len());
                let chunk = uids.get(*next..end).unwrap_or_default();
                *next = end;
                Some(ep.status_rows(chunk))
            }
            Rows::Owned(it) => {
                let chunk: Vec<ProxyStatusRow> = it.by_ref().take(self.chunk_rows).collect();
                (!chunk.is_empty()).then_some(chunk)
            }
        }
    }

    /// The next chunk serialized (empty when the filters kept none of its rows); `None` once
    /// every row was written.
    fn next_chunk(&mut self) -> Option<Result<Vec<u8>, serde_json::Error>> {
        let rows = self.next_rows()?;
        let mut buf = Vec::new();
        for row in rows.iter().filter(|r| self.filters.keeps_proxy(r)) {
            if self.wrote_row {
                buf.push(b',');
            }
            if let Err(e) = serde_json::to_writer(&mut buf, row) {
                return Some(Err(e));
            }
            self.wrote_row = true;
        }
        Some(Ok(buf))
    }
}

/// Splits the serialized document without rows (`…"proxies":[]…`) into what comes before
/// the rows (up to `[`) and after them (from `]`).
fn split_around_rows(json: Vec<u8>) -> Result<(Bytes, Bytes), serde_json::Error> {
    // NB: `"proxies":[]` cannot occur earlier: the only member before it is `generatedAt`,
    // a JSON string, in which every `"` is escaped.
    const MARK: &[u8] = b"\"proxies\":[]";
    let at = json
        .windows(MARK.len())
        .position(|w| w == MARK)
        .ok_or_else(|| {
            <serde_json::Error as serde::ser::Error>::custom("no proxies member in the outline")
        })?;
    let json = Bytes::from(json);
    let cut = at + MARK.len() - 1;
    Ok((json.slice(..cut), json.slice(cut..)))
}

impl hyper::body::Body for StatusBody {
    type Data = Bytes;
    type Error = serde_json::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(head) = this.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        // NB: a chunk the filters emptied is skipped here rather than sent as an empty frame;
        // the loop ends after at most (rows / chunk) chunks.
        while let Some(chunk) = this.next_chunk() {
            match chunk {
                Ok(buf) if buf.is_empty() => {}
                Ok(buf) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf))))),
                Err(e) => {
                    this.tail = None;
                    this.rows = Rows::Owned(Vec::new().into_iter());
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        Poll::Ready(this.tail.take().map(|t| Ok(Frame::data(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.tail.is_none()
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
