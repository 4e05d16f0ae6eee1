//! Image format detection from the first bytes (finding L7).
//!
//! Guarantees: qcow2 is recognised by its magic `QFI\xfb`; archives and other disk formats
//! that would boot as garbage if taken for raw (gzip, xz, bzip2, zstd, VMDK, VHD, VHDX, VDI)
//! are refused by name; anything else is raw. The declared format must equal the detected one.
//!
//! A disk image must not reach outside itself: a qcow2 header naming a backing file
//! (`backing_file_offset` ≠ 0), an external data file (incompatible feature bit 2, the
//! `data_file` option) or encryption (`crypt_method` ≠ 0), and a LUKS container, are refused
//! from these first bytes, before the upload goes further. Such an image would make libvirt and
//! QEMU open a host file the image names (another tenant's seed, `/etc/shadow`) for the guest.

use crate::error::{ProviderError, Result};
use crate::libvirt::config::ImageFormat;

/// How many leading bytes [`detect`] looks at.
// NB: the qcow2 v3 header's fields up to `incompatible_features` (bytes 72..80) must be
// read; 104 bytes is the whole fixed v3 header (through `header_length`), which also covers
// the longest other magic (VDI at offset 64..68).
pub const SNIFF_LEN: usize = 104;

/// The LUKS (v1 and v2) container magic.
pub const LUKS_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";

/// qcow2 incompatible feature bit: the guest data lives in an external data file.
pub const QCOW2_INCOMPAT_DATA_FILE: u64 = 1 << 2;

/// The qcow2 magic.
pub const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";

/// The format of an image that starts with `head` (at most [`SNIFF_LEN`] bytes; fewer only
/// when the image is that short). Err names the unsupported format found.
pub fn detect(head: &[u8]) -> std::result::Result<ImageFormat, &'static str> {
    let starts = |m: &[u8]| head.starts_with(m);
    if starts(QCOW2_MAGIC) {
        return Ok(ImageFormat::Qcow2);
    }
    let known: &[(&[u8], &'static str)] = &[
        (b"\x1f\x8b", "gzip-compressed"),
        (b"\xfd7zXZ\x00", "xz-compressed"),
        (b"BZh", "bzip2-compressed"),
        (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
        (b"KDMV", "VMDK"),
        (b"conectix", "VHD"),
        (b"vhdxfile", "VHDX"),
        (LUKS_MAGIC, "LUKS-encrypted"),
    ];
    if let Some((_, name)) = known.iter().find(|(m, _)| starts(m)) {
        return Err(name);
    }
    if head.get(64..68) == Some(b"\x7f\x10\xda\xbe") {
        return Err("VDI");
    }
    Ok(ImageFormat::Raw)
}

fn be_u32(head: &[u8], at: usize) -> Option<u32> {
    let b = head.get(at..at + 4)?;
    Some(u32::from_be_bytes(<[u8; 4]>::try_from(b).ok()?))
}

fn be_u64(head: &[u8], at: usize) -> Option<u64> {
    let b = head.get(at..at + 8)?;
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(b).ok()?))
}

/// Why a qcow2 image starting with `head` would reach outside itself, if it would: a backing
/// file, an external data file, or encryption. A header too short to hold a field counts as
/// refusing it (QEMU could not open such an image either).
pub fn qcow2_reaches_outside(head: &[u8]) -> Option<String> {
    let version = be_u32(head, 4)?;
    let backing_offset = be_u64(head, 8);
    match backing_offset {
        Some(0) => {}
        Some(off) => {
            return Some(format!(
                "names a backing file (qcow2 header backing_file_offset {off})"
            ));
        }
        None => return Some("has a truncated qcow2 header".into()),
    }
    match be_u32(head, 32) {
        Some(0) => {}
        Some(m) => {
            let how = match m {
                1 => "AES",
                2 => "LUKS",
                _ => "an unknown method",
            };
            return Some(format!(
                "is encrypted ({how}; qcow2 header crypt_method {m})"
            ));
        }
        None => return Some("has a truncated qcow2 header".into()),
    }
    if version >= 3 {
        match be_u64(head, 72) {
            Some(f) if f & QCOW2_INCOMPAT_DATA_FILE != 0 => {
                return Some(format!(
                    "keeps its data in an external data file (qcow2 incompatible feature \
                     bit 2 set, incompatible_features {f:#x})"
                ));
            }
            Some(_) => {}
            None => return Some("has a truncated qcow2 header".into()),
        }
    }
    None
}

