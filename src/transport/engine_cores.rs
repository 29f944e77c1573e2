//! Which cores a rank's engine threads are pinned to (decision 0036).
//!
//! Ranks on a host are homed on the first cores they may use, one each by
//! local rank (`ringwire_uring::set_home_core`). Engine threads go on the
//! cores after those, each rank's on its own run of them, so no thread
//! shares a core with a rank's waiting caller or another rank's threads.
//! Where the host has too few cores for that, the threads run unpinned and
//! the scheduler places them: pinning two busy threads to one core would
//! be worse than letting them move.
#![forbid(unsafe_code)]

/// The cores (ids from `usable`, the process's affinity mask in order) to
/// pin `threads` engine threads of local rank `local_rank` of `on_host`
/// ranks to; empty where the host has fewer than `on_host * (1 + threads)`.
pub(crate) fn engine_thread_cores(
    threads: usize,
    local_rank: usize,
    on_host: usize,
    usable: &[usize],
) -> Vec<usize> {
    let on_host = on_host.max(1);
    if threads == 0 || local_rank >= on_host || usable.len() < on_host * (1 + threads) {
        return Vec::new();
    }
    let first = on_host + local_rank * threads;
    usable[first..first + threads].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_gets_its_own_cores_after_those_the_ranks_are_homed_on() {
        let usable: Vec<usize> = (0..16).collect();
        // 2 ranks of 2 threads each on 16 cores: ranks on 0 and 1.
        assert_eq!(engine_thread_cores(2, 0, 2, &usable), vec![2, 3]);
        assert_eq!(engine_thread_cores(2, 1, 2, &usable), vec![4, 5]);
        // 8 ranks of 1 thread: exactly 16.
        assert_eq!(engine_thread_cores(1, 7, 8, &usable), vec![15]);
        // Ids as the mask has them, not positions.
        let odd: Vec<usize> = (0..8).map(|i| 2 * i + 1).collect();
        assert_eq!(engine_thread_cores(1, 1, 2, &odd), vec![7]);
        // Every thread of every rank on a core of its own.
        let mut all: Vec<usize> = (0..4)
            .flat_map(|r| engine_thread_cores(3, r, 4, &usable))
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, (4..16).collect::<Vec<_>>());
    }

    #[test]
    fn too_few_cores_leave_the_threads_unpinned() {
        let usable: Vec<usize> = (0..16).collect();
        assert!(engine_thread_cores(2, 0, 8, &usable).is_empty(), "24 > 16");
        assert!(engine_thread_cores(1, 0, 2, &[0, 1]).is_empty(), "this VM");
        assert!(
            engine_thread_cores(0, 0, 1, &usable).is_empty(),
            "none asked"
        );
        assert!(
            engine_thread_cores(1, 3, 2, &usable).is_empty(),
            "a bad rank"
        );
    }
}
