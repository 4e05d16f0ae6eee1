//! The ownership mark: domain metadata in our own namespace saying the domain is managed by
//! us, for which Proxy UID, in which entry, for which installation, since when.
//!
//! Guarantees (findings M2, E2, L9): [`parse`] accepts only a mark whose `managed` is exactly
//! `true`, whose UID is a canonical lowercase UUID with no padding, whose entry equals the
//! expected entry exactly, and whose creation time is RFC 3339; anything else is `None`, and
//! a domain without a valid mark is never touched. A creation time in the future is clamped
//! to now in [`Mark::created_at`]; the time as written stays in [`Mark::recorded_at`], so the
//! listing can restamp a future-dated mark with the time it was first seen (see
//! [`crate::libvirt::ops::list`]) and the age it reports then grows from that stamp.
//!
//! Installation identity: a mark may carry an `installation` field, an ID checked by
//! [`valid_installation_id`] (a present but invalid, padded or duplicated one makes the mark
//! invalid). A mark written before the field existed parses with [`Mark::installation`]
//! `None`; [`Mark::owner`] tells an installation whether a mark is its own, a mark without an
//! ID to adopt and rewrite once ([`Owner::Unclaimed`]), or another installation's
//! ([`Owner::Foreign`], never collected, adopted or rewritten).
//!
//! Declared egress addresses: a mark may carry up to two `address` fields, the addresses the
//! instance was allocated from its host's address pool (at most one per family), written in
//! canonical form (`203.0.113.5`, `2001:db8::5`: what [`IpAddr`]'s `Display` writes). A
//! present address that is not exactly that form, or two of one family, make the whole mark
//! invalid (as an invalid installation ID does): the domain is then not ours — never adopted,
//! deleted or collected — and, its claim being unreadable, the allocator cannot count what it
//! holds; writing such a mark takes a hand edit of the domain's metadata, and the config
//! check's rule that pools of hosts sharing a segment do not overlap is what keeps our own
//! allocations apart. A mark written before the field existed parses with no address.

use std::net::IpAddr;
use std::time::SystemTime;

use quick_xml::Reader;
use quick_xml::events::Event;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::model::ProxyUid;

/// The metadata namespace URI of the mark.
pub const NAMESPACE: &str = "https://egress-proxies.dev/libvirt/v1";
/// The key (element prefix) libvirt stores the mark under.
pub const KEY: &str = "ep";

/// A verified mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The Proxy UID.
    pub uid: ProxyUid,
    /// The provider entry.
    pub entry: String,
    /// Creation time (never in the future: a later recorded time reads as `now`).
    pub created_at: SystemTime,
    /// The creation time exactly as recorded in the mark (may be in the future).
    pub recorded_at: SystemTime,
    /// The installation that wrote the mark; `None` for a mark written before installation
    /// identity existed.
    pub installation: Option<String>,
    /// The declared egress addresses allocated to the instance (at most one per family, IPv4
    /// first); empty for an instance without any (no address pool on its host, or a mark
    /// written before the field existed).
    pub addresses: Vec<IpAddr>,
}

/// Whose a parsed mark is, from the point of view of one installation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The mark carries this installation's ID (or neither side has an ID).
    Ours,
    /// The mark carries no ID while this installation has one: it predates installation
    /// identity; the listing adopts it once and rewrites it with this installation's ID.
    Unclaimed,
    /// The mark carries another installation's ID (or an ID while this installation has
    /// none): never collected, adopted or rewritten.
    Foreign,
}

impl Mark {
    /// Whose this mark is for the installation `ours` (`None`: an installation without an ID).
    pub fn owner(&self, ours: Option<&str>) -> Owner {
        match (self.installation.as_deref(), ours) {
            (None, None) => Owner::Ours,
            (None, Some(_)) => Owner::Unclaimed,
            (Some(m), Some(o)) if m == o => Owner::Ours,
            (Some(_), _) => Owner::Foreign,
        }
    }
}

/// Longest installation ID.
// NB: a DNS label's length: a Kubernetes namespace/release pair or a UUID fits.
pub const MAX_INSTALLATION_ID_LEN: usize = 63;

/// Whether `id` is a valid installation ID: 1 to [`MAX_INSTALLATION_ID_LEN`] characters of
/// lowercase ASCII letters, digits, `-` and `.`, starting and ending with a letter or digit.
/// Such an ID needs no escaping in XML and reads back byte for byte.
pub fn valid_installation_id(id: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_INSTALLATION_ID_LEN
        && b.iter().all(|&c| alnum(c) || c == b'-' || c == b'.')
        && b.first().copied().is_some_and(alnum)
        && b.last().copied().is_some_and(alnum)
}

