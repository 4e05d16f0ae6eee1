//! The HTTP side of an import: one client per policy, `HEAD` for a length, `GET` streamed
//! through a reader that hashes, counts, sniffs the format and enforces the size cap
//! (findings M9, M11, M12, L7, L24).
//!
//! Guarantees: no system proxy; every request has connect, read (stall) and total bounds;
//! redirects are bounded and each hop is checked (scheme, credentials, allowlist and address
//! policy for URL images); a `HEAD` without a usable length falls back to `GET`'s length and
//! is never an error by itself (M9); the body reader fails the moment more bytes arrive than
//! `maxImageBytes` or than the `GET` declared, or when the body ends short; the image is never
//! buffered beyond one chunk plus two hash batches ([`HASH_BATCH`], shared, not copied): the
//! sha256 runs on the blocking pool, overlapping the upload; messages carry redacted URLs only.
//!
//! TLS: https is verified against the system's roots, plus, for a catalogue entry with
//! `caFile`, the certificates of that PEM file ([`CaRoots`]: read once per provider, on the
//! first download that needs them, bounded by [`MAX_CA_FILE_BYTES`]; a missing, oversized or
//! certificate-less file is a Permanent error naming `images.<key>.caFile` and the path). A
//! certificate the client does not trust fails the download as **Transient**, with a message
//! naming the (redacted) URL, the TLS problem and `caFile`: a certificate's validity changes
//! on the server (expiry, renewal, a rotated mirror) without any change to our
//! configuration, so a latch would keep every Proxy failed after the mirror is fixed; the
//! condition shows it meanwhile. Nothing is uploaded or published: the `GET` fails before a
//! temporary volume exists.
//!
//! One piece: the client policy (TLS roots, redirect and address rules) and the streaming body
//! reader enforce one set of limits on the same request, and share its error classification.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use reqwest::redirect::{Attempt, Policy};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, ReadBuf};

use super::format::{self, SNIFF_LEN};
use super::source::Source;
use super::ssrf::{self, GuardedResolver, Refused};
use crate::error::{ProviderError, Result, redact};
use crate::libvirt::config::ImageFormat;
use crate::model::Progress;

/// Time to establish a TCP (and TLS) connection to an image server.
// NB: an image server answers a SYN in well under a second; 15 s tolerates a slow mirror
// without pinning an import on a black hole.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest gap between two body reads before the transfer counts as stalled.
// NB: a healthy mirror never pauses this long mid-body; a stalled one ends the import as a
// Transient failure long before the whole-import budget.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for a `HEAD` request (headers only).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Most redirects followed for one request.
// NB: mirrors redirect once or twice (CDN, then region); 5 bounds a loop.
pub const MAX_REDIRECTS: usize = 5;

/// Fetcher settings that are not in the provider config.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// TCP/TLS connect bound.
    pub connect_timeout: Duration,
    /// Body stall bound (also bounds waiting for response headers).
    pub stall_timeout: Duration,
    /// `HEAD` bound.
    pub head_timeout: Duration,
    /// Redirect hop limit.
    pub max_redirects: usize,
    /// Admit loopback addresses for URL images. Tests only: not reachable from configuration.
    pub allow_loopback_for_tests: bool,
    /// Skip the qcow2 header's self-containment check while streaming, so that tests can
    /// prove the check after the upload holds on its own. Tests only: not reachable from
    /// configuration.
    pub skip_header_check_for_tests: bool,
    /// Extra CA certificates read from catalogue `caFile`s, shared by every clone of these
    /// options (the provider's), so each file is read once per provider.
    pub ca_roots: CaRoots,
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            connect_timeout: CONNECT_TIMEOUT,
            stall_timeout: STALL_TIMEOUT,
            head_timeout: HEAD_TIMEOUT,
            max_redirects: MAX_REDIRECTS,
            allow_loopback_for_tests: false,
            skip_header_check_for_tests: false,
            ca_roots: CaRoots::default(),
        }
    }
}

