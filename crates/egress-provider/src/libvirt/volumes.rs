//! Per-instance volumes: the pool-space check, the root overlay backed by the base, and the
//! cloud-init seed volume.
//!
//! Guarantees:
//! - The space check refreshes the pool first, so it never trusts libvirt's cached figure
//!   (finding M4), and keeps the configured reserve free; not fitting is QuotaExceeded naming
//!   the host, pool, sizes and reserve.
//! - An overlay smaller than the base's virtual size is refused before anything is created,
//!   naming `resources.diskGiB`, both sizes and the image (finding M5); an existing overlay is reused
//!   only if its capacity, format and backing store match (findings M5, L4), and is otherwise
//!   reported, never silently booted.
//! - Only volumes named from the UID are created or replaced here; bases are never touched.

use libvirt_remote::Client;
use libvirt_remote::proto::{StoragePool, StorageVol};

use super::classify::classify;
use super::config::ImageFormat;
use crate::error::{ProviderError, Result};

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// What the overlay must be backed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingBase {
    /// Path of the base volume on the host.
    pub path: String,
    /// The base's virtual size in bytes.
    pub capacity: u64,
    /// The base's format.
    pub format: ImageFormat,
    /// The image's name as the user wrote it (catalogue key or redacted URL), for messages.
    pub image: String,
}

/// Refreshes `pool` and checks that `needed` bytes fit while keeping `reserve` bytes free.
pub async fn check_space(
    client: &Client,
    host: &str,
    pool: &StoragePool,
    needed: u64,
    reserve: u64,
) -> Result<()> {
    client
        .pool_refresh(pool)
        .await
        .map_err(|e| classify(&e, &format!("refreshing pool {} on host {host}", pool.name)))?;
    let info = client
        .pool_info(pool)
        .await
        .map_err(|e| classify(&e, &format!("reading pool {} on host {host}", pool.name)))?;
    let usable = info.available.saturating_sub(reserve);
    if needed > usable {
        return Err(ProviderError::quota(format!(
            "pool {} on host {host} has {} MiB available, {} MiB reserved (poolReserveGiB), \
             and {} MiB are needed: free space on the host or lower the disk size",
            pool.name,
            info.available >> 20,
            reserve >> 20,
            needed >> 20
        )));
    }
    Ok(())
}

/// Checks that a disk of `disk_gib` can hold `base` (finding M5).
pub fn check_disk_size(disk_gib: u64, base: &BackingBase) -> Result<u64> {
    let disk = disk_gib.checked_mul(GIB).ok_or_else(|| {
        ProviderError::permanent(format!("resources.diskGiB {disk_gib} is too large"))
    })?;
    if disk < base.capacity {
        return Err(ProviderError::permanent(format!(
            "resources.diskGiB {disk_gib} ({disk} bytes) is smaller than image {}'s virtual \
             size ({} bytes, {:.2} GiB): raise resources.diskGiB (or the entry's \
             defaults.diskGiB) to at least {}",
            base.image,
            base.capacity,
            base.capacity as f64 / GIB as f64,
            base.capacity.div_ceil(GIB)
        )));
    }
    Ok(disk)
}

/// The facts of an existing volume that decide whether it can be reused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeFacts {
    /// Capacity in bytes.
    pub capacity: u64,
    /// Target format.
    pub format: Option<String>,
    /// Backing store path.
    pub backing: Option<String>,
    /// The volume's own path (`<target><path>`).
    pub path: Option<String>,
}