/// The mark without an installation ID, as written before installation identity existed
/// (what [`render_for`] writes for an installation without an ID).
pub fn render(uid: &ProxyUid, entry: &str, created_at: SystemTime) -> String {
    render_for(uid, entry, None, created_at)
}

/// The metadata XML written at define (the element libvirt stores under [`NAMESPACE`]),
/// carrying `installation` when given. An ID that fails [`valid_installation_id`] is not
/// written (the config refuses one before any mark is written).
pub fn render_for(
    uid: &ProxyUid,
    entry: &str,
    installation: Option<&str>,
    created_at: SystemTime,
) -> String {
    render_with(uid, entry, installation, &[], created_at)
}

/// [`render_for`] carrying the instance's declared egress `addresses` (at most one per family;
/// extra ones of a family are not written, so what is written always parses back).
pub fn render_with(
    uid: &ProxyUid,
    entry: &str,
    installation: Option<&str>,
    addresses: &[IpAddr],
    created_at: SystemTime,
) -> String {
    let mut addrs = String::new();
    for v4 in [true, false] {
        if let Some(a) = addresses.iter().find(|a| a.is_ipv4() == v4) {
            addrs.push_str(&format!("<{KEY}:address>{a}</{KEY}:address>"));
        }
    }
    let inst = installation
        .filter(|i| valid_installation_id(i))
        .map(|i| format!("<{KEY}:installation>{i}</{KEY}:installation>"))
        .unwrap_or_default();
    let ts = OffsetDateTime::from(created_at)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
    format!(
        "<{KEY}:instance xmlns:{KEY}=\"{NAMESPACE}\"><{KEY}:managed>true</{KEY}:managed>\
         <{KEY}:uid>{}</{KEY}:uid><{KEY}:entry>{}</{KEY}:entry>{inst}{addrs}\
         <{KEY}:createdAt>{ts}</{KEY}:createdAt></{KEY}:instance>",
        uid.canonical(),
        xml_escape(entry),
    )
}

/// The mark as [`render`] writes it, but without a namespace prefix: the form
/// `DOMAIN_SET_METADATA` takes (libvirt puts the element under [`KEY`] and [`NAMESPACE`]
/// itself). [`parse`] reads both forms alike.
pub fn render_for_set_metadata(
    uid: &ProxyUid,
    entry: &str,
    installation: Option<&str>,
    addresses: &[IpAddr],
    created_at: SystemTime,
) -> String {
    render_with(uid, entry, installation, addresses, created_at)
        .replace(&format!(" xmlns:{KEY}=\"{NAMESPACE}\""), "")
        .replace(&format!("<{KEY}:"), "<")
        .replace(&format!("</{KEY}:"), "</")
}

