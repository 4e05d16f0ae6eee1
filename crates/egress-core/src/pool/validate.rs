//! Checks a [`ProxyPoolSpec`]'s values and resolves them into a [`PoolPolicy`]: plain
//! numbers and durations the pool decision works with.
//!
//! Guarantees: every error at once, each naming the field path and the value at fault
//! (`spec.update: maxSurge 0 and maxUnavailable 0 ...`); the member template is checked as a
//! Proxy spec would be, under `spec.template`; no panic on any input.

use std::time::Duration;

use super::duration::parse_duration;
use super::quantity::Rounding;
use super::spec::{EgressAddressPolicy, ProxyPoolSpec, ScaleInOrder};
use crate::model::{SpecError, is_dns_subdomain};
use crate::pool::member::{ANNOTATION_QUARANTINE, LABEL_POOL, LABEL_TEMPLATE_HASH};

/// Most members one pool may ask for.
// NB: ten times the benchmarked fleet (1,000 on 10 hosts); a typo of extra zeros is refused
// before it asks the hosts for a million VMs.
pub const MAX_REPLICAS: u32 = 10_000;
/// Longest pool name.
// NB: member names are `POOL-xxxxxx`; 56 + 7 keeps them DNS labels (at most 63), usable
// as Kubernetes label values and guest hostnames, and the pool name a label value too.
pub const MAX_POOL_NAME: usize = 56;
/// Shortest `rotation.maxAge`.
// NB: a member must have time to boot and pass its health checks (about a minute for a
// Debian guest) before its age retires it; shorter would replace members that never served.
pub const MIN_MAX_AGE: Duration = Duration::from_secs(60);
/// Shortest `autohealing.unhealthyAfter`.
// NB: one health check interval (30 s by default): less would replace a member on a single
// failed round.
pub const MIN_UNHEALTHY_AFTER: Duration = Duration::from_secs(30);
/// Shortest `autohealing.hostDeadAfter`.
// NB: one host check's deadline (10 s): a host is reported dead only after that long without
// an answer anyway; shorter would add nothing but replacements on a single slow check.
pub const MIN_HOST_DEAD_AFTER: Duration = Duration::from_secs(10);
/// Longest `autohealing.hostDeadAfter`.
// NB: a day; longer is "never", which `autohealing.enabled: false` says plainly.
pub const MAX_HOST_DEAD_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Longest `autohealing.backoff.max`.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 3600);
/// Longest `update.drainGrace` (the gateway's `drainGrace` has the same bound).
pub const MAX_DRAIN_GRACE: Duration = Duration::from_secs(24 * 3600);

/// A valid pool spec, resolved for `replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPolicy {
    /// Members wanted.
    pub replicas: u32,
    /// Members allowed above `replicas` (maxSurge resolved, rounded up).
    pub max_surge: u32,
    /// Available members allowed below `replicas` (maxUnavailable resolved, rounded down; 1
    /// when both resolve to 0, as a Deployment does, so a rollout can always move).
    pub max_unavailable: u32,
    /// At most this many members on one host.
    pub max_per_host: Option<u32>,
    /// Only these hosts; empty: every host of the entry.
    pub hosts: Vec<String>,
    /// Whether a pool that has become uneven (a host with two members more than another) is
    /// spread again (`placement.rebalance`).
    pub rebalance: bool,
    /// Members older than this are replaced.
    pub max_age: Option<Duration>,
    /// Whether broken members are replaced.
    pub autohealing: bool,
    /// How long a member may be unhealthy before it is replaced.
    pub unhealthy_after: Duration,
    /// How long a member's host may be dead before the member is lost (replaced elsewhere).
    pub host_dead_after: Duration,
    /// First backoff after a failure on a host.
    pub backoff_initial: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
    /// Scale-in tie-break among available members.
    pub scale_in: ScaleInOrder,
    /// Whether the operator generates the members' credentials.
    pub generate_credentials: bool,
    /// Replacements for age or a template change keep the old member's addresses.
    pub keep_addresses: bool,
    /// What a member listed in a DNS blocklist gets.
    pub on_listed: super::spec::OnListed,
    /// How long a listed address a replacement leaves behind stays retired: the operator's
    /// `reputation.retireFor` (drivers set it; the default otherwise).
    pub retire_for: Duration,
    /// The most members the pool may hold at once, quarantined ones included: the provider
    /// entry's `quotas.maxPoolReplicas` (see [`PoolPolicy::within_quota`]); no bound until
    /// a driver applies it.
    pub max_members: u32,
    /// How long a member removed for a planned cause ([`super::DeleteCause::is_planned`])
    /// stays unpublished before it is deleted: `update.drainGrace`, else the gateway's
    /// `drainGrace` when the pool declares a gateway, else zero (deleted at once).
    pub drain_grace: Duration,
}

