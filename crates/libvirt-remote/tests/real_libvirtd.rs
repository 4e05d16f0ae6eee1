//! The client against the REAL libvirtd on this machine (`qemu:///system`), over its unix
//! socket and through a real OpenSSH sshd on 127.0.0.1 (`support::sshd`). Each test is one
//! line over a transport-generic body in `real/bodies.rs`, run with a [`real::Dialer`].
//!
//! Needs a running libvirtd and openssh-server (CI guarantees both): without the daemon every
//! test FAILS saying so.
//! Resources are named `eptest-<test>-<unix secs>-<random>`, printed before creation, removed
//! by Drop guards on every path, and leftovers older than 30 minutes are swept at the start.
//! Run: `cargo test -p libvirt-remote --test real_libvirtd -- --nocapture`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod real;
mod support;

use std::time::Duration;

use real::cleanup::{self, DomainGuard, PoolFixture};
use real::ssh::Ssh;
use real::{TEST_BUDGET, Unix, bodies, in_own_process, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_answers_open_hostname_versions_and_capabilities() {
    run(
        "connection-level calls",
        &Unix,
        TEST_BUDGET,
        bodies::connection_level_calls(&Unix),
    )
    .await;
}

// finding: L5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcg_domain_with_checkpoint_metadata_is_defined_started_destroyed_and_undefined() {
    run(
        "domain lifecycle",
        &Unix,
        TEST_BUDGET,
        bodies::domain_lifecycle(&Unix),
    )
    .await;
}

