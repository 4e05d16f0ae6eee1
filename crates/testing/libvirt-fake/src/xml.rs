//! Reading the few facts the fake needs out of domain and volume XML, with quick-xml.
//!
//! Guarantees: no XML model is built; only the listed elements are read, at their exact
//! depth, so a `<name>` inside `<metadata>` or `<backingStore>` is never mistaken for the
//! object's name. Malformed XML is an error, never a panic. Sizes use libvirt's scaled
//! units and overflow is an error.

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, XmlVersion};

/// Why a document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XmlError {
    /// The document is not well-formed XML.
    #[error("malformed XML: {0}")]
    Malformed(String),
    /// The root element is not the expected one.
    #[error("expected root element <{expected}>, found <{found}>")]
    WrongRoot {
        /// The element expected.
        expected: &'static str,
        /// The element found.
        found: String,
    },
    /// A required element is missing.
    #[error("missing <{0}> element")]
    Missing(&'static str),
    /// A value could not be parsed.
    #[error("invalid {what} '{value}'")]
    Invalid {
        /// Which value.
        what: &'static str,
        /// The text found.
        value: String,
    },
}

/// What the fake reads from a domain definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainXml {
    /// `<name>`.
    pub name: String,
    /// `<uuid>`, when given.
    pub uuid: Option<[u8; 16]>,
    /// `<domain type=...>`.
    pub virt_type: String,
    /// `<memory>` in KiB.
    pub memory_kib: u64,
    /// `<currentMemory>` in KiB (defaults to `memory_kib`).
    pub current_memory_kib: u64,
    /// `<vcpu>`.
    pub vcpus: u16,
    /// Children of `<metadata>` that carry a namespace: `(namespace URI, element XML)`, the
    /// element returned as libvirt returns it (root prefix and namespace declaration removed).
    pub metadata: Vec<(String, String)>,
    /// Whether a `org.qemu.guest_agent.*` channel is declared.
    pub guest_agent: bool,
}

/// What the fake reads from a volume definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeXml {
    /// `<name>`.
    pub name: String,
    /// `<capacity>` in bytes, when given.
    pub capacity: Option<u64>,
    /// `<allocation>` in bytes, when given.
    pub allocation: Option<u64>,
    /// `<target><format type=...>`, when given.
    pub format: Option<String>,
    /// `<backingStore><path>`, when given.
    pub backing_path: Option<String>,
}

fn malformed(e: impl std::fmt::Display) -> XmlError {
    XmlError::Malformed(e.to_string())
}

fn local(e: &BytesStart<'_>) -> String {
    e.local_name().as_ref().to_string()
}

fn attr(e: &BytesStart<'_>, name: &str) -> Result<Option<String>, XmlError> {
    for a in e.attributes() {
        let a = a.map_err(malformed)?;
        if a.key.local_name().as_ref() == name {
            return Ok(Some(
                a.normalized_value(XmlVersion::Implicit1_0)
                    .map_err(malformed)?
                    .into_owned(),
            ));
        }
    }
    Ok(None)
}

/// Reads the text content of the element just opened by `start`, consuming its end tag.
fn text(r: &mut NsReader<&[u8]>, start: &BytesStart<'_>) -> Result<String, XmlError> {
    let raw = r.read_text(start.name()).map_err(malformed)?;
    let s = quick_xml::escape::unescape(&raw).map_err(malformed)?;
    Ok(s.trim().to_string())
}

/// Multiplier of a libvirt scaled-integer unit (`virScaleInteger`), case-insensitive.
fn unit_scale(unit: &str) -> Option<u64> {
    const K: u64 = 1024;
    let u = unit.to_ascii_lowercase();
    let (base, exp) = match u.as_str() {
        "b" | "byte" | "bytes" => return Some(1),
        "k" | "kib" => (K, 1),
        "kb" => (1000, 1),
        "m" | "mib" => (K, 2),
        "mb" => (1000, 2),
        "g" | "gib" => (K, 3),
        "gb" => (1000, 3),
        "t" | "tib" => (K, 4),
        "tb" => (1000, 4),
        "p" | "pib" => (K, 5),
        "pb" => (1000, 5),
        "e" | "eib" => (K, 6),
        "eb" => (1000, 6),
        _ => return None,
    };
    base.checked_pow(exp)
}

