//! The one poison-recovering mutex lock of the workspace ([`lock`]), used by the provider,
//! the operator core and both drivers.
//!
//! Why recover: every mutex these crates hold guards plain data that each update leaves
//! consistent (a table, a cache, a counter), and no guard is held across an `.await` or a
//! call that may panic half-way through an update. A panic elsewhere while a guard was held
//! therefore leaves usable data, and refusing it would turn one panicked task into a process
//! that can no longer serve anything.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering the data if a panicking thread poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_hands_out_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
