//! Network filters (`<filter>` documents): what `NWFILTER_LOOKUP_BY_NAME`,
//! `NWFILTER_GET_XML_DESC`, `NWFILTER_DEFINE_XML` and `NWFILTER_UNDEFINE` act on, and the
//! check libvirtd makes when a domain whose interface references a filter starts.
//!
//! Guarantees, as libvirtd 11.3 behaves (observed with virsh and our client on the real
//! daemon): a filter is keyed by name; redefining a name with another UUID is refused
//! (code 9); a definition without a UUID keeps the existing filter's UUID or gets a fresh
//! one; undefining a filter a running domain's interface references is refused (code 55);
//! starting a domain whose interface references a missing filter fails (code 1). The XML
//! is returned as it was defined (libvirtd re-serialises it; the fake keeps the text).

use std::collections::BTreeMap;

use libvirt_remote::proto::{self, RemoteErrorWire, Uuid};
use quick_xml::XmlVersion;
use quick_xml::events::{BytesStart, Event};

use crate::errors::{self, codes};

/// `VIR_FROM_NWFILTER`.
pub(crate) const FROM_NWFILTER: i32 = 33;

/// One defined filter.
#[derive(Debug, Clone)]
struct FilterObj {
    uuid: Uuid,
    xml: String,
}

/// The filters a fake daemon holds.
#[derive(Debug, Default)]
pub(crate) struct NwFilters {
    by_name: BTreeMap<String, FilterObj>,
}

type OpResult<T> = Result<T, Box<RemoteErrorWire>>;

fn no_filter_name(name: &str) -> Box<RemoteErrorWire> {
    errors::remote_error(
        62,
        FROM_NWFILTER,
        format!("Network filter not found: no nwfilter with matching name '{name}'"),
    )
}

/// The value of attribute `key` of `e`.
fn attr(e: &BytesStart<'_>, key: &str) -> Result<Option<String>, String> {
    for a in e.attributes() {
        let a = a.map_err(|e| e.to_string())?;
        if a.key.as_ref() == key {
            return Ok(Some(
                a.normalized_value(XmlVersion::Implicit1_0)
                    .map_err(|e| e.to_string())?
                    .into_owned(),
            ));
        }
    }
    Ok(None)
}

