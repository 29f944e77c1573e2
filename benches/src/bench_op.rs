//! The ops the bench measures ([`BenchOp`]): their names, what each moves
//! for a nominal size ([`Shape`]), and their bus-bandwidth factor
//! (nccl-tests' formulas).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BenchOp {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    /// Every rank's input to the root (nccl-tests' gather).
    Gather,
    /// The root's input, a block to each rank (nccl-tests' scatter).
    Scatter,
    Barrier,
    /// nccl-tests' sendrecv: every rank sends to the next and receives
    /// from the previous at once (`send_recv`).
    SendRecv,
    /// Ranks 0 and 1 bounce one buffer (`send` then `recv`); reported one
    /// way, as half the round trip.
    PingPong,
}

/// Buffer lengths (elements) for one size, and the bytes the size row
/// reports (nccl-tests' S: the larger of the op's buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) input: usize,
    pub(crate) output: usize,
    pub(crate) bytes: usize,
}

impl BenchOp {
    pub(crate) const ALL: [BenchOp; 11] = [
        BenchOp::AllReduce,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::AllToAll,
        BenchOp::Gather,
        BenchOp::Scatter,
        BenchOp::Barrier,
        BenchOp::SendRecv,
        BenchOp::PingPong,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::AllToAll => "all_to_all",
            BenchOp::Gather => "gather",
            BenchOp::Scatter => "scatter",
            BenchOp::Barrier => "barrier",
            BenchOp::SendRecv => "sendrecv",
            BenchOp::PingPong => "pingpong",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<BenchOp> {
        BenchOp::ALL
            .into_iter()
            .find(|op| op.name() == name.replace('-', "_"))
    }

    pub(crate) fn reduces(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::Reduce | BenchOp::ReduceScatter
        )
    }

    /// Whether it needs another rank to talk to.
    pub(crate) fn point_to_point(self) -> bool {
        matches!(self, BenchOp::SendRecv | BenchOp::PingPong)
    }

    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::Gather | BenchOp::Scatter
        )
    }

    /// busbw = algbw * factor (nccl-tests, doc/PERFORMANCE.md): the bandwidth
    /// each link needs, comparable with the hardware's.
    pub(crate) fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::Gather
            | BenchOp::Scatter => (n - 1.0) / n,
            BenchOp::Broadcast
            | BenchOp::Reduce
            | BenchOp::SendRecv
            | BenchOp::PingPong
            | BenchOp::Barrier => 1.0,
        }
    }

    /// Buffer lengths for a nominal `size` in bytes, rounded down so that
    /// blocks divide evenly where the op needs it.
    pub(crate) fn shape(self, size: usize, elem: usize, ranks: usize) -> Shape {
        let count = size / elem;
        match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce | BenchOp::PingPong => {
                Shape {
                    input: count,
                    output: 0,
                    bytes: count * elem,
                }
            }
            BenchOp::SendRecv => Shape {
                input: count,
                output: count,
                bytes: count * elem,
            },
            // Every rank passes the root's length where the op leaves it
            // unused, as symmetric code would.
            BenchOp::AllGather | BenchOp::Gather => {
                let per = count / ranks;
                Shape {
                    input: per,
                    output: per * ranks,
                    bytes: per * ranks * elem,
                }
            }
            BenchOp::ReduceScatter | BenchOp::Scatter => {
                let total = count / ranks * ranks;
                Shape {
                    input: total,
                    output: total / ranks,
                    bytes: total * elem,
                }
            }
            BenchOp::AllToAll => {
                let total = count / ranks * ranks;
                Shape {
                    input: total,
                    output: total,
                    bytes: total * elem,
                }
            }
            BenchOp::Barrier => Shape {
                input: 0,
                output: 0,
                bytes: 0,
            },
        }
    }
}
