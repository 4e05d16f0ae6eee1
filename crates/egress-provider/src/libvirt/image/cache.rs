//! The volume side of the image cache: finding a published base, publishing one without
//! copying it, and sweeping what dead imports left (findings H4, M10, M13, E7).
//!
//! The protocol, as every reader and writer follows it:
//! - An import uploads into a temporary data volume `<prefix>-<source>-<digest|unverified>
//!   .part-<unix>-<random>`, so a sweep can tell its age. Until a published base references
//!   it, nothing reads a `.part-*`.
//! - Once the digest is verified, the final, digest-bearing name is created as an instant
//!   qcow2 overlay whose backing store is the verified part, backing format given
//!   ([`overlay_base_xml`]; libvirt has no rename, and a clone copies every byte). The final
//!   name is visible before its marker, so it means nothing by itself.
//! - Last, the marker `<final>.marker` is created: a raw volume whose capacity records the
//!   base's virtual size and whose content records digest, size, capacity, format, the data
//!   volume and the redacted source, for humans (`virsh vol-download`). A base is usable only
//!   when its marker exists and the marker's capacity equals the base's; the name binds
//!   entry, source and digest, so the digest always matches by construction.
//! - Creating the final name is the claim: exactly one creator wins it (libvirt refuses a
//!   second volume of that name). The loser never touches it, deletes its own part and waits,
//!   bounded, for the winner's marker.
//! - A call deletes only what it created: its own part (unless its base now references it),
//!   and the final base it created if the publish then fails before the marker. A digest
//!   change is a new name and new volumes; old bases stay until a collector finds no overlay
//!   on them (and then removes the base, its marker and its data volume together).
//! - The sweep ([`super::sweep_parts`]) deletes old parts of its entry, never one that any
//!   volume of the entry's base prefix names as its backing store (a published base's data).
//! - Readers ([`check_published`]) build volume handles from names (libvirt resolves a volume
//!   by pool and name; a missing one answers "no storage vol") and read the marker's info and
//!   the base's XML: two round trips, which also give the base's path and on-disk format.
//! - Every step after the upload runs on the upload's own dedicated connection, reopened
//!   once if it died (M10); the pooled control link is used only for cache lookups.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libvirt_remote::proto::{StoragePool, StorageVol};
use libvirt_remote::{Client, Error as LvError};

use crate::error::{ProviderError, Result};
use crate::libvirt::classify::classify;
use crate::libvirt::config::ImageFormat;
use crate::libvirt::names;

/// libvirt's `VIR_ERR_NO_STORAGE_VOL`.
const NO_STORAGE_VOL: i32 = 50;
/// libvirt's `VIR_ERR_STORAGE_VOL_EXIST`.
const STORAGE_VOL_EXIST: i32 = 90;
/// Suffix of a marker volume.
pub const MARKER_SUFFIX: &str = ".marker";
/// Infix of a temporary upload volume.
pub const PART_INFIX: &str = ".part-";
/// How often a loser of the publish race looks for the winner's marker.
// NB: a clone of a cloud image takes seconds; polling every 2 s costs two lookups per poll.
pub const MARKER_POLL: Duration = Duration::from_secs(2);
/// Longest a loser waits for the winner's marker.
// NB: the winner's clone of an 8 GiB (maxImageBytes default) image on a slow disk takes a few
// minutes; past 10 minutes the winner is presumed dead and the caller is told what to delete.
pub const MARKER_WAIT: Duration = Duration::from_secs(600);

/// The marker name of base `base`.
pub fn marker_name(base: &str) -> String {
    format!("{base}{MARKER_SUFFIX}")
}

/// A fresh part name for `source_key` in `entry`: `<base prefix><source>-<digest>.part-<unix>-<rand>`.
pub fn part_name(entry: &str, source_key: &str, digest: Option<&str>) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{}{source_key}-{}{PART_INFIX}{now}-{:016x}",
        names::base_prefix(entry),
        digest.unwrap_or("unverified"),
        random_u64()
    )
}

/// A random number for part names: std's per-process random hash keys over a counter and
/// the clock (unpredictable enough to keep two imports' parts apart; not a secret).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The creation time (unix seconds) in a part name, if `name` is a part of `entry`.
pub fn part_age(entry: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(&names::base_prefix(entry))?;
    let (_, tail) = rest.rsplit_once(PART_INFIX)?;
    let (secs, _) = tail.split_once('-')?;
    secs.parse().ok()
}

