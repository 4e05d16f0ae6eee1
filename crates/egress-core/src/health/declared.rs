//! Verifying declared egress addresses: a proxy whose instance holds addresses from its
//! host's address pool is probed once per declared address, each family against its own
//! check target, and every probe must see exactly the declared address of its family.
//!
//! Guarantees:
//! - an IPv4 address is probed through [`HealthSettings::target`], an IPv6 address through
//!   [`HealthSettings::target_ipv6`] when set (else through `target` too: then a mismatch says
//!   that no IPv6 target is configured), so each family's egress is seen on its own;
//! - a check passes only when every probe answered and each saw its declared address; a
//!   probe that saw another address makes the proxy Unhealthy at once with reason
//!   `EgressMismatch`, naming every declared and every observed address (the traffic would
//!   leave from an address nobody declared: not a blip to ride out); a failed probe counts as
//!   one failure of the check under the usual hysteresis;
//! - `spec.proxy.expectedEgress`, when also set, applies to the probe of its family.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use super::probe::{self, CheckTarget};
use super::{
    HealthSettings, Outcome, ProbeResult, ProbeTarget, ProxyHealth, egress_matches, reason,
};

/// One probe made for one declared address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredProbe {
    /// The declared address this probe checks.
    pub declared: IpAddr,
    /// What the probe found.
    pub result: ProbeResult,
}

/// One probe of a round: the declared address it checks (`None`: the single probe of a
/// proxy without declared addresses) and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The declared address checked, if any.
    pub declared: Option<IpAddr>,
    /// What the probe found.
    pub result: ProbeResult,
}

/// Probes `t` (through `settings.dial_map` when set): once against
/// [`HealthSettings::target`] when it has no declared addresses, else once per declared
/// address against its family's target ([`HealthSettings::target_for`]), one after the
/// other (each under the probe deadline).
pub async fn probe_target(t: &ProbeTarget, settings: &HealthSettings) -> Vec<Probed> {
    let mut ep = t.endpoint.clone();
    if let Some(f) = settings.dial_map {
        ep.addr = f(ep.addr);
    }
    let result = |r: Result<_, _>| match r {
        Ok(s) => ProbeResult::Ok(s),
        Err(e) => ProbeResult::Failed(e),
    };
    if t.declared.is_empty() {
        let r = probe::probe_within(
            &ep,
            &settings.target,
            settings.probe_timeout,
            settings.connect_timeout,
        )
        .await;
        return vec![Probed {
            declared: None,
            result: result(r),
        }];
    }
    let mut out = Vec::with_capacity(t.declared.len());
    for d in &t.declared {
        let r = probe::probe_within(
            &ep,
            settings.target_for(*d),
            settings.probe_timeout,
            settings.connect_timeout,
        )
        .await;
        out.push(Probed {
            declared: Some(*d),
            result: result(r),
        });
    }
    out
}

/// Records the probes of `t` in its state `h`: a single probe as [`ProxyHealth::record`]
/// does, probes of declared addresses as [`ProxyHealth::record_declared`] does.
pub fn record_target(
    h: &mut ProxyHealth,
    t: &ProbeTarget,
    probes: &[Probed],
    settings: &HealthSettings,
    now: SystemTime,
) {
    let expected = t.expected_egress.as_deref();
    match probes {
        [
            Probed {
                declared: None,
                result,
            },
        ] => h.record(t.endpoint.addr, result, expected, settings, now),
        _ => {
            let declared: Vec<DeclaredProbe> = probes
                .iter()
                .filter_map(|p| {
                    p.declared.map(|declared| DeclaredProbe {
                        declared,
                        result: p.result.clone(),
                    })
                })
                .collect();
            h.record_declared(t.endpoint.addr, &declared, expected, settings, now);
        }
    }
}

impl HealthSettings {
    /// The check target that probes the egress of `declared`'s family.
    pub fn target_for(&self, declared: IpAddr) -> &CheckTarget {
        match (&self.target_ipv6, declared) {
            (Some(v6), IpAddr::V6(_)) => v6,
            _ => &self.target,
        }
    }
}

