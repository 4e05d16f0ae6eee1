//! The pool spec's defaults, and its validation naming each field and value at fault.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::time::Duration;

use super::spec::{ProxyPoolManifest, ProxyPoolSpec, ScaleInOrder};
use super::validate::{PoolPolicy, validate_pool_name};

const TEMPLATE: &str = "template:\n  spec:\n    provider: home\n    image: debian-12\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n";

fn spec(extra: &str) -> ProxyPoolSpec {
    serde_saphyr::from_str(&format!("{TEMPLATE}{extra}")).unwrap()
}

fn errors(extra: &str) -> Vec<(String, String)> {
    spec(extra)
        .validate()
        .unwrap_err()
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect()
}

#[test]
fn a_minimal_manifest_gets_the_documented_defaults() {
    let y = format!(
        "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\nspec:\n{}",
        TEMPLATE
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    let m: ProxyPoolManifest = serde_saphyr::from_str(&y).unwrap();
    assert_eq!(
        m.spec.validate().unwrap(),
        PoolPolicy {
            replicas: 1,
            max_surge: 1,
            max_unavailable: 0,
            max_per_host: None,
            hosts: vec![],
            rebalance: true,
            max_age: None,
            autohealing: true,
            unhealthy_after: Duration::from_secs(300),
            host_dead_after: Duration::from_secs(60),
            backoff_initial: Duration::from_secs(30),
            backoff_max: Duration::from_secs(600),
            scale_in: ScaleInOrder::OldestFirst,
            generate_credentials: false,
            keep_addresses: false,
            on_listed: crate::pool::spec::OnListed::Ignore,
            retire_for: egress_reputation::config::DEFAULT_RETIRE_FOR,
            max_members: u32::MAX,
            drain_grace: Duration::ZERO,
        }
    );
    assert!(validate_pool_name(&m.metadata.name).is_none());
}

#[test]
fn every_bad_value_is_reported_at_once_with_its_path_and_value() {
    let errs = errors(
        "replicas: 20000\nplacement:\n  maxPerHost: 0\n  hosts: [h1, '', h1]\nrotation:\n  maxAge: 30s\n\
         update:\n  maxSurge: 0\n  maxUnavailable: 0%\nautohealing:\n  unhealthyAfter: soon\n  \
         backoff:\n    initial: 5m\n    max: 1m\n",
    );
    let paths: Vec<&str> = errs.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.replicas",
            "spec.placement.maxPerHost",
            "spec.placement.hosts[1]",
            "spec.placement.hosts[2]",
            "spec.rotation.maxAge",
            "spec.autohealing.unhealthyAfter",
            "spec.autohealing.backoff.max",
            "spec.update",
        ]
    );
    let msg = |p: &str| &errs.iter().find(|(q, _)| q == p).unwrap().1;
    assert!(msg("spec.replicas").contains("20000"));
    assert!(msg("spec.placement.hosts[2]").contains("\"h1\" is listed twice"));
    assert!(msg("spec.rotation.maxAge").contains("\"30s\" is shorter than the minimum 1m"));
    assert!(msg("spec.autohealing.unhealthyAfter").contains("\"soon\" is not a duration"));
    assert!(
        msg("spec.autohealing.backoff.max")
            .contains("\"1m\" is shorter than backoff.initial \"5m\"")
    );
    assert!(msg("spec.update").contains("maxSurge 0 and maxUnavailable 0%"));
}

