//! A set of namespaces (`access:` lists of an entry, a host, an address pool): by name, or,
//! in Kubernetes, by their labels. Its own module so that the address pools and the entry
//! config both use it without importing each other.
//!
//! Guarantees: [`Namespaces::admits`] is pure; an empty selector admits nothing by labels.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A set of namespaces: by name, or (Kubernetes) by their labels. A namespace is in it when
/// its name is listed or its labels match `namespaceSelector` (every `matchLabels` pair).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Namespaces {
    /// Namespace names.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces whose labels hold every pair of `matchLabels` (Kubernetes only: a
    /// standalone manifest's namespace has no labels).
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
}

/// A label selector (`matchLabels` only).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels a namespace must carry, each with this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl Namespaces {
    /// Whether namespace `ns` (with `labels`, when known) is in the set.
    pub fn admits(&self, ns: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.namespaces.iter().any(|n| n == ns)
            || self.namespace_selector.as_ref().is_some_and(|s| {
                !s.match_labels.is_empty()
                    && labels
                        .is_some_and(|l| s.match_labels.iter().all(|(k, v)| l.get(k) == Some(v)))
            })
    }
}