/// Digest and format in a final base name of `entry`/`source_key`, if it is one.
pub fn parse_base(entry: &str, source_key: &str, name: &str) -> Option<(String, ImageFormat)> {
    let rest = name
        .strip_prefix(&names::base_prefix(entry))?
        .strip_prefix(source_key)?
        .strip_prefix('-')?;
    let (digest, ext) = rest.split_once('.')?;
    let ok = digest.len() == 64
        && digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let format = match ext {
        "qcow2" => ImageFormat::Qcow2,
        "raw" => ImageFormat::Raw,
        _ => return None,
    };
    ok.then(|| (digest.to_owned(), format))
}

/// Whether `e` is libvirt's "no such volume".
pub fn is_no_vol(e: &LvError) -> bool {
    e.libvirt_code() == Some(NO_STORAGE_VOL)
}

/// Whether `e` is libvirt's "volume exists".
pub fn is_vol_exists(e: &LvError) -> bool {
    e.libvirt_code() == Some(STORAGE_VOL_EXIST)
}

/// Looks a volume up; `None` when it does not exist.
pub async fn lookup(
    c: &Client,
    pool: &StoragePool,
    name: &str,
) -> std::result::Result<Option<StorageVol>, LvError> {
    match c.vol_lookup_by_name(pool, name).await {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_no_vol(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A volume handle for `name` in `pool`, built without a lookup: libvirt resolves handles by
/// pool and volume name (the key is informative only), so calls on it answer "no storage
/// vol" when the volume does not exist.
pub fn handle(pool: &StoragePool, name: &str, key: &str) -> StorageVol {
    StorageVol {
        pool: pool.name.clone(),
        name: name.to_owned(),
        key: key.to_owned(),
    }
}

/// A base that passed the reader's checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The base volume (its key is its path, as libvirt reports it for file-based pools).
    pub vol: StorageVol,
    /// Its virtual size as libvirt reports it.
    pub capacity: u64,
    /// Its path on the host.
    pub path: String,
    /// Its on-disk format (qcow2 for bases published as overlays on their data volume).
    pub disk_format: ImageFormat,
    /// The path of its data volume (the backing store its XML names), if it has one.
    pub data_path: Option<String>,
}

/// Checks base `name` the way every reader must: base and marker exist and the marker's
/// capacity equals the base's. Two round trips (the marker's info, the base's XML), on
/// handles built from the names. `Ok(None)`: not (yet) published. Err Permanent: both exist
/// but disagree (something outside this protocol changed one of them), or the base's XML
/// lacks its path or a known format.
pub async fn check_published(
    c: &Client,
    pool: &StoragePool,
    name: &str,
    host: &str,
) -> Result<Option<Published>> {
    let marker = marker_name(name);
    let lv = |e: LvError, what: &str| classify(&e, &format!("{what} on host {host}"));
    let mi = match c.vol_info(&handle(pool, &marker, "")).await {
        Ok(i) => i,
        Err(e) if is_no_vol(&e) => return Ok(None),
        Err(e) => return Err(lv(e, "reading the base marker")),
    };
    let xml = match c.vol_xml(&handle(pool, name, "")).await {
        Ok(x) => x,
        Err(e) if is_no_vol(&e) => return Ok(None),
        Err(e) => return Err(lv(e, "reading the base")),
    };
    let bad = |why: &str| {
        ProviderError::permanent(format!(
            "base volume {name} in pool {} on host {host} {why}: it was changed outside the \
             operator; delete both {name} and {marker} once no guest uses them",
            pool.name
        ))
    };
    let facts = crate::libvirt::volumes::parse_volume_xml(&xml)
        .ok_or_else(|| bad("has a description that cannot be read"))?;
    let path = facts.path.clone().ok_or_else(|| bad("has no path"))?;
    let disk_format = match facts.format.as_deref() {
        Some("qcow2") => ImageFormat::Qcow2,
        Some("raw") => ImageFormat::Raw,
        other => return Err(bad(&format!("has format {other:?}, neither qcow2 nor raw"))),
    };
    if facts.capacity != mi.capacity {
        return Err(bad(&format!(
            "does not match its marker ({} bytes virtual vs {} recorded)",
            facts.capacity, mi.capacity
        )));
    }
    Ok(Some(Published {
        vol: handle(pool, name, &path),
        capacity: facts.capacity,
        path,
        disk_format,
        data_path: facts.backing.clone(),
    }))
}

/// The XML of the published base `name`: a qcow2 overlay of `capacity` bytes whose backing
/// store is the verified data volume at `data_path`, in `data_format` (given, never probed).
pub fn overlay_base_xml(
    name: &str,
    capacity: u64,
    data_path: &str,
    data_format: ImageFormat,
) -> String {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity>\
         <target><format type='qcow2'/></target>\
         <backingStore><path>{}</path><format type='{}'/></backingStore></volume>",
        esc(name),
        esc(data_path),
        data_format.as_str()
    )
}

/// The XML of a new raw volume `name` of `capacity` bytes, sparse.
pub fn raw_volume_xml(name: &str, capacity: u64) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity>\
         <allocation unit='bytes'>0</allocation><target><format type='raw'/></target></volume>",
        quick_xml::escape::escape(name)
    )
}

