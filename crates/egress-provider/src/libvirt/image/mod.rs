//! The base-image cache: turns a Proxy's `image` into a verified, published base volume on a
//! host, importing it when needed (findings H4, M9, M10, M11, M12, M13, L7, L8, L24, E7).
//!
//! Pipeline: [`source`] resolves and checks the image offline → the cache is looked up on
//! the pooled control link ([`cache::check_published`]) → on a miss, [`fetch`] sends `HEAD`
//! (early size check; no usable length falls back to `GET`'s), then `GET`, whose length (the
//! size actually streamed, M11) drives the pool-space check, and every stream, with a length
//! or without, is stopped (QuotaExceeded, its part removed) before it crosses the pool's free
//! space less `poolReserveGiB` as read before the upload; the body is streamed through a
//! hashing, size-capping, format-sniffing reader straight into `STORAGE_VOL_UPLOAD` on a
//! dedicated connection opened with [`BulkConnect`], never buffered; the part is verified
//! and published by the protocol in [`cache`]: the final name is an instant qcow2 overlay on
//! the verified part (no copy), then the marker.
//!
//! Guarantees: a base returned is complete and verified (its marker exists and matches); no
//! call deletes a volume it did not create; concurrent imports of one base in this process
//! share one download, and imports in other processes never corrupt or delete each other's
//! base; the whole import is bounded by `timeouts.imageImport`; every error is a classified,
//! redacted [`ProviderError`] naming what to change; after a failed upload its connection is
//! closed before the partial volume is deleted over a fresh one (H2).
//! A new base that would pass `limits.maxBases` (or, from a URL, `limits.maxUrlImages`)
//! first makes room by removing the entry's oldest bases nothing on the host uses ([`evict`]);
//! when none can go it is refused (QuotaExceeded) before any download; an image
//! whose header reaches outside itself (backing file, data file, encryption) is refused while
//! streaming, and a part libvirt reads as backed by a file is refused when it settles.
//!
//! One piece: the import is one ordered protocol (look up, lock, import, publish, settle, clean up
//! a failed upload) over one link and one deadline; its separable parts already live in `source`,
//! `cache` and `fetch`, and cutting the sequence would spread one protocol's invariants over
//! several files.

pub mod cache;
pub mod debris;
pub mod evict;
pub mod fetch;
pub mod format;
pub mod gc;
pub mod source;
pub mod ssrf;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use libvirt_remote::proto::{StoragePool, StorageVol};
use libvirt_remote::upload::UploadOptions;
use libvirt_remote::{Client, Error as LvError};
use tokio::time::Instant;

pub use fetch::FetchOptions;
pub use source::Source;

use crate::error::{ProviderError, Result};
use crate::libvirt::classify::classify;
use crate::libvirt::config::{Firmware, ImageFormat, LibvirtEntry};
use crate::libvirt::names;
use crate::model::Progress;

/// Opens a dedicated libvirt connection to the host, for bulk transfers.
#[async_trait]
pub trait BulkConnect: Send + Sync {
    /// A new connection used by one import only; it is closed when the import ends.
    async fn open(&self) -> Result<Client>;
}

/// What an import needs to know about the place it imports to.
pub struct Target<'a> {
    /// The provider entry (catalogue, URL policy, `maxImageBytes`, `timeouts.imageImport`).
    pub entry: &'a LibvirtEntry,
    /// The host's name in the entry (messages and the in-process lock).
    pub host: &'a str,
    /// The pooled control connection (cache lookups only).
    pub client: &'a Client,
    /// The storage pool for bases.
    pub pool: &'a StoragePool,
    /// Space to keep free in the pool (`poolReserveGiB` in bytes).
    pub reserve_bytes: u64,
    /// Opens dedicated connections for the upload and everything after it.
    pub bulk: &'a dyn BulkConnect,
    /// Receives bytes done/total while downloading.
    pub progress: &'a dyn Progress,
    /// HTTP settings that are not configuration.
    pub fetch: &'a FetchOptions,
}

