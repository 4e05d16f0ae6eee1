//! The registry's families, labels and presence from start.

use super::*;

/// Family names (from `# TYPE` lines) of an exposition.
fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Whether some sample line of `text` belongs to family `name`.
fn has_sample(text: &str, name: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']) || rest.starts_with("_bucket"))
    })
}

#[test]
fn the_text_names_every_metric_with_bounded_labels() {
    let m = Metrics::new();
    m.set_phase_counts(&[(Phase::Running, 3)]);
    m.reconciled(None, Duration::from_millis(20));
    m.reconciled(Some("TransientError"), Duration::from_millis(20));
    m.host_checked("local", "h1", true, Some(0.004));
    m.gc_ran("ok", 2);
    m.image_bytes(1024);
    m.set_controller_counters(ControllerCounters {
        errors_quota: 4,
        creates_in_flight: 2,
        ..ControllerCounters::default()
    });
    m.set_pool(
        "default/web",
        PoolReplicas {
            desired: 3,
            available: 2,
        },
    );
    let t = m.encode(MetricsFormat::Prometheus);
    for want in [
        "egress_proxies_proxies{phase=\"Running\"} 3",
        "egress_proxies_proxies{phase=\"Failed\"} 0",
        "egress_proxies_reconciles_total{result=\"ok\"} 1",
        "egress_proxies_reconciles_total{result=\"TransientError\"} 1",
        "egress_proxies_reconcile_duration_seconds_count 2",
        "egress_proxies_host_up{entry=\"local\",host=\"h1\"} 1",
        "egress_proxies_health_probes_total{entry=\"local\",host=\"h1\",result=\"ok\"} 0",
        "egress_proxies_gc_deleted_instances_total 2",
        "egress_proxies_image_transferred_bytes_total 1024",
        "egress_proxies_provider_errors_total{class=\"quota_exceeded\"} 4",
        "egress_proxies_instance_creates_in_flight 2",
        "egress_proxies_pool_replicas{pool=\"default/web\"} 3",
        "egress_proxies_pool_available_replicas{pool=\"default/web\"} 2",
    ] {
        assert!(t.contains(want), "{want} missing in\n{t}");
    }
    m.retain_hosts(|_, _| false);
    m.forget_pool("default/web");
    let t = m.encode(MetricsFormat::Prometheus);
    assert!(
        !t.contains("host=\"h1\""),
        "a removed host's series stay:\n{t}"
    );
    assert!(
        !t.contains("default/web"),
        "a deleted pool's series stay:\n{t}"
    );
}

#[test]
fn every_family_without_per_host_or_per_object_labels_is_present_from_start() {
    let t = Metrics::new().encode(MetricsFormat::Prometheus);
    // Per host (their series come with the host's first check) and per object.
    let later = [
        "egress_proxies_host_up",
        "egress_proxies_host_check_latency_seconds",
        "egress_proxies_health_probe_latency_seconds",
        "egress_proxies_health_probes_total",
        "egress_proxies_health_proxy_up",
        "egress_proxies_pool_replicas",
        "egress_proxies_pool_available_replicas",
    ];
    let fams = families(&t);
    assert!(fams.len() >= 20, "{fams:?}");
    for f in &fams {
        if later.contains(&f.as_str()) {
            continue;
        }
        assert!(has_sample(&t, f), "{f} has no series at start:\n{t}");
    }
    // An empty family is left out of the exposition altogether: name each one.
    for name in [
        "egress_proxies_build_info",
        "egress_proxies_leader",
        "egress_proxies_proxies",
        "egress_proxies_reconciles_total",
        "egress_proxies_reconcile_duration_seconds",
        "egress_proxies_provider_errors_total",
        "egress_proxies_instance_creates_total",
        "egress_proxies_instance_creates_in_flight",
        "egress_proxies_instance_deletes_total",
        "egress_proxies_instance_deletes_in_flight",
        "egress_proxies_instance_replacements_total",
        "egress_proxies_instance_duplicate_deletes_total",
        "egress_proxies_host_busy_refusals_total",
        "egress_proxies_gc_runs_total",
        "egress_proxies_gc_deleted_instances_total",
        "egress_proxies_image_transferred_bytes_total",
        "egress_proxies_config_reloads_total",
        "egress_proxies_config_last_reload_successful",
        "egress_proxies_config_last_reload_success_timestamp_seconds",
        "egress_proxies_manifests_rejected",
        "egress_proxies_health_proxies",
        "egress_proxies_health_last_round_duration_seconds",
    ] {
        assert!(has_sample(&t, name), "{name} has no series at start:\n{t}");
    }
    // Listed without series until a pool exists.
    for name in [
        "egress_proxies_pool_replicas",
        "egress_proxies_pool_available_replicas",
    ] {
        assert!(fams.iter().any(|f| f == name), "{name} not listed:\n{t}");
    }
}