impl ProxyHealth {
    /// Records one check of `addr` made of one probe per declared address, applying
    /// hysteresis; see the module's guarantees. `expected` is `spec.proxy.expectedEgress`.
    pub fn record_declared(
        &mut self,
        addr: SocketAddr,
        probes: &[DeclaredProbe],
        expected: Option<&str>,
        settings: &HealthSettings,
        now: SystemTime,
    ) {
        let failed = probes.iter().find_map(|p| match &p.result {
            ProbeResult::Failed(e) => Some((p.declared, e)),
            ProbeResult::Ok(_) => None,
        });
        let outcome = if let Some((declared, e)) = failed {
            Outcome::Failed {
                reason: reason::PROBE_FAILED,
                message: format!("probing the egress of {declared}: {e} ({})", e.reason()),
                immediate: false,
            }
        } else {
            let seen: Vec<(IpAddr, IpAddr, Duration)> = probes
                .iter()
                .filter_map(|p| match &p.result {
                    ProbeResult::Ok(s) => Some((p.declared, s.egress_ip, s.latency)),
                    ProbeResult::Failed(_) => None,
                })
                .collect();
            let Some(&(_, first, _)) = seen.first() else {
                return;
            };
            let observed: Vec<IpAddr> = seen.iter().map(|(_, o, _)| *o).collect();
            let latency = seen.iter().map(|(_, _, l)| *l).max().unwrap_or_default();
            self.observed(addr, first, observed.clone(), latency);
            match mismatch(&seen, expected, settings) {
                Some(message) => Outcome::Failed {
                    reason: reason::EGRESS_MISMATCH,
                    message,
                    immediate: true,
                },
                None => Outcome::Succeeded {
                    egress: join(&observed),
                    latency,
                },
            }
        };
        self.decide(addr, outcome, settings, now);
    }
}

/// Why the egress seen contradicts the declaration (or `expected`), naming both.
fn mismatch(
    seen: &[(IpAddr, IpAddr, Duration)],
    expected: Option<&str>,
    settings: &HealthSettings,
) -> Option<String> {
    let wrong = seen
        .iter()
        .any(|(declared, observed, _)| declared != observed);
    let outside = expected.and_then(|want| {
        seen.iter()
            .map(|(_, o, _)| *o)
            .find(|o| same_family(want, *o) && !egress_matches(want, *o))
            .map(|o| (want, o))
    });
    if !wrong && outside.is_none() {
        return None;
    }
    let declared: Vec<IpAddr> = seen.iter().map(|(d, _, _)| *d).collect();
    let observed: Vec<IpAddr> = seen.iter().map(|(_, o, _)| *o).collect();
    let mut msg = format!(
        "the declared egress address is {} but the check target saw {}",
        join(&declared),
        join(&observed)
    );
    if let Some((want, o)) = outside {
        msg.push_str(&format!(
            "; {o} is outside spec.proxy.expectedEgress {want}"
        ));
    }
    let v6_unchecked = settings.target_ipv6.is_none()
        && seen
            .iter()
            .any(|(d, o, _)| d.is_ipv6() && o != d && o.is_ipv4());
    if v6_unchecked {
        msg.push_str(
            " (no IPv6 check target is set: the IPv6 address was probed through the IPv4 \
             target; set --health-target-ipv6)",
        );
    }
    Some(msg)
}

/// Whether `want` (an IP or CIDR) is of `ip`'s family.
fn same_family(want: &str, ip: IpAddr) -> bool {
    crate::model::parse_ip_or_cidr(want.trim()).is_some_and(|(n, _)| n.is_ipv4() == ip.is_ipv4())
}

fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::super::probe::{ProbeError, ProbeSuccess};
    use super::super::{HealthState, reason};
    use super::*;

    fn settings(v6: bool) -> HealthSettings {
        let mut s = HealthSettings::new(CheckTarget::parse("http://192.0.2.1/").unwrap());
        if v6 {
            s.target_ipv6 = Some(CheckTarget::parse("http://[2001:db8::1]/").unwrap());
        }
        s
    }

    fn addr() -> SocketAddr {
        "192.0.2.10:3128".parse().unwrap()
    }

    fn probe(declared: &str, seen: &str) -> DeclaredProbe {
        DeclaredProbe {
            declared: declared.parse().unwrap(),
            result: ProbeResult::Ok(ProbeSuccess {
                egress_ip: seen.parse().unwrap(),
                latency: Duration::from_millis(5),
            }),
        }
    }

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    #[test]
    fn each_family_goes_to_its_own_target() {
        let s = settings(true);
        assert_eq!(
            s.target_for("203.0.113.7".parse().unwrap()).host,
            "192.0.2.1"
        );
        assert_eq!(
            s.target_for("2001:db8::7".parse().unwrap()).host,
            "[2001:db8::1]"
        );
        let s = settings(false);
        assert_eq!(
            s.target_for("2001:db8::7".parse().unwrap()).host,
            "192.0.2.1"
        );
    }

    #[test]
    fn the_declared_addresses_seen_make_the_proxy_healthy() {
        let s = settings(true);
        let mut h = ProxyHealth::default();
        let probes = [
            probe("203.0.113.7", "203.0.113.7"),
            probe("2001:db8::7", "2001:db8::7"),
        ];
        h.record_declared(addr(), &probes, None, &s, t(0));
        h.record_declared(addr(), &probes, None, &s, t(1));
        assert_eq!(h.state, HealthState::Healthy, "{}", h.message);
        assert_eq!(h.egress_ip, Some("203.0.113.7".parse().unwrap()));
        assert_eq!(h.to_status().egress_ips, ["203.0.113.7", "2001:db8::7"]);
    }

    #[test]
    fn another_ipv4_egress_is_a_mismatch_at_once_naming_both() {
        let s = settings(true);
        let mut h = ProxyHealth::default();
        let ok = [probe("203.0.113.7", "203.0.113.7")];
        h.record_declared(addr(), &ok, None, &s, t(0));
        h.record_declared(addr(), &ok, None, &s, t(1));
        assert_eq!(h.state, HealthState::Healthy);
        h.record_declared(
            addr(),
            &[probe("203.0.113.7", "198.51.100.1")],
            None,
            &s,
            t(2),
        );
        assert_eq!(h.state, HealthState::Unhealthy, "one probe decides");
        assert_eq!(h.reason, reason::EGRESS_MISMATCH);
        assert!(
            h.message.contains("203.0.113.7") && h.message.contains("198.51.100.1"),
            "{}",
            h.message
        );
    }

    #[test]
    fn another_ipv6_egress_is_a_mismatch_even_when_ipv4_matches() {
        let s = settings(true);
        let mut h = ProxyHealth::default();
        let probes = [
            probe("203.0.113.7", "203.0.113.7"),
            probe("2001:db8::7", "2001:db8::99"),
        ];
        h.record_declared(addr(), &probes, None, &s, t(0));
        assert_eq!(h.state, HealthState::Unhealthy);
        assert_eq!(h.reason, reason::EGRESS_MISMATCH);
        assert!(
            h.message.contains("2001:db8::7") && h.message.contains("2001:db8::99"),
            "{}",
            h.message
        );
        // Without an IPv6 target the probe came back over IPv4: the message says what to set.
        let mut h = ProxyHealth::default();
        let s = settings(false);
        h.record_declared(
            addr(),
            &[probe("2001:db8::7", "203.0.113.7")],
            None,
            &s,
            t(0),
        );
        assert_eq!(h.reason, reason::EGRESS_MISMATCH);
        assert!(h.message.contains("--health-target-ipv6"), "{}", h.message);
    }

    #[test]
    fn a_failed_probe_is_one_failure_and_expected_egress_applies_to_its_family() {
        let s = settings(true);
        let mut h = ProxyHealth::default();
        let failed = DeclaredProbe {
            declared: "2001:db8::7".parse().unwrap(),
            result: ProbeResult::Failed(ProbeError::Connect("refused".into())),
        };
        h.record_declared(
            addr(),
            &[probe("203.0.113.7", "203.0.113.7"), failed],
            None,
            &s,
            t(0),
        );
        assert_eq!(h.state, HealthState::Unknown, "one failure is not enough");
        assert_eq!(h.reason, reason::PROBE_FAILED);
        assert!(h.message.contains("2001:db8::7"), "{}", h.message);
        let both = [
            probe("203.0.113.7", "203.0.113.7"),
            probe("2001:db8::7", "2001:db8::7"),
        ];
        let mut h = ProxyHealth::default();
        h.record_declared(addr(), &both, Some("2001:db8::/32"), &s, t(0));
        h.record_declared(addr(), &both, Some("2001:db8::/32"), &s, t(1));
        assert_eq!(h.state, HealthState::Healthy, "{}", h.message);
    }
}