/// A published, verified base image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The base volume.
    pub vol: StorageVol,
    /// Its name (also `vol.name`).
    pub name: String,
    /// Its path on the host (overlays back onto it).
    pub path: String,
    /// Its virtual size in bytes as libvirt reports it (qcow2: from the header).
    pub capacity: u64,
    /// The image's format (the bytes downloaded; also in the name).
    pub format: ImageFormat,
    /// The base volume's own on-disk format, as libvirt reads it: what an overlay on the base
    /// must name as its backing format. qcow2 for every base this code publishes (an overlay
    /// on its data volume).
    pub disk_format: ImageFormat,
    /// The path of the base's data volume (its backing store, in [`Base::format`]), when it
    /// is an overlay on one: the domain declares it as the last layer of the disk chain.
    pub data_path: Option<String>,
    /// Firmware it boots with.
    pub firmware: Firmware,
    /// The sha256 of the imported bytes.
    pub digest: String,
    /// Whether this call imported it (false: it was already cached).
    pub imported: bool,
}

/// Returns the verified base for `image` on `target`, importing and publishing it if it is
/// not cached. Bounded by `timeouts.imageImport`; dropping the future is safe (an unfinished
/// upload is aborted; its part volume is left for [`sweep_parts`]).
pub async fn ensure_base(target: &Target<'_>, image: &str) -> Result<Base> {
    ensure_base_fitting(target, image, None).await
}

/// [`ensure_base`] for a Proxy whose disk is `disk_gib` GiB: an import of an image whose
/// virtual size is larger (the qcow2 header's size field, in the first bytes; a raw image's
/// length) stops as soon as the header has arrived, Permanent, naming `resources.diskGiB`.
/// A base already published is returned whatever its size (the caller compares it).
pub async fn ensure_base_fitting(
    target: &Target<'_>,
    image: &str,
    disk_gib: Option<u64>,
) -> Result<Base> {
    let src = source::resolve(target.entry, image)?;
    let budget = target.entry.timeouts.image_import;
    let deadline = Instant::now() + budget;
    let work = async {
        // NB: one import per (host, pool, entry, source) in this process: a second caller
        // waits here and then finds the base published, so it never downloads twice. The
        // guard is an async mutex held for the import on purpose; it is bounded by `budget`.
        let key = format!(
            "{}/{}/{}/{}",
            target.host,
            target.pool.name,
            target.entry.name,
            names::source_key(src.name_source())
        );
        let lock = import_lock(&key);
        let _held = lock.lock().await;
        let base = match find(target, &src).await? {
            Some(b) => b,
            None => {
                base_quota(target, &src).await?;
                import(target, &src, disk_gib, deadline).await?
            }
        };
        // A base handed to a create is not evicted while the create builds on it.
        evict::note_use(target.host, &target.pool.name, &base.name);
        Ok(base)
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(r) => r,
        Err(_) => Err(ProviderError::transient(format!(
            "importing image {} to pool {} on host {} did not finish within \
             timeouts.imageImport ({}s); raise it or use a faster mirror",
            src.display,
            target.pool.name,
            target.host,
            budget.as_secs()
        ))),
    }
}

type LockTable = Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>;

fn import_lock(key: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<LockTable> = std::sync::OnceLock::new();
    let table = LOCKS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut t = crate::sync::lock(table);
    t.retain(|_, w| w.strong_count() > 0);
    if let Some(l) = t.get(key).and_then(Weak::upgrade) {
        return l;
    }
    let l = Arc::new(tokio::sync::Mutex::new(()));
    t.insert(key.to_owned(), Arc::downgrade(&l));
    l
}

/// Looks for a published base of `src` (pooled link).
async fn find(target: &Target<'_>, src: &Source) -> Result<Option<Base>> {
    let c = target.client;
    let pool = target.pool;
    let entry = &target.entry.name;
    let source_key = names::source_key(src.name_source());
    let candidates: Vec<(String, String, ImageFormat)> = match (&src.pinned, src.declared) {
        (Some(d), Some(f)) => vec![(names::base(entry, src.name_source(), d, f), d.clone(), f)],
        _ => {
            let vols = c.pool_list_volumes(pool).await.map_err(|e| {
                classify(
                    &e,
                    &format!("listing pool {} on host {}", pool.name, target.host),
                )
            })?;
            let mut out: Vec<(String, String, ImageFormat)> = vols
                .iter()
                .filter_map(|v| v.name.strip_suffix(cache::MARKER_SUFFIX))
                .filter_map(|b| {
                    let (d, f) = cache::parse_base(entry, &source_key, b)?;
                    let digest_ok = src.pinned.as_deref().is_none_or(|p| p == d);
                    let format_ok = src.declared.is_none_or(|x| x == f);
                    (digest_ok && format_ok).then(|| (b.to_owned(), d, f))
                })
                .collect();
            out.sort_by(|a, b| a.0.cmp(&b.0));
            out
        }
    };
    for (name, digest, format) in candidates {
        // NB: two round trips (marker info, base XML), which also give the base's path and
        // on-disk format.
        if let Some(p) = cache::check_published(c, pool, &name, target.host).await? {
            return Ok(Some(Base {
                vol: p.vol,
                name,
                path: p.path,
                capacity: p.capacity,
                format,
                disk_format: p.disk_format,
                data_path: p.data_path,
                firmware: src.firmware,
                digest,
                imported: false,
            }));
        }
    }
    Ok(None)
}

