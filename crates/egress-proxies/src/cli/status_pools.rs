//! The pools part of `egress-proxies status`: one line per ProxyPool (available of desired,
//! its Progressing reason, quarantined members, its error) followed by its members (host,
//! phase, declared egress addresses, available, quarantine, drain or deletion, age), its
//! retired addresses and its members lost with their host.
//!
//! Guarantees: pure (the document and the clock in, text out); a document without pools
//! renders nothing.

use std::time::SystemTime;

use egress_core::pool::status::condition;
use egress_web::status::StatusDocument;

use super::table::{self, Table};

/// The pools of `doc` as text: a header line per pool, then a table of its members; `wide`
/// adds each member's TEMPLATE (the hash of the template it was made from, which the pool's
/// own hash is compared with to roll members).
pub fn render(doc: &StatusDocument, now: SystemTime, wide: bool) -> String {
    let mut out = String::new();
    for p in &doc.pools {
        let progressing = p
            .status
            .condition(condition::PROGRESSING)
            .map(|c| c.reason.clone())
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "pool {}/{}: {} of {} available, {} updated, {progressing}{}{}\n",
            p.namespace,
            p.name,
            p.status.available_replicas,
            p.desired,
            p.status.updated_replicas,
            if p.status.quarantined.is_empty() {
                String::new()
            } else {
                format!(", quarantined: {}", p.status.quarantined.join(", "))
            },
            p.error
                .as_deref()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        ));
        out.push_str(&retired(p));
        out.push_str(&lost(p));
        if let Some(r) = &p.status.rebalancing {
            out.push_str(&format!(
                "  moving {} from host {} to host {} to spread the pool again (since {})\n",
                r.member, r.from, r.to, r.since
            ));
        }
        if p.members.is_empty() {
            continue;
        }
        let mut header = vec![
            "  MEMBER",
            "HOST",
            "PHASE",
            "EGRESS",
            "AVAILABLE",
            "STATE",
            "AGE",
        ];
        if wide {
            header.push("TEMPLATE");
        }
        let mut t = Table::new(&header);
        for m in &p.members {
            let age = humantime::parse_rfc3339_weak(&m.created_at)
                .ok()
                .and_then(|c| now.duration_since(c).ok())
                .map_or_else(|| "-".to_owned(), table::age);
            let state = match (&m.quarantine, m.deleting, &m.draining_since) {
                (_, true, _) => "deleting".to_owned(),
                (Some(why), false, _) => format!("quarantined: {why}"),
                (None, false, Some(since)) => format!("draining since {since}"),
                (None, false, None) => "-".to_owned(),
            };
            let mut row = vec![
                format!("  {}", m.name),
                m.host.clone().unwrap_or_else(|| "-".into()),
                m.phase.as_str().to_owned(),
                if m.egress_address.is_empty() {
                    "-".to_owned()
                } else {
                    m.egress_address.join(",")
                },
                if m.available { "yes" } else { "no" }.to_owned(),
                state,
                age,
            ];
            if wide {
                row.push(if m.template_hash == p.status.template_hash {
                    format!("{} (current)", m.template_hash)
                } else {
                    m.template_hash.clone()
                });
            }
            t.row(row);
        }
        out.push_str(&t.render());
    }
    out
}

/// The pool's retired addresses, one line each (address, host, until when, why); empty
/// without any.
fn retired(p: &egress_web::status::PoolStatusRow) -> String {
    let mut out = String::new();
    for r in &p.status.retired_addresses {
        out.push_str(&format!(
            "  retired {} on {} until {} (member {}: {})\n",
            r.address, r.host, r.until, r.member, r.reason
        ));
    }
    out
}

