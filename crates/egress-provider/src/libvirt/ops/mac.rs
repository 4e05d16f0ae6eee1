//! Guest MAC collisions on a host, detected before a create defines its domain.
//!
//! A guest's MAC is derived from its entry and Proxy UID
//! ([`names::mac`](crate::libvirt::names::mac): `52` and 40 hash bits; guests created before
//! it keep [`names::legacy_mac`](crate::libvirt::names::legacy_mac)'s `52:54:00` and 24 bits).
//! Across hosts of one segment, 40 bits keep collisions negligible without reading other
//! hosts; on one host a collision (or a foreign domain given our MAC) is still possible, and
//! two NICs with one MAC on a segment break each other's networking, so a create first reads
//! every domain on the host — ours, other entries', other installations' and foreign ones,
//! running or not — and refuses (Permanent, naming the other domain and the MAC) when any
//! other domain already uses the MAC it would give.
//!
//! Guarantees: [`mac_user`] answers from a complete read of the host's domains: a domain that
//! vanishes meanwhile is skipped, any other failure fails the call (connection-class ones
//! Transient), never a partial "no collision"; the domain named `own` (the one being created
//! or adopted) is not counted. Reads run at most [`MAC_READS_IN_FLIGHT`] at a time.
//! Not covered: two creates on one host whose derived MACs collide and that both pass the
//! check before either defines its domain, and MACs used outside libvirt on the same segment.
//!
//! Creates ask [`MacIndex`], not [`mac_user`]: reading every domain on each create made a
//! create's cost grow with the host's domains (filling a host was quadratic in its domain
//! count; it showed in a CPU profile of the Kubernetes benchmark). The index reads a host's
//! domains at most once per [`MAC_INDEX_TTL`] and learns the domains this process defines; a
//! MAC it finds in use is confirmed by a fresh read before a create is refused, so a domain
//! deleted since never blocks one. A foreign domain defined within the TTL of the last read is
//! not seen until the next.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use libvirt_remote::Client;

use super::{CODE_NO_DOMAIN, classify, is_code};
use crate::sync::lock;

/// Domain XML reads in flight at once while looking for a MAC.
// NB: each is one small round trip; 8 keeps a host of a thousand domains to about a second
// without crowding the connection other calls share.
pub const MAC_READS_IN_FLIGHT: usize = 8;

