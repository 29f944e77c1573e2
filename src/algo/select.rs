//! Which schedule each collective runs: one pure function per collective of
//! the job's shape and the op's size (NCCL's `graph/tuning.cc` role).
//!
//! Every rank must pick the same schedule for the same op, or the first
//! frame is a mismatch: so a choice depends only on what every rank agrees
//! on (the communicator's size, facts agreed at rendezvous, the op's size,
//! the settings every rank must share) and never on the rank itself.

/// What every rank of a communicator agrees on, that choices depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Ranks in the communicator.
    pub ranks: usize,
    /// Some host of the job runs more ranks than it has cores (agreed at
    /// rendezvous): ops there are CPU-bound (decisions 0013, 0024).
    pub crowded_anywhere: bool,
    /// Some link of the job is TCP (another host, local links set to TCP,
    /// or TLS; agreed at rendezvous): decision 0022.
    pub tcp_anywhere: bool,
    /// Below this many bytes an op is latency-bound
    /// (RINGWIRE_SMALL_MESSAGE_BYTES, the same on every rank).
    pub small_message_bytes: usize,
}

/// The schedule of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduce {
    /// Chunked pipelined ring: large ops (decisions 0011, 0014).
    Ring,
    /// Recursive doubling: small ops.
    Doubling,
    /// Tree reduce, then broadcast: small ops where ranks share cores
    /// (2(p-1) frames against doubling's p log2 p, decision 0013).
    Tree,
    /// Rabenseifner's halving-doubling: mid sizes where some link is TCP
    /// (decision 0022).
    Halving,
}

/// The schedule of a broadcast or a reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rooted {
    /// Binomial tree.
    Tree,
    /// Pipelined chain.
    Chain,
}

/// A rooted op's schedule, and whether it is paced (a sender waits for its
/// receiver's word, decision 0024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootedChoice {
    pub schedule: Rooted,
    pub paced: bool,
}

impl Shape {
    fn small(&self, bytes: usize) -> bool {
        bytes < self.small_message_bytes
    }

    /// An all-reduce of `bytes`.
    pub fn all_reduce(&self, bytes: usize) -> AllReduce {
        if super::all_reduce_halving_pays(self.ranks, bytes, self.tcp_anywhere) {
            AllReduce::Halving
        } else if !self.small(bytes) {
            AllReduce::Ring
        } else if self.crowded_anywhere {
            AllReduce::Tree
        } else {
            AllReduce::Doubling
        }
    }

    /// A broadcast of `bytes`.
    pub fn broadcast(&self, bytes: usize) -> RootedChoice {
        RootedChoice {
            schedule: match self.small(bytes) {
                true => Rooted::Tree,
                false => Rooted::Chain,
            },
            paced: super::pacing_pays(self.crowded_anywhere, bytes),
        }
    }

    /// A reduce of `len` elements of `bytes` in all, sent in chunks of
    /// `chunk` elements. Large ones take the chain where its root receives
    /// and reduces the buffer once against a tree's ceil(log2 p) times; a
    /// tree's leaves are paced where ranks share cores (a chain gained
    /// nothing paced).
    pub fn reduce(&self, len: usize, bytes: usize, chunk: usize) -> RootedChoice {
        let chain = !self.small(bytes) && super::reduce_chain_pays(self.ranks, len, chunk);
        RootedChoice {
            schedule: match chain {
                true => Rooted::Chain,
                false => Rooted::Tree,
            },
            paced: !chain && super::pacing_pays(self.crowded_anywhere, bytes),
        }
    }

    /// Whether a gather of blocks of `block_bytes` asks each rank in turn
    /// (decision 0023).
    pub fn gather_in_turn(&self, block_bytes: usize) -> bool {
        super::gather_in_turn_pays(self.ranks, block_bytes)
    }