/// Parses a scaled integer: `value` in `unit`, or in `default_scale` when no unit is given.
pub fn scaled(value: &str, unit: Option<&str>, default_scale: u64) -> Result<u64, XmlError> {
    let invalid = || XmlError::Invalid {
        what: "size",
        value: format!("{value} {}", unit.unwrap_or("")).trim().to_string(),
    };
    let n: u64 = value.trim().parse().map_err(|_| invalid())?;
    let scale = match unit {
        None | Some("") => default_scale,
        Some(u) => unit_scale(u).ok_or_else(invalid)?,
    };
    n.checked_mul(scale).ok_or_else(invalid)
}

/// Parses a UUID the way libvirt does: 32 hex digits, hyphens and spaces ignored.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-' && *b != b' ').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Rebuilds a metadata element without its root prefix and namespace declarations, as
/// libvirt's `virDomainGetMetadata` returns it. `inner` is the raw content between the tags,
/// `None` for an empty element.
fn strip_root_namespace(start: &BytesStart<'_>, inner: Option<&str>) -> Result<String, XmlError> {
    let name = local(start);
    let mut out = format!("<{name}");
    for a in start.attributes() {
        let a = a.map_err(malformed)?;
        let key = a.key.as_ref().to_string();
        if key == "xmlns" || key.starts_with("xmlns:") {
            continue;
        }
        let value = &a.value;
        out.push_str(&format!(" {key}=\"{value}\""));
    }
    match inner {
        None => out.push_str("/>"),
        Some(body) => out.push_str(&format!(">{body}</{name}>")),
    }
    Ok(out)
}

fn bound_namespace(ns: &ResolveResult<'_>) -> Option<String> {
    match ns {
        ResolveResult::Bound(n) => Some(n.as_ref().to_string()),
        _ => None,
    }
}

