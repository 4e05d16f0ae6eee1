//! `egress-proxies addresses [--server URL] [--json]`: the declared egress addresses of a
//! running operator (`standalone` or `kubernetes`, read from its `GET /status`): each address
//! allocated to a Proxy (with its pool, when it is a member), each address retired from its
//! host's address pool (with the pool and member it was retired from, why, and until when),
//! and per host and family how many addresses are free.
//!
//! Guarantees: one HTTP GET to the given server and nothing else (the request of `status`,
//! with its bounds); a retirement whose end has passed is not shown; exit 1 when nothing
//! answers there.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::SystemTime;

use serde::Serialize;

use super::status::{DEFAULT_SERVER, fetch, server_url};
use super::table::Table;
use super::{EXIT_FAILED, EXIT_OK, UsageError};
use egress_core::host_health::AddressPoolUsage;
use egress_web::status::StatusDocument;

/// Arguments of `addresses`.
#[derive(Debug, clap::Args)]
pub struct AddressesArgs {
    /// Base URL of a running operator's status listener (`standalone --listen`, or
    /// `kubernetes --listen`).
    #[arg(long, value_name = "URL", default_value = DEFAULT_SERVER,
          env = "EGRESS_PROXIES_SERVER")]
    server: String,
    /// Print the rows as one JSON document (the same as `-o json`).
    #[arg(long)]
    json: bool,
}

/// One address and what it is used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressRow {
    /// The address.
    pub address: String,
    /// `allocated` (held by a Proxy) or `retired` (handed to no Proxy until `until`).
    pub state: &'static str,
    /// The host whose address pool it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The Proxy holding it (`namespace/name`), or the member it was retired from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The pool (`namespace/name`) of that Proxy, when it is a member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Why it is retired (the listing: zone, meaning, since when).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When its retirement ends (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// One family of one host's address pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostAddressesRow {
    /// Provider entry.
    pub entry: String,
    /// Host.
    pub host: String,
    /// Its usage as the host's last check saw it.
    #[serde(flatten)]
    pub usage: AddressPoolUsage,
}

/// What `addresses` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressesDocument {
    /// Every allocated and retired address, by host then address.
    pub addresses: Vec<AddressRow>,
    /// Every host's address pool usage, per family.
    pub hosts: Vec<HostAddressesRow>,
}

/// Runs `addresses`.
pub async fn run(a: AddressesArgs) -> anyhow::Result<u8> {
    let fmt = super::output::format(a.json);
    let base = url::Url::parse(&server_url(&a.server))
        .ok()
        .filter(|u| u.scheme() == "http" && u.host().is_some())
        .ok_or_else(|| {
            UsageError::new(format!(
                "--server {:?} is not an http:// URL or a host:port (e.g. {DEFAULT_SERVER})",
                a.server
            ))
        })?;
    let url = base
        .join("/status")
        .map_err(|e| UsageError::new(format!("--server {}: {e}", a.server)))?;
    let body = match fetch(&url).await {
        Ok(b) => b,
        Err(msg) => {
            super::output::print_error(&msg, EXIT_FAILED);
            return Ok(EXIT_FAILED);
        }
    };
    let doc: StatusDocument = serde_json::from_slice(&body).map_err(|e| {
        anyhow::anyhow!("{url} did not answer with a status document ({e}); is it egress-proxies?")
    })?;
    let out = addresses_of(&doc, SystemTime::now());
    if let Some(text) = super::output::document(&out, fmt)? {
        println!("{text}");
    } else {
        print!("{}", render(&out));
    }
    Ok(EXIT_OK)
}

/// Sort key of an address: parsed when it parses (so 10.0.0.10 follows 10.0.0.9).
fn address_key(a: &str) -> (Option<IpAddr>, String) {
    (a.parse().ok(), a.to_owned())
}