    /// Whether a scatter of blocks of `block_bytes` is paced, by the op's
    /// whole size (the same on every rank; decision 0024).
    pub fn scatter_paced(&self, block_bytes: usize) -> bool {
        super::pacing_pays(self.crowded_anywhere, block_bytes * self.ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    fn shape(ranks: usize, crowded_anywhere: bool, tcp_anywhere: bool) -> Shape {
        Shape {
            ranks,
            crowded_anywhere,
            tcp_anywhere,
            small_message_bytes: 64 * KIB,
        }
    }

    #[test]
    fn all_reduce_takes_doubling_small_and_the_ring_large() {
        let s = shape(4, false, false);
        assert_eq!(s.all_reduce(0), AllReduce::Doubling);
        assert_eq!(s.all_reduce(8), AllReduce::Doubling);
        assert_eq!(s.all_reduce(64 * KIB - 1), AllReduce::Doubling);
        assert_eq!(s.all_reduce(64 * KIB), AllReduce::Ring);
        assert_eq!(s.all_reduce(1 << 30), AllReduce::Ring);
    }

    #[test]
    fn crowded_jobs_reduce_small_ops_over_a_tree() {
        let s = shape(4, true, false);
        assert_eq!(s.all_reduce(8), AllReduce::Tree);
        assert_eq!(s.all_reduce(64 * KIB), AllReduce::Ring);
    }

    #[test]
    fn tcp_jobs_of_three_or_more_halve_mid_sizes() {
        let s = shape(4, false, true);
        assert_eq!(s.all_reduce(8), AllReduce::Doubling);
        assert_eq!(s.all_reduce(256 * KIB - 1), AllReduce::Ring);
        assert_eq!(s.all_reduce(256 * KIB), AllReduce::Halving);
        assert_eq!(s.all_reduce(8 * MIB - 1), AllReduce::Halving);
        assert_eq!(s.all_reduce(8 * MIB), AllReduce::Ring);
        // Two ranks have nothing to halve; and the halving beats crowding.
        assert_eq!(shape(2, false, true).all_reduce(MIB), AllReduce::Ring);
        assert_eq!(shape(4, true, true).all_reduce(MIB), AllReduce::Halving);
    }

    #[test]
    fn the_small_message_threshold_is_the_settings() {
        let s = Shape {
            small_message_bytes: MIB,
            ..shape(4, false, false)
        };
        assert_eq!(s.all_reduce(512 * KIB), AllReduce::Doubling);
        assert_eq!(s.broadcast(512 * KIB).schedule, Rooted::Tree);
    }

    #[test]
    fn rooted_ops_are_paced_only_where_ranks_share_cores_and_in_the_window() {
        for crowded in [false, true] {
            let s = shape(4, crowded, false);
            for (bytes, window) in [
                (64 * KIB, false),
                (256 * KIB, true),
                (16 * MIB - 1, true),
                (16 * MIB, false),
            ] {
                assert_eq!(s.broadcast(bytes).paced, crowded && window, "{bytes}");
                // A scatter counts the whole op: 4 blocks of a quarter.
                assert_eq!(s.scatter_paced(bytes / 4), crowded && window, "{bytes}");
            }
        }
        let s = shape(4, false, false);
        assert_eq!(s.broadcast(8).schedule, Rooted::Tree);
        assert_eq!(s.broadcast(MIB).schedule, Rooted::Chain);
    }

    #[test]
    fn a_large_reduce_takes_the_chain_where_it_pays_and_only_a_tree_is_paced() {
        let chunk = 256 * KIB / 4;
        let s = shape(4, true, false);
        let small = s.reduce(2, 8, chunk);
        assert_eq!(small.schedule, Rooted::Tree);
        assert!(!small.paced);
        let mid = s.reduce(MIB / 4, MIB, chunk);
        assert_eq!(mid.schedule, Rooted::Chain);
        assert!(!mid.paced, "a chain is never paced");
        // Two ranks: a chain is the tree; the tree is kept.
        let two = shape(2, true, false).reduce(MIB / 4, MIB, chunk);
        assert_eq!(two.schedule, Rooted::Tree);
        assert!(two.paced);
    }

    #[test]
    fn gathers_of_three_or_more_take_large_blocks_in_turn() {
        assert!(!shape(2, false, false).gather_in_turn(MIB));
        assert!(!shape(3, false, false).gather_in_turn(128 * KIB - 1));
        assert!(shape(3, false, false).gather_in_turn(128 * KIB));
    }
}
