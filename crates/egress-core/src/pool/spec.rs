//! The `ProxyPool` manifest and its spec: the same YAML as a standalone manifest and as a
//! Kubernetes resource. Every field is optional except `template`; the defaults are named
//! constants here and documented for users in docs/pools.md.
//!
//! Guarantees: shape only (unknown fields are refused); the values are checked by
//! [`ProxyPoolSpec::validate`](super::validate), which names the field and the value at fault.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::quantity::IntOrPercent;
use crate::model::{ObjectMeta, ProxySpec};

/// The kind of a ProxyPool manifest (its `apiVersion` is [`crate::model::API_VERSION`]).
pub const POOL_KIND: &str = "ProxyPool";
/// `replicas` when omitted.
pub const DEFAULT_REPLICAS: u32 = 1;
/// `update.maxSurge` when omitted: one extra member at a time, so a replacement is healthy
/// before the member it replaces goes.
pub const DEFAULT_MAX_SURGE: IntOrPercent = IntOrPercent::Count(1);
/// `update.maxUnavailable` when omitted: no healthy member is removed before its
/// replacement is healthy.
pub const DEFAULT_MAX_UNAVAILABLE: IntOrPercent = IntOrPercent::Count(0);
/// `autohealing.unhealthyAfter` when omitted.
// NB: the health engine needs a few consecutive failed checks (30 s apart by default) before
// it calls a proxy unhealthy; five minutes of that is an outage, not a blip.
pub const DEFAULT_UNHEALTHY_AFTER: &str = "5m";
/// `autohealing.hostDeadAfter` when omitted.
// NB: a dead host shows in its row at most 30 s after it stopped answering (the default check
// interval and keepalive, docs/operations.md); 60 s more is two further check rounds that
// still find it dead, so one lost round or a libvirtd restart (back within seconds) never
// replaces members, while a member's replacement is asked for at most 90 s after its host
// died, well before `unhealthyAfter` (5 m).
pub const DEFAULT_HOST_DEAD_AFTER: &str = "60s";
/// `autohealing.backoff.initial` when omitted.
pub const DEFAULT_BACKOFF_INITIAL: &str = "30s";
/// `autohealing.backoff.max` when omitted.
// NB: a broken host is retried at least every 10 minutes, and a broken image costs at most
// six creates an hour per host.
pub const DEFAULT_BACKOFF_MAX: &str = "10m";

/// A ProxyPool manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyPoolManifest {
    /// Must be [`crate::model::API_VERSION`].
    pub api_version: String,
    /// Must be [`POOL_KIND`].
    pub kind: String,
    /// Name and namespace.
    pub metadata: ObjectMeta,
    /// What the user wants.
    pub spec: ProxyPoolSpec,
}