/// Reads capacity, format, own path and backing path from a volume's XML.
pub fn parse_volume_xml(xml: &str) -> Option<VolumeFacts> {
    use quick_xml::Reader;
    use quick_xml::events::Event;
    let mut reader = Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut facts = VolumeFacts::default();
    let mut unit = String::from("bytes");
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => {
                let name = e.local_name().into_inner().to_owned();
                if name == "capacity" {
                    unit = attr(&e, "unit").unwrap_or_else(|| "bytes".into());
                }
                path.push(name);
            }
            Event::Empty(e) => {
                let name = e.local_name().into_inner();
                if name == "format" {
                    match path.last().map(String::as_str) {
                        Some("target") if path.len() == 2 => facts.format = attr(&e, "type"),
                        _ => {}
                    }
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) => {
                let text = t.xml10_content().trim().to_owned();
                let p: Vec<&str> = path.iter().map(String::as_str).collect();
                match p.as_slice() {
                    ["volume", "capacity"] => {
                        facts.capacity = to_bytes(text.parse().ok()?, &unit)?;
                    }
                    ["volume", "backingStore", "path"] => facts.backing = Some(text),
                    ["volume", "target", "path"] => facts.path = Some(text),
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    Some(facts)
}

fn attr(e: &quick_xml::events::BytesStart<'_>, name: &str) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.local_name().into_inner() == name)
        .and_then(|a| {
            a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .ok()
                .map(|v| v.into_owned())
        })
}

fn to_bytes(v: u64, unit: &str) -> Option<u64> {
    let mul: u64 = match unit {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    v.checked_mul(mul)
}

/// The XML of a qcow2 overlay of `disk` bytes backed by `base`.
pub fn overlay_xml(name: &str, disk: u64, base: &BackingBase) -> String {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{disk}</capacity>\
         <target><format type='qcow2'/></target>\
         <backingStore><path>{}</path><format type='{}'/></backingStore></volume>",
        esc(name),
        esc(&base.path),
        base.format.as_str()
    )
}

/// Creates the overlay `name` in `pool`, or verifies an existing one. Returns the volume and
/// whether this call created it (so a failed create can remove only what it made).
pub async fn ensure_overlay(
    client: &Client,
    host: &str,
    pool: &StoragePool,
    name: &str,
    disk: u64,
    base: &BackingBase,
) -> Result<(StorageVol, bool)> {
    // NB: create first (one round trip on the usual path); "exists" (90) means a previous
    // attempt made it, and it is verified before reuse.
    match client
        .vol_create_xml(pool, &overlay_xml(name, disk, base), 0)
        .await
    {
        Ok(vol) => Ok((vol, true)),
        Err(e) if e.libvirt_code() == Some(90) => {
            let vol = client
                .vol_lookup_by_name(pool, name)
                .await
                .map_err(|e| classify(&e, &format!("looking up overlay {name} on host {host}")))?;
            let xml = client
                .vol_xml(&vol)
                .await
                .map_err(|e| classify(&e, &format!("reading overlay {name} on host {host}")))?;
            let facts = parse_volume_xml(&xml).ok_or_else(|| {
                ProviderError::transient(format!(
                    "cannot read overlay {name}'s description on host {host}"
                ))
            })?;
            verify_overlay(name, host, &facts, disk, base)?;
            Ok((vol, false))
        }
        Err(e) => Err(classify(
            &e,
            &format!("creating overlay {name} on host {host}"),
        )),
    }
}

/// Checks that an existing overlay is the one we would create (findings M5, L4).
pub fn verify_overlay(
    name: &str,
    host: &str,
    facts: &VolumeFacts,
    disk: u64,
    base: &BackingBase,
) -> Result<()> {
    let problem = if facts.backing.as_deref() != Some(base.path.as_str()) {
        Some(format!(
            "is backed by {:?}, not by the base {}",
            facts.backing.as_deref().unwrap_or("nothing"),
            base.path
        ))
    } else if facts.format.as_deref() != Some("qcow2") {
        Some(format!("has format {:?}, not qcow2", facts.format))
    } else if facts.capacity < base.capacity {
        Some(format!(
            "holds {} bytes, less than the image's {} bytes",
            facts.capacity, base.capacity
        ))
    } else if facts.capacity != disk {
        Some(format!(
            "holds {} bytes, not the requested {disk}",
            facts.capacity
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        // NB: Transient, not Permanent: delete (by UID) removes it and the next create makes
        // a correct one; the message says so.
        Some(p) => Err(ProviderError::transient(format!(
            "existing overlay {name} on host {host} {p}; it is left untouched — delete the \
             Proxy's instance to recreate it"
        ))),
    }
}

/// The XML of a raw seed volume of `size` bytes.
pub fn seed_xml(name: &str, size: u64) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{size}</capacity>\
         <target><format type='raw'/></target></volume>",
        quick_xml::escape::escape(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(cap: u64) -> BackingBase {
        BackingBase {
            path: "/pool/ep-home-base-img-deb-aa.qcow2".into(),
            capacity: cap,
            format: ImageFormat::Qcow2,
            image: "deb".into(),
        }
    }

    #[test]
    fn a_disk_smaller_than_the_image_is_refused_naming_both_sizes() {
        // finding: M5
        let e = check_disk_size(2, &base(3 * GIB + 1)).unwrap_err();
        assert!(e.is_permanent());
        assert!(e.message.contains("resources.diskGiB 2"), "{}", e.message);
        assert!(
            e.message.contains(&(3 * GIB + 1).to_string()),
            "{}",
            e.message
        );
        assert!(e.message.contains("image deb"), "{}", e.message);
        assert!(e.message.contains("at least 4"), "{}", e.message);
        assert_eq!(check_disk_size(4, &base(3 * GIB + 1)).unwrap(), 4 * GIB);
        assert!(
            check_disk_size(u64::MAX, &base(1)).is_err(),
            "checked arithmetic"
        );
    }

    #[test]
    fn volume_xml_facts_are_read_with_units() {
        let xml = "<volume type='file'><name>x</name><capacity unit='G'>5</capacity>\
                   <target><path>/p/x</path><format type='qcow2'/></target>\
                   <backingStore><path>/p/b</path><format type='raw'/></backingStore></volume>";
        let f = parse_volume_xml(xml).unwrap();
        assert_eq!(f.capacity, 5 * GIB);
        assert_eq!(f.format.as_deref(), Some("qcow2"));
        assert_eq!(f.backing.as_deref(), Some("/p/b"));
        assert_eq!(f.path.as_deref(), Some("/p/x"));
    }

    #[test]
    fn a_reused_overlay_must_match_base_format_and_size() {
        // finding: M5, L4
        let b = base(GIB);
        let good = VolumeFacts {
            capacity: 2 * GIB,
            format: Some("qcow2".into()),
            backing: Some(b.path.clone()),
            path: None,
        };
        verify_overlay("o", "h", &good, 2 * GIB, &b).unwrap();
        let short = VolumeFacts {
            capacity: GIB / 2,
            ..good.clone()
        };
        assert!(verify_overlay("o", "h", &short, 2 * GIB, &b).is_err());
        let other_base = VolumeFacts {
            backing: Some("/p/other".into()),
            ..good.clone()
        };
        let e = verify_overlay("o", "h", &other_base, 2 * GIB, &b).unwrap_err();
        assert!(e.message.contains("/p/other"), "{}", e.message);
        let raw = VolumeFacts {
            format: Some("raw".into()),
            ..good
        };
        assert!(verify_overlay("o", "h", &raw, 2 * GIB, &b).is_err());
    }
}