/// The `name` attribute of the root `<filter>` and the text of its `<uuid>`.
fn parse(xml: &str) -> Result<(String, Option<String>), String> {
    let mut r = quick_xml::Reader::from_str(xml);
    let mut name = None;
    let mut uuid = None;
    let mut depth = 0usize;
    loop {
        match r.read_event().map_err(|e| e.to_string())? {
            Event::Start(e) | Event::Empty(e) if depth == 0 => {
                if e.name().as_ref() != "filter" {
                    return Err("unknown root element".into());
                }
                name = attr(&e, "name")?;
                depth = 1;
            }
            Event::Start(e) if depth == 1 && e.name().as_ref() == "uuid" => {
                let t = r.read_text(e.name()).map_err(|e| e.to_string())?;
                uuid = Some(t.trim().to_owned());
            }
            Event::Start(_) => depth += 1,
            Event::End(_) => depth = depth.saturating_sub(1),
            Event::Eof => break,
            _ => {}
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or("filter has no name")?;
    Ok((name, uuid))
}

fn parse_uuid(s: &str) -> Option<Uuid> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(u)
}

impl NwFilters {
    /// `NWFILTER_LOOKUP_BY_NAME`.
    pub fn lookup(&self, name: &str) -> OpResult<proto::NwFilter> {
        self.by_name
            .get(name)
            .map(|f| proto::NwFilter {
                name: name.to_owned(),
                uuid: f.uuid,
            })
            .ok_or_else(|| no_filter_name(name))
    }

    fn by_handle(&self, h: &proto::NwFilter) -> OpResult<&FilterObj> {
        self.by_name
            .get(&h.name)
            .filter(|f| f.uuid == h.uuid)
            .ok_or_else(|| no_filter_name(&h.name))
    }

    /// `NWFILTER_GET_XML_DESC`.
    pub fn xml(&self, h: &proto::NwFilter) -> OpResult<String> {
        self.by_handle(h).map(|f| f.xml.clone())
    }

    /// The XML of filter `name`, if defined (inspection).
    pub fn xml_by_name(&self, name: &str) -> Option<String> {
        self.by_name.get(name).map(|f| f.xml.clone())
    }

    /// `NWFILTER_DEFINE_XML`; `fresh` supplies a UUID for a new filter defined without one.
    pub fn define(&mut self, xml: &str, fresh: impl FnOnce() -> Uuid) -> OpResult<proto::NwFilter> {
        let (name, uuid) =
            parse(xml).map_err(|e| errors::xml_error(FROM_NWFILTER, &format!("filter: {e}")))?;
        let uuid = match uuid {
            Some(s) => Some(parse_uuid(&s).ok_or_else(|| {
                errors::xml_error(FROM_NWFILTER, &format!("unable to parse uuid '{s}'"))
            })?),
            None => None,
        };
        if let Some(u) = uuid
            && let Some((other, _)) = self
                .by_name
                .iter()
                .find(|(n, f)| f.uuid == u && **n != name)
        {
            return Err(errors::remote_error(
                codes::OPERATION_FAILED,
                FROM_NWFILTER,
                format!(
                    "operation failed: filter with same UUID but different name ('{other}') \
                     already exists"
                ),
            ));
        }
        let uuid = match (self.by_name.get(&name), uuid) {
            (Some(old), Some(u)) if old.uuid != u => {
                return Err(errors::remote_error(
                    codes::OPERATION_FAILED,
                    FROM_NWFILTER,
                    format!(
                        "operation failed: filter '{name}' already exists with uuid {}",
                        proto::format_uuid(&old.uuid)
                    ),
                ));
            }
            (Some(old), None) => old.uuid,
            (_, Some(u)) => u,
            (None, None) => fresh(),
        };
        self.by_name.insert(
            name.clone(),
            FilterObj {
                uuid,
                xml: xml.to_owned(),
            },
        );
        Ok(proto::NwFilter { name, uuid })
    }

    /// `NWFILTER_UNDEFINE`; `in_use` tells whether a running domain references the filter.
    pub fn undefine(&mut self, h: &proto::NwFilter, in_use: bool) -> OpResult<()> {
        self.by_handle(h)?;
        if in_use {
            return Err(errors::remote_error(
                codes::OPERATION_INVALID,
                FROM_NWFILTER,
                "Requested operation is not valid: nwfilter is in use",
            ));
        }
        self.by_name.remove(&h.name);
        Ok(())
    }

    /// The first filter `domain_xml`'s interfaces reference that is not defined, as the
    /// error starting that domain gives.
    pub fn check_references(&self, domain_xml: &str) -> OpResult<()> {
        for name in references(domain_xml) {
            if !self.by_name.contains_key(&name) {
                return Err(errors::remote_error(
                    codes::INTERNAL_ERROR,
                    FROM_NWFILTER,
                    format!("internal error: referenced filter '{name}' is missing"),
                ));
            }
        }
        Ok(())
    }
}

/// The `filter` attributes of every `<filterref>` in a domain's XML.
pub(crate) fn references(domain_xml: &str) -> Vec<String> {
    let mut r = quick_xml::Reader::from_str(domain_xml);
    let mut out = Vec::new();
    while let Ok(ev) = r.read_event() {
        match ev {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == "filterref" => {
                if let Ok(Some(f)) = attr(&e, "filter") {
                    out.push(f);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const U1: &str = "11111111-2222-3333-4444-555555555555";

    #[test]
    fn a_name_keeps_its_uuid_and_a_running_reference_pins_it() {
        let mut f = NwFilters::default();
        let xml = format!("<filter name='a' chain='root'><uuid>{U1}</uuid></filter>");
        let h = f.define(&xml, || [9; 16]).unwrap();
        assert_eq!(proto::format_uuid(&h.uuid), U1);
        // Redefined without a UUID: the same filter.
        let again = f
            .define("<filter name='a' chain='root'/>", || [9; 16])
            .unwrap();
        assert_eq!(again.uuid, h.uuid);
        let clash = f
            .define(
                "<filter name='a'><uuid>11111111-2222-3333-4444-000000000000</uuid></filter>",
                || [9; 16],
            )
            .unwrap_err();
        assert_eq!(clash.code, codes::OPERATION_FAILED);
        assert_eq!(
            f.undefine(&h, true).unwrap_err().code,
            codes::OPERATION_INVALID
        );
        f.undefine(&h, false).unwrap();
        assert_eq!(f.lookup("a").unwrap_err().code, 62);
        let dom = "<domain><devices><interface type='network'><filterref filter='a'/>\
                   </interface></devices></domain>";
        assert_eq!(references(dom), ["a"]);
        assert_eq!(
            f.check_references(dom).unwrap_err().code,
            codes::INTERNAL_ERROR
        );
    }
}