/// Largest `caFile` read.
// NB: a private CA is one or two certificates (~2 KiB each); even the whole Mozilla bundle
// is ~220 KiB. 1 MiB refuses a wrong path (an image, a log) without reading it all.
pub const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// The extra CA certificates of catalogue `caFile`s, read once per path and shared by every
/// clone (cheap: one `Arc`). Reads happen under a short std mutex with no `.await`, so two
/// concurrent first downloads read a file once; a failed read is not remembered (the next
/// download tries again and reports the same error until the file is fixed).
#[derive(Clone, Default)]
pub struct CaRoots {
    inner: Arc<CaRootsInner>,
}

#[derive(Default)]
struct CaRootsInner {
    loaded: Mutex<HashMap<PathBuf, Arc<Vec<reqwest::Certificate>>>>,
    reads: AtomicU64,
}

impl std::fmt::Debug for CaRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaRoots")
            .field("reads", &self.reads())
            .finish_non_exhaustive()
    }
}

impl CaRoots {
    /// How many times a CA file was read from disk (for tests and diagnostics).
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }

    /// The certificates of `path` (read on first use, then shared). Errors are Permanent and
    /// name `setting` and the path: an absolute path is required, the file must be readable,
    /// at most [`MAX_CA_FILE_BYTES`], and hold at least one PEM `CERTIFICATE`.
    pub fn get(&self, path: &Path, setting: &str) -> Result<Arc<Vec<reqwest::Certificate>>> {
        let mut loaded = crate::sync::lock(&self.inner.loaded);
        if let Some(c) = loaded.get(path) {
            return Ok(c.clone());
        }
        // NB: synchronous read on purpose: once per provider and path, a few KiB of a local
        // file, under a mutex that guards no network call.
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        let certs = Arc::new(read_ca_file(path, setting)?);
        loaded.insert(path.to_owned(), certs.clone());
        Ok(certs)
    }
}

fn read_ca_file(path: &Path, setting: &str) -> Result<Vec<reqwest::Certificate>> {
    let shown = path.display();
    let bad = |why: String| ProviderError::permanent(format!("{setting} = {shown}: {why}"));
    if !path.is_absolute() {
        return Err(bad("must be an absolute path".into()));
    }
    let file = std::fs::File::open(path)
        .map_err(|e| bad(format!("cannot be read ({e}); fix the path or the file")))?;
    let mut pem = Vec::new();
    file.take(MAX_CA_FILE_BYTES.saturating_add(1))
        .read_to_end(&mut pem)
        .map_err(|e| bad(format!("cannot be read ({e}); fix the path or the file")))?;
    if pem.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(bad(format!(
            "is larger than {MAX_CA_FILE_BYTES} bytes; it must be a PEM file of CA certificates"
        )));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| bad(format!("is not a PEM certificate bundle ({e})")))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----); it must hold the CA \
             that signed the mirror's certificate"
                .into(),
        ));
    }
    Ok(certs)
}

/// An HTTP client set up for one source's policy.
pub struct Fetcher {
    http: reqwest::Client,
    source: Source,
    opts: FetchOptions,
}

