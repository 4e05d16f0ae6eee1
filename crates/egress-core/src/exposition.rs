//! The `/metrics` text both drivers serve: the operator's [`Metrics`], refreshed from the
//! controller's counters and image-byte total, with the proxy health engine's registry merged
//! into the same exposition.
//!
//! Guarantees: one OpenMetrics exposition with a single trailing `# EOF`; the image-byte
//! counter only ever grows by what the controller's monotonic total added since the last
//! scrape (a new controller whose total starts lower adds nothing until it passes the
//! highest total exported).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::controller::Controller;
use crate::health::HealthEngine;
use crate::metrics::Metrics;

/// The trailing line of an OpenMetrics exposition.
const EOF_LINE: &str = "# EOF\n";

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

    /// The exposition text: `metrics` after taking `controller`'s counters (when there is
    /// one: a Kubernetes follower has none), then `health`'s registry before the `# EOF`.
    pub fn render(
        &self,
        metrics: &Metrics,
        controller: Option<&Controller>,
        health: Option<&HealthEngine>,
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
        let mut text = metrics.encode();
        if let Some(engine) = health {
            // One exposition: the health registry goes before the single `# EOF`.
            if let Some(body) = text.strip_suffix(EOF_LINE) {
                let mut out = body.to_owned();
                engine.metrics().encode_into(&mut out);
                out.push_str(EOF_LINE);
                text = out;
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::health::HealthSettings;
    use crate::health::probe::CheckTarget;

    #[test]
    fn the_health_registry_goes_before_the_single_eof() {
        let engine = HealthEngine::new(HealthSettings::new(CheckTarget {
            host: "203.0.113.1".into(),
            port: 80,
            path: "/".into(),
        }));
        let text = Exposition::new().render(&Metrics::new(), None, Some(&engine));
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with(EOF_LINE), "{text}");
        assert!(text.contains("health_round_seconds"), "{text}");
        let without = Exposition::new().render(&Metrics::new(), None, None);
        assert!(!without.contains("health_round_seconds"), "{without}");
    }
}
