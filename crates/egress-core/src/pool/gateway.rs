//! `spec.gateway` of a ProxyPool: one front proxy for the pool (listeners, member choice,
//! sessions, failover, drain, limits) and its validation into a [`GatewayPolicy`]. The
//! membership a driver publishes to the gateway is [`super::gateway_source`].
//!
//! Guarantees: every field has a named default, documented for users in docs/gateway.md;
//! validation reports every error at once with its path (`spec.gateway.listeners[1].port`);
//! Pure: no I/O.
//!
//! One piece (about 480 lines before its tests, most of them the spec's documented fields):
//! the spec's types, their defaults and their validation are read together (each field's
//! default, bound and error path sit next to each other); splitting would scatter one field
//! across files.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::{format_duration, parse_duration};
use crate::model::{ProxyProtocol, SpecError};

/// `address` when omitted (standalone): loopback only, so a gateway is never exposed by
/// accident.
pub const DEFAULT_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Most listeners one gateway declares.
pub const MAX_LISTENERS: usize = 4;
/// Most client credentials (identities) one gateway declares.
// NB: each identity is a metric series set; 64 keeps a pool's series bounded.
pub const MAX_CLIENT_CREDENTIALS: usize = 64;
/// `failover.attempts` when omitted.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Most `failover.attempts`.
pub const MAX_ATTEMPTS: u32 = 10;
/// `failover.connectTimeout` when omitted.
pub const DEFAULT_CONNECT_TIMEOUT: &str = "5s";
/// `timeouts.request` when omitted.
pub const DEFAULT_REQUEST_TIMEOUT: &str = "10s";
/// `timeouts.tunnel` when omitted.
pub const DEFAULT_TUNNEL_TIMEOUT: &str = "1h";
/// `drainGrace` when omitted.
pub const DEFAULT_DRAIN_GRACE: &str = "5m";
/// `sessions.maxTTL` when omitted.
pub const DEFAULT_MAX_TTL: &str = "24h";
/// `limits.period` when omitted.
pub const DEFAULT_PERIOD: &str = "1d";

/// The pool's gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.listeners.all(l, self.listeners.exists_one(m, m.port == l.port))",
    "message": "spec.gateway.listeners: each port once"
}])))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySpec {
    /// Standalone mode: the address the listeners bind (default `127.0.0.1`; `0.0.0.0` for
    /// every IPv4 address). Kubernetes: not used; the gateway Deployment listens on every
    /// address of its pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 45)))]
    pub address: Option<String>,
    /// Where clients connect: a port and what it speaks, `http` (CONNECT and absolute-URI
    /// requests) or `socks5` (username/password). One to four, each port once.
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 4)))]
    pub listeners: Vec<GatewayListener>,
    /// How a connection without a session picks a member: `RoundRobin` (default, each
    /// connection the next member) or `LeastConnections` (the member with the fewest open
    /// connections through this gateway replica).
    #[serde(default)]
    pub mode: GatewayMode,
    /// Sticky sessions from the username (`NAME-session-ID[-ttl-DURATION]`).
    #[serde(default)]
    pub sessions: GatewaySessions,
    /// Trying another member when one fails before the client's first byte.
    #[serde(default)]
    pub failover: GatewayFailover,
    /// Deadlines of the client's request and of an idle tunnel.
    #[serde(default)]
    pub timeouts: GatewayTimeouts,
    /// How long connections through a member that left the pool's published members keep
    /// running before they are cut (default `5m`; `0s` cuts at once).
    #[serde(default = "default_drain_grace")]
    pub drain_grace: String,
    /// The credentials clients authenticate with, each its own accounting identity (its
    /// username): Secret names in the pool's namespace (keys `username` and `password`,
    /// labelled `egress-proxies.dev/credentials: "true"` or of that type) in Kubernetes, file
    /// paths relative to the manifest directory (one line `username:password`) in
    /// standalone. Empty (default): the pool's own credentials (generated, or the template's
    /// `credentialsRef`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 64), extend(
        "items" = {"type": "string", "minLength": 1, "maxLength": 253}
    )))]
    pub client_credentials: Vec<String>,
    /// Limits per client identity, counted by each gateway replica.
    #[serde(default, skip_serializing_if = "GatewayLimits::is_default")]
    pub limits: GatewayLimits,
}

fn default_drain_grace() -> String {
    DEFAULT_DRAIN_GRACE.into()
}

/// One listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayListener {
    /// The TCP port.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub port: u16,
    /// `http` (default) or `socks5`.
    #[serde(default)]
    pub protocol: ProxyProtocol,
}

