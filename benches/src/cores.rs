//! Core-to-core round trip: how long a cache line takes to go from one core
//! to another and back, measured between two of the cores this process may
//! use.
//!
//! On a VM the host may move the vCPUs between neighbouring cores and far
//! ones; on this project's 2-core VM the round trip moved between about 55
//! and 310-425 ns within minutes, and in the far phase every collective that
//! hands data between cores (TCP links most, Open MPI's as much as ours) ran
//! 2-2.5x slower (docs/perf.md, tenth session). The launcher measures it
//! before the ranks start and after they end, so a reader can tell which
//! phase a run saw.

use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Round trips per batch, and batches: the fastest batch is reported, so a
/// batch another thread interrupted does not count.
const TRIPS: u64 = 2000;
const BATCHES: usize = 7;

/// Written by a thread that cannot pin itself: the other side stops too.
const GIVE_UP: u64 = u64::MAX;

/// The two cores measured and the round trip between them; `None` with
/// fewer than two usable cores or when a thread cannot be pinned.
pub(crate) fn round_trip() -> Option<(usize, usize, Duration)> {
    let usable = ringwire_uring::usable_core_ids();
    let (&a, &b) = (usable.first()?, usable.get(1)?);
    Some((a, b, between(a, b)?))
}

/// The fastest batch's mean round trip between cores `a` and `b`.
fn between(a: usize, b: usize) -> Option<Duration> {
    let line = AtomicU64::new(0);
    // Waits until `line` holds `value`; false if the other side gave up.
    let wait_for = |value: u64| loop {
        match line.load(Ordering::Acquire) {
            v if v == value => return true,
            GIVE_UP => return false,
            _ => std::hint::spin_loop(),
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            if pin(b).is_none() {
                line.store(GIVE_UP, Ordering::Release);
                return;
            }
            // Answers each odd value with the next even one.
            for i in 0..TRIPS * BATCHES as u64 {
                if !wait_for(2 * i + 1) {
                    return;
                }
                line.store(2 * i + 2, Ordering::Release);
            }
        });
        s.spawn(|| -> Option<Duration> {
            if pin(a).is_none() {
                line.store(GIVE_UP, Ordering::Release);
                return None;
            }
            let mut best = Duration::MAX;
            for batch in 0..BATCHES as u64 {
                let start = Instant::now();
                for i in batch * TRIPS..(batch + 1) * TRIPS {
                    // Not over a GIVE_UP: that would leave this side waiting.
                    let asked = line.compare_exchange(
                        2 * i,
                        2 * i + 1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if asked.is_err() || !wait_for(2 * i + 2) {
                        return None;
                    }
                }
                best = best.min(start.elapsed() / TRIPS as u32);
            }
            Some(best)
        })
        .join()
        .ok()
        .flatten()
    })
}

fn pin(core: usize) -> Option<()> {
    let mut only = CpuSet::new();
    only.set(core).ok()?;
    sched_setaffinity(Pid::from_raw(0), &only).ok()
}

/// The line the launcher prints, e.g. `# core-to-core round trip (cores 0
/// and 1) before the ranks start: 55 ns`.
pub(crate) fn line(when: &str) -> Option<String> {
    let (a, b, t) = round_trip()?;
    Some(format!(
        "# core-to-core round trip (cores {a} and {b}) {when}: {} ns",
        t.as_nanos()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_usable_cores_give_a_round_trip() {
        let cores = ringwire_uring::usable_cores();
        match round_trip() {
            Some((a, b, t)) => {
                assert_ne!(a, b);
                assert!(t > Duration::ZERO && t < Duration::from_millis(1), "{t:?}");
            }
            None => assert!(cores < 2, "{cores} cores but no round trip"),
        }
    }

    #[test]
    fn a_core_that_cannot_be_used_ends_the_probe_without_hanging() {
        let first = ringwire_uring::usable_core_ids()[0];
        // Past the last possible CPU: pinning there fails on either side.
        let absent = CpuSet::count() + 1;
        // A hang fails the test here instead of stalling the suite.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send((between(first, absent), between(absent, first)));
        });
        let results = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the probe hung");
        assert_eq!(results, (None, None));
    }
}