/// The pool's members lost with their host, one line each (member, host, since when the host
/// is dead); empty without any.
fn lost(p: &egress_web::status::PoolStatusRow) -> String {
    let mut out = String::new();
    for l in &p.status.lost_members {
        out.push_str(&format!(
            "  lost {} with host {} (dead since {}): replaced; deleted once the host answers \
             again\n",
            l.member, l.host, l.since
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_core::model::Phase;
    use egress_web::status::{PoolMemberRow, PoolStatusRow};

    #[test]
    fn a_pools_retired_addresses_are_listed_with_why_and_until_when() {
        let mut p = PoolStatusRow {
            namespace: "default".into(),
            name: "web".into(),
            desired: 1,
            status: Default::default(),
            members: vec![],
            error: None,
        };
        assert_eq!(retired(&p), "");
        p.status.retired_addresses = vec![egress_core::pool::status::RetiredAddress {
            host: "h1".into(),
            address: "203.0.113.2".into(),
            member: "web-abc".into(),
            reason: "listed: 203.0.113.2 in bl.example (SBL) since 2026-01-01T00:00:00Z".into(),
            since: "2026-01-01T00:01:00Z".into(),
            until: "2026-01-08T00:01:00Z".into(),
        }];
        let doc = StatusDocument {
            generated_at: "2026-01-01T02:00:00Z".into(),
            proxies: vec![],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![p],
        };
        let out = render(&doc, SystemTime::UNIX_EPOCH, false);
        assert!(
            out.contains(
                "  retired 203.0.113.2 on h1 until 2026-01-08T00:01:00Z (member web-abc: \
                 listed: 203.0.113.2 in bl.example (SBL) since 2026-01-01T00:00:00Z)\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn a_pool_line_then_its_members_with_their_state() {
        let member = |name: &str, available: bool| PoolMemberRow {
            name: name.into(),
            host: Some("h1".into()),
            phase: Phase::Running,
            available,
            template_hash: "abc".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            quarantine: None,
            deleting: false,
            egress_address: Vec::new(),
            draining_since: None,
        };
        let mut pinned = member("web-1", true);
        pinned.egress_address = vec!["203.0.113.7".into(), "2001:db8::7".into()];
        let mut q = member("web-2", true);
        q.quarantine = Some("banned".into());
        let mut d = member("web-3", false);
        d.deleting = true;
        d.template_hash = "old".into();
        let mut drained = member("web-4", false);
        drained.draining_since = Some("2026-01-01T01:59:00Z".into());
        let doc = StatusDocument {
            generated_at: String::new(),
            proxies: vec![],
            hosts: vec![],
            manifest_errors: vec![],
            pools: vec![PoolStatusRow {
                namespace: "default".into(),
                name: "web".into(),
                desired: 2,
                status: egress_core::pool::ProxyPoolStatus {
                    available_replicas: 1,
                    quarantined: vec!["web-2".into()],
                    template_hash: "abc".into(),
                    lost_members: vec![egress_core::pool::status::LostMember {
                        member: "web-0".into(),
                        host: "h2".into(),
                        since: "2026-01-01T01:58:00Z".into(),
                    }],
                    rebalancing: Some(egress_core::pool::status::Rebalancing {
                        member: "web-5".into(),
                        from: "h1".into(),
                        to: "h2".into(),
                        since: "2026-01-01T01:59:30Z".into(),
                    }),
                    ..Default::default()
                },
                members: vec![pinned, q, d, drained],
                error: None,
            }],
        };
        let now =
            humantime::parse_rfc3339("2026-01-01T02:00:00Z").unwrap_or(SystemTime::UNIX_EPOCH);
        let text = render(&doc, now, false);
        assert!(
            text.starts_with(
                "pool default/web: 1 of 2 available, 0 updated, -, quarantined: web-2\n"
            ),
            "{text}"
        );
        assert!(text.contains("quarantined: banned"), "{text}");
        // Each member's declared egress addresses, under EGRESS; "-" when it holds none.
        assert!(text.contains("EGRESS"), "{text}");
        let web1 = text
            .lines()
            .find(|l| l.contains("web-1"))
            .unwrap_or_default();
        assert!(web1.contains(" 203.0.113.7,2001:db8::7 "), "{text}");
        let web2 = text
            .lines()
            .find(|l| l.contains("web-2 "))
            .unwrap_or_default();
        assert!(web2.contains(" Running  - "), "{text}");
        assert!(text.contains("deleting"), "{text}");
        let web4 = text
            .lines()
            .find(|l| l.contains("web-4"))
            .unwrap_or_default();
        assert!(
            web4.contains(" draining since 2026-01-01T01:59:00Z "),
            "{text}"
        );
        assert!(
            text.contains(
                "\n  lost web-0 with host h2 (dead since 2026-01-01T01:58:00Z): replaced; deleted \
                 once the host answers again\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "\n  moving web-5 from host h1 to host h2 to spread the pool again (since \
                 2026-01-01T01:59:30Z)\n"
            ),
            "{text}"
        );
        assert!(text.contains("2h"), "{text}");
        assert!(!text.contains("TEMPLATE"), "{text}");
        let wide = render(&doc, now, true);
        let web1 = wide
            .lines()
            .find(|l| l.contains("web-1"))
            .unwrap_or_default();
        assert!(wide.contains("  AGE  TEMPLATE"), "{wide}");
        assert!(web1.ends_with("  abc (current)"), "{wide}");
        let web3 = wide
            .lines()
            .find(|l| l.contains("web-3"))
            .unwrap_or_default();
        assert!(
            web3.ends_with("  old"),
            "not the pool's current template: {wide}"
        );
        let empty = StatusDocument {
            pools: vec![],
            ..doc
        };
        assert_eq!(render(&empty, now, true), "");
    }
}
