//! The driver's side of engine threads (decision 0036): starting them,
//! handing them lane entries and waking them by MSG_RING, counting each
//! wake off its sender (a caller leaving the engine waits for its own),
//! and settling the wakes when the driver is dropped.

use super::*;

/// The `wakers` slot of the wakes `Drop` sends (none of theirs).
pub(super) const STOPPING_WAKER: usize = 0xffff;

/// Starts `config.engine_threads` engine threads for the ring of
/// descriptor `ring` (pinned to `config.thread_cores` where given); none
/// where the kernel cannot run them, with a warning.
pub(super) fn start_threads(config: &EngineConfig, ring: RawFd, entries: u32) -> Vec<EngineThread> {
    let mut threads = Vec::new();
    for i in 0..config.engine_threads {
        let core = config.thread_cores.get(i).copied();
        match EngineThread::start(i, ring, entries, core) {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "engine threads cannot run here (they need Linux 6.3+); \
                     the lanes run on the caller-driven ring"
                );
                return Vec::new();
            }
        }
    }
    threads
}

impl Driver {
    /// Hands `entry` to engine thread `t` (with the others of this turn).
    ///
    /// # Safety
    /// As `push`: memory `entry` names must stay valid until its last
    /// completion is taken from this ring.
    pub(super) unsafe fn hand(&mut self, t: usize, entry: squeue::Entry) -> bool {
        self.handed[t].push(entry);
        self.in_flight += 1;
        self.pushed += 1;
        true
    }

    /// Gives each engine thread the entries built for it, and wakes it by
    /// a message from this ring (submitted with the rest of the turn); a
    /// wake that found the queue full is sent the next turn.
    pub(super) fn wake_threads(&mut self) {
        for t in 0..self.threads.len() {
            if self.handed[t].is_empty() && !self.wake_owed[t] {
                continue;
            }
            let mut handed = std::mem::take(&mut self.handed[t]);
            // SAFETY: `hand`'s contract, taken by whoever handed them.
            unsafe { self.threads[t].hand(&mut handed) };
            self.handed[t] = handed;
            let waker = self.waker_slot();
            let wake = self.threads[t].wake_entry(tag(THREAD_WAKE, waker));
            // SAFETY: a message names no memory. Should the queue stay full,
            // the thread still finds its entries within its idle wait.
            let pushed = unsafe { self.push(&wake) };
            if pushed {
                self.wakers[waker].1 += 1;
            }
            self.wake_owed[t] = !pushed;
        }
    }

    /// The slot in `wakers` of the thread driving this turn (a free one
    /// taken if it has none).
    fn waker_slot(&mut self) -> usize {
        let me = self.me;
        if let Some(i) = self.wakers.iter().position(|w| w.0 == me && w.1 > 0) {
            return i;
        }
        let i = match self.wakers.iter().position(|w| w.1 == 0) {
            Some(i) => i,
            None => {
                self.wakers.push((None, 0));
                self.wakers.len() - 1
            }
        };
        self.wakers[i].0 = me;
        i
    }

    /// Wake messages the thread driving this turn sent that have not
    /// completed here.
    pub(super) fn wakes_owed(&self) -> bool {
        self.wakers.iter().any(|w| w.0 == self.me && w.1 > 0)
    }

    /// Wake messages sent whose completion has not come.
    pub(super) fn wakes_in_flight(&self) -> usize {
        let owed = |count: u32| count as usize;
        owed(self.stop_wakes) + self.wakers.iter().map(|w| owed(w.1)).sum::<usize>()
    }

    /// `Drop`'s reap: takes every completion there is, counting it off
    /// `in_flight`, and a wake's off its sender's count too.
    pub(super) fn settle_for_drop(&mut self) {
        let done: Vec<(u64, u32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.flags()))
            .collect();
        self.in_flight = settled(self.in_flight, done.iter().map(|c| c.1));
        for &(user_data, _) in done.iter().filter(|c| c.0 & KIND == THREAD_WAKE) {
            self.wake_done(user_data);
        }
    }

    /// The wake tagged `user_data` completed: counted off its sender's
    /// slot, or off `stop_wakes` (`STOPPING_WAKER`).
    pub(super) fn wake_done(&mut self, user_data: u64) {
        let slot = (user_data >> 16) as usize;
        let count = match self.wakers.get_mut(slot) {
            Some(w) => &mut w.1,
            None => &mut self.stop_wakes,
        };
        *count = count.saturating_sub(1);
    }
}