/// What a ProxyPool asks for: `replicas` member Proxies made from `template`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyPoolSpec {
    /// How many members the pool keeps (default 1; 0 keeps none).
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// What every member is made from, shaped like a Deployment's Pod template:
    /// `metadata` (labels and annotations the members get) and `spec` (the member Proxy's
    /// spec; `host` must not be set: the pool places its members, see `placement`).
    pub template: ProxyTemplate,
    /// Where members go: spread over the provider entry's hosts as evenly as host health and
    /// capacity allow, optionally at most `maxPerHost` per host and only on `hosts`.
    #[serde(default, skip_serializing_if = "Placement::is_default")]
    pub placement: Placement,
    /// When members are replaced for their age (`maxAge`; unset: never), one batch at a time
    /// within the `update` budget, each replacement healthy before the member it replaces
    /// goes (with the default budget).
    #[serde(default, skip_serializing_if = "Rotation::is_default")]
    pub rotation: Rotation,
    /// How many members may be added (`maxSurge`, default 1) or missing (`maxUnavailable`,
    /// default 0) while members are replaced for rotation, a template change or scale-in.
    #[serde(default)]
    pub update: UpdatePolicy,
    /// When failed or unhealthy members are replaced (at once when Failed, after
    /// `unhealthyAfter` when unhealthy), and how creates on a failing host back off.
    #[serde(default)]
    pub autohealing: Autohealing,
    /// Which members go first when the pool shrinks: unhealthy ones, then those not ready
    /// yet, then the oldest (or the newest, with `order: NewestFirst`).
    #[serde(default)]
    pub scale_in: ScaleIn,
    /// Credentials the operator generates for the pool's members (`generate: true`): a user
    /// name and password kept in a Secret (Kubernetes) or a file (standalone) that the pool
    /// owns; editing or deleting them replaces the members.
    #[serde(default, skip_serializing_if = "CredentialsPolicy::is_default")]
    pub credentials: CredentialsPolicy,
    /// What the pool does with a member whose egress address is listed in a DNS blocklist
    /// the operator checks (`onListed`: `Ignore`, the default; `Unpublish`; `Replace`).
    #[serde(default, skip_serializing_if = "ReputationPolicy::is_default")]
    pub reputation: ReputationPolicy,
    /// A front proxy for the pool (the pool gateway): one endpoint that authenticates
    /// clients, spreads their connections over the published members or keeps a session on
    /// one, fails over before the first byte, and logs and counts every connection. Unset:
    /// no gateway. See docs/gateway.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<super::gateway::GatewaySpec>,
}

fn default_replicas() -> u32 {
    DEFAULT_REPLICAS
}

/// What every member of a pool is made from, shaped like a Kubernetes Pod template (a
/// Deployment's, or KubeVirt's VirtualMachinePool's): `metadata` for the members, `spec`
/// for their Proxy spec.
///
/// A template written flat (the Proxy's fields directly under `template`, the shape of
/// earlier versions) is read, not rejected outright, so that a stored object of that shape
/// still loads: it carries [`ProxyTemplate::shape_error`], which validation reports with the
/// new shape, and the pool does nothing until it is rewritten.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyTemplate {
    /// Labels and annotations every member gets (Kubernetes: on each member Proxy, beside the
    /// labels the pool sets itself). A change replaces the members, as a change of `spec`
    /// does.
    #[serde(default, skip_serializing_if = "TemplateMetadata::is_empty")]
    pub metadata: TemplateMetadata,
    /// The member Proxies' spec: provider, image, resources and proxy settings. `host` and
    /// `egress` must not be set: the pool places its members and their addresses come from
    /// their hosts.
    pub spec: ProxySpec,
    /// Why the template cannot be used as written (a flat template, or one without `spec`):
    /// reported by [`ProxyPoolSpec::validate`]. Never written out.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub shape_error: Option<String>,
}

/// The labels and annotations of a pool's members.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateMetadata {
    /// Labels every member gets. The pool's own (`egress-proxies.dev/pool`,
    /// `egress-proxies.dev/template-hash`) may not be set here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations every member gets. `egress-proxies.dev/quarantine` may not be set here
    /// (it would hold every member out of the pool).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl TemplateMetadata {
    /// Whether neither labels nor annotations are set.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The fields of a Proxy spec: a template that names one of them directly is flat.
const PROXY_SPEC_FIELDS: &[&str] = &["provider", "host", "image", "resources", "proxy", "egress"];

/// What a flat template is told (the shape to write instead).
pub const FLAT_TEMPLATE: &str = "the template takes the shape of a Kubernetes Pod template: \
     `template: {metadata: {labels: {...}, annotations: {...}}, spec: {provider: ..., image: \
     ..., proxy: {...}}}`; move the Proxy fields written directly under `template` (provider, \
     image, resources, proxy) into `template.spec` (metadata is optional). ProxyPool is \
     v1alpha1: its shape may change between versions without a compatibility promise";