/// How a connection without a session picks a member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum GatewayMode {
    /// Each connection the next member, in turn.
    #[default]
    RoundRobin,
    /// The member with the fewest open connections.
    LeastConnections,
}

/// Sticky sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySessions {
    /// Whether a username may carry `-session-ID` (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The TTL of a session whose username gives none (unset: the session holds while its
    /// member is published).
    #[serde(
        default,
        rename = "defaultTTL",
        skip_serializing_if = "Option::is_none"
    )]
    pub default_ttl: Option<String>,
    /// The longest TTL a username may ask for (default `24h`, at most `7d`).
    #[serde(default = "default_max_ttl", rename = "maxTTL")]
    pub max_ttl: String,
}

fn default_true() -> bool {
    true
}
fn default_max_ttl() -> String {
    DEFAULT_MAX_TTL.into()
}

impl Default for GatewaySessions {
    fn default() -> Self {
        Self {
            enabled: true,
            default_ttl: None,
            max_ttl: default_max_ttl(),
        }
    }
}

/// Failover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayFailover {
    /// Members tried per connection before the client gets an error (default 3, 1 to 10).
    #[serde(default = "default_attempts")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 10)))]
    pub attempts: u32,
    /// The deadline of one attempt: connect, handshake and the member's answer (default
    /// `5s`, 1s to 60s).
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: String,
}

fn default_attempts() -> u32 {
    DEFAULT_ATTEMPTS
}
fn default_connect_timeout() -> String {
    DEFAULT_CONNECT_TIMEOUT.into()
}

impl Default for GatewayFailover {
    fn default() -> Self {
        Self {
            attempts: DEFAULT_ATTEMPTS,
            connect_timeout: default_connect_timeout(),
        }
    }
}

/// Deadlines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayTimeouts {
    /// The client's whole request: HTTP head, or SOCKS5 greeting, login and request
    /// (default `10s`, 1s to 5m).
    #[serde(default = "default_request")]
    pub request: String,
    /// A tunnel silent both ways is closed after this (default `1h`, 10s to 7d).
    #[serde(default = "default_tunnel")]
    pub tunnel: String,
}

fn default_request() -> String {
    DEFAULT_REQUEST_TIMEOUT.into()
}
fn default_tunnel() -> String {
    DEFAULT_TUNNEL_TIMEOUT.into()
}

impl Default for GatewayTimeouts {
    fn default() -> Self {
        Self {
            request: default_request(),
            tunnel: default_tunnel(),
        }
    }
}

/// Limits per client identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayLimits {
    /// Open connections per identity (unset: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_connections: Option<u32>,
    /// Bytes (both directions) per identity per `period`; once spent, new connections are
    /// refused until the next period (unset: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub bytes_per_period: Option<u64>,
    /// The period of `bytesPerPeriod`, aligned to the Unix epoch (default `1d`, 1m to 31d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
}