/// Makes room for a new base of `src` when the entry already has `limits.maxBases` published
/// bases (markers) in the pool, or, for a URL image, `limits.maxUrlImages` bases from URL
/// images, by removing the oldest unused ones ([`evict::make_room`]); refuses it,
/// QuotaExceeded, when that is not enough. Nothing is downloaded or created before this
/// check.
// NB: counted from one listing without a lock across processes: two imports started together
// may each see room for one more, so the limit can be passed by the number of concurrent
// imports of the entry (one per image source in this process).
async fn base_quota(target: &Target<'_>, src: &Source) -> Result<()> {
    let pool = target.pool;
    let limits = &target.entry.limits;
    let vols = target.client.pool_list_volumes(pool).await.map_err(|e| {
        classify(
            &e,
            &format!("listing pool {} on host {}", pool.name, target.host),
        )
    })?;
    let prefix = names::base_prefix(&target.entry.name);
    let bases: Vec<&str> = vols
        .iter()
        .filter_map(|v| v.name.strip_suffix(cache::MARKER_SUFFIX))
        .filter_map(|b| b.strip_prefix(prefix.as_str()))
        .collect();
    let url_bases = bases.iter().filter(|b| b.starts_with("url-")).count();
    let max_bases = limits.max_bases as usize;
    let max_url = limits.max_url_images as usize;
    let need_any = (bases.len() + 1).saturating_sub(max_bases);
    let need_url = if src.untrusted {
        (url_bases + 1).saturating_sub(max_url)
    } else {
        0
    };
    if need_any == 0 && need_url == 0 {
        return Ok(());
    }
    // Over a limit: the oldest bases nothing uses make room first (evict.rs).
    let names: Vec<String> = bases.iter().map(|b| format!("{prefix}{b}")).collect();
    let room = evict::make_room(target, &names, need_any, need_url).await?;
    let removed = &room.removed;
    let left = bases.len() - removed.len().min(bases.len());
    let url_removed = removed
        .iter()
        .filter(|n| {
            n.strip_prefix(prefix.as_str())
                .is_some_and(|b| b.starts_with("url-"))
        })
        .count();
    let url_left = url_bases - url_removed.min(url_bases);
    let over = |setting: &str, have: usize, max: u32| {
        ProviderError::quota(format!(
            "entry {} already has {have} published base images in pool {} on host {} \
             (limits.{setting} = {max}); image {} would be another{}: stop using an image so \
             its base can go, reuse an image already cached, or raise limits.{setting}",
            target.entry.name,
            pool.name,
            target.host,
            src.display,
            evict::explain(&room)
        ))
    };
    if left >= max_bases {
        return Err(over("maxBases", left, limits.max_bases));
    }
    if src.untrusted && url_left >= max_url {
        return Err(over("maxUrlImages", url_left, limits.max_url_images));
    }
    Ok(())
}

/// A dedicated connection that is reopened (at most [`MAX_REOPENS`] times) when it dies, for
/// the steps after an upload (M10).
struct Link<'a> {
    bulk: &'a dyn BulkConnect,
    client: Client,
    reopens: u32,
    /// The host's name, for [`debris::note`].
    host: &'a str,
}

/// How often the post-upload steps may reopen their connection.
// NB: one death is an accident (a killed SSH session); two in one import mean the host is
// unwell and the import should fail Transient.
const MAX_REOPENS: u32 = 2;

impl Link<'_> {
    async fn reopen(&mut self) -> Result<()> {
        self.client.close();
        self.client = self.bulk.open().await?;
        self.reopens += 1;
        Ok(())
    }
}