impl Fetcher {
    /// A client for `source`: URL images get the guarded resolver and a redirect policy that
    /// re-checks scheme, credentials, `hosts` (the allowlist) and literal addresses on every
    /// hop; catalogue entries (set by the operator, trusted) get the hop bound and the scheme
    /// and credential checks.
    pub fn new(source: &Source, opts: &FetchOptions, hosts: &[String]) -> Result<Self> {
        let guard = source
            .untrusted
            .then(|| GuardedResolver::new(opts.allow_loopback_for_tests));
        let policy = RedirectRules {
            max: opts.max_redirects,
            pinned: source.pinned.is_some(),
            allowed_hosts: source.untrusted.then(|| {
                hosts
                    .iter()
                    .map(|h| h.trim().to_ascii_lowercase())
                    .collect()
            }),
            guard: guard.clone(),
        };
        // An IP-literal host never reaches the resolver: check it here, before any traffic.
        if let Some(g) = &guard {
            let host = source.url.host_str().unwrap_or_default();
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
                g.admits(ip).map_err(|e| {
                    ProviderError::permanent(format!(
                        "image {} refused by the URL image policy: {}",
                        source.display, e.0
                    ))
                })?;
            }
        }
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(opts.connect_timeout)
            .read_timeout(opts.stall_timeout)
            .redirect(Policy::custom(move |a| policy.check(a)));
        if let Some(g) = guard {
            b = b.dns_resolver(g);
        }
        let extra = match &source.ca_file {
            Some(path) => Some((path, opts.ca_roots.get(path, &source.ca_setting())?)),
            None => None,
        };
        if let Some((_, certs)) = &extra {
            // NB: merged with the system's roots (reqwest's rustls platform verifier), not
            // replacing them: a mirror that redirects to a public CDN keeps working.
            b = b.tls_certs_merge(certs.iter().cloned());
        }
        let http = b.build().map_err(|e| match &extra {
            // The only input the build can reject is our certificates.
            Some((path, _)) => ProviderError::permanent(format!(
                "{} = {}: its certificates cannot be used: {}",
                source.ca_setting(),
                path.display(),
                chain(&e)
            )),
            None => ProviderError::transient(format!("cannot build the HTTP client: {e}")),
        })?;
        Ok(Self {
            http,
            source: source.clone(),
            opts: opts.clone(),
        })
    }

    /// The length `HEAD` reports, or `None` when it gives no positive length, answers
    /// non-2xx, or fails for a reason other than the address policy (M9: the caller then
    /// uses `GET`'s length).
    pub async fn head_length(&self) -> Result<Option<u64>> {
        let req = self
            .http
            .head(self.source.url.clone())
            .timeout(self.opts.head_timeout);
        match req.send().await {
            Ok(r) if r.status().is_success() => Ok(r.content_length().filter(|n| *n > 0)),
            Ok(_) => Ok(None),
            Err(e) => match refused(&e) {
                Some(why) => Err(self.refusal(&why)),
                None => Ok(None),
            },
        }
    }

    /// Starts the `GET`; returns the response (status checked) and its declared length.
    pub async fn get(&self) -> Result<(reqwest::Response, Option<u64>)> {
        let r = self
            .http
            .get(self.source.url.clone())
            .send()
            .await
            .map_err(|e| self.http_error(&e, "GET"))?;
        let status = r.status();
        if !status.is_success() {
            return Err(self.status_error(status));
        }
        let len = r.content_length().filter(|n| *n > 0);
        Ok((r, len))
    }

    fn refusal(&self, why: &str) -> ProviderError {
        ProviderError::permanent(format!(
            "image {} refused by the URL image policy: {why}",
            self.source.display
        ))
    }

    /// Classifies a transport error: policy refusals are Permanent, the rest Transient.
    pub fn http_error(&self, e: &reqwest::Error, what: &str) -> ProviderError {
        if let Some(why) = refused(e) {
            return self.refusal(&why);
        }
        if let Some(tls) = tls_problem(e) {
            let fix = if self.source.key.is_some() {
                format!(
                    "set {} to the PEM file of the CA that signed it, or fix the server's \
                     certificate",
                    self.source.ca_setting()
                )
            } else {
                "URL images trust the system's roots only: fix the server's certificate, or \
                 use a catalogue entry with caFile"
                    .to_owned()
            };
            return ProviderError::transient(format!(
                "{what} {}: TLS with the server failed ({}): the server's certificate is not \
                 trusted; {fix}",
                self.source.display,
                redact(&tls)
            ));
        }
        let kind = if e.is_timeout() {
            "timed out"
        } else if e.is_connect() {
            "could not connect"
        } else if e.is_redirect() {
            "too many redirects"
        } else {
            "failed"
        };
        // NB: reqwest's Display carries the URL; `redact` strips credentials and queries.
        ProviderError::transient(format!(
            "{what} {} {kind}: {}",
            self.source.display,
            redact(&chain(e))
        ))
    }

    fn status_error(&self, status: StatusCode) -> ProviderError {
        let msg = format!(
            "GET {} answered {status}; fix {} or the server",
            self.source.display,
            self.source.setting()
        );
        let retry = status.is_server_error()
            || matches!(
                status,
                StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
            );
        if retry {
            ProviderError::transient(msg)
        } else {
            ProviderError::permanent(msg)
        }
    }
}

