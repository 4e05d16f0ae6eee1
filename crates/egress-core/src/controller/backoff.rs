//! Per-object exponential backoff (finding APX-2): `base · 2^(failures-1)`, capped at `max`.
//!
//! Guarantees: never panics or overflows (saturating arithmetic); monotonic in `failures`;
//! never above `max`; zero failures means no delay. No jitter: the decision stays pure and
//! testable, and reconciles of different objects are already spread by their own histories.
//! Hand-written rather than the `backoff` crates: those keep mutable state per retry loop,
//! while ours is a pure function of a counter the controller stores per object.

use std::time::Duration;

/// The delay before retry number `failures` (1 = first retry).
pub fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let exp = failures.saturating_sub(1).min(31);
    base.saturating_mul(1u32 << exp).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_base_and_stop_at_the_cap() {
        // finding: APX-2
        let (b, m) = (Duration::from_secs(5), Duration::from_secs(300));
        let got: Vec<u64> = (0..10).map(|n| backoff(b, m, n).as_secs()).collect();
        assert_eq!(got, [0, 5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(b, m, u32::MAX), m);
        assert_eq!(backoff(Duration::MAX, Duration::MAX, 40), Duration::MAX);
    }
}