impl PoolPolicy {
    /// The fewest available members the pool's own removals may leave.
    pub fn min_available(&self) -> u32 {
        self.replicas.saturating_sub(self.max_unavailable)
    }

    /// The most members (of any state, quarantined ones aside) the pool may hold.
    pub fn max_total(&self) -> u32 {
        self.replicas.saturating_add(self.max_surge)
    }

    /// This policy bound by its provider entry's `quotas.maxPoolReplicas` (`max`): refused,
    /// naming `spec.replicas`, when it asks for more; else every member counts against
    /// `max`, quarantined ones included (a quarantined member is replaced, so quarantining
    /// again and again never grows the pool past it).
    pub fn within_quota(mut self, max: u32) -> Result<Self, SpecError> {
        if self.replicas > max {
            return Err(SpecError {
                path: "spec.replicas".into(),
                message: format!(
                    "{} is above the provider entry's quotas.maxPoolReplicas ({max})",
                    self.replicas
                ),
            });
        }
        self.max_members = max;
        Ok(self)
    }
}

/// Most bytes of a template's annotations, keys and values together (Kubernetes' own
/// limit for an object's annotations).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Why `k` is not a Kubernetes label or annotation key (`[prefix/]name`: the prefix a DNS
/// subdomain of at most 253 characters, the name 1 to 63 characters of letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit), if it is not.
pub fn label_key_fault(k: &str) -> Option<String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.len() > 253 || !is_dns_subdomain(p))
    {
        return Some(format!(
            "{k:?}: the prefix before '/' must be a DNS subdomain (lowercase letters, digits, \
             '-' and '.', at most 253 characters)"
        ));
    }
    label_name_fault(name).map(|why| format!("{k:?}: the name {why}"))
}

/// Why `v` is not a Kubernetes label value (empty, or a label name), if it is not.
pub fn label_value_fault(v: &str) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    label_name_fault(v).map(|why| format!("value {v:?}: {why}"))
}

fn label_name_fault(n: &str) -> Option<String> {
    let b = n.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    (!ok).then(|| {
        "must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter \
         or digit"
            .to_owned()
    })
}

/// Checks a pool's name: a DNS label-like name short enough to be a label value.
pub fn validate_pool_name(name: &str) -> Option<SpecError> {
    (!is_dns_subdomain(name) || name.contains('.') || name.len() > MAX_POOL_NAME).then(|| {
        SpecError {
            path: "metadata.name".into(),
            message: format!(
                "{name:?} is not a pool name: 1 to {MAX_POOL_NAME} lowercase letters, digits \
                 and '-', starting and ending with a letter or digit"
            ),
        }
    })
}