#[test]
fn host_dead_after_is_checked_with_its_path_and_value() {
    for (v, want) in [
        ("5s", "\"5s\" is shorter than the minimum 10s"),
        ("2d", "\"2d\" is longer than the maximum 1d"),
        ("later", "\"later\" is not a duration"),
    ] {
        let errs = errors(&format!("autohealing:\n  hostDeadAfter: {v}\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].0, "spec.autohealing.hostDeadAfter");
        assert!(errs[0].1.contains(want), "{v}: {}", errs[0].1);
    }
    let ok: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  spec:\n    provider: home\n    image: debian-12\n    proxy:\n      \
         allowedClientCidrs: [10.0.0.0/8]\nautohealing:\n  hostDeadAfter: 2m\n",
    )
    .unwrap();
    assert_eq!(
        ok.validate().unwrap().host_dead_after,
        Duration::from_secs(120)
    );
}

#[test]
fn the_drain_grace_defaults_to_the_gateways_and_a_bad_one_is_named() {
    let grace = |extra: &str| spec(extra).validate().unwrap().drain_grace;
    // No gateway: deleted at once, unless set.
    assert_eq!(grace(""), Duration::ZERO);
    assert_eq!(
        grace("update:\n  drainGrace: 90s\n"),
        Duration::from_secs(90)
    );
    // A gateway: its drainGrace (5m by default), unless set.
    let gw = "credentials:\n  generate: true\ngateway:\n  listeners: [{port: 3128}]\n";
    assert_eq!(grace(gw), Duration::from_secs(300));
    assert_eq!(
        grace(&format!("{gw}  drainGrace: 20s\n")),
        Duration::from_secs(20)
    );
    assert_eq!(
        grace(&format!("{gw}update:\n  drainGrace: 0s\n")),
        Duration::ZERO
    );
    for (bad, why) in [
        ("soon", "\"soon\" is not a duration"),
        ("25h", "\"25h\" is longer than the maximum 1d"),
        ("-1s", "\"-1s\" is not a duration"),
    ] {
        let errs = errors(&format!("update:\n  drainGrace: {bad}\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].0, "spec.update.drainGrace");
        assert!(errs[0].1.contains(why), "{bad}: {}", errs[0].1);
    }
}

#[test]
fn the_template_is_checked_as_a_proxy_under_spec_template() {
    let s: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  spec:\n    provider: home\n    host: h1\n    image: ''\n    proxy:\n      port: 0\n",
    )
    .unwrap();
    let paths: Vec<String> = s
        .validate()
        .unwrap_err()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(
        paths,
        [
            "spec.template.spec.host",
            "spec.template.spec.image",
            "spec.template.spec.proxy.port",
            "spec.template.spec.proxy"
        ]
    );
}

#[test]
fn a_template_pinning_an_egress_address_is_refused() {
    let s: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  spec:\n    provider: home\n    image: debian-12\n    proxy:\n      \
         allowedClientCidrs: [10.0.0.0/8]\n    egress:\n      address: [203.0.113.7]\n",
    )
    .unwrap();
    let e = s.validate().unwrap_err();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].path, "spec.template.spec.egress.address");
    assert!(e[0].message.contains("203.0.113.7"), "{e:?}");
}

#[test]
fn generated_credentials_close_the_relay_and_conflict_with_a_credentials_ref() {
    let s: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  spec:\n    provider: home\n    image: debian-12\ncredentials:\n  generate: true\n",
    )
    .unwrap();
    assert!(s.validate().unwrap().generate_credentials);
    let mut s2 = s.clone();
    s2.template.spec.proxy.credentials_ref = Some("mine".into());
    let e = s2.validate().unwrap_err();
    assert_eq!(e[0].path, "spec.credentials.generate");
    assert!(e[0].message.contains("\"mine\""));
}

#[test]
fn percentages_resolve_against_replicas_and_both_zero_after_rounding_allows_one_unavailable() {
    let p = spec("replicas: 10\nupdate:\n  maxSurge: 25%\n  maxUnavailable: 25%\n")
        .validate()
        .unwrap();
    assert_eq!(
        (
            p.max_surge,
            p.max_unavailable,
            p.min_available(),
            p.max_total()
        ),
        (3, 2, 8, 13)
    );
    // 0% surge and 10% of 3 unavailable (0.3, down to 0): a Deployment's rule gives 1.
    let p = spec("replicas: 3\nupdate:\n  maxSurge: 0%\n  maxUnavailable: 10%\n")
        .validate()
        .unwrap();
    assert_eq!((p.max_surge, p.max_unavailable), (0, 1));
}

