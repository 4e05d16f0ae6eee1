//! Making room in the base cache: when a new base would pass `limits.maxBases` (or, for a URL
//! image, `limits.maxUrlImages`), the entry's oldest bases that nothing on the host uses are
//! removed first, as many as the new one needs, before the import starts. Only when none can
//! go is the new base refused (QuotaExceeded, as before). What "uses" means is read once, in
//! [`usage`], which the collection of unused bases ([`super::gc`]) shares.
//!
//! Why here and not in the orphan GC: the limits are the cache's size, so a base is kept until
//! its room is needed (an idle image is not downloaded again just because a GC pass found it
//! unused), and the bases never pass the limits; the decision is taken under the import lock
//! of the new base, on the listing the limit was counted from.
//!
//! Guarantees (a base is "in use" and never removed when any of these holds):
//! - any domain on the host — ours, another entry's or installation's, or foreign; running
//!   (its live XML, whose disk chains libvirt has followed) or not (its definition), and a
//!   running one's next definition too — names the base's or its data volume's path or name
//!   anywhere in its XML;
//! - any other volume in the pool has the base or its data volume as its backing store (an
//!   overlay whose domain is not defined yet, or another tool's);
//! - this process handed the base to a create within [`RECENT_USE`], or an import of its
//!   source is running in this process (its import lock is held);
//! - and eviction is refused on the host altogether while any domain has a disk whose chain
//!   cannot be seen: a shut-off domain's qcow2 (or unknown-format) disk outside this pool
//!   without a declared `<backingStore>` (libvirt reads such a chain only when it starts the
//!   domain), so a chain that might reach a base is never guessed.
//!
//! Order: oldest first, by the time the base's data volume was uploaded (in its name); a base
//! whose age cannot be read is never removed. A base is removed as base, then marker, then
//! data volume: a crash in between leaves either a marker whose base is gone (the next import
//! of that image publishes anew and accepts the marker, as it records the same size) or an
//! unreferenced data volume (the part sweep collects it).
//! Not covered: another process that finds a base published and defines an overlay on it in
//! the moment between this check and the removal (its create then fails Transient and the
//! retry imports the image again).
//!
//! One piece (about 590 lines before its tests): the usage read, the oldest-first choice and
//! the removal order share one host listing and one set of "in use" rules, which must not
//! drift apart between the eviction and the unused-base collection that reads them.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use libvirt_remote::Client;
use libvirt_remote::proto::{Domain, StoragePool, StorageVol};
use tokio::time::Instant;

use super::{Target, cache, import_lock};
use crate::error::Result;
use crate::libvirt::classify::classify;
use crate::libvirt::names;
use crate::libvirt::volumes;
use crate::sync::lock;

/// How long a base handed to a create in this process is protected from eviction.
// NB: a create goes from the base to a defined domain in seconds (overlay, seed, define);
// 10 minutes covers a slow seed upload on a loaded host with a wide margin.
pub const RECENT_USE: Duration = Duration::from_secs(600);
/// libvirt XML reads in flight at once while looking for users of a base.
// NB: small round trips; 8 keeps a host of a thousand domains and volumes to seconds.
pub const READS_IN_FLIGHT: usize = 8;
/// `VIR_DOMAIN_XML_INACTIVE`: the definition, not the running state.
const XML_INACTIVE: u32 = 2;
/// `VIR_ERR_NO_DOMAIN`.
const NO_DOMAIN: i32 = 42;
/// `VIR_ERR_NO_STORAGE_VOL`.
const NO_STORAGE_VOL: i32 = 50;

type UseTable = Mutex<HashMap<String, Instant>>;

fn uses() -> &'static UseTable {
    static USES: OnceLock<UseTable> = OnceLock::new();
    USES.get_or_init(|| Mutex::new(HashMap::new()))
}

fn use_key(host: &str, pool: &str, base: &str) -> String {
    format!("{host}/{pool}/{base}")
}

