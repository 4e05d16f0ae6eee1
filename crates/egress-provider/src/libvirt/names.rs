//! Every name the provider uses, derived from the provider entry and the Proxy UID (or, for
//! bases, from the entry, the image key and the content digest).
//!
//! Guarantees: names of two entries never collide (the entry is in every name); a base's name
//! is bound to its full sha256 digest, so a new digest is a new volume (findings H4, M13, L8);
//! catalogue keys and URL images live under distinct prefixes (L8); a UID maps to exactly one
//! domain, overlay, seed and MAC per entry.

use sha2::{Digest, Sha256};

use super::config::ImageFormat;
use crate::model::ProxyUid;

/// Prefix of everything this operator creates on a host.
pub const PREFIX: &str = "ep-";

/// The domain name of `uid` in `entry`.
pub fn domain(entry: &str, uid: &ProxyUid) -> String {
    format!("{PREFIX}{entry}-{}", uid.simple())
}

/// The root overlay volume of `uid` in `entry`.
pub fn overlay(entry: &str, uid: &ProxyUid) -> String {
    format!("{PREFIX}{entry}-{}-root.qcow2", uid.simple())
}

/// The cloud-init seed volume of `uid` in `entry`.
pub fn seed(entry: &str, uid: &ProxyUid) -> String {
    format!("{PREFIX}{entry}-{}-seed.iso", uid.simple())
}

/// The root network filter of `entry` for `installation` (`None`: an installation without an
/// ID): one per entry and installation, so two installations sharing a host never replace
/// each other's policy. `filter2`: the set with anti-spoofing (guests created before
/// reference the destination-only `…-filter…` of earlier releases, left as it is).
pub fn nwfilter(entry: &str, installation: Option<&str>) -> String {
    match installation {
        Some(id) => format!("{PREFIX}{entry}-filter2-{id}"),
        None => format!("{PREFIX}{entry}-filter2"),
    }
}