impl<'de> Deserialize<'de> for ProxyTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ProxyTemplate;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Proxy template with `metadata` and `spec`")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ProxyTemplate, A::Error> {
                use serde::de::Error;
                let mut metadata = None;
                let mut spec = None;
                let mut flat = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "metadata" if metadata.is_some() => {
                            return Err(A::Error::duplicate_field("metadata"));
                        }
                        "spec" if spec.is_some() => return Err(A::Error::duplicate_field("spec")),
                        "metadata" => metadata = Some(map.next_value()?),
                        "spec" => spec = Some(map.next_value()?),
                        k if PROXY_SPEC_FIELDS.contains(&k) => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            flat.push(key);
                        }
                        k => return Err(A::Error::unknown_field(k, &["metadata", "spec"])),
                    }
                }
                let shape_error = match (&spec, flat.is_empty()) {
                    (_, false) => Some(format!(
                        "{} written directly under template: {FLAT_TEMPLATE}",
                        flat.join(", ")
                    )),
                    (None, true) => Some(format!("no spec: {FLAT_TEMPLATE}")),
                    (Some(_), true) => None,
                };
                Ok(ProxyTemplate {
                    metadata: metadata.unwrap_or_default(),
                    spec: spec.unwrap_or_default(),
                    shape_error,
                })
            }
        }
        d.deserialize_struct("ProxyTemplate", &["metadata", "spec"], V)
    }
}

/// Where a pool's members go: spread over the provider entry's hosts, as evenly as health
/// and capacity allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placement {
    /// At most this many members on one host (unset: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_per_host: Option<u32>,
    /// Only these hosts of the entry (their names in the provider config); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
    pub hosts: Vec<String>,
    /// Spread the members again when a host holds at least two more of them than another
    /// host the pool may use (as after a failover once the dead host is back): one member at
    /// a time is replaced on the least loaded host, within the `update` budget, once the pool
    /// is settled and that host has been `Ready` for `autohealing.hostDeadAfter` (default
    /// true).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub rebalance: bool,
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            max_per_host: None,
            hosts: Vec::new(),
            rebalance: true,
        }
    }
}

impl Placement {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Replacement of members for their age.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rotation {
    /// A member older than this is replaced (`"30m"`, `"12h"`, `"7d"`; at least `1m`).
    /// Unset: members are never replaced for their age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// What a member replaced for its age or a template change does with its egress
    /// addresses: `Fresh` (default) gives the replacement new ones; `Keep` deletes the old
    /// member first (within `update.maxUnavailable`, no surge) and creates the replacement
    /// on the same host with the same addresses.
    #[serde(default, skip_serializing_if = "EgressAddressPolicy::is_fresh")]
    pub egress_address: EgressAddressPolicy,
}

/// The egress addresses of a member's replacement (`rotation.egressAddress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum EgressAddressPolicy {
    /// New addresses from the host's address pool; the old member serves until its
    /// replacement is available.
    #[default]
    Fresh,
    /// The old member's addresses, on its host; the old member is deleted first.
    Keep,
}

impl EgressAddressPolicy {
    fn is_fresh(&self) -> bool {
        *self == Self::Fresh
    }
}

impl Rotation {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The replacement budget shared by rotation, template changes and scale-in, with a
/// Deployment's arithmetic: a percentage of `replicas`, `maxSurge` rounded up and
/// `maxUnavailable` rounded down; and the drain grace of the members these remove.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdatePolicy {
    /// Members that may exist above `replicas` while members are replaced (default 1).
    #[serde(default = "default_max_surge")]
    pub max_surge: IntOrPercent,
    /// Members that may be unavailable below `replicas` because the pool removed them
    /// (default 0). Both 0 is invalid: nothing could ever be replaced.
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: IntOrPercent,
    /// How long a member the pool removes for rotation, a template change, a listing, a
    /// draining host or scale-in stays after it is unpublished (no new client gets it; open
    /// connections run on) before it is deleted (`"0s"` to `"24h"`). Unset: the gateway's
    /// `drainGrace` when the pool declares `gateway`, else `0s` (deleted at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_grace: Option<String>,
}