/// Checks the detected format against the declared one (`None`: accept what was detected),
/// and refuses a qcow2 header that reaches outside the image ([`qcow2_reaches_outside`]).
pub fn check(head: &[u8], declared: Option<ImageFormat>, what: &str) -> Result<ImageFormat> {
    let found = check_format(head, declared, what)?;
    self_contained(head, found, what)?;
    Ok(found)
}

/// Refuses, Permanent, an image of format `found` whose header (`head`) reaches outside it
/// ([`qcow2_reaches_outside`]); the message names `what` and what was refused.
pub fn self_contained(head: &[u8], found: ImageFormat, what: &str) -> Result<()> {
    if found == ImageFormat::Qcow2
        && let Some(why) = qcow2_reaches_outside(head)
    {
        return Err(ProviderError::permanent(format!(
            "{what} refused: it {why}; a disk image must be self-contained (no backing file, \
             no external data file, no encryption): flatten it with `qemu-img convert -O qcow2`"
        )));
    }
    Ok(())
}

/// Checks the detected format against the declared one (`None`: accept what was detected),
/// without looking further into the header.
pub fn check_format(head: &[u8], declared: Option<ImageFormat>, what: &str) -> Result<ImageFormat> {
    let found = detect(head).map_err(|name| {
        ProviderError::permanent(format!(
            "{what} is {name}, which is not a bootable disk image; serve a qcow2 or raw image"
        ))
    })?;
    match declared {
        Some(d) if d != found => Err(ProviderError::permanent(format!(
            "{what} is declared {} but its bytes are {}; fix the format setting or the URL",
            d.as_str(),
            found.as_str()
        ))),
        _ => Ok(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qcow2_is_recognised_by_its_magic_and_everything_plain_is_raw() {
        // finding: L7
        assert_eq!(detect(b"QFI\xfb\0\0\0\x03"), Ok(ImageFormat::Qcow2));
        assert_eq!(detect(&[0u8; 72]), Ok(ImageFormat::Raw));
        assert_eq!(detect(b""), Ok(ImageFormat::Raw));
        assert_eq!(detect(b"\x1f\x8b\x08"), Err("gzip-compressed"));
        assert!(check(&[0u8; 72], Some(ImageFormat::Qcow2), "image x").is_err());
        assert!(check(b"QFI\xfb", Some(ImageFormat::Raw), "image x").is_err());
    }

    fn header(version: u32, backing: u64, crypt: u32, incompat: u64) -> Vec<u8> {
        let mut h = b"QFI\xfb".to_vec();
        h.extend_from_slice(&version.to_be_bytes());
        h.extend_from_slice(&backing.to_be_bytes());
        h.extend_from_slice(&0u32.to_be_bytes());
        h.extend_from_slice(&16u32.to_be_bytes());
        h.extend_from_slice(&(1u64 << 30).to_be_bytes());
        h.extend_from_slice(&crypt.to_be_bytes());
        h.resize(72, 0);
        h.extend_from_slice(&incompat.to_be_bytes());
        h.resize(SNIFF_LEN, 0);
        h
    }

    #[test]
    fn a_qcow2_header_with_a_backing_file_data_file_or_encryption_is_refused() {
        assert_eq!(qcow2_reaches_outside(&header(3, 0, 0, 0)), None);
        assert_eq!(qcow2_reaches_outside(&header(3, 0, 0, 1)), None); // dirty bit only
        assert_eq!(qcow2_reaches_outside(&header(2, 0, 0, 4)), None); // v2 has no feature field
        let e = check(&header(3, 0x150, 0, 0), None, "image x").unwrap_err();
        assert!(e.to_string().contains("image x") && e.to_string().contains("backing file"));
        assert!(e.is_permanent());
        let e = check(&header(3, 0, 2, 0), None, "image x").unwrap_err();
        assert!(e.to_string().contains("encrypted (LUKS"), "{e}");
        let e = check(&header(3, 0, 0, 4), None, "image x").unwrap_err();
        assert!(e.to_string().contains("external data file"), "{e}");
        assert!(qcow2_reaches_outside(b"QFI\xfb\0\0\0\x03").is_some());
        assert_eq!(detect(b"LUKS\xba\xbe\0\x02"), Err("LUKS-encrypted"));
    }
}
