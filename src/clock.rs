//! A coarse monotonic clock for bookkeeping that needs milliseconds, not
//! nanoseconds (the flight recorder's times, the executor's idle window).
//! Reading it costs a few ns where `Instant::now()` costs about 20 on a VM
//! (kvm-clock reads the TSC and scales it), and every op's bookkeeping read
//! the clock several times: a fifth of a small op's floor (issue 31, part
//! 5; docs/perf.md).

use std::time::Duration;

/// Time since an unspecified start (boot), at the kernel tick's
/// resolution (1-4 ms); never goes back.
pub(crate) fn coarse_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(Duration::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::coarse_now;
    use std::time::{Duration, Instant};

    #[test]
    fn it_moves_with_the_precise_clock_to_within_a_tick() {
        let (c0, p0) = (coarse_now(), Instant::now());
        std::thread::sleep(Duration::from_millis(60));
        let (c1, p1) = (coarse_now(), Instant::now());
        let (coarse, precise) = (c1 - c0, p1 - p0);
        assert!(coarse > Duration::ZERO, "the coarse clock did not move");
        let apart = coarse.abs_diff(precise);
        assert!(
            apart < Duration::from_millis(20),
            "{coarse:?} against {precise:?}"
        );
    }
}