#[test]
fn pool_names_are_short_dns_labels() {
    for ok in ["web", "a", "web-2", &"a".repeat(56)] {
        assert!(validate_pool_name(ok).is_none(), "{ok}");
    }
    for bad in ["", "Web", "a.b", "-a", "a-", &"a".repeat(57), "a/b"] {
        let e = validate_pool_name(bad).unwrap();
        assert_eq!(e.path, "metadata.name");
        assert!(e.message.contains(&format!("{bad:?}")));
    }
}

#[test]
fn unknown_fields_are_refused() {
    let r =
        serde_saphyr::from_str::<ProxyPoolSpec>(&format!("{TEMPLATE}rotation:\n  maxAgee: 1h\n"));
    assert!(r.unwrap_err().to_string().contains("maxAgee"));
}

#[test]
fn the_users_page_documents_every_spec_field_with_its_default() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/pools.md"))
        .unwrap();
    let rows = [
        ("replicas", "`1`"),
        ("template", "(required)"),
        ("placement.maxPerHost", "unset"),
        ("placement.hosts", "all hosts"),
        ("placement.rebalance", "`true`"),
        ("rotation.maxAge", "unset"),
        ("update.maxSurge", "`1`"),
        ("update.maxUnavailable", "`0`"),
        ("autohealing.enabled", "`true`"),
        ("autohealing.unhealthyAfter", "`5m`"),
        ("autohealing.backoff.initial", "`30s`"),
        ("autohealing.backoff.max", "`10m`"),
        ("scaleIn.order", "`OldestFirst`"),
        ("credentials.generate", "`false`"),
    ];
    for (field, default) in rows {
        let row = format!("| `{field}` | {default}");
        assert!(doc.contains(&row), "docs/pools.md lacks the row {row}");
    }
    // The defaults in the table are the code's.
    let full = serde_json::to_value(spec("")).unwrap();
    assert_eq!(full["update"]["maxSurge"], 1);
    assert_eq!(full["update"]["maxUnavailable"], 0);
    assert_eq!(full["autohealing"]["unhealthyAfter"], "5m");
    assert_eq!(full["autohealing"]["backoff"]["initial"], "30s");
    assert_eq!(full["autohealing"]["backoff"]["max"], "10m");
    assert_eq!(full["autohealing"]["enabled"], true);
    assert_eq!(full["scaleIn"]["order"], "OldestFirst");
    assert_eq!(full["replicas"], 1);
    // Every field the spec serializes is in the table.
    let mut keys = Vec::new();
    let mut st = vec![(String::new(), full)];
    while let Some((prefix, v)) = st.pop() {
        if let serde_json::Value::Object(m) = v {
            for (k, v) in m {
                let path = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                if path != "template" {
                    st.push((path.clone(), v));
                }
                keys.push(path);
            }
        }
    }
    let mut with_all = serde_json::to_value(spec(
        "placement:\n  maxPerHost: 1\n  hosts: [a]\n  rebalance: false\nrotation:\n  maxAge: 1h\ncredentials:\n  generate: false\n",
    ))
    .unwrap();
    for section in ["placement", "rotation"] {
        for k in with_all[section].as_object_mut().unwrap().keys() {
            keys.push(format!("{section}.{k}"));
        }
    }
    keys.push("credentials.generate".into());
    for k in keys {
        let is_leaf_or_section =
            doc.contains(&format!("| `{k}` |")) || doc.contains(&format!("| `{k}.",));
        assert!(
            is_leaf_or_section,
            "docs/pools.md does not document spec.{k}"
        );
    }
}

#[test]
fn keeping_egress_addresses_needs_max_unavailable() {
    let errs = errors("rotation:\n  egressAddress: Keep\n");
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "spec.rotation.egressAddress");
    assert!(errs[0].1.contains("spec.update.maxUnavailable"), "{errs:?}");
    let errs =
        errors("replicas: 3\nrotation:\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 10%\n");
    assert_eq!(errs[0].0, "spec.rotation.egressAddress", "{errs:?}");
    let p = spec("rotation:\n  egressAddress: Keep\nupdate:\n  maxUnavailable: 1\n")
        .validate()
        .unwrap();
    assert!(p.keep_addresses);
    assert!(!spec("").validate().unwrap().keep_addresses);
    assert!(
        serde_saphyr::from_str::<ProxyPoolSpec>(&format!(
            "{TEMPLATE}rotation:\n  egressAddress: Sticky\n"
        ))
        .is_err()
    );
}