/// The text of an error and its sources.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The TLS failure inside a reqwest error (rustls' own error, found through the `io::Error`s
/// that carry it), if that is what failed.
fn tls_problem(e: &reqwest::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        // NB: observed: reqwest 0.13 carries rustls' error inside an io::Error inside another
        // (Other → InvalidData → rustls), and `io::Error::source` skips the error it wraps,
        // so look inside explicitly, through any depth of io::Errors.
        let mut io = c.downcast_ref::<std::io::Error>();
        while let Some(inner) = io.and_then(|x| x.get_ref()) {
            if let Some(r) = inner.downcast_ref::<rustls::Error>() {
                return Some(r.to_string());
            }
            io = inner.downcast_ref::<std::io::Error>();
        }
        cur = c.source();
    }
    None
}

/// The address-policy refusal inside a reqwest error, if that is what failed.
fn refused(e: &reqwest::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<Refused>() {
            return Some(r.0.clone());
        }
        cur = c.source();
    }
    None
}

/// The checks applied to every redirect hop.
#[derive(Clone)]
struct RedirectRules {
    max: usize,
    pinned: bool,
    allowed_hosts: Option<Vec<String>>,
    guard: Option<Arc<GuardedResolver>>,
}

impl RedirectRules {
    fn check(&self, a: Attempt<'_>) -> reqwest::redirect::Action {
        match self.verdict(a.url(), a.previous().len()) {
            Ok(()) => a.follow(),
            Err(why) => a.error(Refused(why)),
        }
    }

    fn verdict(&self, next: &Url, hops: usize) -> std::result::Result<(), String> {
        let shown = redact(next.as_str());
        if hops > self.max {
            return Err(format!(
                "more than {} redirects (last to {shown})",
                self.max
            ));
        }
        match next.scheme() {
            "https" => {}
            "http" if self.pinned => {}
            "http" => {
                return Err(format!(
                    "redirect to plain http ({shown}) without a pinned digest"
                ));
            }
            other => return Err(format!("redirect to unsupported scheme {other:?}")),
        }
        if !next.username().is_empty() || next.password().is_some() {
            return Err(format!("redirect to a URL with credentials ({shown})"));
        }
        let host = next.host_str().unwrap_or_default().to_ascii_lowercase();
        if let Some(allowed) = &self.allowed_hosts
            && !super::source::host_allowed(allowed, next)
        {
            let at = next.port().map(|p| format!(":{p}")).unwrap_or_default();
            return Err(format!(
                "redirect to {host}{at}, which is not in urlImages.allowedHosts"
            ));
        }
        if let Some(g) = &self.guard {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
                g.admits(ip)
                    .map_err(|e| format!("redirect to {shown}: {}", e.0))?;
            }
        }
        Ok(())
    }
}

/// What the body reader saw, readable after the upload consumed it.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Bytes delivered.
    pub bytes: u64,
    /// The sha256 of those bytes (when the body ended cleanly).
    pub digest: Option<String>,
    /// The format detected from the first bytes.
    pub format: Option<ImageFormat>,
    /// Why the reader failed, when it did (redacted, classified).
    pub error: Option<ProviderError>,
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Bytes handed to the hashing thread at once.
// NB: 1 MiB makes the blocking-pool hop per batch negligible (1024 per GiB), while the two
// batches alive at most (one hashing, one filling) hold ~2 MiB, far below the import's
// 32 MiB peak-RSS goal.
pub const HASH_BATCH: usize = 1 << 20;

