//! Hosts an administrator declared dead in Kubernetes mode: one annotation per host on its
//! entry's [`ProviderHealth`](crate::api::ProviderHealth),
//! `fence.egress-proxies.dev/HOST: REASON` (`kubectl annotate providerhealth ENTRY
//! fence.egress-proxies.dev/HOST="why"`, or `egress-proxies hosts fence --kubernetes`).
//!
//! One annotation per host keeps every edit local to its key: declaring one host never
//! rewrites another's declaration, and the operator removes a declaration with a JSON patch
//! that tests the value it read first ([`removal_patch`]), so a newer declaration written
//! meanwhile stays.
//!
//! Guarantees (parsing, [`parse`]): only keys under [`PREFIX`] are read, at most
//! [`MAX_DECLARATIONS`] of them; a key whose host is not a host of the entry, or whose value
//! is not one line of at most [`MAX_REASON_CHARS`] printable characters, is never applied and
//! is reported ([`Problem`]); nothing here panics on any input.

use std::collections::BTreeMap;

/// The annotation key prefix; the host's name follows.
pub const PREFIX: &str = "fence.egress-proxies.dev/";
/// Longest reason applied.
pub const MAX_REASON_CHARS: usize = 256;
/// Most declarations read on one ProviderHealth (the rest are reported, not applied).
pub const MAX_DECLARATIONS: usize = 64;

/// The annotation key declaring `host` dead.
pub fn key(host: &str) -> String {
    format!("{PREFIX}{host}")
}

/// One declaration read from the annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The host (one of the entry's hosts).
    pub host: String,
    /// The annotation's value, as written (the reason).
    pub reason: String,
}

/// An annotation under [`PREFIX`] that is not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The entry has no such host.
    UnknownHost(String),
    /// The value is not one line of printable text of at most [`MAX_REASON_CHARS`].
    BadReason {
        /// The host.
        host: String,
        /// What is wrong.
        why: String,
    },
    /// More than [`MAX_DECLARATIONS`] declarations: the ones after it were ignored.
    TooMany(usize),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownHost(h) => write!(
                f,
                "{PREFIX}{}: the entry has no such host; not applied",
                egress_core::model::truncate(h, 64)
            ),
            Self::BadReason { host, why } => write!(f, "{PREFIX}{host}: {why}; not applied"),
            Self::TooMany(n) => write!(
                f,
                "{n} fence annotations; only the first {MAX_DECLARATIONS} are read"
            ),
        }
    }
}

/// Checks a reason: one line of printable text, at most [`MAX_REASON_CHARS`] characters
/// (an empty reason is allowed).
pub fn check_reason(r: &str) -> Result<(), String> {
    let n = r.chars().count();
    if n > MAX_REASON_CHARS {
        return Err(format!(
            "reason of {n} characters; at most {MAX_REASON_CHARS}"
        ));
    }
    if r.chars().any(char::is_control) {
        return Err("the reason has control characters (a line break, a tab)".to_owned());
    }
    Ok(())
}

/// The declarations in `annotations` for an entry whose hosts are `hosts`, and the
/// annotations under [`PREFIX`] that are not applied.
pub fn parse(
    annotations: &BTreeMap<String, String>,
    hosts: &[&str],
) -> (Vec<Declaration>, Vec<Problem>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let ours: Vec<(&str, &String)> = annotations
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(PREFIX).map(|h| (h, v)))
        .collect();
    if ours.len() > MAX_DECLARATIONS {
        problems.push(Problem::TooMany(ours.len()));
    }
    for (host, value) in ours.into_iter().take(MAX_DECLARATIONS) {
        if !hosts.contains(&host) {
            problems.push(Problem::UnknownHost(host.to_owned()));
            continue;
        }
        if let Err(why) = check_reason(value) {
            problems.push(Problem::BadReason {
                host: host.to_owned(),
                why,
            });
            continue;
        }
        out.push(Declaration {
            host: host.to_owned(),
            reason: value.clone(),
        });
    }
    (out, problems)
}

/// What the leader does with a valid declaration after a check of its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Free what the host's instances held (the provider's `fence_host`).
    Apply,
    /// Nothing: this term already applied it.
    AlreadyApplied,
    /// Nothing: the host answered since the declaration was written (the row said
    /// `Removing`); it never applies again.
    Stale,
    /// Remove the annotation: the host answered.
    Remove,
}