/// Records that base `base` in `pool` on `host` was just handed to a create.
pub fn note_use(host: &str, pool: &str, base: &str) {
    let mut t = lock(uses());
    let now = Instant::now();
    t.retain(|_, at| now.duration_since(*at) < RECENT_USE);
    t.insert(use_key(host, pool, base), now);
}

/// Whether base `base` in `pool` on `host` was handed to a create in this process within
/// [`RECENT_USE`].
pub(super) fn recently_used(host: &str, pool: &str, base: &str) -> bool {
    let t = lock(uses());
    t.get(&use_key(host, pool, base))
        .is_some_and(|at| at.elapsed() < RECENT_USE)
}

/// A base of the entry that might be removed.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    /// The base volume's name.
    pub(super) name: String,
    /// Whether it is published (its marker exists and agrees). An unpublished one is a base
    /// being published right now, or one whose import died between creating it and marking
    /// it: only the collection of unused bases judges those ([`super::gc`]), by age.
    pub(super) published: bool,
    /// Its source key (`img-…` / `url-…`), for the import lock.
    pub(super) source_key: String,
    /// Its path.
    pub(super) path: String,
    /// Its data volume's path and name, when it has one.
    pub(super) data_path: Option<String>,
    pub(super) data_name: Option<String>,
    /// When its data volume was uploaded (unix seconds).
    pub(super) created_unix: u64,
    /// From a URL image.
    pub(super) url: bool,
}

impl Candidate {
    /// The strings whose presence in a domain's XML means the domain uses this base.
    fn needles(&self) -> Vec<&str> {
        let mut n = vec![self.name.as_str(), self.path.as_str()];
        n.extend(self.data_path.as_deref());
        n.extend(self.data_name.as_deref());
        n
    }

    /// The key of its source's import lock (the one an import of its image holds).
    pub(super) fn lock_key(&self, host: &str, pool: &str, entry: &str) -> String {
        format!("{host}/{pool}/{entry}/{}", self.source_key)
    }
}

/// What [`make_room`] did.
#[derive(Debug, Default)]
pub struct Room {
    /// The bases removed, oldest first.
    pub removed: Vec<String>,
    /// Why more could not be removed, when fewer than asked were.
    pub blocked: Option<String>,
}

/// Who uses the entry's bases on one host, as read from the host itself.
#[derive(Debug, Default)]
pub(super) struct Usage {
    /// Each base whose path, data volume and age could be read, with what uses it (a domain
    /// or a volume, named), `None` when nothing on the host does.
    pub(super) bases: Vec<(Candidate, Option<String>)>,
    /// Bases whose age or data volume could not be read (never removed), with why.
    pub(super) unreadable: Vec<(String, String)>,
    /// Why nothing may be removed on this host at all, when so (a chain libvirt hides).
    pub(super) blocked: Option<String>,
}

/// Reads who uses `bases` (base names of `entry`; one without its marker is read as an
/// unpublished [`Candidate`]) in `pool` on `host`: every
/// domain's XML (live and next definition) and every other volume's backing store of the
/// pool (see the module guarantees). Fails as a whole on any read failure but "vanished".
pub(super) async fn usage(
    c: &Client,
    pool: &StoragePool,
    host: &str,
    entry: &str,
    bases: &[String],
) -> Result<Usage> {
    let lv = |what: String| move |e: libvirt_remote::Error| classify(&e, &what);
    let (cands, unreadable) = candidates(c, pool, host, entry, bases).await?;
    if cands.is_empty() {
        return Ok(Usage {
            unreadable,
            ..Usage::default()
        });
    }
    let doms = c
        .list_all_domains(0)
        .await
        .map_err(lv(format!("listing domains on host {host}")))?;
    let pool_paths = pool_volume_paths(c, pool, host).await?;
    let texts = domain_texts(c, host, doms).await?;
    // NB: a running domain's live XML shows the chain libvirt followed; its next definition
    // is searched for names and paths below, not for chains it cannot show.
    let blocked = texts
        .iter()
        .filter(|t| t.live_or_off)
        .find_map(|t| unseen_chain(&t.xml, &pool.name, &pool_paths));
    let backed = backing_paths(c, pool, host, &cands).await?;
    let bases = cands
        .into_iter()
        .map(|k| {
            let by_domain = texts
                .iter()
                .find(|t| k.needles().iter().any(|n| t.xml.contains(n)))
                .map(|t| format!("domain {}", t.domain));
            let by_volume = || {
                backed
                    .iter()
                    .find(|(_, b)| *b == k.path || k.data_path.as_deref() == Some(b.as_str()))
                    .map(|(v, _)| format!("volume {v}, which it backs"))
            };
            let user = by_domain.or_else(by_volume);
            (k, user)
        })
        .collect();
    Ok(Usage {
        bases,
        unreadable,
        blocked,
    })
}

