//! The poison-recovering locks of the workspace: [`lock`] for a `Mutex`, [`read`] and
//! [`write`] for an `RwLock`, used by the provider, the operator core, the web crate and both
//! drivers instead of an inline `.lock().unwrap_or_else(PoisonError::into_inner)`.
//!
//! Why recover: every lock these crates hold guards plain data that each update leaves
//! consistent (a table, a cache, a counter), and no guard is held across an `.await` or a
//! call that may panic half-way through an update. A panic elsewhere while a guard was held
//! therefore leaves usable data, and refusing it would turn one panicked task into a process
//! that can no longer serve anything.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the data if a panicking thread poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, recovering the data if a panicking thread poisoned it.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, recovering the data if a panicking thread poisoned it.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
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

    #[test]
    fn a_poisoned_rwlock_still_hands_out_its_data() {
        let l = std::sync::Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        *write(&l) += 1;
        assert_eq!(*read(&l), 2);
    }
}