impl ProxyPoolSpec {
    /// Checks every value and resolves the spec; all errors at once, each with its path.
    pub fn validate(&self) -> Result<PoolPolicy, Vec<SpecError>> {
        let mut errs = Vec::new();
        let mut err = |path: &str, message: String| {
            errs.push(SpecError {
                path: path.to_owned(),
                message,
            })
        };
        if self.replicas > MAX_REPLICAS {
            err(
                "spec.replicas",
                format!("{} is above the limit of {MAX_REPLICAS}", self.replicas),
            );
        }
        if let Some(why) = &self.template.shape_error {
            // The spec is a placeholder: checking it would only add noise.
            err("spec.template", why.clone());
        } else {
            self.validate_template(&mut err);
        }
        if self.placement.max_per_host == Some(0) {
            err(
                "spec.placement.maxPerHost",
                "0 would place no member: at least 1, or unset for no limit".into(),
            );
        }
        for (i, h) in self.placement.hosts.iter().enumerate() {
            let path = format!("spec.placement.hosts[{i}]");
            if h.trim().is_empty() {
                err(&path, "must name a host of the provider entry".into());
            } else if self.placement.hosts.iter().take(i).any(|o| o == h) {
                err(&path, format!("{h:?} is listed twice"));
            }
        }
        let mut duration =
            |path: &str, text: &str, min: Duration, max: Option<Duration>| match parse_duration(
                text,
            ) {
                None => {
                    err(
                        path,
                        format!(
                            "{text:?} is not a duration: use whole numbers with units s, m, h, d \
                             (\"30s\", \"1h30m\", \"7d\")"
                        ),
                    );
                    None
                }
                Some(d) if d < min => {
                    err(
                        path,
                        format!(
                            "{text:?} is shorter than the minimum {}",
                            super::duration::format_duration(min)
                        ),
                    );
                    None
                }
                Some(d) if max.is_some_and(|m| d > m) => {
                    err(
                        path,
                        format!(
                            "{text:?} is longer than the maximum {}",
                            super::duration::format_duration(max.unwrap_or(d))
                        ),
                    );
                    None
                }
                Some(d) => Some(d),
            };
        let max_age = self
            .rotation
            .max_age
            .as_deref()
            .map(|t| duration("spec.rotation.maxAge", t, MIN_MAX_AGE, None));
        let unhealthy_after = duration(
            "spec.autohealing.unhealthyAfter",
            &self.autohealing.unhealthy_after,
            MIN_UNHEALTHY_AFTER,
            None,
        );
        let host_dead_after = duration(
            "spec.autohealing.hostDeadAfter",
            &self.autohealing.host_dead_after,
            MIN_HOST_DEAD_AFTER,
            Some(MAX_HOST_DEAD_AFTER),
        );
        let initial = duration(
            "spec.autohealing.backoff.initial",
            &self.autohealing.backoff.initial,
            Duration::from_secs(1),
            Some(MAX_BACKOFF),
        );
        let max = duration(
            "spec.autohealing.backoff.max",
            &self.autohealing.backoff.max,
            Duration::from_secs(1),
            Some(MAX_BACKOFF),
        );
        let drain_grace = self.update.drain_grace.as_deref().map(|t| {
            duration(
                "spec.update.drainGrace",
                t,
                Duration::ZERO,
                Some(MAX_DRAIN_GRACE),
            )
        });
        if let (Some(i), Some(m)) = (initial, max)
            && m < i
        {
            err(
                "spec.autohealing.backoff.max",
                format!(
                    "{:?} is shorter than backoff.initial {:?}",
                    self.autohealing.backoff.max, self.autohealing.backoff.initial
                ),
            );
        }
        let u = &self.update;
        if u.max_surge.is_zero() && u.max_unavailable.is_zero() {
            err(
                "spec.update",
                format!(
                    "maxSurge {} and maxUnavailable {}: at least one must be above 0, or no \
                     member could ever be replaced",
                    u.max_surge, u.max_unavailable
                ),
            );
        }
        if self.rotation.egress_address == EgressAddressPolicy::Keep
            && u.max_unavailable
                .resolve(self.replicas.max(1), Rounding::Down)
                == 0
        {
            err(
                "spec.rotation.egressAddress",
                format!(
                    "Keep needs spec.update.maxUnavailable of at least 1 (it is {}): the old \
                     member is deleted before its replacement takes its addresses",
                    u.max_unavailable
                ),
            );
        }
        let mut gateway_grace = None;
        if let Some(g) = &self.gateway {
            let own =
                self.credentials.generate || self.template.spec.proxy.credentials_ref.is_some();
            match g.validate(own) {
                Ok(p) => gateway_grace = Some(p.drain_grace),
                Err(es) => {
                    for e in es {
                        err(&e.path, e.message);
                    }
                }
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        let (
            Some(unhealthy_after),
            Some(host_dead_after),
            Some(backoff_initial),
            Some(backoff_max),
        ) = (unhealthy_after, host_dead_after, initial, max)
        else {
            return Err(errs);
        };
        let max_surge = u.max_surge.resolve(self.replicas, Rounding::Up);
        let mut max_unavailable = u.max_unavailable.resolve(self.replicas, Rounding::Down);
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        Ok(PoolPolicy {
            max_members: u32::MAX,
            replicas: self.replicas,
            max_surge,
            max_unavailable,
            max_per_host: self.placement.max_per_host,
            hosts: self.placement.hosts.clone(),
            rebalance: self.placement.rebalance,
            max_age: max_age.flatten(),
            autohealing: self.autohealing.enabled,
            unhealthy_after,
            host_dead_after,
            backoff_initial,
            backoff_max,
            scale_in: self.scale_in.order,
            generate_credentials: self.credentials.generate,
            keep_addresses: self.rotation.egress_address == EgressAddressPolicy::Keep,
            on_listed: self.reputation.on_listed,
            retire_for: egress_reputation::config::DEFAULT_RETIRE_FOR,
            drain_grace: drain_grace
                .flatten()
                .or(gateway_grace)
                .unwrap_or(Duration::ZERO),
        })
    }

    /// The template's checks: metadata, and the member spec as a Proxy's (under
    /// `spec.template.spec`), with what a pool forbids in it.
    fn validate_template(&self, err: &mut impl FnMut(&str, String)) {
        let meta = &self.template.metadata;
        for (k, v) in &meta.labels {
            let path = format!("spec.template.metadata.labels[{k:?}]");
            if [LABEL_POOL, LABEL_TEMPLATE_HASH].contains(&k.as_str()) {
                err(
                    &path,
                    "is set by the pool itself on every member; remove it".into(),
                );
            } else if let Some(why) = label_key_fault(k) {
                err(&path, why);
            } else if let Some(why) = label_value_fault(v) {
                err(&path, why);
            }
        }
        for k in meta.annotations.keys() {
            let path = format!("spec.template.metadata.annotations[{k:?}]");
            if k == ANNOTATION_QUARANTINE {
                err(
                    &path,
                    "would quarantine every member as it is made; quarantine members one by \
                     one on the member Proxies"
                        .into(),
                );
            } else if let Some(why) = label_key_fault(k) {
                err(&path, why);
            }
        }
        let annotations: usize = meta
            .annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if annotations > MAX_ANNOTATION_BYTES {
            err(
                "spec.template.metadata.annotations",
                format!("{annotations} bytes; at most {MAX_ANNOTATION_BYTES} in all"),
            );
        }
        if let Some(h) = &self.template.spec.host {
            err(
                "spec.template.spec.host",
                format!("{h:?}: a pool places its members; choose hosts with spec.placement.hosts"),
            );
        }
        if !self.template.spec.egress.is_empty() {
            err(
                "spec.template.spec.egress.address",
                format!(
                    "{}: every member would pin the same address; members get distinct \
                     addresses from their hosts' address pools",
                    self.template.spec.egress.address.join(", ")
                ),
            );
        }
        let mut template = self.template.spec.clone();
        template.host = None;
        template.egress = crate::model::EgressSpec::default();
        if self.credentials.generate {
            if let Some(r) = &self.template.spec.proxy.credentials_ref {
                err(
                    "spec.credentials.generate",
                    format!(
                        "true conflicts with spec.template.spec.proxy.credentialsRef {r:?}: the pool \
                         either generates its credentials or uses yours"
                    ),
                );
            }
            // The generated credentials will be referenced; check the rest as it will be.
            template.proxy.credentials_ref = Some("generated".into());
        }
        for e in template.validate() {
            let path = match e.path.strip_prefix("spec.") {
                Some(rest) => format!("spec.template.spec.{rest}"),
                None => e.path,
            };
            err(&path, e.message);
        }
    }
}