/// Removes up to `need_any` of the entry's bases (any source) and, among them or besides,
/// enough URL-image bases that `need_url` of those go, oldest first, never one in use (see
/// the module guarantees). `bases` are the entry's published base names (marker present).
pub async fn make_room(
    target: &Target<'_>,
    bases: &[String],
    mut need_any: usize,
    mut need_url: usize,
) -> Result<Room> {
    let mut room = Room::default();
    let c = target.client;
    let pool = target.pool;
    let host = target.host;
    let entry = &target.entry.name;
    let u = usage(c, pool, host, entry, bases).await?;
    if u.bases.is_empty() {
        room.blocked = Some("no base's age could be read".into());
        return Ok(room);
    }
    if let Some(why) = u.blocked {
        room.blocked = Some(why);
        return Ok(room);
    }
    let mut cands: Vec<Candidate> = u
        .bases
        .into_iter()
        .filter(|(k, user)| {
            k.published && user.is_none() && !recently_used(host, &pool.name, &k.name)
        })
        .map(|(k, _)| k)
        .collect();
    cands.sort_by(|a, b| (a.created_unix, &a.name).cmp(&(b.created_unix, &b.name)));
    for k in cands {
        if need_any == 0 && need_url == 0 {
            break;
        }
        if need_any == 0 && !k.url {
            continue;
        }
        let lock = import_lock(&k.lock_key(host, &pool.name, entry));
        let Ok(_held) = lock.try_lock() else {
            continue;
        };
        // NB: a create notes its use under this lock; one that took the base since the scan
        // above has noted it by now, and one that comes later waits for the lock and then
        // finds the base gone (and imports it again).
        if recently_used(host, &pool.name, &k.name) {
            continue;
        }
        remove(c, pool, host, &k).await?;
        tracing::info!(base = %k.name, host = %host, pool = %pool.name, "removed the oldest unused base to make room for a new one");
        need_any = need_any.saturating_sub(1);
        if k.url {
            need_url = need_url.saturating_sub(1);
        }
        room.removed.push(k.name);
    }
    if need_any > 0 || need_url > 0 {
        room.blocked =
            Some("every other base is in use by a domain or a volume on the host".into());
    }
    Ok(room)
}

/// The entry's bases whose path, data volume and age can be read, and those that cannot
/// (with why).
async fn candidates(
    c: &Client,
    pool: &StoragePool,
    host: &str,
    entry: &str,
    bases: &[String],
) -> Result<(Vec<Candidate>, Vec<(String, String)>)> {
    let prefix = names::base_prefix(entry);
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for name in bases {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        // `<source key>-<64 hex>.<ext>`
        let Some((source_key, _)) = rest.rsplit_once('-') else {
            unreadable.push((name.clone(), "its name has no digest".to_owned()));
            continue;
        };
        let (path, data_path, published) = match cache::check_published(c, pool, name, host).await {
            Ok(Some(p)) => (p.path, p.data_path, true),
            // Not (or no longer) published: being published, left by an import that died
            // before its marker, or being removed.
            Ok(None) => match unpublished(c, pool, name, host).await {
                Ok(Some((path, data))) => (path, data, false),
                Ok(None) => continue,
                Err(e) if e.is_permanent() => {
                    unreadable.push((name.clone(), e.message));
                    continue;
                }
                Err(e) => return Err(e),
            },
            Err(e) if e.is_permanent() => {
                unreadable.push((name.clone(), e.message));
                continue;
            }
            Err(e) => return Err(e),
        };
        let data_name = data_path
            .as_deref()
            .and_then(|d| d.rsplit('/').next())
            .map(str::to_owned);
        let Some(created_unix) = data_name.as_deref().and_then(|d| cache::part_age(entry, d))
        else {
            unreadable.push((
                name.clone(),
                "its data volume's upload time cannot be read from its name".to_owned(),
            ));
            continue;
        };
        out.push(Candidate {
            name: name.clone(),
            published,
            source_key: source_key.to_owned(),
            path,
            data_path,
            data_name,
            created_unix,
            url: source_key.starts_with("url-"),
        });
    }
    Ok((out, unreadable))
}

