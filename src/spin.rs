//! Bounded polling before sleeping.

use std::time::{Duration, Instant};

/// Calls `poll` until it gives something or `budget` has passed, yielding
/// the core between calls so a spinner never holds it from a thread that
/// has work (and moving off a core it shares with another poller, see
/// `ringwire_uring::poll_yield`). `None` at once when `budget` is zero.
pub(crate) fn poll_for<T>(budget: Duration, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
    if budget.is_zero() {
        return None;
    }
    let start = Instant::now();
    loop {
        if let Some(v) = poll() {
            return Some(v);
        }
        if start.elapsed() >= budget {
            return None;
        }
        ringwire_uring::poll_yield();
    }
}