fn default_max_surge() -> IntOrPercent {
    DEFAULT_MAX_SURGE
}
fn default_max_unavailable() -> IntOrPercent {
    DEFAULT_MAX_UNAVAILABLE
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        Self {
            max_surge: DEFAULT_MAX_SURGE,
            max_unavailable: DEFAULT_MAX_UNAVAILABLE,
            drain_grace: None,
        }
    }
}

/// Replacement of broken members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Autohealing {
    /// Whether broken members are replaced (default true). Off: a Failed or unhealthy member
    /// stays until someone deletes it.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// A running member unhealthy (or paused) for this long is replaced (default `5m`). A
    /// member in phase Failed is replaced at once.
    #[serde(default = "default_unhealthy_after")]
    pub unhealthy_after: String,
    /// A member whose host has been dead (`Unreachable` or `Timeout`, without a break) for
    /// this long is lost: it is replaced on another host at once and deleted once its host
    /// answers again, never before (default `60s`).
    #[serde(default = "default_host_dead_after")]
    pub host_dead_after: String,
    /// How replacements back off on a host whose members keep failing.
    #[serde(default)]
    pub backoff: Backoff,
}

fn default_true() -> bool {
    true
}
fn default_unhealthy_after() -> String {
    DEFAULT_UNHEALTHY_AFTER.into()
}
fn default_host_dead_after() -> String {
    DEFAULT_HOST_DEAD_AFTER.into()
}

impl Default for Autohealing {
    fn default() -> Self {
        Self {
            enabled: true,
            unhealthy_after: default_unhealthy_after(),
            host_dead_after: default_host_dead_after(),
            backoff: Backoff::default(),
        }
    }
}

/// Backoff of member creation on a host after members there failed: `initial · 2^(n-1)`
/// after `n` consecutive failures, at most `max`; reset when a member on that host becomes
/// available.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Backoff {
    /// The wait after the first failure (default `30s`).
    #[serde(default = "default_backoff_initial")]
    pub initial: String,
    /// The longest wait (default `10m`).
    #[serde(default = "default_backoff_max")]
    pub max: String,
}

fn default_backoff_initial() -> String {
    DEFAULT_BACKOFF_INITIAL.into()
}
fn default_backoff_max() -> String {
    DEFAULT_BACKOFF_MAX.into()
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: default_backoff_initial(),
            max: default_backoff_max(),
        }
    }
}

/// Which members go first when the pool has more than it needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleIn {
    /// Among available members, `OldestFirst` (default: age is what rotation retires) or
    /// `NewestFirst` (keeps long-lived egress addresses). Members that are not available
    /// always go first: unhealthy ones, then those not ready yet.
    #[serde(default)]
    pub order: ScaleInOrder,
}

/// The tie-break among available members on scale-in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ScaleInOrder {
    /// The oldest member goes first.
    #[default]
    OldestFirst,
    /// The newest member goes first.
    NewestFirst,
}

/// What the pool does about members whose egress addresses are listed in a DNS blocklist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReputationPolicy {
    /// `Ignore` (default): a listing is only reported. `Unpublish`: a listed member stops
    /// being available (clients no longer get it) until it is delisted, and is not replaced
    /// for it. `Replace`: a member whose declared egress address is listed is replaced, within
    /// the `update` budget, by one with a fresh address, and the listed address is retired
    /// from its host's address pool for the operator's `reputation.retireFor`.
    #[serde(default)]
    pub on_listed: OnListed,
}

impl ReputationPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `reputation.onListed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum OnListed {
    /// Report only.
    #[default]
    Ignore,
    /// Stop publishing the member while it is listed.
    Unpublish,
    /// Replace the member with one at a fresh address and retire the listed address.
    Replace,
}

/// Credentials the operator makes for the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialsPolicy {
    /// Generate a username and password once and give them to every member (default
    /// false). The template must then not set `proxy.credentialsRef`. Changing or removing
    /// the generated credentials replaces the members.
    #[serde(default)]
    pub generate: bool,
}

impl CredentialsPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