impl GatewayLimits {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A valid `spec.gateway`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayPolicy {
    /// The bind address (standalone).
    pub address: IpAddr,
    /// The listeners: port and protocol.
    pub listeners: Vec<(u16, ProxyProtocol)>,
    /// Member choice without a session.
    pub mode: GatewayMode,
    /// Sessions allowed.
    pub sessions: bool,
    /// Default session TTL.
    pub default_ttl: Option<Duration>,
    /// Longest session TTL.
    pub max_ttl: Duration,
    /// Members tried per connection.
    pub attempts: u32,
    /// One attempt's deadline.
    pub connect_timeout: Duration,
    /// The request deadline.
    pub request_timeout: Duration,
    /// The idle tunnel deadline.
    pub tunnel_timeout: Duration,
    /// The drain grace.
    pub drain_grace: Duration,
    /// Client credential references (empty: the pool's own credentials).
    pub client_credentials: Vec<String>,
    /// Open connections per identity.
    pub max_connections: Option<u32>,
    /// Bytes per identity per period.
    pub bytes_per_period: Option<(u64, Duration)>,
}

impl GatewaySpec {
    /// Checks every value (paths under `spec.gateway`); `pool_has_credentials` says whether
    /// the pool generates credentials or its template names some (the default client
    /// credentials).
    pub fn validate(&self, pool_has_credentials: bool) -> Result<GatewayPolicy, Vec<SpecError>> {
        let mut errs = Vec::new();
        let mut err = |path: String, message: String| errs.push(SpecError { path, message });
        let address = match &self.address {
            None => DEFAULT_ADDRESS,
            Some(a) => a.parse::<IpAddr>().unwrap_or_else(|_| {
                err(
                    "spec.gateway.address".into(),
                    format!("{a:?} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)"),
                );
                DEFAULT_ADDRESS
            }),
        };
        if self.listeners.is_empty() || self.listeners.len() > MAX_LISTENERS {
            err(
                "spec.gateway.listeners".into(),
                format!(
                    "{} listeners: declare 1 to {MAX_LISTENERS}",
                    self.listeners.len()
                ),
            );
        }
        for (i, l) in self.listeners.iter().enumerate() {
            if l.port == 0 {
                err(
                    format!("spec.gateway.listeners[{i}].port"),
                    "0 is not a usable port".into(),
                );
            } else if self.listeners.iter().take(i).any(|o| o.port == l.port) {
                err(
                    format!("spec.gateway.listeners[{i}].port"),
                    format!("port {} is declared twice", l.port),
                );
            }
        }
        let mut dur =
            |path: &str, text: &str, min: Duration, max: Duration| match parse_duration(text) {
                Some(d) if d >= min && d <= max => Some(d),
                Some(_) => {
                    err(
                        format!("spec.gateway.{path}"),
                        format!(
                            "{text:?} is outside {} to {}",
                            format_duration(min),
                            format_duration(max)
                        ),
                    );
                    None
                }
                None => {
                    err(
                        format!("spec.gateway.{path}"),
                        format!(
                            "{text:?} is not a duration: use whole numbers with units s, m, h, d \
                         (\"30s\", \"1h30m\", \"7d\")"
                        ),
                    );
                    None
                }
            };
        let secs = Duration::from_secs;
        let max_ttl = dur(
            "sessions.maxTTL",
            &self.sessions.max_ttl,
            secs(1),
            secs(7 * 86_400),
        );
        let default_ttl = self
            .sessions
            .default_ttl
            .as_deref()
            .map(|t| dur("sessions.defaultTTL", t, secs(1), secs(7 * 86_400)));
        let connect = dur(
            "failover.connectTimeout",
            &self.failover.connect_timeout,
            secs(1),
            secs(60),
        );
        let request = dur(
            "timeouts.request",
            &self.timeouts.request,
            secs(1),
            secs(300),
        );
        let tunnel = dur(
            "timeouts.tunnel",
            &self.timeouts.tunnel,
            secs(10),
            secs(7 * 86_400),
        );
        let drain = dur("drainGrace", &self.drain_grace, secs(0), secs(86_400));
        let period = dur(
            "limits.period",
            self.limits.period.as_deref().unwrap_or(DEFAULT_PERIOD),
            secs(60),
            secs(31 * 86_400),
        );
        if let (Some(Some(d)), Some(m)) = (default_ttl, max_ttl)
            && d > m
        {
            err(
                "spec.gateway.sessions.defaultTTL".into(),
                format!(
                    "{:?} is longer than sessions.maxTTL {:?}",
                    self.sessions.default_ttl.as_deref().unwrap_or_default(),
                    self.sessions.max_ttl
                ),
            );
        }
        if self.failover.attempts == 0 || self.failover.attempts > MAX_ATTEMPTS {
            err(
                "spec.gateway.failover.attempts".into(),
                format!("{} is outside 1 to {MAX_ATTEMPTS}", self.failover.attempts),
            );
        }
        if self.client_credentials.len() > MAX_CLIENT_CREDENTIALS {
            err(
                "spec.gateway.clientCredentials".into(),
                format!(
                    "{} entries: at most {MAX_CLIENT_CREDENTIALS}",
                    self.client_credentials.len()
                ),
            );
        }
        for (i, c) in self.client_credentials.iter().enumerate() {
            let path = format!("spec.gateway.clientCredentials[{i}]");
            if c.trim().is_empty() {
                err(
                    path,
                    "must name a Secret (Kubernetes) or a file (standalone)".into(),
                );
            } else if self.client_credentials.iter().take(i).any(|o| o == c) {
                err(path, format!("{c:?} is listed twice"));
            }
        }
        if self.client_credentials.is_empty() && !pool_has_credentials {
            err(
                "spec.gateway.clientCredentials".into(),
                "the gateway needs client credentials: list them here, or let the pool \
                 generate its credentials (spec.credentials.generate) or use the template's \
                 proxy.credentialsRef"
                    .into(),
            );
        }
        if self.limits.max_connections == Some(0) {
            err(
                "spec.gateway.limits.maxConnections".into(),
                "0 would refuse every connection: at least 1, or unset".into(),
            );
        }
        if self.limits.bytes_per_period == Some(0) {
            err(
                "spec.gateway.limits.bytesPerPeriod".into(),
                "0 would refuse every connection: at least 1, or unset".into(),
            );
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        let (Some(max_ttl), Some(connect), Some(request), Some(tunnel), Some(drain), Some(period)) =
            (max_ttl, connect, request, tunnel, drain, period)
        else {
            return Err(errs);
        };
        Ok(GatewayPolicy {
            address,
            listeners: self
                .listeners
                .iter()
                .map(|l| (l.port, l.protocol))
                .collect(),
            mode: self.mode,
            sessions: self.sessions.enabled,
            default_ttl: default_ttl.flatten(),
            max_ttl,
            attempts: self.failover.attempts,
            connect_timeout: connect,
            request_timeout: request,
            tunnel_timeout: tunnel,
            drain_grace: drain,
            client_credentials: self.client_credentials.clone(),
            max_connections: self.limits.max_connections,
            bytes_per_period: self.limits.bytes_per_period.map(|b| (b, period)),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn spec(y: &str) -> GatewaySpec {
        serde_saphyr::from_str(y).unwrap()
    }

    #[test]
    fn a_minimal_gateway_takes_every_default() {
        let p = spec("listeners: [{port: 3128}]\n").validate(true).unwrap();
        assert_eq!(p.address, DEFAULT_ADDRESS);
        assert_eq!(p.listeners, [(3128, ProxyProtocol::Http)]);
        assert_eq!(p.mode, GatewayMode::RoundRobin);
        assert!(p.sessions);
        assert_eq!(
            (p.attempts, p.connect_timeout, p.request_timeout),
            (3, Duration::from_secs(5), Duration::from_secs(10))
        );
        assert_eq!(p.tunnel_timeout, Duration::from_secs(3600));
        assert_eq!(p.drain_grace, Duration::from_secs(300));
        assert_eq!(p.max_ttl, Duration::from_secs(86_400));
        assert_eq!(
            (p.default_ttl, p.max_connections, p.bytes_per_period),
            (None, None, None)
        );
    }

    #[test]
    fn every_bad_value_is_named_with_its_path() {
        let s = spec(
            "address: nope\nlisteners: [{port: 3128}, {port: 3128, protocol: socks5}, {port: 0}]\n\
             mode: LeastConnections\nsessions: {defaultTTL: 2d, maxTTL: 1d}\n\
             failover: {attempts: 0, connectTimeout: 2m}\ntimeouts: {request: 1x, tunnel: 1s}\n\
             drainGrace: 2d\nclientCredentials: [a, a, ' ']\n\
             limits: {maxConnections: 0, bytesPerPeriod: 0, period: 10s}\n",
        );
        let paths: Vec<String> = s
            .validate(true)
            .unwrap_err()
            .into_iter()
            .map(|e| e.path)
            .collect();
        for p in [
            "spec.gateway.address",
            "spec.gateway.listeners[1].port",
            "spec.gateway.listeners[2].port",
            "spec.gateway.sessions.defaultTTL",
            "spec.gateway.failover.attempts",
            "spec.gateway.failover.connectTimeout",
            "spec.gateway.timeouts.request",
            "spec.gateway.timeouts.tunnel",
            "spec.gateway.drainGrace",
            "spec.gateway.clientCredentials[1]",
            "spec.gateway.clientCredentials[2]",
            "spec.gateway.limits.maxConnections",
            "spec.gateway.limits.bytesPerPeriod",
            "spec.gateway.limits.period",
        ] {
            assert!(paths.iter().any(|x| x == p), "{p} missing from {paths:?}");
        }
        let none = spec("listeners: []\n").validate(true).unwrap_err();
        assert_eq!(none[0].path, "spec.gateway.listeners");
        let open = spec("listeners: [{port: 1080, protocol: socks5}]\n")
            .validate(false)
            .unwrap_err();
        assert_eq!(open[0].path, "spec.gateway.clientCredentials");
        assert!(open[0].message.contains("needs client credentials"));
        assert!(
            spec("listeners: [{port: 1}]\nclientCredentials: [alice]\n")
                .validate(false)
                .is_ok()
        );
        assert!(
            serde_saphyr::from_str::<GatewaySpec>("listeners: [{port: 1}]\nbogus: 1\n").is_err()
        );
    }
}