// finding: M18
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_under_two_namespaces_stays_apart_on_one_domain() {
    run(
        "metadata namespaces",
        &Unix,
        TEST_BUDGET,
        bodies::metadata_namespaces(&Unix),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_all_domains_includes_ours_by_state() {
    run(
        "list all domains",
        &Unix,
        TEST_BUDGET,
        bodies::list_all_domains(&Unix),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_created_uploaded_inspected_and_deleted_in_a_dir_pool() {
    run(
        "storage round trip",
        &Unix,
        TEST_BUDGET,
        bodies::storage_round_trip(&Unix),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_256_mib_upload_reads_back_identical() {
    run(
        "256 MiB upload",
        &Unix,
        TEST_BUDGET,
        bodies::big_upload(&Unix),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_upload_stops_at_its_declared_length_and_reads_back_identical() {
    run(
        "file upload",
        &Unix,
        TEST_BUDGET,
        bodies::file_upload(&Unix),
    )
    .await;
}

// finding: H2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_source_fails_midway_returns_the_source_error_and_leaks_nothing() {
    in_own_process(
        "an_upload_whose_source_fails_midway_returns_the_source_error_and_leaks_nothing",
        run(
            "upload, source fails",
            &Unix,
            TEST_BUDGET,
            bodies::upload_source_fails(&Unix),
        ),
    )
    .await;
}

// finding: H2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_past_its_deadline_times_out_and_leaks_nothing() {
    in_own_process(
        "an_upload_past_its_deadline_times_out_and_leaks_nothing",
        run(
            "upload, deadline",
            &Unix,
            TEST_BUDGET,
            bodies::upload_deadline_passes(&Unix),
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_domain_delivers_a_lifecycle_event() {
    run(
        "lifecycle events",
        &Unix,
        TEST_BUDGET,
        bodies::lifecycle_events(&Unix),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_survives_a_minute_of_idleness() {
    run(
        "keepalive",
        &Unix,
        TEST_BUDGET,
        bodies::keepalive_idle_minute(&Unix),
    )
    .await;
}

// ---- the same bodies through a real sshd ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_answers_open_hostname_versions_and_capabilities_through_sshd() {
    let d = Ssh::start();
    run(
        "connection-level calls",
        &d,
        TEST_BUDGET,
        bodies::connection_level_calls(&d),
    )
    .await;
}

// finding: L5
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcg_domain_with_checkpoint_metadata_is_defined_started_destroyed_and_undefined_through_sshd()
 {
    let d = Ssh::start();
    run(
        "domain lifecycle",
        &d,
        TEST_BUDGET,
        bodies::domain_lifecycle(&d),
    )
    .await;
}

// finding: M18
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_under_two_namespaces_stays_apart_on_one_domain_through_sshd() {
    let d = Ssh::start();
    run(
        "metadata namespaces",
        &d,
        TEST_BUDGET,
        bodies::metadata_namespaces(&d),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_all_domains_includes_ours_by_state_through_sshd() {
    let d = Ssh::start();
    run(
        "list all domains",
        &d,
        TEST_BUDGET,
        bodies::list_all_domains(&d),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_created_uploaded_inspected_and_deleted_in_a_dir_pool_through_sshd() {
    let d = Ssh::start();
    run(
        "storage round trip",
        &d,
        TEST_BUDGET,
        bodies::storage_round_trip(&d),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_256_mib_upload_reads_back_identical_through_sshd() {
    let d = Ssh::start();
    run("256 MiB upload", &d, TEST_BUDGET, bodies::big_upload(&d)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_upload_stops_at_its_declared_length_and_reads_back_identical_through_sshd() {
    let d = Ssh::start();
    run("file upload", &d, TEST_BUDGET, bodies::file_upload(&d)).await;
}

// finding: H2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_source_fails_midway_returns_the_source_error_and_leaks_nothing_through_sshd()
 {
    in_own_process(
        "an_upload_whose_source_fails_midway_returns_the_source_error_and_leaks_nothing_through_sshd",
        async {
            let d = Ssh::start();
            run("upload, source fails", &d, TEST_BUDGET, bodies::upload_source_fails(&d)).await;
        },
    )
    .await;
}

// finding: H2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_past_its_deadline_times_out_and_leaks_nothing_through_sshd() {
    in_own_process(
        "an_upload_past_its_deadline_times_out_and_leaks_nothing_through_sshd",
        async {
            let d = Ssh::start();
            run(
                "upload, deadline",
                &d,
                TEST_BUDGET,
                bodies::upload_deadline_passes(&d),
            )
            .await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_domain_delivers_a_lifecycle_event_through_sshd() {
    let d = Ssh::start();
    run(
        "lifecycle events",
        &d,
        TEST_BUDGET,
        bodies::lifecycle_events(&d),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_survives_a_minute_of_idleness_through_sshd() {
    let d = Ssh::start();
    run(
        "keepalive",
        &d,
        TEST_BUDGET,
        bodies::keepalive_idle_minute(&d),
    )
    .await;
}

// finding: M19
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_old_eptest_leftovers_and_keeps_young_ones() {
    cleanup::sweep_once();
    let two_hours_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 2 * 3600;
    let old_dom = DomainGuard {
        name: cleanup::name_at("sweep-old", two_hours_ago),
    };
    let young_dom = DomainGuard::new("sweep-young");
    let old_pool = PoolFixture::create_named(cleanup::name_at("sweep-old", two_hours_ago));
    let young_pool = PoolFixture::create("sweep-young");
    println!(
        "eptest: creating domain {} and pool {}",
        old_dom.name, old_pool.name
    );
    for g in [&old_dom, &young_dom] {
        let xml = std::env::temp_dir().join(format!("{}.xml", g.name));
        std::fs::write(&xml, bodies::tcg_domain_xml(&g.name)).unwrap();
        let out = cleanup::virsh(&["define", xml.to_str().unwrap()]);
        let _ = std::fs::remove_file(&xml);
        assert!(out.status.success(), "define {}: {:?}", g.name, out);
    }
    assert!(cleanup::age_of(&old_dom.name).unwrap() > cleanup::SWEEP_AGE);
    assert!(cleanup::age_of(&young_dom.name).unwrap() < Duration::from_secs(60));

    let swept = cleanup::sweep_older_than(cleanup::SWEEP_AGE);
    let doms = cleanup::domain_names();
    let pools = cleanup::pool_names();
    // NB: a concurrent run's start-of-suite sweep may have removed the old ones first; either
    // way they must be gone, and the young ones must remain.
    assert!(
        !doms.contains(&old_dom.name),
        "old domain survived: {swept:?}"
    );
    assert!(
        !pools.contains(&old_pool.name),
        "old pool survived: {swept:?}"
    );
    assert!(
        !old_pool.dir.exists(),
        "old pool directory survived: {swept:?}"
    );
    assert!(
        doms.contains(&young_dom.name),
        "young domain swept: {swept:?}"
    );
    assert!(
        pools.contains(&young_pool.name),
        "young pool swept: {swept:?}"
    );
    assert!(
        young_pool.dir.exists(),
        "young pool directory swept: {swept:?}"
    );
}

#[test]
fn the_generated_source_is_the_same_however_it_is_read() {
    use tokio::io::AsyncReadExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let read_all = |step: usize| {
        rt.block_on(async {
            let mut g = real::sources::Generated::new(7, 100_003);
            let mut out = Vec::new();
            let mut buf = vec![0u8; step];
            loop {
                let n = g.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            (out, g.digest())
        })
    };
    let (a, da) = read_all(1 << 16);
    for step in [1, 3, 7, 8, 13, 4096] {
        let (b, db) = read_all(step);
        assert_eq!(a.len(), 100_003);
        assert!(a == b, "stream differs when read {step} bytes at a time");
        assert_eq!(da, db);
    }
    assert_ne!(a[..8], a[8..16], "the generator repeats itself");
}

#[test]
fn keep_switch_parses_booleans_strictly() {
    // finding: L25 — `EPTEST_KEEP=0` means remove, never keep; garbage is refused.
    use real::cleanup::parse_bool;
    for v in ["0", "false", "FALSE", "no", "off", "", " 0 "] {
        assert_eq!(parse_bool(v), Some(false), "{v:?}");
    }
    for v in ["1", "true", "Yes", "on"] {
        assert_eq!(parse_bool(v), Some(true), "{v:?}");
    }
    for v in ["2", "keep", "nope", "0x1"] {
        assert_eq!(parse_bool(v), None, "{v:?}");
    }
}

#[test]
fn ci_builds_and_runs_every_test_target() {
    // finding: L23 — the seed's integration tests were never compiled; ours are, because the
    // README's test command (run by .ci/run) builds and runs every target of every crate.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let test = std::fs::read_to_string(root.join("scripts/test")).expect("scripts/test");
    let cmd = test
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("cargo test --workspace --all-targets")
        })
        .expect("scripts/test runs cargo test on every target of the workspace");
    assert!(!cmd.contains("--exclude") && !cmd.contains(" -p "), "{cmd}");
    assert!(
        test.lines()
            .any(|l| l.trim_start().starts_with("cargo test --workspace --doc")),
        "scripts/test runs the doc tests"
    );
    let ci = std::fs::read_to_string(root.join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "./scripts/test"),
        ".ci/run must run ./scripts/test"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    assert!(
        readme.contains("./scripts/test"),
        "README must show the test command"
    );
}