/// The path and backing store of base `name` read without its marker; `None` when it does not
/// exist. Permanent when its description cannot be read or names no path.
async fn unpublished(
    c: &Client,
    pool: &StoragePool,
    name: &str,
    host: &str,
) -> Result<Option<(String, Option<String>)>> {
    let xml = match c.vol_xml(&cache::handle(pool, name, "")).await {
        Ok(x) => x,
        Err(e) if cache::is_no_vol(&e) => return Ok(None),
        Err(e) => return Err(classify(&e, &format!("reading base {name} on host {host}"))),
    };
    let facts = volumes::parse_volume_xml(&xml).and_then(|f| f.path.map(|p| (p, f.backing)));
    match facts {
        Some(f) => Ok(Some(f)),
        None => Err(crate::error::ProviderError::permanent(format!(
            "base volume {name} in pool {} on host {host} (no marker) has a description \
             without a path",
            pool.name
        ))),
    }
}

/// Every volume path in `pool` (to tell disks inside it from disks elsewhere).
async fn pool_volume_paths(c: &Client, pool: &StoragePool, host: &str) -> Result<Vec<String>> {
    let vols = c
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &format!("listing pool {} on host {host}", pool.name)))?;
    // NB: for a file-based pool the key is the path; other pool types are asked.
    let mut out = Vec::with_capacity(vols.len());
    for v in vols {
        if v.key.starts_with('/') {
            out.push(v.key);
        } else {
            match c.vol_path(&v).await {
                Ok(p) => out.push(p),
                Err(e) if e.remote().is_some_and(|r| r.code == NO_STORAGE_VOL) => {}
                Err(e) => {
                    return Err(classify(
                        &e,
                        &format!("reading volume {} on host {host}", v.name),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// One domain XML read by [`domain_texts`].
struct DomainText {
    domain: String,
    xml: String,
    /// The live XML (or the definition of a domain that is shut off), not a running
    /// domain's next definition.
    live_or_off: bool,
}

/// The XML of every domain: live (or the definition, when shut off), and for a running one
/// its definition too. A domain that vanished meanwhile is skipped.
async fn domain_texts(c: &Client, host: &str, doms: Vec<Domain>) -> Result<Vec<DomainText>> {
    let reads: Vec<(Domain, u32)> = doms
        .into_iter()
        .flat_map(|d| {
            let active = d.id >= 0;
            let mut v = vec![(d.clone(), 0)];
            if active {
                v.push((d, XML_INACTIVE));
            }
            v
        })
        .collect();
    let mut s = stream::iter(reads)
        .map(|(d, flags)| async move {
            match c.domain_xml(&d, flags).await {
                Ok(xml) => Ok(Some(DomainText {
                    domain: d.name.clone(),
                    xml,
                    live_or_off: flags == 0,
                })),
                Err(e) if e.remote().is_some_and(|r| r.code == NO_DOMAIN) => Ok(None),
                Err(e) => Err(classify(
                    &e,
                    &format!("reading domain {} on host {host}", d.name),
                )),
            }
        })
        .buffer_unordered(READS_IN_FLIGHT);
    let mut out = Vec::new();
    while let Some(r) = s.next().await {
        out.extend(r?);
    }
    Ok(out)
}

/// The backing-store paths of the pool's volumes other than the candidates' own base and
/// data volumes and markers, each with the name of the volume it backs.
async fn backing_paths(
    c: &Client,
    pool: &StoragePool,
    host: &str,
    cands: &[Candidate],
) -> Result<Vec<(String, String)>> {
    let vols = c
        .pool_list_volumes(pool)
        .await
        .map_err(|e| classify(&e, &format!("listing pool {} on host {host}", pool.name)))?;
    let skip = |v: &StorageVol| {
        v.name.ends_with(cache::MARKER_SUFFIX)
            || cands
                .iter()
                .any(|k| k.name == v.name || k.data_name.as_deref() == Some(v.name.as_str()))
    };
    let todo: Vec<StorageVol> = vols.into_iter().filter(|v| !skip(v)).collect();
    let mut s = stream::iter(todo)
        .map(|v| async move {
            match c.vol_xml(&v).await {
                Ok(x) => Ok(volumes::parse_volume_xml(&x)
                    .and_then(|f| f.backing)
                    .map(|b| (v.name.clone(), b))),
                Err(e) if e.remote().is_some_and(|r| r.code == NO_STORAGE_VOL) => Ok(None),
                Err(e) => Err(classify(
                    &e,
                    &format!("reading volume {} on host {host}", v.name),
                )),
            }
        })
        .buffer_unordered(READS_IN_FLIGHT);
    let mut out = Vec::new();
    while let Some(r) = s.next().await {
        out.extend(r?);
    }
    Ok(out)
}

/// Why a domain XML hides a chain that might reach a base: a disk (not a CD-ROM or raw
/// image) whose source is a file or block device outside `pool_paths`, or a volume of
/// another pool than `pool`, with no `<backingStore>` declared.
pub fn unseen_chain(xml: &str, pool: &str, pool_paths: &[String]) -> Option<String> {
    for d in disks(xml) {
        if d.has_backing || d.format.as_deref() == Some("raw") {
            continue;
        }
        let inside = d.file.as_ref().is_some_and(|f| pool_paths.contains(f))
            || (d.volume.is_some() && d.pool.as_deref() == Some(pool));
        if inside {
            continue;
        }
        let what = d
            .file
            .clone()
            .or(d.volume.clone())
            .unwrap_or_else(|| "a disk".into());
        if d.file.is_none() && d.volume.is_none() {
            continue;
        }
        return Some(format!(
            "domain {} has disk {what} ({} format) outside the pool whose backing chain \
             libvirt does not show while it is shut off",
            d.domain,
            d.format.as_deref().unwrap_or("unknown")
        ));
    }
    None
}

/// One `<disk>` of a domain XML, as far as [`unseen_chain`] needs it.
#[derive(Debug, Default)]
struct Disk {
    domain: String,
    format: Option<String>,
    file: Option<String>,
    volume: Option<String>,
    pool: Option<String>,
    has_backing: bool,
}

fn disks(xml: &str) -> Vec<Disk> {
    use quick_xml::events::Event;
    let mut r = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    let mut domain = String::new();
    let mut path: Vec<String> = Vec::new();
    let mut cur: Option<Disk> = None;
    let mut in_name = false;
    loop {
        let ev = match r.read_event() {
            Ok(Event::Eof) | Err(_) => break,
            Ok(e) => e,
        };
        let (start, empty) = match &ev {
            Event::Start(e) => (Some(e.clone()), false),
            Event::Empty(e) => (Some(e.clone()), true),
            _ => (None, false),
        };
        if let Some(e) = start {
            let name = e.local_name().into_inner().to_owned();
            let attr = |k: &str| {
                e.attributes()
                    .flatten()
                    .find(|a| a.key.local_name().into_inner() == k)
                    .and_then(|a| {
                        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                            .ok()
                            .map(|v| v.into_owned())
                    })
            };
            let depth = path.len();
            if name == "name" && depth == 1 {
                in_name = !empty;
            }
            if name == "disk" && depth == 2 {
                let device = attr("device").unwrap_or_default();
                cur = (device != "cdrom" && device != "floppy").then(|| Disk {
                    domain: domain.clone(),
                    ..Disk::default()
                });
            }
            if let Some(d) = cur.as_mut()
                && depth == 3
            {
                match name.as_str() {
                    "driver" => d.format = attr("type"),
                    "source" => {
                        d.file = attr("file").or_else(|| attr("dev"));
                        d.volume = attr("volume");
                        d.pool = attr("pool");
                    }
                    "backingStore" => d.has_backing = true,
                    _ => {}
                }
            }
            if !empty {
                path.push(name);
            } else if path.len() == 2 && e.local_name().into_inner() == "disk" {
                out.extend(cur.take());
            }
        } else {
            match ev {
                Event::End(_) => {
                    let closed = path.pop();
                    if closed.as_deref() == Some("disk") && path.len() == 2 {
                        out.extend(cur.take());
                    }
                    in_name = false;
                }
                Event::Text(t) if in_name => {
                    domain = t.xml10_content().into_owned();
                }
                _ => {}
            }
        }
    }
    out
}

/// Removes base `k`: base, marker, data volume; one already gone is fine.
pub(super) async fn remove(
    c: &Client,
    pool: &StoragePool,
    host: &str,
    k: &Candidate,
) -> Result<()> {
    let mut names = vec![k.name.clone(), cache::marker_name(&k.name)];
    names.extend(k.data_name.clone());
    for n in names {
        let v = cache::handle(pool, &n, "");
        match c.vol_delete(&v, 0).await {
            Ok(()) => {}
            Err(e) if e.remote().is_some_and(|r| r.code == NO_STORAGE_VOL) => {}
            Err(e) => {
                return Err(classify(
                    &e,
                    &format!("removing unused base volume {n} on host {host}"),
                ));
            }
        }
    }
    Ok(())
}

/// Why a QuotaExceeded names no room made ("…; none could be removed: …").
pub fn explain(room: &Room) -> String {
    match &room.blocked {
        Some(why) => format!("; no unused base could be removed to make room: {why}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_shut_off_domains_qcow2_disk_outside_the_pool_hides_its_chain() {
        let pool = vec!["/pool/a.qcow2".to_owned()];
        let dom =
            |disk: &str| format!("<domain><name>vm1</name><devices>{disk}</devices></domain>");
        let outside = dom(
            "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
             <source file='/elsewhere/x.qcow2'/><target dev='vda'/></disk>",
        );
        let why = unseen_chain(&outside, "images", &pool).unwrap();
        assert!(
            why.contains("vm1") && why.contains("/elsewhere/x.qcow2"),
            "{why}"
        );
        for fine in [
            // inside the pool: its backing store is read from the volume
            "<disk type='file' device='disk'><driver type='qcow2'/><source file='/pool/a.qcow2'/></disk>",
            // declared chain
            "<disk type='file' device='disk'><driver type='qcow2'/><source file='/e/x'/>\
             <backingStore type='file'><source file='/e/y'/><backingStore/></backingStore></disk>",
            // raw images have no backing file
            "<disk type='file' device='disk'><driver type='raw'/><source file='/e/x.img'/></disk>",
            // a CD-ROM
            "<disk type='file' device='cdrom'><driver type='raw'/><source file='/e/x.iso'/></disk>",
            // no source (empty drive)
            "<disk type='file' device='disk'><driver type='qcow2'/></disk>",
        ] {
            assert_eq!(unseen_chain(&dom(fine), "images", &pool), None, "{fine}");
        }
        let block = dom(
            "<disk type='block' device='disk'><driver type='qcow2'/><source dev='/dev/vg/x'/></disk>",
        );
        assert!(unseen_chain(&block, "images", &pool).is_some());
        let vol = |p: &str| {
            dom(&format!(
                "<disk type='volume' device='disk'><driver type='qcow2'/>\
                 <source pool='{p}' volume='v1'/></disk>"
            ))
        };
        assert_eq!(unseen_chain(&vol("images"), "images", &pool), None);
        assert!(unseen_chain(&vol("other"), "images", &pool).is_some());
    }
}