/// The name of a domain on the host, other than `own`, whose XML (live, or its definition
/// when shut off) carries the MAC `mac` (compared case-insensitively), if any.
pub async fn mac_user(
    c: &Client,
    host: &str,
    mac: &str,
    own: &str,
) -> crate::error::Result<Option<String>> {
    let doms = c
        .list_all_domains(0)
        .await
        .map_err(|e| classify(&e, &format!("listing domains on host {host}")))?;
    let want = mac.to_ascii_lowercase();
    let mut reads = stream::iter(doms.into_iter().filter(|d| d.name != own))
        .map(|d| async move {
            match c.domain_xml(&d, 0).await {
                Ok(xml) => Ok(Some((d.name, xml))),
                Err(e) if is_code(&e, CODE_NO_DOMAIN) => Ok(None),
                Err(e) => Err(classify(
                    &e,
                    &format!("reading domain {} on host {host}", d.name),
                )),
            }
        })
        .buffer_unordered(MAC_READS_IN_FLIGHT);
    while let Some(r) = reads.next().await {
        if let Some((name, xml)) = r?
            && macs_in(&xml).contains(&want)
        {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// How long a host's MAC index is used before its domains are read again.
pub const MAC_INDEX_TTL: Duration = Duration::from_secs(60);

/// Every MAC on the host (lower-cased) → the domains using it, from a complete read.
async fn read_all(c: &Client, host: &str) -> crate::error::Result<HashMap<String, Vec<String>>> {
    let doms = c
        .list_all_domains(0)
        .await
        .map_err(|e| classify(&e, &format!("listing domains on host {host}")))?;
    let mut reads = stream::iter(doms)
        .map(|d| async move {
            match c.domain_xml(&d, 0).await {
                Ok(xml) => Ok(Some((d.name, xml))),
                Err(e) if is_code(&e, CODE_NO_DOMAIN) => Ok(None),
                Err(e) => Err(classify(
                    &e,
                    &format!("reading domain {} on host {host}", d.name),
                )),
            }
        })
        .buffer_unordered(MAC_READS_IN_FLIGHT);
    let mut map = HashMap::new();
    while let Some(r) = reads.next().await {
        if let Some((name, xml)) = r? {
            for m in macs_in(&xml) {
                map.entry(m).or_insert_with(Vec::new).push(name.clone());
            }
        }
    }
    Ok(map)
}

/// One host's MACs (lower-cased) → the domains using each, and when they were read.
type HostMacs = (Instant, HashMap<String, Vec<String>>);

/// A domain other than `own` among those using `mac` in `map`.
fn other_user(map: &HashMap<String, Vec<String>>, mac: &str, own: &str) -> Option<String> {
    map.get(mac)?.iter().find(|d| *d != own).cloned()
}

/// The MACs in use on each host, read at most once per [`MAC_INDEX_TTL`]; see the module doc.
#[derive(Debug, Default)]
pub struct MacIndex {
    hosts: Mutex<HashMap<String, HostMacs>>,
}

impl MacIndex {
    /// The domain other than `own` using `mac` on `host`, as [`mac_user`] answers it, from the
    /// index when it is fresh; a hit is confirmed by a fresh read before it is returned.
    pub async fn user(
        &self,
        c: &Client,
        host: &str,
        mac: &str,
        own: &str,
    ) -> crate::error::Result<Option<String>> {
        let want = mac.to_ascii_lowercase();
        let cached = {
            let hosts = lock(&self.hosts);
            hosts
                .get(host)
                .filter(|(at, _)| at.elapsed() < MAC_INDEX_TTL)
                .map(|(_, m)| other_user(m, &want, own))
        };
        if let Some(None) = cached {
            return Ok(None);
        }
        // Not indexed, stale, or a hit to confirm: read the host again.
        let map = read_all(c, host).await?;
        let found = other_user(&map, &want, own);
        lock(&self.hosts).insert(host.to_owned(), (Instant::now(), map));
        Ok(found)
    }

    /// Records that `domain` on `host` now uses `mac` (after this process defined it).
    pub fn note(&self, host: &str, mac: &str, domain: &str) {
        if let Some((_, m)) = lock(&self.hosts).get_mut(host) {
            let users = m.entry(mac.to_ascii_lowercase()).or_default();
            if !users.iter().any(|d| d == domain) {
                users.push(domain.to_owned());
            }
        }
    }
}

/// Every `<mac address='…'/>` in a domain XML, lower-cased (an unreadable document yields
/// what was read before the error).
pub fn macs_in(xml: &str) -> Vec<String> {
    use quick_xml::events::Event;
    let mut r = quick_xml::Reader::from_str(xml);
    let mut out = Vec::new();
    loop {
        match r.read_event() {
            Ok(Event::Start(e) | Event::Empty(e)) if e.local_name().as_ref() == "mac" => {
                let address = e
                    .attributes()
                    .flatten()
                    .find(|a| a.key.local_name().into_inner() == "address")
                    .and_then(|a| {
                        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                            .ok()
                            .map(|v| v.to_ascii_lowercase())
                    });
                out.extend(address);
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_domain_sharing_a_mac_never_hides_another_user() {
        let mut m = HashMap::new();
        m.insert(
            "52:54:00:00:00:01".to_owned(),
            vec!["own".to_owned(), "other".to_owned()],
        );
        assert_eq!(
            other_user(&m, "52:54:00:00:00:01", "own").as_deref(),
            Some("other")
        );
        m.insert("52:54:00:00:00:02".to_owned(), vec!["own".to_owned()]);
        assert_eq!(other_user(&m, "52:54:00:00:00:02", "own"), None);
        assert_eq!(other_user(&m, "52:54:00:00:00:03", "own"), None);
    }

    #[test]
    fn macs_are_read_from_every_interface_whatever_the_case() {
        let xml = "<domain><devices><interface type='network'><mac address='52:54:00:AB:cd:01'/>\
                   </interface><interface type='bridge'><mac address=\"52:54:00:00:00:02\">\
                   </mac></interface></devices></domain>";
        assert_eq!(macs_in(xml), ["52:54:00:ab:cd:01", "52:54:00:00:00:02"]);
        assert!(macs_in("<domain><devices/></domain>").is_empty());
        assert!(macs_in("<domain><mac address='x'").len() <= 1);
    }
}