/// Reads a domain definition.
pub fn parse_domain(xml: &str) -> Result<DomainXml, XmlError> {
    let mut r = NsReader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut d = DomainXml::default();
    let mut have_name = false;
    let mut current_memory = None;
    loop {
        let (ns, ev) = r.read_resolved_event().map_err(malformed)?;
        let ns = bound_namespace(&ns);
        match ev {
            Event::Start(e) if path.is_empty() => {
                d.virt_type = root(&e, "domain")?;
                path.push(local(&e));
            }
            Event::Empty(e) if path.is_empty() => {
                d.virt_type = root(&e, "domain")?;
                break;
            }
            Event::Start(e) => {
                let name = local(&e);
                let depth = path.len();
                let parent = path.last().map(String::as_str);
                match (depth, parent, name.as_str()) {
                    (1, _, "name") => {
                        d.name = text(&mut r, &e)?;
                        have_name = true;
                    }
                    (1, _, "uuid") => {
                        let t = text(&mut r, &e)?;
                        d.uuid = Some(parse_uuid(&t).ok_or(XmlError::Invalid {
                            what: "uuid",
                            value: t,
                        })?);
                    }
                    (1, _, "memory") => {
                        let unit = attr(&e, "unit")?;
                        d.memory_kib = scaled(&text(&mut r, &e)?, unit.as_deref(), 1024)? / 1024;
                    }
                    (1, _, "currentMemory") => {
                        let unit = attr(&e, "unit")?;
                        current_memory =
                            Some(scaled(&text(&mut r, &e)?, unit.as_deref(), 1024)? / 1024);
                    }
                    (1, _, "vcpu") => {
                        let t = text(&mut r, &e)?;
                        d.vcpus = t.parse().map_err(|_| XmlError::Invalid {
                            what: "vcpu",
                            value: t,
                        })?;
                    }
                    (2, Some("metadata"), _) => {
                        let span = r.read_to_end(e.name()).map_err(malformed)?;
                        let start = usize::try_from(span.start).map_err(malformed)?;
                        let end = usize::try_from(span.end).map_err(malformed)?;
                        let inner = xml.get(start..end).ok_or_else(|| malformed("bad span"))?;
                        if let Some(uri) = ns {
                            d.metadata
                                .push((uri, strip_root_namespace(&e, Some(inner))?));
                        }
                    }
                    _ => {
                        check_agent(&mut d, &path, &e)?;
                        path.push(name);
                    }
                }
            }
            Event::Empty(e) => {
                if path.len() == 2 && path.last().map(String::as_str) == Some("metadata") {
                    if let Some(uri) = ns {
                        d.metadata.push((uri, strip_root_namespace(&e, None)?));
                    }
                } else {
                    check_agent(&mut d, &path, &e)?;
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof if path.is_empty() => break,
            Event::Eof => return Err(malformed(format!("unclosed <{}>", path.join("/")))),
            _ => {}
        }
    }
    if !have_name || d.name.is_empty() {
        return Err(XmlError::Missing("name"));
    }
    d.current_memory_kib = current_memory.unwrap_or(d.memory_kib);
    Ok(d)
}

/// Checks the root element's name; returns its `type` attribute (empty when absent).
fn root(e: &BytesStart<'_>, expected: &'static str) -> Result<String, XmlError> {
    let found = local(e);
    if found != expected {
        return Err(XmlError::WrongRoot { expected, found });
    }
    Ok(attr(e, "type")?.unwrap_or_default())
}

/// Notes a `<channel><target name='org.qemu.guest_agent.0'/>` inside `<devices>`.
fn check_agent(d: &mut DomainXml, path: &[String], e: &BytesStart<'_>) -> Result<(), XmlError> {
    let in_channel = path.len() == 3
        && path.get(1).map(String::as_str) == Some("devices")
        && path.get(2).map(String::as_str) == Some("channel");
    if in_channel
        && local(e) == "target"
        && attr(e, "name")?.is_some_and(|n| n.starts_with("org.qemu.guest_agent"))
    {
        d.guest_agent = true;
    }
    Ok(())
}

/// Reads a volume definition.
pub fn parse_volume(xml: &str) -> Result<VolumeXml, XmlError> {
    let mut r = NsReader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut v = VolumeXml::default();
    loop {
        let (_, ev) = r.read_resolved_event().map_err(malformed)?;
        match ev {
            Event::Start(e) if path.is_empty() => {
                root(&e, "volume")?;
                path.push(local(&e));
            }
            Event::Empty(e) if path.is_empty() => {
                root(&e, "volume")?;
                break;
            }
            Event::Start(e) => {
                let name = local(&e);
                let parent = path.last().map(String::as_str).unwrap_or_default();
                match (path.len(), parent, name.as_str()) {
                    (1, _, "name") => v.name = text(&mut r, &e)?,
                    (1, _, "capacity") => {
                        let unit = attr(&e, "unit")?;
                        v.capacity = Some(scaled(&text(&mut r, &e)?, unit.as_deref(), 1)?);
                    }
                    (1, _, "allocation") => {
                        let unit = attr(&e, "unit")?;
                        v.allocation = Some(scaled(&text(&mut r, &e)?, unit.as_deref(), 1)?);
                    }
                    (2, "backingStore", "path") => v.backing_path = Some(text(&mut r, &e)?),
                    (2, "target", "format") => {
                        v.format = attr(&e, "type")?;
                        path.push(name);
                    }
                    _ => path.push(name),
                }
            }
            Event::Empty(e) => {
                let parent = path.last().map(String::as_str).unwrap_or_default();
                if path.len() == 2 && parent == "target" && local(&e) == "format" {
                    v.format = attr(&e, "type")?;
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof if path.is_empty() => break,
            Event::Eof => return Err(malformed(format!("unclosed <{}>", path.join("/")))),
            _ => {}
        }
    }
    if v.name.is_empty() {
        return Err(XmlError::Missing("name"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_name_is_read_at_its_depth_only() {
        let xml = r#"<domain type='qemu'>
            <metadata><ep:mark xmlns:ep="https://ep.example/1"><name>not-me</name></ep:mark></metadata>
            <name>vm&amp;1</name>
            <uuid>12345678-9abc-def0-0123-456789abcdef</uuid>
            <memory unit='MiB'>64</memory><vcpu placement='static'>2</vcpu>
            <devices><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices>
        </domain>"#;
        let d = parse_domain(xml).unwrap();
        assert_eq!(d.name, "vm&1");
        assert_eq!(d.virt_type, "qemu");
        assert_eq!(d.uuid.unwrap()[0], 0x12);
        assert_eq!(d.memory_kib, 65536);
        assert_eq!(d.current_memory_kib, 65536);
        assert_eq!(d.vcpus, 2);
        assert!(d.guest_agent);
        assert_eq!(
            d.metadata,
            vec![(
                "https://ep.example/1".to_string(),
                "<mark><name>not-me</name></mark>".to_string()
            )]
        );
    }

    #[test]
    fn metadata_without_a_namespace_is_ignored_and_empty_elements_are_kept() {
        let xml = r#"<domain><name>a</name><metadata><plain/><x:m xmlns:x="urn:x" a="1"/></metadata></domain>"#;
        let d = parse_domain(xml).unwrap();
        assert_eq!(
            d.metadata,
            vec![("urn:x".to_string(), r#"<m a="1"/>"#.to_string())]
        );
        assert!(!d.guest_agent);
    }

    #[test]
    fn domain_without_name_or_with_bad_uuid_is_rejected() {
        assert_eq!(
            parse_domain("<domain type='qemu'/>"),
            Err(XmlError::Missing("name"))
        );
        assert!(matches!(
            parse_domain("<domain><name>a</name><uuid>xyz</uuid></domain>"),
            Err(XmlError::Invalid { what: "uuid", .. })
        ));
        assert!(matches!(
            parse_domain("<pool><name>a</name></pool>"),
            Err(XmlError::WrongRoot { .. })
        ));
        assert!(matches!(
            parse_domain("<domain><name>a</name>"),
            Err(XmlError::Malformed(_))
        ));
    }

    #[test]
    fn volume_reads_sizes_format_and_backing_store() {
        let xml = r#"<volume type='file'>
            <name>ov</name>
            <capacity unit='G'>2</capacity>
            <allocation>0</allocation>
            <target><path>/x/ov</path><format type='qcow2'/></target>
            <backingStore><path>/x/base</path><format type='raw'/></backingStore>
        </volume>"#;
        let v = parse_volume(xml).unwrap();
        assert_eq!(v.name, "ov");
        assert_eq!(v.capacity, Some(2 << 30));
        assert_eq!(v.allocation, Some(0));
        assert_eq!(v.format.as_deref(), Some("qcow2"));
        assert_eq!(v.backing_path.as_deref(), Some("/x/base"));
    }

    #[test]
    fn scaled_units_follow_libvirt_and_overflow_is_an_error() {
        assert_eq!(scaled("3", Some("KB"), 1).unwrap(), 3000);
        assert_eq!(scaled("3", Some("KiB"), 1).unwrap(), 3072);
        assert_eq!(scaled("3", None, 1024).unwrap(), 3072);
        assert!(scaled("3", Some("furlong"), 1).is_err());
        assert!(scaled("18446744073709551615", Some("k"), 1).is_err());
        assert!(scaled("-1", None, 1).is_err());
    }

    #[test]
    fn uuid_parses_with_or_without_hyphens() {
        let a = parse_uuid("12345678-9abc-def0-0123-456789abcdef").unwrap();
        let b = parse_uuid("123456789abcdef00123456789abcdef").unwrap();
        assert_eq!(a, b);
        assert!(parse_uuid("12345678").is_none());
        assert!(parse_uuid("g2345678-9abc-def0-0123-456789abcdef").is_none());
    }
}