/// The action for a declaration whose host this check found `dead` (`Unreachable` or
/// `Timeout`), that this term `applied` already, and whose row said `Removing` before
/// (`removing`): only a dead host's fresh declaration is applied; an answering host's is
/// removed.
pub fn decide(dead: bool, applied: bool, removing: bool) -> Action {
    if !dead {
        Action::Remove
    } else if removing {
        Action::Stale
    } else if applied {
        Action::AlreadyApplied
    } else {
        Action::Apply
    }
}

/// The JSON patch removing `host`'s declaration only while its value is still `reason`: a
/// declaration rewritten meanwhile makes the patch fail (the `test` operation) and stays.
pub fn removal_patch(host: &str, reason: &str) -> json_patch::Patch {
    let path = format!(
        "/metadata/annotations/{}",
        key(host).replace('~', "~0").replace('/', "~1")
    );
    // NB: a literal document: serde_json never fails on it.
    serde_json::from_value(serde_json::json!([
        {"op": "test", "path": path, "value": reason},
        {"op": "remove", "path": path},
    ]))
    .unwrap_or_else(|_| json_patch::Patch(Vec::new()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn ann(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn declarations_of_known_hosts_are_read_and_the_rest_reported() {
        let long = "x".repeat(MAX_REASON_CHARS + 1);
        let a = ann(&[
            ("fence.egress-proxies.dev/h1", "rack 4 unplugged"),
            ("fence.egress-proxies.dev/h2", ""),
            ("fence.egress-proxies.dev/h9", "typo"),
            ("fence.egress-proxies.dev/h3", "two\nlines"),
            ("fence.egress-proxies.dev/h4", &long),
            ("other.example/h1", "not ours"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]);
        let (d, p) = parse(&a, &["h1", "h2", "h3", "h4"]);
        assert_eq!(
            d,
            vec![
                Declaration {
                    host: "h1".into(),
                    reason: "rack 4 unplugged".into()
                },
                Declaration {
                    host: "h2".into(),
                    reason: String::new()
                },
            ]
        );
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.contains(&Problem::UnknownHost("h9".into())));
        assert!(
            p.iter()
                .any(|x| matches!(x, Problem::BadReason { host, .. } if host == "h3"))
        );
        assert!(p.iter().any(
            |x| matches!(x, Problem::BadReason { host, why } if host == "h4" && why.contains("257"))
        ));
        assert!(p[0].to_string().contains("not applied"));
    }

    #[test]
    fn at_most_max_declarations_are_read() {
        let a: BTreeMap<String, String> = (0..MAX_DECLARATIONS + 5)
            .map(|i| (key(&format!("h{i:03}")), "r".to_owned()))
            .collect();
        let names: Vec<String> = (0..MAX_DECLARATIONS + 5)
            .map(|i| format!("h{i:03}"))
            .collect();
        let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
        let (d, p) = parse(&a, &hosts);
        assert_eq!(d.len(), MAX_DECLARATIONS);
        assert_eq!(p, vec![Problem::TooMany(MAX_DECLARATIONS + 5)]);
    }

    #[test]
    fn only_a_dead_hosts_fresh_declaration_is_applied_and_only_once() {
        use Action::*;
        for applied in [false, true] {
            for removing in [false, true] {
                assert_eq!(decide(false, applied, removing), Remove);
            }
        }
        assert_eq!(decide(true, false, false), Apply);
        assert_eq!(decide(true, true, false), AlreadyApplied);
        assert_eq!(decide(true, false, true), Stale);
        assert_eq!(decide(true, true, true), Stale);
    }

    #[test]
    fn the_removal_patch_removes_only_an_unchanged_declaration() {
        let mut obj = serde_json::json!({"metadata": {"annotations": {
            "fence.egress-proxies.dev/h1": "old", "fence.egress-proxies.dev/h2": "keep"}}});
        let mut newer = obj.clone();
        newer["metadata"]["annotations"]["fence.egress-proxies.dev/h1"] = "new".into();
        json_patch::patch(&mut obj, &removal_patch("h1", "old")).unwrap();
        assert_eq!(
            obj["metadata"]["annotations"],
            serde_json::json!({"fence.egress-proxies.dev/h2": "keep"})
        );
        let before = newer.clone();
        assert!(json_patch::patch(&mut newer, &removal_patch("h1", "old")).is_err());
        assert_eq!(newer, before);
    }
}
