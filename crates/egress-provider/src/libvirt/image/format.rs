//! Image format detection from the first bytes (finding L7).
//!
//! Guarantees: qcow2 is recognised by its magic `QFI\xfb`; archives and other disk formats
//! that would boot as garbage if taken for raw (gzip, xz, bzip2, zstd, VMDK, VHD, VHDX, VDI)
//! are refused by name; anything else is raw. The declared format must equal the detected one.

use crate::error::{ProviderError, Result};
use crate::libvirt::config::ImageFormat;

/// How many leading bytes [`detect`] looks at.
// NB: the longest magic recognised (VHDX "vhdxfile", VDI at offset 64..68) fits in 72 bytes.
pub const SNIFF_LEN: usize = 72;

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
    ];
    if let Some((_, name)) = known.iter().find(|(m, _)| starts(m)) {
        return Err(name);
    }
    if head.get(64..68) == Some(b"\x7f\x10\xda\xbe") {
        return Err("VDI");
    }
    Ok(ImageFormat::Raw)
}

/// Checks the detected format against the declared one (`None`: accept what was detected).
pub fn check(head: &[u8], declared: Option<ImageFormat>, what: &str) -> Result<ImageFormat> {
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
        assert_eq!(check(b"QFI\xfb", None, "x").unwrap(), ImageFormat::Qcow2);
    }
}
