//! Volumes of our naming scheme that a collector may remove: listing them on one host, and
//! deleting one after re-checking it, for orphan GC (findings M3, M15, E2, M2).
//!
//! Guarantees:
//! - [`parse_volume_name`] recognises exactly three shapes for an entry, strictly: a Proxy
//!   overlay or seed whose name is byte-for-byte the name [`names::overlay`] /
//!   [`names::seed`] derives from a canonical UID (so a re-cased or padded UID is not ours,
//!   E2), and a temporary image upload (`<base prefix><img-KEY|url-SHA>-<digest|unverified>
//!   .part-<unix>-<16 hex>`, see [`cache::part_name`]). A base, a marker, or any other name —
//!   another tool's, another entry's — is `None`, so it is never listed and never deleted;
//! - a part that any volume of the entry's base prefix names as its backing store is a
//!   published base's data volume (see [`cache`]'s protocol), not a leftover: it is never
//!   listed, and [`delete_orphan_volume`] re-checks that right before deleting a part;
//! - [`list_volumes`] returns the complete list or fails: any failure of the pool lookup, the
//!   listing or a base's XML read fails the call (connection-class ones Transient), never a
//!   partial list (finding M15);
//! - [`delete_orphan_volume`] re-parses the name, and for an overlay or seed refuses
//!   (Permanent, nothing touched) when any domain with the name derived from its UID exists —
//!   ours or not, since it may be that domain's disk (M2); a volume already gone is success.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libvirt_remote::Client;
use libvirt_remote::proto::StoragePool;

use super::{CODE_NO_DOMAIN, CODE_NO_STORAGE_POOL, CODE_NO_STORAGE_VOL, classify, is_code};
use crate::error::{ProviderError, Result};
use crate::libvirt::image::cache;
use crate::libvirt::names;
use crate::model::{OwnedVolume, ProxyUid, VolumeKind};

/// Suffix of an overlay name after the UID.
const OVERLAY_SUFFIX: &str = "-root.qcow2";
/// Suffix of a seed name after the UID.
const SEED_SUFFIX: &str = "-seed.iso";
/// Length of the random tail of a part name (`{:016x}`).
const PART_RANDOM_LEN: usize = 16;

/// What a volume name of an entry's scheme is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeName {
    /// The root overlay of this UID.
    Overlay(ProxyUid),
    /// The seed of this UID.
    Seed(ProxyUid),
    /// A temporary image upload started at this unix time (seconds).
    Part {
        /// Creation time from the name, unix seconds.
        created_unix: u64,
    },
}

impl VolumeName {
    /// The kind.
    pub fn kind(&self) -> VolumeKind {
        match self {
            Self::Overlay(_) => VolumeKind::Overlay,
            Self::Seed(_) => VolumeKind::Seed,
            Self::Part { .. } => VolumeKind::Part,
        }
    }

    /// The UID, for an overlay or seed.
    pub fn uid(&self) -> Option<ProxyUid> {
        match self {
            Self::Overlay(u) | Self::Seed(u) => Some(*u),
            Self::Part { .. } => None,
        }
    }
}

/// Classifies `name` for `entry`, strictly; `None` for anything not collectable of ours.
pub fn parse_volume_name(entry: &str, name: &str) -> Option<VolumeName> {
    if let Some(u) = uid_before(entry, name, OVERLAY_SUFFIX) {
        return (names::overlay(entry, &u) == name).then_some(VolumeName::Overlay(u));
    }
    if let Some(u) = uid_before(entry, name, SEED_SUFFIX) {
        return (names::seed(entry, &u) == name).then_some(VolumeName::Seed(u));
    }
    parse_part(entry, name).map(|created_unix| VolumeName::Part { created_unix })
}

