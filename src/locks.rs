//! Locking a mutex whatever a panicking holder left, for state that stays
//! consistent at every unlock: the transport's and the arena's.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, whatever a panicking holder left: the transport's state stays
/// consistent at every unlock (a panic in an op is reported, not spread).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
