//! Polling threads: yielding between polls, and getting off a core another
//! poller uses.
//!
//! A thread that polls for a frame yields its core between polls, so it
//! never holds a core another thread needs. But the scheduler sometimes
//! stacks two ranks' pollers on one core while another core idles: a
//! loopback wake-up places the woken thread next to its waker, and threads
//! that run this often look cache-hot to the load balancer, which then
//! leaves them there. Stacked, they hand the core to each other at every
//! poll: measured on 2 cores, 2 ranks forced onto one core take 40 us per
//! 8-byte all-reduce against 11 us on two, and unforced runs of 20 ops fell
//! into that state 3 times in 12 (decision 0008).
//!
//! So a thread that runs a rank's ops may carry a *home core* (its local
//! rank's core, modulo the cores it may use; where ranks outnumber cores,
//! the communicator sets it for small ops only): when a yield shows that
//! another thread ran on its core, it moves
//! itself home by narrowing its own affinity to that core and restoring it
//! at once. The thread's affinity ends as it was; only its placement
//! changes, at most once per [`MOVE_EVERY`].

use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// A yield that took this long let another thread run on this core.
const SHARED_CORE: Duration = Duration::from_micros(3);
/// A thread moves itself at most this often. Short, because a wake-up can
/// stack the ranks again right after a move, and a stacked rank pays about
/// 20 us per small op until it may move (20 ms, the first value, left
/// sweeps of 2 ranks stacked for several sizes; docs/perf.md).
const MOVE_EVERY: Duration = Duration::from_millis(2);

thread_local! {
    /// Index of this thread's home among the cores it may use.
    static HOME: Cell<Option<usize>> = const { Cell::new(None) };
    static LAST_MOVE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Sets the calling thread's home core (an index into the cores it may
/// use, taken modulo their number) or clears it; returns the previous one.
pub fn set_home_core(home: Option<usize>) -> Option<usize> {
    HOME.replace(home)
}

/// The number of cores this process may run on (its affinity mask).
pub fn usable_cores() -> usize {
    usable_core_ids().len().max(1)
}

/// The ids of the cores this process may run on, in order (empty if the
/// affinity mask cannot be read).
pub fn usable_core_ids() -> Vec<usize> {
    sched_getaffinity(Pid::from_raw(0)).map_or_else(|_| Vec::new(), |set| cores_in(&set))
}

fn cores_in(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// Yields the core between two polls; if another thread ran meanwhile and
/// this thread has a home core it is not on, moves there.
pub fn poll_yield() {
    let before = Instant::now();
    std::thread::yield_now();
    if before.elapsed() >= SHARED_CORE
        && let Some(home) = HOME.get()
    {
        let _ = move_home(home);
    }
}

/// Moves the calling thread to its home core unless it moved less than
/// `MOVE_EVERY` ago, is there already, or may use only one core; the core
/// it was on right after moving, if it moved.
fn move_home(home: usize) -> Option<usize> {
    let now = Instant::now();
    if LAST_MOVE
        .get()
        .is_some_and(|t| now.duration_since(t) < MOVE_EVERY)
    {
        return None;
    }
    LAST_MOVE.set(Some(now));
    let me = Pid::from_raw(0);
    let allowed = sched_getaffinity(me).ok()?;
    let usable = cores_in(&allowed);
    if usable.len() < 2 {
        return None;
    }
    let target = usable[home % usable.len()];
    if sched_getcpu().is_ok_and(|c| c == target) {
        return None;
    }
    let mut only = CpuSet::new();
    only.set(target).ok()?;
    sched_setaffinity(me, &only).ok()?;
    let landed = sched_getcpu().ok();
    // Moved; the affinity itself goes back to what it was.
    let _ = sched_setaffinity(me, &allowed);
    landed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_moves_home_and_keeps_its_affinity() {
        std::thread::spawn(|| {
            let me = Pid::from_raw(0);
            let before = sched_getaffinity(me).unwrap();
            if usable_cores() < 2 {
                eprintln!("SKIP: one usable core, nowhere to move");
                return;
            }
            let here = sched_getcpu().unwrap();
            let usable = cores_in(&before);
            let home = usable.iter().position(|&c| c != here).unwrap();
            move_home(home);
            assert_eq!(
                sched_getcpu().unwrap(),
                usable[home],
                "moved to its home core"
            );
            let after = sched_getaffinity(me).unwrap();
            assert!(
                usable.iter().all(|&c| after.is_set(c).unwrap()),
                "affinity restored"
            );
            // A second move within MOVE_EVERY is skipped (a last move
            // in the future keeps the test clear of the clock).
            LAST_MOVE.set(Some(Instant::now() + Duration::from_secs(60)));
            let again = usable.iter().position(|&c| c == here).unwrap();
            move_home(again);
            assert_eq!(sched_getcpu().unwrap(), usable[home]);
        })
        .join()
        .unwrap();
    }
}