/// The UID in `ep-<entry>-<32 lowercase hex><suffix>`.
fn uid_before(entry: &str, name: &str, suffix: &str) -> Option<ProxyUid> {
    let simple = name
        .strip_prefix(names::PREFIX)?
        .strip_prefix(entry)?
        .strip_prefix('-')?
        .strip_suffix(suffix)?;
    let hex_ok = simple.len() == 32
        && simple
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex_ok {
        return None;
    }
    uuid::Uuid::try_parse(simple).ok().map(ProxyUid)
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The creation time of a part name of `entry`, checked against the whole shape
/// [`cache::part_name`] produces.
fn parse_part(entry: &str, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(&names::base_prefix(entry))?;
    let (head, tail) = rest.rsplit_once(cache::PART_INFIX)?;
    let (secs, random) = tail.split_once('-')?;
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !is_lower_hex(random, PART_RANDOM_LEN) {
        return None;
    }
    let (source, digest) = head.rsplit_once('-')?;
    if digest != "unverified" && !is_lower_hex(digest, 64) {
        return None;
    }
    let source_ok = match (source.strip_prefix("img-"), source.strip_prefix("url-")) {
        (Some(key), _) => {
            !key.is_empty()
                && key
                    .bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        }
        (None, Some(h)) => is_lower_hex(h, 64),
        (None, None) => false,
    };
    if !source_ok {
        return None;
    }
    secs.parse().ok()
}

/// Every collectable volume of `entry` in pool `pool_name` on host `host_name`.
pub async fn list_volumes(
    client: &Client,
    entry: &str,
    host_name: &str,
    pool_name: &str,
    now: SystemTime,
) -> Result<Vec<OwnedVolume>> {
    let pool = lookup_pool(client, entry, host_name, pool_name).await?;
    let vols = client.pool_list_volumes(&pool).await.map_err(|e| {
        classify(
            &e,
            &format!(
                "listing pool {pool_name} on host {host_name} (the list is incomplete, so it is \
                 not returned)"
            ),
        )
    })?;
    let has_parts = vols.iter().any(|v| {
        matches!(
            parse_volume_name(entry, &v.name),
            Some(VolumeName::Part { .. })
        )
    });
    let referenced = if has_parts {
        cache::base_backing_paths(
            client,
            entry,
            &vols,
            &format!("in pool {pool_name} on host {host_name}"),
        )
        .await?
    } else {
        HashSet::new()
    };
    let mut kept = Vec::new();
    for v in vols {
        let Some(parsed) = parse_volume_name(entry, &v.name) else {
            continue;
        };
        if parsed.kind() == VolumeKind::Part
            && referenced
                .contains(&cache::volume_path(client, &v, &format!("on host {host_name}")).await?)
        {
            continue;
        }
        kept.push((v, parsed));
    }
    // Domains on the host, by name: an overlay or seed without its domain is an orphan
    // candidate, and only those pay a round trip for their timestamps.
    let domains: HashSet<String> = if kept.iter().any(|(_, p)| p.uid().is_some()) {
        client
            .list_all_domains(0)
            .await
            .map_err(|e| classify(&e, &format!("listing domains on host {host_name}")))?
            .into_iter()
            .map(|d| d.name)
            .collect()
    } else {
        HashSet::new()
    };
    let mut out = Vec::with_capacity(kept.len());
    for (v, parsed) in kept {
        let domain_exists = parsed
            .uid()
            .is_some_and(|u| domains.contains(&names::domain(entry, &u)));
        let age_since = match parsed {
            VolumeName::Part { created_unix } => {
                Some((UNIX_EPOCH + Duration::from_secs(created_unix)).min(now))
            }
            VolumeName::Overlay(u) | VolumeName::Seed(u) => {
                if domains.contains(&names::domain(entry, &u)) {
                    None
                } else {
                    match client.vol_xml(&v).await {
                        Ok(xml) => last_change(&xml).map(|t| t.min(now)),
                        // Vanished since the listing: nothing to collect.
                        Err(e) if is_code(&e, CODE_NO_STORAGE_VOL) => continue,
                        Err(e) => {
                            return Err(classify(
                                &e,
                                &format!("reading volume {} on host {host_name}", v.name),
                            ));
                        }
                    }
                }
            }
        };
        out.push(OwnedVolume {
            entry: entry.to_owned(),
            host: host_name.to_owned(),
            name: v.name,
            kind: parsed.kind(),
            uid: parsed.uid(),
            age_since,
            domain_exists,
        });
    }
    Ok(out)
}

/// The later of `<target><timestamps><mtime>` and `<ctime>` in a volume's XML (file-backed
/// volumes report them as `SECONDS.NANOS`), if present.
pub fn last_change(xml: &str) -> Option<SystemTime> {
    use quick_xml::Reader;
    use quick_xml::events::Event;
    let mut reader = Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut best: Option<SystemTime> = None;
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => path.push(e.local_name().into_inner().to_owned()),
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) => {
                let in_ts = path.len() == 4
                    && path.first().is_some_and(|p| p == "volume")
                    && path.get(1).is_some_and(|p| p == "target")
                    && path.get(2).is_some_and(|p| p == "timestamps")
                    && path.get(3).is_some_and(|p| p == "mtime" || p == "ctime");
                if in_ts {
                    let text = t.xml10_content().into_owned();
                    if let Some(ts) = parse_timestamp(text.trim()) {
                        best = Some(best.map_or(ts, |b| b.max(ts)));
                    }
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    best
}

/// `SECONDS[.FRACTION]` since the epoch.
fn parse_timestamp(s: &str) -> Option<SystemTime> {
    let secs = s.split_once('.').map_or(s, |(a, _)| a);
    secs.parse::<u64>()
        .ok()
        .map(|n| UNIX_EPOCH + Duration::from_secs(n))
}

async fn lookup_pool(
    client: &Client,
    entry: &str,
    host_name: &str,
    pool_name: &str,
) -> Result<StoragePool> {
    match client.pool_lookup_by_name(pool_name).await {
        Ok(p) => Ok(p),
        Err(e) if is_code(&e, CODE_NO_STORAGE_POOL) => Err(ProviderError::permanent(format!(
            "storage pool {pool_name} (setting `pool` of host {host_name} in entry {entry}) \
             does not exist on the host; fix the setting or create the pool"
        ))
        .with_code(e.libvirt_code())),
        Err(e) => Err(classify(
            &e,
            &format!("looking up pool {pool_name} on host {host_name}"),
        )),
    }
}

/// Deletes the orphan volume `v` of `entry` from pool `pool_name`, re-checking first (see the
/// module guarantees). The caller holds whatever per-name lock keeps a create of the same UID
/// from running meanwhile.
pub async fn delete_orphan_volume(
    client: &Client,
    entry: &str,
    pool_name: &str,
    v: &OwnedVolume,
) -> Result<()> {
    let host = &v.host;
    let refuse = |why: String| {
        Err(ProviderError::permanent(format!(
            "refusing to delete volume {} on host {host}: {why}; nothing was touched",
            v.name
        )))
    };
    if v.entry != entry {
        return refuse(format!("it was listed for entry {}, not {entry}", v.entry));
    }
    let Some(parsed) = parse_volume_name(entry, &v.name) else {
        return refuse(format!(
            "its name is not of entry {entry}'s collectable scheme"
        ));
    };
    if parsed.kind() != v.kind || parsed.uid() != v.uid {
        return refuse(format!(
            "its name says {} of {:?}, the listing said {} of {:?}",
            parsed.kind(),
            parsed.uid().map(|u| u.canonical()),
            v.kind,
            v.uid.map(|u| u.canonical())
        ));
    }
    if let Some(uid) = parsed.uid() {
        let dom = names::domain(entry, &uid);
        match client.domain_lookup_by_name(&dom).await {
            Ok(_) => {
                return refuse(format!(
                    "domain {dom} exists on the host, so it is not an orphan (it may be that \
                     domain's disk)"
                ));
            }
            Err(e) if is_code(&e, CODE_NO_DOMAIN) => {}
            Err(e) => {
                return Err(classify(
                    &e,
                    &format!(
                        "looking up domain {dom} on host {host} before deleting {}",
                        v.name
                    ),
                ));
            }
        }
    }
    let pool = lookup_pool(client, entry, host, pool_name).await?;
    let ctx = || {
        format!(
            "deleting volume {} in pool {pool_name} on host {host}",
            v.name
        )
    };
    let vol = match client.vol_lookup_by_name(&pool, &v.name).await {
        Ok(vol) => vol,
        Err(e) if is_code(&e, CODE_NO_STORAGE_VOL) => return Ok(()),
        Err(e) => return Err(classify(&e, &ctx())),
    };
    if parsed.kind() == VolumeKind::Part {
        let vols = client
            .pool_list_volumes(&pool)
            .await
            .map_err(|e| classify(&e, &format!("listing pool {pool_name} on host {host}")))?;
        let referenced = cache::base_backing_paths(
            client,
            entry,
            &vols,
            &format!("in pool {pool_name} on host {host}"),
        )
        .await?;
        if referenced.contains(&cache::volume_path(client, &vol, &format!("on host {host}")).await?)
        {
            return refuse("a published base uses it as its data volume".into());
        }
    }
    match client.vol_delete(&vol, 0).await {
        Ok(()) => Ok(()),
        Err(e) if is_code(&e, CODE_NO_STORAGE_VOL) => Ok(()),
        Err(e) => Err(classify(&e, &ctx())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libvirt::config::ImageFormat;
    use crate::libvirt::names::ImageSource;

    fn uid() -> ProxyUid {
        ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap()
    }

    #[test]
    fn overlays_and_seeds_parse_back_to_their_uid_only_in_canonical_form() {
        // finding: E2
        let u = uid();
        assert_eq!(
            parse_volume_name("home", &names::overlay("home", &u)),
            Some(VolumeName::Overlay(u))
        );
        assert_eq!(
            parse_volume_name("home", &names::seed("home", &u)),
            Some(VolumeName::Seed(u))
        );
        let upper = names::overlay("home", &u).replace("0f8fad5b", "0F8FAD5B");
        for bad in [
            upper.as_str(),
            " ep-home-0f8fad5bd9cb469fa16570867728950e-root.qcow2",
            "ep-home-0f8fad5bd9cb469fa16570867728950e-root.qcow2 ",
            "ep-home-0f8fad5b-d9cb-469f-a165-70867728950e-root.qcow2",
            "ep-home-0f8fad5bd9cb469fa16570867728950e-root.qcow2.bak",
            "ep-home-0f8fad5bd9cb469fa16570867728950e",
            "ep-lab-0f8fad5bd9cb469fa16570867728950e-root.qcow2",
            "ep-home-lab-0f8fad5bd9cb469fa16570867728950e-root.qcow2",
            "other-0f8fad5bd9cb469fa16570867728950e-seed.iso",
        ] {
            assert_eq!(parse_volume_name("home", bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_last_change_is_the_later_of_mtime_and_ctime_under_target() {
        let xml = "<volume type='file'>\n  <name>v</name>\n  <target>\n    \
                   <path>/p/v</path>\n    <format type='qcow2'/>\n    <timestamps>\n      \
                   <atime>1800000000.5</atime>\n      <mtime>1700000100.123456789</mtime>\n      \
                   <ctime>1700000200.000000001</ctime>\n    </timestamps>\n  </target>\n  \
                   <backingStore><timestamps><mtime>1900000000</mtime></timestamps>\
                   </backingStore>\n</volume>";
        assert_eq!(
            last_change(xml),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_200))
        );
        assert_eq!(last_change("<volume><target/></volume>"), None);
        assert_eq!(last_change("garbage <"), None);
    }

    #[test]
    fn parts_parse_with_their_age_and_bases_and_markers_never_do() {
        let d = "a".repeat(64);
        let p = cache::part_name("home", "img-debian-12", Some(&d));
        assert!(matches!(
            parse_volume_name("home", &p),
            Some(VolumeName::Part { created_unix }) if created_unix > 1_700_000_000
        ));
        let pu = cache::part_name(
            "home",
            &names::source_key(ImageSource::Url("https://x/y")),
            None,
        );
        assert!(matches!(
            parse_volume_name("home", &pu),
            Some(VolumeName::Part { .. })
        ));
        let base = names::base(
            "home",
            ImageSource::Catalogue("debian-12"),
            &d,
            ImageFormat::Qcow2,
        );
        assert_eq!(parse_volume_name("home", &base), None);
        assert_eq!(parse_volume_name("home", &cache::marker_name(&base)), None);
        assert_eq!(parse_volume_name("lab", &p), None);
        for bad in [
            format!("{p}x"),
            p.replace(".part-", ".part-x"),
            format!("ep-home-base-img-k-{d}.part-123-ABCDEF0123456789"),
            format!("ep-home-base-zzz-k-{d}.part-123-0123456789abcdef"),
            format!(
                "ep-home-base-img-k-{}.part-123-0123456789abcdef",
                "a".repeat(63)
            ),
        ] {
            assert_eq!(parse_volume_name("home", &bad), None, "{bad:?}");
        }
    }
}