/// The rows of `doc` at `now`: every Proxy's declared egress addresses, every pool's
/// retirements still in effect (an address retired and still held by the member it was
/// retired from is shown once, retired), every host's usage.
pub fn addresses_of(doc: &StatusDocument, now: SystemTime) -> AddressesDocument {
    // Member (namespace, name) → its pool `namespace/name`.
    let mut member_pool: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for p in &doc.pools {
        for m in &p.members {
            member_pool.insert(
                (p.namespace.as_str(), m.name.as_str()),
                format!("{}/{}", p.namespace, p.name),
            );
        }
    }
    let mut rows = Vec::new();
    let mut retired: BTreeSet<(Option<String>, String)> = BTreeSet::new();
    for p in &doc.pools {
        for r in &p.status.retired_addresses {
            let ended = humantime::parse_rfc3339_weak(&r.until).is_ok_and(|u| u <= now);
            if ended || !retired.insert((Some(r.host.clone()), r.address.clone())) {
                continue;
            }
            rows.push(AddressRow {
                address: r.address.clone(),
                state: "retired",
                host: Some(r.host.clone()),
                proxy: Some(format!("{}/{}", p.namespace, r.member)),
                pool: Some(format!("{}/{}", p.namespace, p.name)),
                reason: Some(r.reason.clone()),
                until: Some(r.until.clone()),
            });
        }
    }
    for p in &doc.proxies {
        for a in &p.egress_address {
            if retired.contains(&(p.host.clone(), a.clone())) {
                continue;
            }
            rows.push(AddressRow {
                address: a.clone(),
                state: "allocated",
                host: p.host.clone(),
                proxy: Some(format!("{}/{}", p.namespace, p.name)),
                pool: member_pool
                    .get(&(p.namespace.as_str(), p.name.as_str()))
                    .cloned(),
                reason: None,
                until: None,
            });
        }
    }
    rows.sort_by(|a, b| {
        (&a.host, address_key(&a.address)).cmp(&(&b.host, address_key(&b.address)))
    });
    let hosts = doc
        .hosts
        .iter()
        .flat_map(|h| {
            h.addresses.iter().map(|u| HostAddressesRow {
                entry: h.entry.clone(),
                host: h.host.clone(),
                usage: u.clone(),
            })
        })
        .collect();
    AddressesDocument {
        addresses: rows,
        hosts,
    }
}

/// The two tables: addresses, then each host's pool usage (when any host has a pool).
pub fn render(d: &AddressesDocument) -> String {
    let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let mut t = Table::new(&[
        "ADDRESS", "STATE", "HOST", "PROXY", "POOL", "UNTIL", "REASON",
    ]);
    for r in &d.addresses {
        t.row(vec![
            r.address.clone(),
            r.state.into(),
            dash(&r.host),
            dash(&r.proxy),
            dash(&r.pool),
            dash(&r.until),
            dash(&r.reason),
        ]);
    }
    let mut out = if d.addresses.is_empty() {
        "No egress address is allocated or retired.\n".to_owned()
    } else {
        t.render()
    };
    if !d.hosts.is_empty() {
        let mut h = Table::new(&["ENTRY", "HOST", "FAMILY", "SIZE", "HELD", "RETIRED", "FREE"]);
        for r in &d.hosts {
            h.row(vec![
                r.entry.clone(),
                r.host.clone(),
                r.usage.family.clone(),
                r.usage.size.to_string(),
                r.usage.held.to_string(),
                r.usage.retired.to_string(),
                r.usage.free.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&h.render());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_retired_address_still_held_shows_once_and_an_ended_retirement_not_at_all() {
        let now = SystemTime::now();
        let doc: StatusDocument = serde_json::from_value(serde_json::json!({
            "generatedAt": "2026-01-01T00:00:00Z",
            "proxies": [
                {"namespace": "d", "name": "p-a", "uid": "1", "phase": "Running", "host": "h1",
                 "createdAt": "", "conditions": [], "egressAddress": ["192.0.2.10"]},
                {"namespace": "d", "name": "p-b", "uid": "2", "phase": "Running", "host": "h1",
                 "createdAt": "", "conditions": [], "egressAddress": ["192.0.2.9"]},
                {"namespace": "d", "name": "solo", "uid": "3", "phase": "Running", "host": "h2",
                 "createdAt": "", "conditions": [], "egressAddress": ["192.0.2.20"]},
            ],
            "hosts": [{"entry": "e", "host": "h1", "state": "Ready", "latencyMs": 1,
                       "error": null, "addresses": [{"family": "IPv4", "size": 4, "held": 2,
                       "retired": 1, "free": 1}]}],
            "manifestErrors": [],
            "pools": [{"namespace": "d", "name": "p", "desired": 1,
                       "status": {"retiredAddresses": [
                           {"host": "h1", "address": "192.0.2.10", "member": "p-a",
                            "reason": "listed in bl.test", "since": "2026-01-01T00:00:00Z",
                            "until": "2999-01-01T00:00:00Z"},
                           {"host": "h1", "address": "192.0.2.11", "member": "p-old",
                            "reason": "listed", "since": "2020-01-01T00:00:00Z",
                            "until": "2020-01-02T00:00:00Z"}]},
                       "members": [{"name": "p-a", "phase": "Running", "available": false,
                                    "templateHash": "x", "createdAt": ""},
                                   {"name": "p-b", "phase": "Running", "available": true,
                                    "templateHash": "x", "createdAt": ""}]}]
        }))
        .unwrap();
        let d = addresses_of(&doc, now);
        let got: Vec<(&str, &str, Option<&str>)> = d
            .addresses
            .iter()
            .map(|r| (r.address.as_str(), r.state, r.pool.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("192.0.2.9", "allocated", Some("d/p")),
                ("192.0.2.10", "retired", Some("d/p")),
                ("192.0.2.20", "allocated", None),
            ]
        );
        let text = render(&d);
        assert!(text.contains("listed in bl.test"), "{text}");
        assert!(text.contains("FREE"), "{text}");
    }
}