/// sha256 off the upload's task: chunks (shared `Bytes`, never copied) are batched and hashed
/// in order on tokio's blocking pool, one batch at a time, so hashing overlaps the upload's
/// framing and encryption instead of adding to them. A dropped reader leaves at most one
/// batch being hashed, which ends on its own.
struct Hashing {
    batch: Vec<Bytes>,
    batch_len: usize,
    idle: Option<Sha256>,
    job: Option<tokio::task::JoinHandle<Sha256>>,
}

impl Hashing {
    fn new() -> Self {
        Self {
            batch: Vec::new(),
            batch_len: 0,
            idle: Some(Sha256::new()),
            job: None,
        }
    }

    fn push(&mut self, chunk: Bytes) {
        self.batch_len = self.batch_len.saturating_add(chunk.len());
        self.batch.push(chunk);
    }

    fn full(&self) -> bool {
        self.batch_len >= HASH_BATCH
    }

    /// Waits for the batch being hashed, if any, and takes the hasher.
    fn poll_hasher(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<std::result::Result<Sha256, ProviderError>> {
        if let Some(job) = self.job.as_mut() {
            let r = std::task::ready!(Pin::new(job).poll(cx));
            self.job = None;
            match r {
                Ok(h) => self.idle = Some(h),
                Err(e) => {
                    return Poll::Ready(Err(ProviderError::transient(format!(
                        "hashing the image stopped: {e}"
                    ))));
                }
            }
        }
        Poll::Ready(
            self.idle
                .take()
                .ok_or_else(|| ProviderError::transient("the image hasher was lost")),
        )
    }

    /// Hands the filled batch to the blocking pool once the previous one is hashed.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), ProviderError>> {
        let mut h = match std::task::ready!(self.poll_hasher(cx)) {
            Ok(h) => h,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let batch = std::mem::take(&mut self.batch);
        self.batch_len = 0;
        self.job = Some(tokio::task::spawn_blocking(move || {
            for c in &batch {
                h.update(c);
            }
            h
        }));
        Poll::Ready(Ok(()))
    }

    /// Hashes the rest (less than a batch, here) and returns the digest in lowercase hex.
    fn poll_digest(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<std::result::Result<String, ProviderError>> {
        let mut h = match std::task::ready!(self.poll_hasher(cx)) {
            Ok(h) => h,
            Err(e) => return Poll::Ready(Err(e)),
        };
        for c in self.batch.drain(..) {
            h.update(&c);
        }
        self.batch_len = 0;
        Poll::Ready(Ok(h
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()))
    }
}

/// The virtual size of an image of format `f` starting with `head`: a qcow2 header's size
/// field (bytes 24..32, big-endian; the header is at least 72 bytes in every version), a raw
/// image's length (`len`, when declared). `None` when it cannot be known yet.
pub fn virtual_size(f: ImageFormat, head: &[u8], len: Option<u64>) -> Option<u64> {
    match f {
        ImageFormat::Qcow2 => head
            .get(24..32)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes),
        ImageFormat::Raw => len,
    }
}

/// The `GET` body as an `AsyncRead`: hashes, counts, sniffs and enforces the limits while
/// the upload reads it. At most one chunk and two hash batches are held.
pub struct Body<'a> {
    stream: ByteStream,
    pending: Bytes,
    hash: Hashing,
    ended: bool,
    head: Vec<u8>,
    declared: Option<ImageFormat>,
    expected: Option<u64>,
    max: u64,
    what: String,
    setting: &'static str,
    progress: &'a dyn Progress,
    tally: Tally,
    done: bool,
    disk_gib: Option<u64>,
    skip_header_check: bool,
    room: Option<(u64, String)>,
}