/// Where a base image comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource<'a> {
    /// A catalogue key.
    Catalogue(&'a str),
    /// A URL (only when URL images are enabled).
    Url(&'a str),
}

/// The identity of an image source within an entry: `img-<key>` or `url-<sha256(url)>`.
pub fn source_key(src: ImageSource<'_>) -> String {
    match src {
        ImageSource::Catalogue(k) => format!("img-{k}"),
        ImageSource::Url(u) => format!("url-{}", hex_sha256(u.as_bytes())),
    }
}

/// The published base volume for content `digest` (64 lowercase hex) from `src`.
pub fn base(entry: &str, src: ImageSource<'_>, digest: &str, format: ImageFormat) -> String {
    format!(
        "{PREFIX}{entry}-base-{}-{digest}.{}",
        source_key(src),
        format.as_str()
    )
}

/// Prefix shared by every base of `entry` (for listing and collection).
pub fn base_prefix(entry: &str) -> String {
    format!("{PREFIX}{entry}-base-")
}

/// The MAC address of `uid`'s NIC in `entry`, given to every guest created now: `52` (a
/// locally administered unicast first octet) and 40 bits of a hash of entry and UID, never in
/// the `52:54:00` range (QEMU's default prefix, and [`legacy_mac`]'s): a new guest's MAC never
/// equals an older guest's. With n guests on one segment a collision has probability about
/// n²/2⁴¹ (5·10⁻⁷ at 1,000 guests).
pub fn mac(entry: &str, uid: &ProxyUid) -> String {
    let h = Sha256::digest(format!("{entry}/{}", uid.canonical()).as_bytes());
    let byte = |i: usize| h.get(i).copied().unwrap_or(0);
    let (a, mut b) = (byte(0), byte(1));
    if a == 0x54 && b == 0x00 {
        b = 0x01;
    }
    format!(
        "52:{a:02x}:{b:02x}:{:02x}:{:02x}:{:02x}",
        byte(2),
        byte(3),
        byte(4)
    )
}

/// The MAC address guests created before [`mac`] got: QEMU's `52:54:00` prefix and 24 bits of
/// the same hash. Such a guest keeps it for its life; the address lookup matches our NIC by
/// either ([`macs`]).
pub fn legacy_mac(entry: &str, uid: &ProxyUid) -> String {
    let h = Sha256::digest(format!("{entry}/{}", uid.canonical()).as_bytes());
    let byte = |i: usize| h.get(i).copied().unwrap_or(0);
    format!("52:54:00:{:02x}:{:02x}:{:02x}", byte(0), byte(1), byte(2))
}

/// The MACs `uid`'s NIC in `entry` may have: [`mac`] (guests created now), then [`legacy_mac`].
pub fn macs(entry: &str, uid: &ProxyUid) -> [String; 2] {
    [mac(entry, uid), legacy_mac(entry, uid)]
}

/// The UID a domain name of `entry` encodes, if it is one of ours.
pub fn uid_of_domain(entry: &str, name: &str) -> Option<ProxyUid> {
    let simple = name
        .strip_prefix(PREFIX)?
        .strip_prefix(entry)?
        .strip_prefix('-')?;
    if simple.len() != 32
        || !simple
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    uuid::Uuid::try_parse(simple).ok().map(ProxyUid)
}

/// Lowercase hex sha256 of `bytes`.
pub fn hex_sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in d.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> ProxyUid {
        ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap()
    }

    #[test]
    fn names_carry_the_entry_and_the_uid() {
        let u = uid();
        assert_eq!(
            domain("home", &u),
            "ep-home-0f8fad5bd9cb469fa16570867728950e"
        );
        assert_eq!(
            overlay("home", &u),
            "ep-home-0f8fad5bd9cb469fa16570867728950e-root.qcow2"
        );
        assert_eq!(
            seed("home", &u),
            "ep-home-0f8fad5bd9cb469fa16570867728950e-seed.iso"
        );
        assert_ne!(domain("home", &u), domain("lab", &u));
        assert_eq!(uid_of_domain("home", &domain("home", &u)), Some(u));
        assert_eq!(uid_of_domain("lab", &domain("home", &u)), None);
        assert_eq!(
            uid_of_domain("home", "ep-home-0F8FAD5BD9CB469FA16570867728950E"),
            None
        );
    }

    #[test]
    fn base_names_are_bound_to_entry_source_and_full_digest() {
        // finding: H4, M13, L8
        let d1 = "a".repeat(64);
        let d2 = "b".repeat(64);
        let cat = ImageSource::Catalogue("debian-12");
        let b1 = base("home", cat, &d1, ImageFormat::Qcow2);
        assert_eq!(b1, format!("ep-home-base-img-debian-12-{d1}.qcow2"));
        assert_ne!(
            b1,
            base("home", cat, &d2, ImageFormat::Qcow2),
            "new digest, new volume"
        );
        assert_ne!(
            b1,
            base("lab", cat, &d1, ImageFormat::Qcow2),
            "entries never share"
        );
        let url = base(
            "home",
            ImageSource::Url("https://x/debian-12"),
            &d1,
            ImageFormat::Qcow2,
        );
        assert!(url.starts_with("ep-home-base-url-"), "{url}");
        assert_eq!(
            url.len(),
            "ep-home-base-url-".len() + 64 + 1 + 64 + ".qcow2".len()
        );
        // A catalogue key that looks like a URL hash still lands under img-.
        let sneaky = format!("url-{}", hex_sha256(b"https://x/debian-12"));
        assert_ne!(
            url,
            base(
                "home",
                ImageSource::Catalogue(&sneaky),
                &d1,
                ImageFormat::Qcow2
            )
        );
    }

    #[test]
    fn macs_are_stable_local_and_distinct_per_entry() {
        let u = uid();
        let m = mac("home", &u);
        assert!(m.starts_with("52:") && m.len() == 17, "{m}");
        assert!(!m.starts_with("52:54:00:"), "{m}");
        assert_eq!(m, mac("home", &u));
        assert_ne!(m, mac("lab", &u));
        let l = legacy_mac("home", &u);
        assert!(l.starts_with("52:54:00:") && l.len() == 17, "{l}");
        assert_eq!(macs("home", &u), [m, l]);
    }

    #[test]
    fn legacy_macs_keep_their_derivation() {
        // A guest created before the 40-bit derivation is found by this MAC: it never changes.
        let u = ProxyUid(uuid::Uuid::from_u128(
            0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
        ));
        let h = Sha256::digest(format!("home/{}", u.canonical()).as_bytes());
        let want = format!("52:54:00:{:02x}:{:02x}:{:02x}", h[0], h[1], h[2]);
        assert_eq!(legacy_mac("home", &u), want);
    }

    #[test]
    fn forty_hash_bits_keep_a_large_segment_free_of_collisions() {
        // 2^14 guests: with 24 bits about 8 pairs would collide (n²/2²⁵); with 40 bits the
        // chance of any is 1.2·10⁻⁴, and these UIDs are fixed, so the test is deterministic.
        let mut seen = std::collections::HashSet::new();
        for i in 0..(1u128 << 14) {
            let u = ProxyUid(uuid::Uuid::from_u128(i));
            let m = mac("home", &u);
            assert!(!m.starts_with("52:54:00:"), "{m}");
            assert!(seen.insert(m.clone()), "two guests of one entry derive {m}");
        }
    }
}