/// The format libvirt reports in a volume's XML (`<target><format type='...'/>`).
pub fn xml_format(xml: &str) -> Option<String> {
    let target = xml.find("<target")?;
    let rest = xml.get(target..)?;
    let f = rest.find("<format")?;
    let rest = rest.get(f..)?;
    let t = rest.find("type=")?;
    let rest = rest.get(t + 5..)?;
    let quote = rest.chars().next()?;
    let rest = rest.get(1..)?;
    let end = rest.find(quote)?;
    rest.get(..end).map(str::to_owned)
}

/// The human-readable marker content.
pub fn marker_text(
    base: &str,
    digest: &str,
    size: u64,
    capacity: u64,
    format: ImageFormat,
    data: &str,
    source: &str,
) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "egress-proxies base marker v1\nbase={base}\ndigest=sha256:{digest}\nsize={size}\n\
         capacity={capacity}\nformat={}\nlayout=qcow2 overlay on data volume {data}\n\
         source={source}\ncreated={now}\n",
        format.as_str()
    )
}

/// The backing-store paths named by `entry`'s published bases among `vols` (every volume of
/// the entry's base prefix that is neither a part nor a marker; few: one per image digest).
/// A part is a base's data volume exactly when a base names its path here, so neither the
/// import-side sweep nor GC may remove such a part. `place` ("in pool P on host H") goes into
/// error messages.
pub async fn base_backing_paths(
    client: &Client,
    entry: &str,
    vols: &[StorageVol],
    place: &str,
) -> Result<std::collections::HashSet<String>> {
    let prefix = names::base_prefix(entry);
    let mut referenced = std::collections::HashSet::new();
    for v in vols.iter().filter(|v| {
        v.name.starts_with(&prefix)
            && !v.name.contains(PART_INFIX)
            && !v.name.ends_with(MARKER_SUFFIX)
    }) {
        let xml = match client.vol_xml(v).await {
            Ok(x) => x,
            Err(e) if is_no_vol(&e) => continue,
            Err(e) => {
                return Err(classify(
                    &e,
                    &format!(
                        "reading volume {} {place} (to know which temporary volumes are base data)",
                        v.name
                    ),
                ));
            }
        };
        if let Some(b) = crate::libvirt::volumes::parse_volume_xml(&xml).and_then(|f| f.backing) {
            referenced.insert(b);
        }
    }
    Ok(referenced)
}

/// The path of `v` (file pools use the path as key: no round trip). `place` as above.
pub async fn volume_path(client: &Client, v: &StorageVol, place: &str) -> Result<String> {
    if v.key.starts_with('/') {
        return Ok(v.key.clone());
    }
    client.vol_path(v).await.map_err(|e| {
        classify(
            &e,
            &format!("reading the path of volume {} {place}", v.name),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_carry_their_age_and_never_parse_as_bases() {
        let p = part_name("home", "img-deb", Some(&"a".repeat(64)));
        assert!(p.starts_with("ep-home-base-img-deb-aaaa"), "{p}");
        assert!(part_age("home", &p).unwrap() > 1_700_000_000);
        assert!(parse_base("home", "img-deb", &p).is_none());
        let b = names::base(
            "home",
            names::ImageSource::Catalogue("deb"),
            &"a".repeat(64),
            ImageFormat::Qcow2,
        );
        assert_eq!(
            parse_base("home", "img-deb", &b),
            Some(("a".repeat(64), ImageFormat::Qcow2))
        );
        assert!(parse_base("home", "img-deb", &marker_name(&b)).is_none());
        assert!(part_age("home", &b).is_none());
    }

    #[test]
    fn the_format_is_read_from_the_target_element() {
        let x = "<volume><target><path>/p</path><format type='qcow2'/></target>\
                 <backingStore><format type='raw'/></backingStore></volume>";
        assert_eq!(xml_format(x).as_deref(), Some("qcow2"));
    }
}
