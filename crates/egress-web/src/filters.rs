//! The filters of the fleet page, of `/status` and `/proxies` and of the CLI's `status`:
//! `?entry=&host=&pool=&state=&phase=&health=` read from a query string
//! ([`Filters::from_query`]) and applied to host, pool and proxy rows
//! ([`StatusDocument::filtered`](crate::status::StatusDocument::filtered) for a whole
//! document).
//!
//! Guarantees: at most [`MAX_QUERY_PAIRS`] pairs are read and each value is cut to
//! [`MAX_FILTER_CHARS`], whatever the request holds; an empty value is no filter; a state that
//! names a host state filters hosts only, any other state filters proxies only (by phase or
//! health).

use egress_core::model::Phase;

use crate::status::{HostStatusRow, PoolStatusRow, ProxyStatusRow, StatusDocument, entry_of};

/// Most query pairs read from a request.
// NB: the form sends four; 32 tolerates hand-made URLs and bounds the work per request.
pub const MAX_QUERY_PAIRS: usize = 32;
/// Longest filter value kept (characters).
// NB: DNS's limit for a name, the longest thing a filter can match.
pub const MAX_FILTER_CHARS: usize = 253;

/// The filters a request asked for (`?entry=&host=&pool=&state=`); an empty value is no filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    /// Provider entry.
    pub entry: Option<String>,
    /// Host name.
    pub host: Option<String>,
    /// Pool name (`namespace/name` or `name`).
    pub pool: Option<String>,
    /// A proxy phase (`Running`…), a proxy health (`Healthy`, `Unhealthy`, `Unchecked`) or a
    /// host state (`Ready`, `Degraded`, `Unreachable`, `Timeout`, `Unknown`).
    pub state: Option<String>,
    /// A proxy phase (`Running`…): proxies only.
    pub phase: Option<String>,
    /// A proxy health (`Healthy`, `Unhealthy`, `Unchecked`): proxies only.
    pub health: Option<String>,
}

pub(super) const HOST_STATES: [&str; 5] =
    ["Ready", "Degraded", "Unreachable", "Timeout", "Unknown"];
pub(super) const HEALTH_STATES: [&str; 3] = ["Healthy", "Unhealthy", "Unchecked"];
pub(super) const PHASES: [Phase; 6] = [
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Paused,
    Phase::Failed,
    Phase::Terminating,
];

impl Filters {
    /// Reads the filters from a raw query string (without `?`); unknown keys are ignored.
    pub fn from_query(query: Option<&str>) -> Self {
        let mut f = Self::default();
        let Some(q) = query else { return f };
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()).take(MAX_QUERY_PAIRS) {
            let v = v.trim();
            let v = (!v.is_empty()).then(|| egress_core::model::truncate(v, MAX_FILTER_CHARS));
            match k.as_ref() {
                "entry" => f.entry = v,
                "host" => f.host = v,
                "pool" => f.pool = v,
                "state" => f.state = v,
                "phase" => f.phase = v,
                "health" => f.health = v,
                _ => {}
            }
        }
        f
    }

    /// The query string that reproduces these filters (empty when there are none).
    pub fn to_query(&self) -> String {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("entry", &self.entry),
            ("host", &self.host),
            ("pool", &self.pool),
            ("state", &self.state),
            ("phase", &self.phase),
            ("health", &self.health),
        ] {
            if let Some(v) = v {
                s.append_pair(k, v);
            }
        }
        s.finish()
    }

    /// Whether no filter is set (every row is kept).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn host_state_filter(&self) -> Option<&str> {
        self.state.as_deref().filter(|s| HOST_STATES.contains(s))
    }

    fn proxy_state_filter(&self) -> Option<&str> {
        self.state.as_deref().filter(|s| !HOST_STATES.contains(s))
    }

    /// Whether the host row `h` passes (entry, host, and a host `state`).
    pub fn keeps_host(&self, h: &HostStatusRow) -> bool {
        self.entry.as_deref().is_none_or(|e| e == h.entry)
            && self.host.as_deref().is_none_or(|x| x == h.host)
            && self.host_state_filter().is_none_or(|s| s == h.state)
    }

    /// Whether the proxy row `p` passes (entry, host, pool, a proxy `state`, phase, health).
    pub fn keeps_proxy(&self, p: &ProxyStatusRow) -> bool {
        self.entry
            .as_deref()
            .is_none_or(|e| entry_of(p) == Some(e))
            && self.host.as_deref().is_none_or(|x| p.host.as_deref() == Some(x))
            // NB: proxies carry no pool membership yet: a pool filter matches none of them.
            && self.pool.is_none()
            && self
                .proxy_state_filter()
                .is_none_or(|s| s == p.phase.as_str() || s == health_label(p))
            && self.phase.as_deref().is_none_or(|s| s == p.phase.as_str())
            && self.health.as_deref().is_none_or(|s| s == health_label(p))
    }

    /// Whether the pool row `p` passes (`pool` as `NAME` or `NAMESPACE/NAME`).
    pub fn keeps_pool_row(&self, p: &PoolStatusRow) -> bool {
        self.keeps_pool(&p.namespace, &p.name)
    }

    /// Whether pool `namespace/name` passes (`pool` as `NAME` or `NAMESPACE/NAME`).
    pub fn keeps_pool(&self, namespace: &str, name: &str) -> bool {
        self.pool
            .as_deref()
            .is_none_or(|x| x == name || x == format!("{namespace}/{name}"))
    }
}

/// `Healthy`, `Unhealthy` or `Unchecked` (no decision yet, or health checks off).
pub fn health_label(p: &ProxyStatusRow) -> &'static str {
    match p.health.as_ref().and_then(|h| h.healthy) {
        Some(true) => "Healthy",
        Some(false) => "Unhealthy",
        None => "Unchecked",
    }
}

impl StatusDocument {
    /// The document with only the proxy rows `f` keeps and the host rows it keeps (a filter
    /// on a proxy's phase or health leaves the host rows whole); manifest errors are kept.
    /// O(rows).
    pub fn filtered(&self, f: &Filters) -> StatusDocument {
        let host_filter = Filters {
            phase: None,
            health: None,
            ..f.clone()
        };
        StatusDocument {
            generated_at: self.generated_at.clone(),
            proxies: self
                .proxies
                .iter()
                .filter(|p| f.keeps_proxy(p))
                .cloned()
                .collect(),
            hosts: self
                .hosts
                .iter()
                .filter(|h| host_filter.keeps_host(h))
                .cloned()
                .collect(),
            manifest_errors: self.manifest_errors.clone(),
            pools: self
                .pools
                .iter()
                .filter(|p| f.pool.is_none() || f.keeps_pool_row(p))
                .cloned()
                .collect(),
        }
    }
}
