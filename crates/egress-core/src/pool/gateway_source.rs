//! The membership a driver publishes to a pool's gateway ([`GatewaySource`]): the validated
//! `spec.gateway` plus the pool's published members, each with the address, protocol and
//! credentials to dial it with.
//!
//! Guarantees: [`published_member`] uses the same availability rule as the pool and its
//! publishing (Ready, Running, healthy through itself when health checks run), never a
//! quarantined member or one being deleted. Pure: no I/O. Kept apart from the spec
//! ([`super::gateway`]) so that the spec types import nothing of the members.

use std::net::{IpAddr, SocketAddr};

use super::gateway::GatewayPolicy;
use super::member::{Member, MemberMeta};
use crate::controller::ProxyCredentials;
use crate::model::{ProxyProtocol, ProxySpec, ProxyStatus};

/// One published member as the gateway dials it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayMember {
    /// The member Proxy's UID (the rendezvous hash's node key).
    pub uid: String,
    /// Its name.
    pub name: String,
    /// Where its proxy listens.
    pub addr: SocketAddr,
    /// Its protocol.
    pub protocol: ProxyProtocol,
    /// Its credentials.
    pub credentials: Option<ProxyCredentials>,
    /// Its egress addresses: declared ones, then those the health check saw.
    pub egress: Vec<IpAddr>,
}

/// One pool's gateway as a driver publishes it: the membership source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySource {
    /// The pool's namespace.
    pub namespace: String,
    /// The pool's name.
    pub name: String,
    /// Its resolved `spec.gateway`.
    pub policy: GatewayPolicy,
    /// The member template (its `proxy.allowedDestinations` are refused early).
    pub template: ProxySpec,
    /// The client credentials (each an identity).
    pub clients: Vec<ProxyCredentials>,
    /// The published members.
    pub members: Vec<GatewayMember>,
}

impl GatewaySource {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The member as the gateway sees it, when it is published: available (Ready, Running and,
/// with health checks, healthy through itself), not quarantined, not unpublished by its pool
/// (a drain marker), not being deleted, with an address. `spec` gives its port and protocol, `credentials` those it requires.
pub fn published_member(
    meta: MemberMeta,
    uid: &str,
    status: &ProxyStatus,
    spec: &ProxySpec,
    credentials: Option<&ProxyCredentials>,
    health_checks: bool,
) -> Option<GatewayMember> {
    if meta.quarantine.is_some() || meta.drain.is_some() || meta.deleting {
        return None;
    }
    let name = meta.name.clone();
    let m = Member::observe(meta, status, health_checks);
    if !m.available {
        return None;
    }
    let ip: IpAddr = status.ip.as_deref()?.parse().ok()?;
    let mut egress: Vec<IpAddr> = Vec::new();
    let health = status.health.as_ref();
    let seen = health
        .map(|h| h.egress_ips.iter().chain(h.egress_ip.iter()))
        .into_iter()
        .flatten();
    for a in status.egress_address.iter().chain(seen) {
        if let Ok(ip) = a.parse::<IpAddr>()
            && !egress.contains(&ip)
        {
            egress.push(ip);
        }
    }
    Some(GatewayMember {
        uid: uid.to_owned(),
        name,
        addr: SocketAddr::new(ip, spec.proxy.port),
        protocol: spec.proxy.protocol,
        credentials: credentials.cloned(),
        egress,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn a_member_is_published_only_when_available_and_carries_its_egress() {
        use crate::model::{Condition, ConditionStatus, HealthStatus, Phase, condition};
        let mut st = ProxyStatus {
            phase: Phase::Running,
            ip: Some("10.0.0.5".into()),
            egress_address: vec!["203.0.113.7".into()],
            health: Some(HealthStatus {
                healthy: Some(true),
                egress_ip: Some("203.0.113.7".into()),
                egress_ips: vec!["203.0.113.7".into(), "2001:db8::7".into()],
                ..HealthStatus::default()
            }),
            ..ProxyStatus::default()
        };
        st.set_condition(Condition::new(
            condition::READY,
            ConditionStatus::True,
            "Ready",
            "",
            "t",
            1,
        ));
        let tmpl: ProxySpec = serde_saphyr::from_str(
            "provider: p\nimage: i\nproxy: {port: 1080, protocol: socks5, allowedClientCidrs: [10.0.0.0/8]}\n",
        )
        .unwrap();
        let meta = |q: Option<&str>, deleting| MemberMeta {
            name: "web-abc".into(),
            host: None,
            template_hash: "h".into(),
            created: std::time::SystemTime::UNIX_EPOCH,
            quarantine: q.map(str::to_owned),
            deleting,
            drain: None,
        };
        let m = published_member(meta(None, false), "u1", &st, &tmpl, None, true).unwrap();
        assert_eq!(m.addr, "10.0.0.5:1080".parse().unwrap());
        assert_eq!(m.protocol, ProxyProtocol::Socks5);
        assert_eq!(
            m.egress,
            [
                "203.0.113.7".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        assert!(
            published_member(meta(Some("banned"), false), "u1", &st, &tmpl, None, true).is_none()
        );
        assert!(published_member(meta(None, true), "u1", &st, &tmpl, None, true).is_none());
        let mut drained = meta(None, false);
        drained.drain = Some("2026-12-05T07:20:00Z template".into());
        assert!(published_member(drained, "u1", &st, &tmpl, None, true).is_none());
        st.health.as_mut().unwrap().healthy = Some(false);
        assert!(published_member(meta(None, false), "u1", &st, &tmpl, None, true).is_none());
        assert!(published_member(meta(None, false), "u1", &st, &tmpl, None, false).is_some());
    }
}