/// Runs `$body` (an expression using `$c: &Client`) on the link; once more on a fresh
/// connection when the link died.
macro_rules! on_link {
    ($link:expr, |$c:ident| $body:expr) => {{
        let first = {
            let $c = &$link.client;
            $body.await
        };
        match first {
            Err(e) if e.is_connection() && $link.reopens < MAX_REOPENS => {
                $link.reopen().await?;
                let $c = &$link.client;
                $body.await
            }
            r => r,
        }
    }};
}

fn lv(host: &str, what: &str) -> impl Fn(LvError) -> ProviderError {
    let ctx = format!("{what} on host {host}");
    move |e| classify(&e, &ctx)
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

async fn import(
    target: &Target<'_>,
    src: &Source,
    disk_gib: Option<u64>,
    deadline: Instant,
) -> Result<Base> {
    let entry = target.entry;
    let max = entry.max_image_bytes;
    let fetcher = fetch::Fetcher::new(src, target.fetch, &entry.url_images.allowed_hosts)?;

    // 1. HEAD: an early refusal of an oversized image; no usable length is not an error (M9).
    let head_len = fetcher.head_length().await?;
    if let Some(n) = head_len {
        too_large(src, n, max)?;
    }

    // 2. GET: its length is what will be streamed, so it drives the space check (M11).
    let (resp, get_len) = fetcher.get().await?;
    if let Some(n) = get_len {
        too_large(src, n, max)?;
    }
    let mut link = Link {
        bulk: target.bulk,
        client: target.bulk.open().await?,
        reopens: 0,
        host: target.host,
    };
    let result = import_on(
        target,
        src,
        &fetcher,
        resp,
        get_len.or(head_len),
        get_len,
        disk_gib,
        &mut link,
        deadline,
    )
    .await;
    link.client.close();
    result
}

fn too_large(src: &Source, n: u64, max: u64) -> Result<()> {
    if n > max {
        return Err(ProviderError::permanent(format!(
            "image {} is {n} bytes, more than maxImageBytes = {max}; raise maxImageBytes or use \
             a smaller image",
            src.display
        )));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn import_on(
    target: &Target<'_>,
    src: &Source,
    _fetcher: &fetch::Fetcher,
    resp: reqwest::Response,
    space_len: Option<u64>,
    get_len: Option<u64>,
    disk_gib: Option<u64>,
    link: &mut Link<'_>,
    deadline: Instant,
) -> Result<Base> {
    let entry = &target.entry.name;
    let host = target.host;
    let pool = target.pool;

    // The pool's room (free space less the reserve) is read before every upload: a declared
    // length is checked against it here, and the stream is held to it as bytes arrive (an
    // image without Content-Length would otherwise write up to maxImageBytes past it).
    let room = {
        match on_link!(link, |c| c.pool_refresh(pool)) {
            Ok(()) => {}
            // NB: libvirtd refuses a refresh while another upload or copy runs in the pool
            // (observed: "pool ... has asynchronous jobs running", code 1); the cached figure
            // is then the best there is, and the upload itself still fails on a full disk.
            Err(e) if pool_busy(&e) => {
                tracing::debug!(pool = %pool.name, "pool busy; space check uses cached figures");
            }
            Err(e) => return Err(lv(host, "refreshing the pool")(e)),
        }
        let info = on_link!(link, |c| c.pool_info(pool)).map_err(lv(host, "reading the pool"))?;
        info.available.saturating_sub(target.reserve_bytes)
    };
    if let Some(need) = space_len {
        let free = room;
        if need > free {
            return Err(ProviderError::quota(format!(
                "pool {} on host {host} has {free} bytes free after the {} byte reserve \
                 (poolReserveGiB); image {} needs {need}; free space or lower poolReserveGiB",
                pool.name, target.reserve_bytes, src.display
            )));
        }
    }

    // 3. The part, and the upload into it.
    let source_key = names::source_key(src.name_source());
    let part_name = cache::part_name(entry, &source_key, src.pinned.as_deref());
    let part = on_link!(link, |c| c.vol_create_xml(
        pool,
        &cache::raw_volume_xml(&part_name, get_len.unwrap_or(0)),
        0
    ))
    .map_err(lv(host, "creating the temporary upload volume"))?;
    let mut body = fetch::Body::new(
        resp,
        src,
        get_len,
        target.entry.max_image_bytes,
        target.progress,
    )
    .fitting(disk_gib)
    .skipping_header_check_for_tests(target.fetch.skip_header_check_for_tests)
    // NB: the room was read once, before this upload; concurrent writers to the pool (other
    // imports, in this process or another, and guests' overlays growing) are not counted, so
    // N imports started together may each use the whole room and together cross the reserve
    // by up to (N-1) times it. One stream never crosses it on its own.
    .within_pool_room(
        room,
        format!(
            "pool {} on host {host} (free space less the {} byte reserve, poolReserveGiB)",
            pool.name, target.reserve_bytes
        ),
    );
    let opts = UploadOptions {
        deadline: Some(remaining(deadline)),
        ..UploadOptions::default()
    };
    let up = link
        .client
        .vol_upload(&part, 0, get_len.unwrap_or(0), &mut body, &opts)
        .await;
    if up.is_ok() {
        // NB: the upload stops reading at the declared length; one more read drives the body
        // to its end, where it is checked (nothing extra, digest finalised).
        let mut probe = [0u8; 1];
        if let Ok(n) = tokio::io::AsyncReadExt::read(&mut body, &mut probe).await
            && n > 0
        {
            discard(link, &part).await;
            return Err(ProviderError::transient(format!(
                "image {} sent more bytes than its Content-Length declared",
                src.display
            )));
        }
    }
    let tally = body.tally().clone();
    drop(body);
    let sent = match up {
        Ok(n) => n,
        Err(e) => {
            let err = tally.error.clone().unwrap_or_else(|| {
                classify(
                    &e,
                    &format!(
                        "uploading image {} to pool {} on host {host}",
                        src.display, pool.name
                    ),
                )
            });
            // finding: H2 — the upload's connection is closed before the partial volume is
            // deleted, over a fresh one.
            discard_after_failed_upload(link, &part).await;
            return Err(err);
        }
    };
    let (Some(digest), Some(format)) = (tally.digest.clone(), tally.format) else {
        discard(link, &part).await;
        return Err(ProviderError::transient(format!(
            "image {} ended without a complete body",
            src.display
        )));
    };
    if sent != tally.bytes {
        discard(link, &part).await;
        return Err(ProviderError::transient(format!(
            "image {}: {sent} bytes reached libvirt but {} were read",
            src.display, tally.bytes
        )));
    }
    if let Some(pin) = &src.pinned
        && *pin != digest
    {
        // finding M13: a mismatch deletes only this call's part, never a base.
        discard(link, &part).await;
        return Err(ProviderError::permanent(format!(
            "image {} has sha256 {digest}, but {pin} is pinned; fix {} or the sha256 \
             (a new digest makes a new base; existing bases are left alone)",
            src.display,
            match &src.key {
                Some(k) => format!("images.{k}.sha256"),
                None => "the #sha256= fragment".into(),
            }
        )));
    }

    // 4. Publish (on this dedicated link, reopened if it died: M10). The part becomes the
    // published base's data volume, or is deleted unless a base may reference it.
    let mut keep_part = false;
    let res = publish(
        target,
        src,
        link,
        &part,
        &digest,
        format,
        tally.bytes,
        deadline,
        &mut keep_part,
    )
    .await;
    if !keep_part {
        discard(link, &part).await;
    }
    res
}

/// After a failed upload: closes the upload's connection first — whatever state its stream
/// was left in (mid-abort, an error the daemon is still cleaning up after, a peer that stopped
/// reading) dies with it, and no later call can queue behind it — then deletes the part over
/// a fresh connection, best effort (a part left is noted as [`debris`], removed once the host
/// answers again).
async fn discard_after_failed_upload(link: &mut Link<'_>, part: &StorageVol) {
    link.client.close();
    match link.bulk.open().await {
        Ok(c) => {
            link.client = c;
            discard(link, part).await;
        }
        Err(e) => {
            tracing::warn!(
                part = %part.name,
                error = %e,
                "could not reconnect to delete the temporary upload volume"
            );
            debris::note(link.host, &part.pool, &part.name);
        }
    }
}

/// Deletes this call's part, best effort (a part left is noted as [`debris`]).
async fn discard(link: &mut Link<'_>, part: &StorageVol) {
    let mut r = link.client.vol_delete(part, 0).await;
    if matches!(&r, Err(e) if e.is_connection()) && link.reopen().await.is_ok() {
        r = link.client.vol_delete(part, 0).await;
    }
    match r {
        Ok(()) => {}
        Err(e) if cache::is_no_vol(&e) => {}
        Err(e) => {
            tracing::warn!(
                part = %part.name,
                error = %e,
                "could not delete the temporary upload volume"
            );
            debris::note(link.host, &part.pool, &part.name);
        }
    }
}

/// Publishes the verified `part` as base `name`: an instant qcow2 overlay backed by the part,
/// then the marker. Sets `keep_part` when a base references (or may reference) the part, so
/// the caller must not delete it.
#[allow(clippy::too_many_arguments)]
async fn publish(
    target: &Target<'_>,
    src: &Source,
    link: &mut Link<'_>,
    part: &StorageVol,
    digest: &str,
    format: ImageFormat,
    size: u64,
    deadline: Instant,
    keep_part: &mut bool,
) -> Result<Base> {
    let host = target.host;
    let pool = target.pool;
    let entry = &target.entry.name;

    let (part_info, part_path) =
        settle_part(target, src, link, part, format, size, deadline).await?;
    let name = names::base(entry, src.name_source(), digest, format);
    let marker = cache::marker_name(&name);
    let done = |p: cache::Published, imported: bool| Base {
        vol: p.vol,
        name: name.clone(),
        path: p.path,
        capacity: p.capacity,
        format,
        disk_format: p.disk_format,
        data_path: p.data_path,
        firmware: src.firmware,
        digest: digest.to_owned(),
        imported,
    };

    // Already published (by another process, or a concurrent entry of ours)?
    if let Some(p) = cache::check_published(&link.client, pool, &name, host).await? {
        return Ok(done(p, false));
    }

    // Creating the final name is the claim. It is instant: a qcow2 header naming the part
    // as its backing store, so no byte of the image is copied.
    let xml = cache::overlay_base_xml(&name, part_info.capacity, &part_path, format);
    // NB: not retried on a fresh link: a retry after a lost reply would find "our" name
    // taken and wait for a marker nobody writes.
    let created = link.client.vol_create_xml(pool, &xml, 0).await;
    let base = match created {
        Ok(v) => v,
        Err(e) if e.is_connection() || e.is_timeout() => {
            // NB: the volume may exist on the host, backed by our part; we cannot prove the
            // name is ours here, so we never write its marker. Debris removes it once the
            // host answers, if it is then backed by our part (ours) and unmarked, then the part.
            *keep_part = true;
            debris::note_base(host, &pool.name, &name, &part.name, &part_path);
            return Err(classify(
                &e,
                &format!(
                    "publishing base {name} on host {host} (it may have been created: if it \
                     is there without {marker}, it and its data volume {} are removed once \
                     the host answers)",
                    part.name
                ),
            ));
        }
        Err(e) => {
            let exists = on_link!(link, |c| cache::lookup(c, pool, &name))
                .map_err(lv(host, "looking up the base"))?;
            if exists.is_none() {
                return Err(classify(
                    &e,
                    &format!("publishing base {name} on host {host}"),
                ));
            }
            // Lost the race: wait for the winner's marker; touch nothing of theirs.
            let p = wait_for_marker(target, link, &name, deadline).await?;
            return Ok(done(p, false));
        }
    };

    // From here the final name is ours and references the part: if publishing fails,
    // remove the base (then the part goes too). Until it is marked or removed, a failure to
    // remove it, or this future dropped, leaves it noted as debris.
    let mut unmarked = debris::UnmarkedBase::new(host, &pool.name, &name, &part.name, &part_path);
    let finish = async {
        let info =
            on_link!(link, |c| c.vol_info(&base)).map_err(lv(host, "reading the new base"))?;
        if info.capacity != part_info.capacity {
            return Err(ProviderError::transient(format!(
                "base {name} on host {host} reads {} bytes virtual, the upload {}",
                info.capacity, part_info.capacity
            )));
        }
        let mxml = cache::raw_volume_xml(&marker, info.capacity);
        let m = match on_link!(link, |c| c.vol_create_xml(pool, &mxml, 0)) {
            Ok(m) => Some(m),
            Err(e) if cache::is_vol_exists(&e) => {
                // A marker left by an earlier base of the same name (deleted by hand): it is
                // valid only if it records the same size.
                let old = on_link!(link, |c| c.vol_lookup_by_name(pool, &marker))
                    .map_err(lv(host, "reading the marker"))?;
                let oi =
                    on_link!(link, |c| c.vol_info(&old)).map_err(lv(host, "reading the marker"))?;
                if oi.capacity != info.capacity {
                    return Err(ProviderError::permanent(format!(
                        "marker {marker} in pool {} on host {host} records {} bytes but the base \
                         has {}; delete {marker} (not created by this import)",
                        pool.name, oi.capacity, info.capacity
                    )));
                }
                None
            }
            Err(e) => {
                return Err(classify(
                    &e,
                    &format!("writing marker {marker} on host {host}"),
                ));
            }
        };
        if let Some(m) = m {
            let text = cache::marker_text(
                &name,
                digest,
                size,
                info.capacity,
                format,
                &part.name,
                &src.display,
            );
            let len = text.len() as u64;
            let opts = UploadOptions {
                deadline: Some(remaining(deadline)),
                ..UploadOptions::default()
            };
            // NB: readers rely on the marker's existence and capacity; the text is for humans,
            // so a failure to write it is logged, not fatal.
            if let Err(e) = link
                .client
                .vol_upload(&m, 0, len, text.as_bytes(), &opts)
                .await
            {
                tracing::warn!(marker = %marker, error = %e, "could not write the marker text");
            }
        }
        // NB: for file-based pools the key is the path; other pool types ask.
        let path = if base.key.starts_with('/') {
            base.key.clone()
        } else {
            on_link!(link, |c| c.vol_path(&base)).map_err(lv(host, "reading the base path"))?
        };
        Ok(cache::Published {
            vol: base.clone(),
            capacity: info.capacity,
            path,
            disk_format: ImageFormat::Qcow2,
            data_path: Some(part_path.clone()),
        })
    };
    match finish.await {
        Ok(p) => {
            unmarked.disarm();
            *keep_part = true;
            Ok(done(p, true))
        }
        Err(e) => {
            // Ours (created in this call) and unmarked: remove it; the caller then deletes
            // the part. If the base cannot be removed, the part stays with it, both noted as
            // debris by `unmarked` (an unmarked base would stall every later import of this
            // image on this host).
            // NB: not `on_link!`, whose failed reopen would return before the part is kept.
            let mut r = link.client.vol_delete(&base, 0).await;
            if matches!(&r, Err(d) if d.is_connection()) && link.reopen().await.is_ok() {
                r = link.client.vol_delete(&base, 0).await;
            }
            match r {
                Ok(()) => unmarked.disarm(),
                Err(d) if cache::is_no_vol(&d) => unmarked.disarm(),
                Err(d) => {
                    tracing::warn!(base = %name, error = %d, "could not delete the unpublished base");
                    *keep_part = true;
                }
            }
            Err(e)
        }
    }
}

/// How long the part may take to read as what was uploaded (libvirt re-probes the pool in a
/// thread after an upload, and refuses explicit refreshes while any upload or copy runs).
// NB: the re-probe takes milliseconds, but another import's upload in the same pool blocks
// explicit refreshes for its whole length; the post-upload thread does not wait for it, so
// two minutes only covers a very loaded host.
pub const SETTLE_WAIT: Duration = Duration::from_secs(120);
/// How often the part is re-read while it settles.
pub const SETTLE_POLL: Duration = Duration::from_millis(250);

/// Whether libvirtd refused a pool refresh because uploads or copies are running in it.
fn pool_busy(e: &LvError) -> bool {
    e.remote()
        .is_some_and(|r| r.code == 1 && r.message.contains("asynchronous jobs"))
}

/// Waits until libvirt reads the uploaded part as `format` (qcow2: with the header's virtual
/// size; raw: with the uploaded size), refreshing the pool when libvirtd allows it. Returns
/// its info and its path.
async fn settle_part(
    target: &Target<'_>,
    src: &Source,
    link: &mut Link<'_>,
    part: &StorageVol,
    format: ImageFormat,
    size: u64,
    deadline: Instant,
) -> Result<(libvirt_remote::proto::StorageVolGetInfoRet, String)> {
    let host = target.host;
    let pool = target.pool;
    let until = (Instant::now() + SETTLE_WAIT).min(deadline);
    loop {
        match on_link!(link, |c| c.pool_refresh(pool)) {
            Ok(()) => {}
            Err(e) if pool_busy(&e) => {}
            Err(e) => return Err(lv(host, "refreshing the pool")(e)),
        }
        let info = on_link!(link, |c| c.vol_info(part))
            .map_err(lv(host, "reading the uploaded volume"))?;
        let xml =
            on_link!(link, |c| c.vol_xml(part)).map_err(lv(host, "reading the uploaded volume"))?;
        if let Some(b) = crate::libvirt::volumes::parse_volume_xml(&xml).and_then(|f| f.backing) {
            // The part is a plain upload: any backing store libvirt reads from it was named
            // by the image's own header, not by us (a file of the host or of another tenant).
            return Err(ProviderError::permanent(format!(
                "image {} refused: libvirt on host {host} reads the uploaded volume as backed \
                 by {} (a backing file named inside the image); a disk image must be \
                 self-contained: flatten it with `qemu-img convert -O qcow2`",
                src.display,
                crate::libvirt::classify::truncate(&b, 200)
            )));
        }
        let seen = cache::xml_format(&xml).unwrap_or_default();
        let settled = seen == format.as_str()
            && info.capacity > 0
            && (format == ImageFormat::Qcow2 || info.capacity == size);
        if settled {
            let path = match crate::libvirt::volumes::parse_volume_xml(&xml).and_then(|f| f.path) {
                Some(p) => p,
                None => on_link!(link, |c| c.vol_path(part))
                    .map_err(lv(host, "reading the uploaded volume's path"))?,
            };
            return Ok((info, path));
        }
        if Instant::now() + SETTLE_POLL > until {
            return Err(ProviderError::transient(format!(
                "libvirt on host {host} still reads the uploaded image {} as {seen:?} of {} bytes;                  its bytes are {} ({size} bytes)",
                src.display,
                info.capacity,
                format.as_str()
            )));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Waits (bounded by [`cache::MARKER_WAIT`] and the import deadline) for another
/// publisher's marker on `name`.
async fn wait_for_marker(
    target: &Target<'_>,
    link: &mut Link<'_>,
    name: &str,
    deadline: Instant,
) -> Result<cache::Published> {
    let host = target.host;
    let pool = target.pool;
    let until = (Instant::now() + cache::MARKER_WAIT).min(deadline);
    loop {
        if let Some(p) = cache::check_published(&link.client, pool, name, host).await? {
            return Ok(p);
        }
        let exists = on_link!(link, |c| cache::lookup(c, pool, name))
            .map_err(lv(host, "looking up the base"))?;
        if exists.is_none() {
            return Err(ProviderError::transient(format!(
                "base {name} on host {host} was being published by another import, which gave \
                 up; retrying will import it"
            )));
        }
        if Instant::now() + cache::MARKER_POLL > until {
            return Err(ProviderError::transient(format!(
                "base {name} in pool {} on host {host} has no marker {} after waiting: another \
                 import is still publishing it, or one died (the GC removes it once its upload \
                 is older than timeouts.imageImport plus limits.unusedBaseGraceMinutes; if no \
                 import is running, deleting {name} now is safe)",
                pool.name,
                cache::marker_name(name)
            )));
        }
        tokio::time::sleep(cache::MARKER_POLL).await;
    }
}

/// Deletes this entry's temporary upload volumes older than `older_than` (left by imports
/// that died), except any part that a volume of the entry's base prefix names as its backing
/// store (a published base's data volume, or one a publish may still be marking). Returns the
/// names deleted. Never touches anything else. `older_than` must exceed
/// `timeouts.imageImport`, so that no live import's part is old enough.
pub async fn sweep_parts(
    client: &Client,
    pool: &StoragePool,
    entry: &str,
    older_than: Duration,
) -> Result<Vec<String>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let ctx = |what: &str| format!("{what} in pool {}", pool.name);
    let vols = client
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &ctx("listing volumes")))?;
    let old: Vec<&StorageVol> = vols
        .iter()
        .filter(|v| {
            cache::part_age(entry, &v.name)
                .is_some_and(|t| now.saturating_sub(t) >= older_than.as_secs())
        })
        .collect();
    if old.is_empty() {
        return Ok(Vec::new());
    }
    let place = format!("in pool {}", pool.name);
    let referenced = cache::base_backing_paths(client, entry, &vols, &place).await?;
    let mut gone = Vec::new();
    for v in old {
        if referenced.contains(&cache::volume_path(client, v, &place).await?) {
            continue;
        }
        match client.vol_delete(v, 0).await {
            Ok(()) => gone.push(v.name.clone()),
            Err(e) if cache::is_no_vol(&e) => {}
            Err(e) => return Err(classify(&e, &ctx(&format!("deleting {}", v.name)))),
        }
    }
    Ok(gone)
}