fn xml_escape(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

/// Parses a mark as returned by `DOMAIN_GET_METADATA` for [`NAMESPACE`], requiring `entry`.
/// Returns `None` for anything that is not exactly a mark of ours for that entry.
pub fn parse(xml: &str, entry: &str, now: SystemTime) -> Option<Mark> {
    parse_any(xml, now).filter(|m| m.entry == entry)
}

/// Parses a mark of any entry, as strictly as [`parse`] (the entry is taken from the mark and
/// must be non-empty). For the address listing, which counts every mark's addresses.
pub fn parse_any(xml: &str, now: SystemTime) -> Option<Mark> {
    let mut reader = Reader::from_str(xml);
    let mut depth = 0usize;
    let mut current: Option<String> = None;
    let (mut managed, mut uid, mut ent, mut created) = (None, None, None, None);
    let mut installation = None;
    // NB: an empty `<installation></installation>` yields no text event; it must not read
    // as a mark without the field (which would be adopted).
    let mut installation_elements = 0usize;
    let mut addresses: Vec<IpAddr> = Vec::new();
    // NB: an empty `<address></address>` yields no text event; it must not be ignored.
    let mut address_elements = 0usize;
    let mut root_seen = false;
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => {
                let name = e.local_name().into_inner().to_owned();
                depth += 1;
                match depth {
                    1 => {
                        if name != "instance" || root_seen {
                            return None;
                        }
                        root_seen = true;
                    }
                    2 => {
                        if name == "installation" {
                            installation_elements += 1;
                        }
                        if name == "address" {
                            address_elements += 1;
                        }
                        current = Some(name);
                    }
                    _ => return None,
                }
            }
            Event::End(_) => {
                depth = depth.checked_sub(1)?;
                current = None;
            }
            Event::Text(t) => {
                let text = t.xml10_content().into_owned();
                if current.as_deref() == Some("address") {
                    // Exactly the canonical form, one per family.
                    let ip: IpAddr = text.parse().ok()?;
                    if ip.to_string() != text
                        || addresses.iter().any(|a| a.is_ipv4() == ip.is_ipv4())
                    {
                        return None;
                    }
                    addresses.push(ip);
                    continue;
                }
                if let Some(field) = current.as_deref() {
                    let slot = match field {
                        "managed" => &mut managed,
                        "uid" => &mut uid,
                        "entry" => &mut ent,
                        "createdAt" => &mut created,
                        "installation" => &mut installation,
                        _ => continue,
                    };
                    if slot.is_some() {
                        return None; // duplicated field
                    }
                    *slot = Some(text);
                } else if !text.trim().is_empty() {
                    return None;
                }
            }
            // NB: none of our fields ever needs an entity or CDATA; their presence means the
            // mark was not written by us.
            Event::Empty(_) | Event::CData(_) | Event::GeneralRef(_) => return None,
            Event::Eof => break,
            _ => {}
        }
    }
    if managed.as_deref() != Some("true") {
        return None;
    }
    let uid = ProxyUid::parse_strict(uid.as_deref()?)?;
    let entry = ent.filter(|e| !e.is_empty())?;
    if address_elements != addresses.len() {
        return None;
    }
    addresses.sort_by_key(|a| !a.is_ipv4());
    let t = OffsetDateTime::parse(created.as_deref()?, &Rfc3339).ok()?;
    let recorded_at = SystemTime::from(t);
    let installation_ok = match (installation_elements, installation.as_deref()) {
        (0, None) => true,
        (1, Some(i)) => valid_installation_id(i),
        _ => false,
    };
    if !installation_ok {
        return None;
    }
    Some(Mark {
        uid,
        entry,
        created_at: recorded_at.min(now),
        recorded_at,
        installation,
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn uid() -> ProxyUid {
        ProxyUid::parse_strict("0f8fad5b-d9cb-469f-a165-70867728950e").unwrap()
    }

    /// The mark as libvirt returns it: namespace declared as default, re-indented.
    fn as_libvirt_returns(uid: &str, entry: &str, created: &str) -> String {
        format!(
            "<instance xmlns=\"{NAMESPACE}\">\n  <managed>true</managed>\n  <uid>{uid}</uid>\n  \
             <entry>{entry}</entry>\n  <createdAt>{created}</createdAt>\n</instance>"
        )
    }

    #[test]
    fn a_rendered_mark_parses_back() {
        let now = SystemTime::now();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let m = parse(&render(&uid(), "home", t), "home", now).unwrap();
        assert_eq!(m.uid, uid());
        assert_eq!(m.entry, "home");
        assert_eq!(m.created_at, t);
        let lv = as_libvirt_returns(&uid().canonical(), "home", "2026-11-29T10:00:00Z");
        assert!(parse(&lv, "home", now).is_some());
        let bare = render_for_set_metadata(&uid(), "home", None, &[], t);
        assert!(!bare.contains("ep:") && !bare.contains("xmlns"), "{bare}");
        assert_eq!(parse(&bare, "home", now).unwrap().created_at, t);
    }

    #[test]
    fn padded_or_recased_uids_are_not_marks() {
        // finding: E2
        let now = SystemTime::now();
        let u = uid().canonical();
        for bad in [
            format!(" {u}"),
            format!("{u}\n"),
            u.to_uppercase(),
            format!("\n  {u}\n  "),
        ] {
            let xml = as_libvirt_returns(&bad, "home", "2026-11-29T10:00:00Z");
            assert!(parse(&xml, "home", now).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn marks_of_other_entries_or_unmanaged_are_not_ours() {
        // finding: M2
        let now = SystemTime::now();
        let u = uid().canonical();
        let other = as_libvirt_returns(&u, "lab", "2026-11-29T10:00:00Z");
        assert!(parse(&other, "home", now).is_none());
        assert!(parse(&other.replace(">true<", ">false<"), "lab", now).is_none());
        assert!(
            parse(
                &other.replace("2026-11-29T10:00:00Z", "yesterday"),
                "lab",
                now
            )
            .is_none()
        );
        assert!(parse("<instance/>", "lab", now).is_none());
        assert!(parse("garbage <", "lab", now).is_none());
        let dup = other.replace("<entry>lab</entry>", "<entry>lab</entry><entry>lab</entry>");
        assert!(parse(&dup, "lab", now).is_none());
    }

    #[test]
    fn future_creation_times_are_clamped_to_now() {
        // finding: L9
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let xml = as_libvirt_returns(&uid().canonical(), "home", "2099-01-01T00:00:00Z");
        let m = parse(&xml, "home", now).unwrap();
        assert_eq!(m.created_at, now);
        assert_eq!(
            m.recorded_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(4_070_908_800),
            "the recorded time is kept so the listing can restamp it"
        );
    }

    #[test]
    fn a_mark_carries_its_installation_and_tells_ours_unclaimed_and_foreign_apart() {
        let now = SystemTime::now();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let ours = parse(&render_for(&uid(), "home", Some("site-a"), t), "home", now).unwrap();
        assert_eq!(ours.installation.as_deref(), Some("site-a"));
        assert_eq!(ours.owner(Some("site-a")), Owner::Ours);
        assert_eq!(ours.owner(Some("site-b")), Owner::Foreign);
        assert_eq!(ours.owner(None), Owner::Foreign);
        let legacy = parse(&render(&uid(), "home", t), "home", now).unwrap();
        assert_eq!(legacy.installation, None);
        assert_eq!(legacy.owner(Some("site-a")), Owner::Unclaimed);
        assert_eq!(legacy.owner(None), Owner::Ours);
        let bare = render_for_set_metadata(&uid(), "home", Some("site-a"), &[], t);
        assert_eq!(
            parse(&bare, "home", now).unwrap().installation.as_deref(),
            Some("site-a")
        );
    }

    #[test]
    fn a_padded_recased_duplicated_or_empty_installation_makes_the_mark_invalid() {
        let now = SystemTime::now();
        let good = as_libvirt_returns(&uid().canonical(), "home", "2026-11-29T10:00:00Z");
        for bad in [" site-a", "site-a\n", "Site-A", "", "-a", "a/b", "a&amp;b"] {
            let xml = good.replace(
                "<entry>home</entry>",
                &format!("<entry>home</entry><installation>{bad}</installation>"),
            );
            assert!(parse(&xml, "home", now).is_none(), "{bad:?}");
        }
        let dup = good.replace(
            "<entry>home</entry>",
            "<entry>home</entry><installation>a</installation><installation>a</installation>",
        );
        assert!(parse(&dup, "home", now).is_none());
        assert!(!valid_installation_id(
            &"a".repeat(MAX_INSTALLATION_ID_LEN + 1)
        ));
        assert!(valid_installation_id(&"a".repeat(MAX_INSTALLATION_ID_LEN)));
    }

    #[test]
    fn addresses_round_trip_and_a_malformed_one_makes_the_mark_invalid() {
        let now = SystemTime::now();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let v4: IpAddr = "203.0.113.5".parse().unwrap();
        let v6: IpAddr = "2001:db8::5".parse().unwrap();
        let m = parse(
            &render_with(&uid(), "home", None, &[v6, v4], t),
            "home",
            now,
        )
        .unwrap();
        assert_eq!(m.addresses, vec![v4, v6], "IPv4 first");
        let bare = render_for_set_metadata(&uid(), "home", Some("a"), &[v4], t);
        assert_eq!(parse(&bare, "home", now).unwrap().addresses, vec![v4]);
        assert!(
            parse(&render(&uid(), "home", t), "home", now)
                .unwrap()
                .addresses
                .is_empty()
        );
        // Other entries' marks are read by parse_any only.
        let lab = render_with(&uid(), "lab", None, &[v4], t);
        assert!(parse(&lab, "home", now).is_none());
        assert_eq!(parse_any(&lab, now).unwrap().entry, "lab");
        let good = as_libvirt_returns(&uid().canonical(), "home", "2026-11-29T10:00:00Z");
        for bad in [
            "<address> 203.0.113.5</address>",
            "<address>203.0.113.05</address>",
            "<address>2001:DB8::5</address>",
            "<address>2001:db8:0::5</address>",
            "<address></address>",
            "<address>host.example</address>",
            "<address>203.0.113.5</address><address>203.0.113.6</address>",
        ] {
            let xml = good.replace("<entry>home</entry>", &format!("<entry>home</entry>{bad}"));
            assert!(parse(&xml, "home", now).is_none(), "{bad:?}");
            assert!(parse_any(&xml, now).is_none(), "{bad:?}");
        }
        let two = good.replace(
            "<entry>home</entry>",
            "<entry>home</entry><address>203.0.113.5</address><address>2001:db8::5</address>",
        );
        assert_eq!(parse(&two, "home", now).unwrap().addresses, vec![v4, v6]);
    }
}