impl<'a> Body<'a> {
    /// Wraps `resp`. `expected`: `GET`'s declared length; `max`: `maxImageBytes`.
    pub fn new(
        resp: reqwest::Response,
        source: &Source,
        expected: Option<u64>,
        max: u64,
        progress: &'a dyn Progress,
    ) -> Self {
        Self {
            stream: Box::pin(resp.bytes_stream()),
            pending: Bytes::new(),
            hash: Hashing::new(),
            ended: false,
            head: Vec::with_capacity(SNIFF_LEN),
            declared: source.declared,
            expected,
            max,
            what: format!("image {}", source.display),
            setting: "maxImageBytes",
            progress,
            tally: Tally::default(),
            done: false,
            disk_gib: None,
            skip_header_check: false,
            room: None,
        }
    }

    /// Fails the body, Permanent, as soon as its header shows a virtual size larger than a
    /// disk of `disk_gib` GiB (`None`: no limit): see [`virtual_size`].
    pub fn fitting(mut self, disk_gib: Option<u64>) -> Self {
        self.disk_gib = disk_gib;
        self
    }

    /// Skips [`format::self_contained`] (`true`: tests of the later checks only, from
    /// [`FetchOptions::skip_header_check_for_tests`]).
    pub fn skipping_header_check_for_tests(mut self, skip: bool) -> Self {
        self.skip_header_check = skip;
        self
    }

    /// Fails the body, QuotaExceeded, the moment more than `room` bytes have arrived (the
    /// pool's free space less its reserve, read before the upload; `place` names the pool,
    /// its host and the reserve in the message), before those bytes reach the upload.
    pub fn within_pool_room(mut self, room: u64, place: String) -> Self {
        self.room = Some((room, place));
        self
    }

    fn check_fits(&self) -> std::result::Result<(), ProviderError> {
        let (Some(gib), Some(f)) = (self.disk_gib, self.tally.format) else {
            return Ok(());
        };
        let Some(size) = virtual_size(f, &self.head, self.expected) else {
            return Ok(());
        };
        let disk = gib.saturating_mul(1 << 30);
        if size > disk {
            return Err(ProviderError::permanent(format!(
                "resources.diskGiB {gib} ({disk} bytes) is smaller than {}'s virtual size ({size} \
                 bytes, {:.2} GiB, read from its header before the download went further): \
                 raise resources.diskGiB (or the entry's defaults.diskGiB) to at least {}",
                self.what,
                size as f64 / (1u64 << 30) as f64,
                size.div_ceil(1 << 30)
            )));
        }
        Ok(())
    }

    /// What was read so far (complete once the reader returned end of file).
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    fn fail(&mut self, e: ProviderError) -> std::io::Error {
        self.tally.error = Some(e.clone());
        std::io::Error::other(e)
    }

    fn sniff(&mut self) -> std::result::Result<(), ProviderError> {
        if self.tally.format.is_none() {
            let f = format::check_format(&self.head, self.declared, &self.what)?;
            if !self.skip_header_check {
                format::self_contained(&self.head, f, &self.what)?;
            }
            self.tally.format = Some(f);
        }
        Ok(())
    }

    fn accept(&mut self, chunk: &Bytes) -> std::result::Result<(), ProviderError> {
        let n = chunk.len() as u64;
        let total = self.tally.bytes.saturating_add(n);
        if total > self.max {
            return Err(ProviderError::permanent(format!(
                "{} is larger than {} = {} bytes (more than {} bytes arrived); raise {} or \
                 use a smaller image",
                self.what, self.setting, self.max, self.max, self.setting
            )));
        }
        if let Some(exp) = self.expected
            && total > exp
        {
            return Err(ProviderError::transient(format!(
                "{} sent more than the {exp} bytes its Content-Length declared",
                self.what
            )));
        }
        if let Some((room, place)) = &self.room
            && total > *room
        {
            return Err(ProviderError::quota(format!(
                "{} grew past the {room} bytes of room in {place} while streaming (more than \
                 {room} bytes arrived); the upload was stopped and removed: free space in the \
                 pool or lower poolReserveGiB",
                self.what
            )));
        }
        if self.head.len() < SNIFF_LEN {
            let take = (SNIFF_LEN - self.head.len()).min(chunk.len());
            self.head
                .extend_from_slice(chunk.get(..take).unwrap_or_default());
            if self.head.len() >= SNIFF_LEN {
                self.sniff()?;
                self.check_fits()?;
            }
        }
        self.hash.push(chunk.clone());
        self.tally.bytes = total;
        self.progress.update(total, self.expected);
        Ok(())
    }