#[test]
fn a_flat_template_is_refused_with_the_new_shape_and_no_compatibility_promise() {
    // The shape of earlier versions: the Proxy's fields directly under `template`.
    let flat: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  provider: home\n  image: debian-12\n  proxy:\n    allowedClientCidrs: \
         [10.0.0.0/8]\n",
    )
    .unwrap();
    let e = flat.validate().unwrap_err();
    assert_eq!(e.len(), 1, "one error, not the placeholder spec's: {e:?}");
    assert_eq!(e[0].path, "spec.template");
    for needle in [
        "provider, image, proxy written directly under template",
        "metadata: {labels:",
        "spec: {provider:",
        "template.spec",
        "v1alpha1",
        "without a compatibility promise",
    ] {
        assert!(
            e[0].message.contains(needle),
            "{needle:?} not in {}",
            e[0].message
        );
    }
    // A template with no spec at all (what an API server leaves of a flat one after pruning
    // the fields its schema does not know) is refused the same way.
    let empty: ProxyPoolSpec = serde_json::from_str(r#"{"template": {}}"#).unwrap();
    let e = empty.validate().unwrap_err();
    assert_eq!(e[0].path, "spec.template");
    assert!(e[0].message.starts_with("no spec: "), "{e:?}");
    // Written out, the refused template is not turned into a valid-looking one.
    assert!(flat.template.shape_error.is_some());
    // Anything else unknown under template is a shape error, as everywhere else.
    let r = serde_saphyr::from_str::<ProxyPoolSpec>("template:\n  labels: {a: b}\n");
    assert!(r.unwrap_err().to_string().contains("labels"));
}

#[test]
fn the_members_labels_and_annotations_are_checked_and_the_pools_own_are_refused() {
    let ok = spec("").template;
    assert!(ok.metadata.is_empty() && ok.shape_error.is_none());
    let s: ProxyPoolSpec = serde_saphyr::from_str(
        "template:\n  metadata:\n    labels:\n      team: payments\n      \
         example.com/tier: gold\n      empty: ''\n    annotations:\n      \
         example.com/owner: 'Jane Doe <jane@example.com>'\n  spec:\n    provider: home\n    \
         image: debian-12\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n",
    )
    .unwrap();
    assert!(s.validate().is_ok(), "{:?}", s.validate());
    assert_eq!(s.template.metadata.labels["team"], "payments");
    let e = errors_of(
        "template:\n  metadata:\n    labels:\n      egress-proxies.dev/pool: other\n      \
         egress-proxies.dev/template-hash: x\n      bad key: v\n      ok: 'not ok'\n    \
         annotations:\n      egress-proxies.dev/quarantine: all\n      Bad_Prefix/x: y\n  \
         spec:\n    provider: home\n    image: debian-12\n    proxy:\n      \
         allowedClientCidrs: [10.0.0.0/8]\n",
    );
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.template.metadata.labels[\"bad key\"]",
            "spec.template.metadata.labels[\"egress-proxies.dev/pool\"]",
            "spec.template.metadata.labels[\"egress-proxies.dev/template-hash\"]",
            "spec.template.metadata.labels[\"ok\"]",
            "spec.template.metadata.annotations[\"Bad_Prefix/x\"]",
            "spec.template.metadata.annotations[\"egress-proxies.dev/quarantine\"]",
        ],
        "{e:?}"
    );
    assert!(e[1].1.contains("set by the pool itself"), "{e:?}");
    assert!(e[3].1.contains("not ok"), "{e:?}");
    assert!(e[5].1.contains("quarantine every member"), "{e:?}");
}

fn errors_of(yaml: &str) -> Vec<(String, String)> {
    serde_saphyr::from_str::<ProxyPoolSpec>(yaml)
        .unwrap()
        .validate()
        .unwrap_err()
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect()
}