#[test]
fn openmetrics_and_prometheus_text_carry_the_same_samples() {
    let m = Metrics::new();
    m.host_checked("local", "h1", false, None);
    let om = m.encode(MetricsFormat::OpenMetrics);
    let text = m.encode(MetricsFormat::Prometheus);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert_eq!(om.matches("# EOF").count(), 1);
    assert!(!text.contains("# EOF"), "{text}");
    assert!(om.contains("# TYPE egress_proxies_build info"), "{om}");
    assert!(
        text.contains("# TYPE egress_proxies_build_info gauge"),
        "{text}"
    );
    // Label order may differ between the encoders (`le` first or last): sort the pairs.
    let normal = |l: &str| match (l.find('{'), l.rfind('}')) {
        (Some(a), Some(b)) if a < b => {
            let mut pairs: Vec<&str> = l[a + 1..b].split(',').collect();
            pairs.sort_unstable();
            format!("{}{{{}}}{}", &l[..a], pairs.join(","), &l[b + 1..])
        }
        _ => l.to_owned(),
    };
    let samples = |s: &str| {
        let mut v: Vec<String> = s
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(normal)
            .collect();
        v.sort();
        v
    };
    assert_eq!(samples(&om), samples(&text));
}

#[test]
fn config_loads_set_the_success_gauge_and_its_timestamp() {
    let m = Metrics::new();
    m.config_loaded(true);
    m.config_loaded(false);
    let t = m.encode(MetricsFormat::Prometheus);
    assert!(
        t.contains("egress_proxies_config_reloads_total{result=\"ok\"} 1"),
        "{t}"
    );
    assert!(
        t.contains("egress_proxies_config_reloads_total{result=\"failed\"} 1"),
        "{t}"
    );
    assert!(
        t.contains("egress_proxies_config_last_reload_successful 0"),
        "{t}"
    );
    assert!(
        !t.contains("egress_proxies_config_last_reload_success_timestamp_seconds 0\n"),
        "{t}"
    );
}

#[test]
fn a_check_without_an_answer_drops_the_stale_latency_but_keeps_the_host_down() {
    let m = Metrics::new();
    m.host_checked("local", "h1", true, Some(0.004));
    m.host_checked("local", "h1", false, None);
    let t = m.encode(MetricsFormat::Prometheus);
    assert!(
        t.contains("egress_proxies_host_up{entry=\"local\",host=\"h1\"} 0"),
        "{t}"
    );
    assert!(
        !t.contains("egress_proxies_host_check_latency_seconds{"),
        "{t}"
    );
}

#[test]
fn a_hosts_address_pool_usage_is_exported_per_family_and_removed_with_the_host() {
    let m = Metrics::new();
    let usage = |family, size, held| AddressUsage {
        family,
        size,
        held,
        retired: 0,
    };
    m.host_checked("local", "h1", true, Some(0.004));
    m.host_addresses(
        "local",
        "h1",
        &[usage("IPv4", 14, 3), usage("IPv6", 1 << 64, 3)],
    );
    m.host_checked("local", "h2", true, Some(0.004));
    m.host_addresses("local", "h2", &[usage("IPv4", 2, 2)]);
    let t = m.encode(MetricsFormat::Prometheus);
    for want in [
        "# TYPE egress_proxies_host_egress_addresses gauge",
        "egress_proxies_host_egress_addresses{entry=\"local\",host=\"h1\",family=\"IPv4\",state=\"allocated\"} 3.0",
        "egress_proxies_host_egress_addresses{entry=\"local\",host=\"h1\",family=\"IPv4\",state=\"free\"} 11.0",
        "egress_proxies_host_egress_addresses{entry=\"local\",host=\"h1\",family=\"IPv6\",state=\"allocated\"} 3.0",
        "egress_proxies_host_egress_addresses{entry=\"local\",host=\"h1\",family=\"IPv6\",state=\"free\"} 18446744073709553000.0",
        "egress_proxies_host_egress_addresses{entry=\"local\",host=\"h2\",family=\"IPv4\",state=\"free\"} 0.0",
    ] {
        assert!(t.contains(want), "{want} missing in\n{t}");
    }
    // h1's IPv6 range is removed from its pool; h2 leaves the config.
    m.host_addresses("local", "h1", &[usage("IPv4", 14, 4)]);
    m.retain_hosts(|_, h| h == "h1");
    let t = m.encode(MetricsFormat::Prometheus);
    assert!(
        t.contains("egress_proxies_host_egress_addresses{entry=\"local\",host=\"h1\",family=\"IPv4\",state=\"allocated\"} 4.0"),
        "{t}"
    );
    assert!(!t.contains("family=\"IPv6\""), "{t}");
    assert!(!t.contains("host=\"h2\""), "{t}");
}
