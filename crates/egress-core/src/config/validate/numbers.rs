//! The numeric rules: timeouts within range and consistent with each other, sizes within
//! their floors and ceilings, and byte conversions that cannot overflow.
//!
//! Guarantees: pure; a value that passes can be multiplied into bytes and added to an
//! `Instant` without overflow (findings L17, L20).

use std::time::Duration;

use egress_provider::libvirt::config::{LibvirtEntry, Timeouts};
use egress_provider::libvirt::hostpool::dial_budget;

use super::{
    GIB, MAX_DISK_GIB, MAX_MEMORY_MIB, MAX_TIMEOUT_SECS, MAX_VCPUS, MIB, MIN_MEMORY_MIB, Report,
};

// Closes finding L17.
pub(super) fn timeouts(r: &mut Report, p: &str, t: &Timeouts) {
    let all = [
        ("dial", t.dial),
        ("call", t.call),
        ("imageImport", t.image_import),
        ("start", t.start),
    ];
    let mut in_range = true;
    for (name, d) in all {
        if d.is_zero() || d > Duration::from_secs(MAX_TIMEOUT_SECS) {
            in_range = false;
            r.err(
                &format!("{p}.{name}"),
                format!(
                    "{}s is out of range 1..={MAX_TIMEOUT_SECS} seconds",
                    d.as_secs()
                ),
            );
        }
    }
    let probe_budget = egress_provider::libvirt::check::DEFAULT_PROBE_BUDGET;
    if t.check.is_zero() || t.check > probe_budget {
        in_range = false;
        r.err(
            &format!("{p}.check"),
            format!(
                "{}s is out of range 1..={} seconds (a host check's calls share a {}s budget)",
                t.check.as_secs(),
                probe_budget.as_secs(),
                probe_budget.as_secs()
            ),
        );
    }
    if !in_range {
        return;
    }
    if t.call < t.dial {
        r.err(
            &format!("{p}.call"),
            format!(
                "{}s is shorter than timeouts.dial ({}s); a call must be allowed at least as long \
                 as one dial phase",
                t.call.as_secs(),
                t.dial.as_secs()
            ),
        );
    }
    let import_floor = dial_budget(t).saturating_add(t.call);
    if t.image_import < import_floor {
        r.err(
            &format!("{p}.imageImport"),
            format!(
                "{}s is shorter than {}s, the dial budget (3 × timeouts.dial = {}s) plus one \
                 call (timeouts.call = {}s); an unreachable host would be reported as an import \
                 timeout",
                t.image_import.as_secs(),
                import_floor.as_secs(),
                dial_budget(t).as_secs(),
                t.call.as_secs()
            ),
        );
    }
    if t.start < t.call {
        r.err(
            &format!("{p}.start"),
            format!(
                "{}s is shorter than timeouts.call ({}s); waiting for a start polls with calls",
                t.start.as_secs(),
                t.call.as_secs()
            ),
        );
    }
}

/// Largest `limits.maxBases` accepted.
// NB: a listing of the pool is read before each import; 1000 bases of an entry is far past
// any catalogue and keeps that listing small.
const MAX_BASES: u64 = 1000;
/// Largest `limits.unusedBaseGraceMinutes` accepted: a year.
// NB: past a year a base is effectively kept forever; the ceiling keeps the value a sane
// duration (minutes × 60 never overflows).
const MAX_UNUSED_BASE_GRACE_MINUTES: u64 = 365 * 24 * 60;

// Closes finding L20.
pub(super) fn sizes(r: &mut Report, path: &str, e: &LibvirtEntry) {
    let (d, l) = (&e.defaults, &e.limits);
    // (field, value, floor, ceiling, unit bytes)
    let disk_ok = bounded(
        r,
        &format!("{path}.limits.diskGiB"),
        l.disk_gib,
        1,
        MAX_DISK_GIB,
        GIB,
    );
    let mem_ok = bounded(
        r,
        &format!("{path}.limits.memoryMiB"),
        l.memory_mib,
        MIN_MEMORY_MIB,
        MAX_MEMORY_MIB,
        MIB,
    );
    bounded(
        r,
        &format!("{path}.limits.maxBases"),
        u64::from(l.max_bases),
        1,
        MAX_BASES,
        1,
    );
    bounded(
        r,
        &format!("{path}.limits.maxUrlImages"),
        u64::from(l.max_url_images),
        0,
        u64::from(l.max_bases).clamp(1, MAX_BASES),
        1,
    );
    bounded(
        r,
        &format!("{path}.limits.unusedBaseGraceMinutes"),
        l.unused_base_grace_minutes,
        0,
        MAX_UNUSED_BASE_GRACE_MINUTES,
        1,
    );
    let cpu_ok = bounded(
        r,
        &format!("{path}.limits.vcpus"),
        u64::from(l.vcpus),
        1,
        u64::from(MAX_VCPUS),
        1,
    );
    let disk_max = if disk_ok { l.disk_gib } else { MAX_DISK_GIB };
    let mem_max = if mem_ok { l.memory_mib } else { MAX_MEMORY_MIB };
    let cpu_max = if cpu_ok {
        u64::from(l.vcpus)
    } else {
        u64::from(MAX_VCPUS)
    };
    bounded(
        r,
        &format!("{path}.defaults.diskGiB"),
        d.disk_gib,
        1,
        disk_max,
        GIB,
    );
    bounded(
        r,
        &format!("{path}.defaults.memoryMiB"),
        d.memory_mib,
        MIN_MEMORY_MIB,
        mem_max,
        MIB,
    );
    bounded(
        r,
        &format!("{path}.defaults.vcpus"),
        u64::from(d.vcpus),
        1,
        cpu_max,
        1,
    );
}

/// `v` within `lo..=hi` and `v × unit` representable; reports and returns false otherwise.
pub(super) fn bounded(r: &mut Report, p: &str, v: u64, lo: u64, hi: u64, unit: u64) -> bool {
    if v.checked_mul(unit).is_none() {
        r.err(p, format!("{v} overflows 64 bits when converted to bytes"));
        return false;
    }
    if v < lo || v > hi {
        r.err(p, format!("{v} is out of range {lo}..={hi}"));
        return false;
    }
    true
}