    fn finish(&mut self) -> std::result::Result<(), ProviderError> {
        if let Some(exp) = self.expected
            && self.tally.bytes < exp
        {
            return Err(ProviderError::transient(format!(
                "{} ended after {} of the {exp} bytes its Content-Length declared",
                self.what, self.tally.bytes
            )));
        }
        if self.tally.bytes == 0 {
            return Err(ProviderError::permanent(format!("{} is empty", self.what)));
        }
        self.sniff()?;
        self.check_fits()
    }
}

impl AsyncRead for Body<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                let chunk = this.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            if this.done {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.tally.error {
                return Poll::Ready(Err(std::io::Error::other(e.clone())));
            }
            if this.hash.full() {
                match this.hash.poll_flush(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(this.fail(e))),
                    Poll::Ready(Ok(())) => {}
                }
            }
            if this.ended {
                match this.hash.poll_digest(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(this.fail(e))),
                    Poll::Ready(Ok(d)) => {
                        this.tally.digest = Some(d);
                        this.done = true;
                    }
                }
                continue;
            }
            match this.stream.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Err(e) = this.accept(&chunk) {
                        return Poll::Ready(Err(this.fail(e)));
                    }
                    this.pending = chunk;
                }
                Poll::Ready(Some(Err(e))) => {
                    let kind = if e.is_timeout() { "stalled" } else { "failed" };
                    let pe = ProviderError::transient(format!(
                        "downloading {} {kind} after {} bytes: {}",
                        this.what,
                        this.tally.bytes,
                        redact(&chain(&e))
                    ));
                    return Poll::Ready(Err(this.fail(pe)));
                }
                Poll::Ready(None) => {
                    if let Err(e) = this.finish() {
                        return Poll::Ready(Err(this.fail(e)));
                    }
                    this.ended = true;
                }
            }
        }
    }
}

/// The checks of a redirect hop, for tests of the policy without traffic.
pub fn redirect_verdict(
    source: &Source,
    allowed_hosts: &[String],
    allow_loopback: bool,
    next: &Url,
    hops: usize,
) -> std::result::Result<(), String> {
    RedirectRules {
        max: MAX_REDIRECTS,
        pinned: source.pinned.is_some(),
        allowed_hosts: source.untrusted.then(|| {
            allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect()
        }),
        guard: source
            .untrusted
            .then(|| GuardedResolver::new(allow_loopback)),
    }
    .verdict(next, hops)
}

/// Whether `ip` would be refused for a URL image (re-exported for callers' checks).
pub fn address_refused(ip: std::net::IpAddr) -> bool {
    ssrf::forbidden(ip).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_virtual_size_is_the_qcow2_headers_size_field_or_a_raw_images_length() {
        // A qcow2 v3 header: magic, version, backing offset and size, cluster bits, then the
        // size at bytes 24..32, big-endian (3 GiB here).
        let mut head = b"QFI\xfb\0\0\0\x03".to_vec();
        head.extend_from_slice(&[0u8; 12]);
        head.extend_from_slice(&16u32.to_be_bytes());
        head.extend_from_slice(&(3u64 << 30).to_be_bytes());
        head.resize(SNIFF_LEN, 0);
        assert_eq!(
            virtual_size(ImageFormat::Qcow2, &head, Some(1)),
            Some(3 << 30)
        );
        assert_eq!(virtual_size(ImageFormat::Qcow2, &head[..20], None), None);
        assert_eq!(virtual_size(ImageFormat::Raw, &head, Some(7)), Some(7));
        assert_eq!(virtual_size(ImageFormat::Raw, &head, None), None);
    }
}
