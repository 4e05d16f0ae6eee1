//! The families exported from snapshots rather than live counters, through the crate's
//! [`Collector`] mechanism: the controller's counters (kept by the controller itself and
//! copied in at each scrape) and the pools' replica counts.
//!
//! Guarantees: each family is written with its descriptor at every scrape, at zero before the
//! first snapshot, so it is present from start; label values are closed sets (error classes,
//! results) or pool keys (`namespace/name`, bounded by the pool objects).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::controller::ControllerCounters;
use egress_provider::sync::lock;

/// One label, `key="value"`, for a collector's series.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Label(&'static str, String);

impl EncodeLabelSet for Label {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        (self.0, self.1.as_str()).encode(encoder.encode_label())
    }
}

use prometheus_client::encoding::EncodeLabel as _;

/// Writes a counter family: `name` (without `_total`) with one series per `(label, value)`.
fn counter_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    series: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut e = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (value, n) in series {
        let l = Label(label, (*value).to_owned());
        ConstCounter::new(*n).encode(e.encode_family(&l)?)?;
    }
    Ok(())
}

/// Writes an unlabelled counter.
fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = ConstCounter::new(v);
    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)
}

/// Writes an unlabelled gauge.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let m = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)
}

/// Exports the last controller snapshot given to [`ControllerCollector::set`].
#[derive(Debug, Default)]
pub(super) struct ControllerCollector {
    last: Mutex<ControllerCounters>,
}

impl ControllerCollector {
    /// Keeps `c` for the next scrape.
    pub(super) fn set(&self, c: ControllerCounters) {
        *lock(&self.last) = c;
    }
}

impl Collector for ControllerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = *lock(&self.last);
        counter_family(
            &mut encoder,
            "provider_errors",
            "Provider errors met by the controller (gets, creates, deletes), by error class",
            "class",
            &[
                ("transient", c.errors_transient),
                ("permanent", c.errors_permanent),
                ("not_found", c.errors_not_found),
                ("quota_exceeded", c.errors_quota),
            ],
        )?;
        counter_family(
            &mut encoder,
            "instance_creates",
            "Instance creates finished, by result (ok, or failed including a deadline hit)",
            "result",
            &[("ok", c.creates_succeeded), ("failed", c.creates_failed)],
        )?;
        gauge(
            &mut encoder,
            "instance_creates_in_flight",
            "Instance creates running now",
            c.creates_in_flight,
        )?;
        counter(
            &mut encoder,
            "instance_deletes",
            "Instance deletes started",
            c.deletes_started,
        )?;
        gauge(
            &mut encoder,
            "instance_deletes_in_flight",
            "Instance deletes running now",
            c.deletes_in_flight,
        )?;
        counter(
            &mut encoder,
            "instance_replacements",
            "Instances replaced (a delete, then a create)",
            c.replacements,
        )?;
        counter_family(
            &mut encoder,
            "instance_duplicate_deletes",
            "Deletes of a possible second copy of a Proxy's instance on a host other than its \
             own (left by a create there whose outcome was not known), by result",
            "result",
            &[
                ("ok", c.duplicate_deletes_ok),
                ("failed", c.duplicate_deletes_failed),
            ],
        )?;
        counter(
            &mut encoder,
            "host_busy_refusals",
            "Work or reads refused because the host had no free slot",
            c.host_busy,
        )
    }
}

/// Replica counts of one pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolReplicas {
    /// Members wanted (`spec.replicas`).
    pub desired: u64,
    /// Members healthy through themselves (what the pool counts as available).
    pub available: u64,
}

/// Exports every pool's replica counts; the families are written (their descriptors, with
/// no series) even while no pool exists, so an alert's expression names known families.
#[derive(Debug, Default)]
pub(super) struct PoolCollector {
    pools: Mutex<BTreeMap<String, PoolReplicas>>,
}

impl PoolCollector {
    /// Sets the counts of pool `key` (`namespace/name`).
    pub(super) fn set(&self, key: &str, r: PoolReplicas) {
        lock(&self.pools).insert(key.to_owned(), r);
    }

    /// Drops a deleted pool's series.
    pub(super) fn forget(&self, key: &str) {
        lock(&self.pools).remove(key);
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pools = lock(&self.pools).clone();
        type Pick = fn(&PoolReplicas) -> u64;
        let families: [(&str, &str, Pick); 2] = [
            (
                "pool_replicas",
                "Members the pool wants (spec.replicas)",
                |r| r.desired,
            ),
            (
                "pool_available_replicas",
                "Members of the pool that are available (Running and healthy through themselves)",
                |r| r.available,
            ),
        ];
        for (name, help, pick) in families {
            let mut e = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (key, r) in &pools {
                let l = Label("pool", key.clone());
                ConstGauge::new(i64::try_from(pick(r)).unwrap_or(i64::MAX))
                    .encode(e.encode_family(&l)?)?;
            }
        }
        Ok(())
    }
}
