//! The `/metrics` text both drivers serve: the operator's [`Metrics`] (the health engine's
//! families are in the same registry), refreshed from the controller's counters and
//! image-byte total, in the format the scrape negotiated.
//!
//! Guarantees: one exposition written by one encoder over one registry; the image-byte
//! counter only ever grows by what the controller's monotonic total added since the last
//! scrape (a new controller whose total starts lower adds nothing until it passes the
//! highest total exported).

use std::sync::atomic::{AtomicU64, Ordering};

use egress_core::controller::Controller;
use egress_core::metrics::{Metrics, MetricsFormat};

/// Renders `/metrics`; keeps the controller's image-byte total already exported. One per
/// process (next to its [`Metrics`]).
#[derive(Debug, Default)]
pub struct Exposition {
    image_bytes_exported: AtomicU64,
}

impl Exposition {
    /// A fresh exposition (nothing exported yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// The exposition text in `format`: `metrics` after taking `controller`'s counters
    /// (when there is one: a Kubernetes follower has none).
    pub fn render(
        &self,
        metrics: &Metrics,
        controller: Option<&Controller>,
        format: MetricsFormat,
    ) -> String {
        if let Some(core) = controller {
            metrics.set_controller_counters(core.metrics());
            // The core keeps a monotonic total; the counter gets what it has not seen yet.
            let total = core.image_bytes();
            let before = self.image_bytes_exported.fetch_max(total, Ordering::SeqCst);
            if total > before {
                metrics.image_bytes(total - before);
            }
        }
        metrics.encode(format)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_registry_one_eof_and_the_health_families_without_an_engine() {
        let m = Metrics::new();
        let om = Exposition::new().render(&m, None, MetricsFormat::OpenMetrics);
        assert_eq!(om.matches("# EOF").count(), 1, "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("egress_proxies_health_proxies{"), "{om}");
        let text = Exposition::new().render(&m, None, MetricsFormat::Prometheus);
        assert!(!text.contains("# EOF"), "{text}");
        assert!(text.contains("egress_proxies_health_proxies{"), "{text}");
    }
}
