//! Fault injection: parsing `RINGWIRE_STANDIN_NCCL_FAULT` into what one
//! rank of a comm must do wrong, so the consumer's watchdog, abort and
//! error paths can be tested without a GPU or a broken network.

use crate::codes::NcclResult;

/// One item of the variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Op `op` on `rank` never completes (until abort).
    Hang { rank: usize, op: u64 },
    /// Op `op` on `rank` sets the async error to `code`, then hangs.
    Error {
        rank: usize,
        op: u64,
        code: NcclResult,
    },
    /// Init on `rank` fails with `ncclUnhandledCudaError`.
    InitFail { rank: usize },
    /// Init on `rank` never finishes (until abort).
    InitStall { rank: usize },
    /// `ncclCommShrink` on (parent) `rank` fails before it sends anything.
    ShrinkFail { rank: usize },
    /// `ncclCommShrink` on (parent) `rank` never finishes (until the
    /// parent or the child is aborted).
    ShrinkStall { rank: usize },
}

/// What a given rank's op does instead of running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpFault {
    Hang,
    Error(NcclResult),
}

/// The faults that apply to one rank of one comm.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankFaults {
    pub(crate) init_fail: bool,
    pub(crate) init_stall: bool,
    pub(crate) shrink_fail: bool,
    pub(crate) shrink_stall: bool,
    ops: Vec<(u64, OpFault)>,
}

impl RankFaults {
    /// The faults of `rank` among `all`.
    pub(crate) fn for_rank(all: &[Fault], rank: usize) -> RankFaults {
        let mut mine = RankFaults::default();
        for fault in all {
            match *fault {
                Fault::Hang { rank: r, op } if r == rank => mine.ops.push((op, OpFault::Hang)),
                Fault::Error { rank: r, op, code } if r == rank => {
                    mine.ops.push((op, OpFault::Error(code)));
                }
                Fault::InitFail { rank: r } if r == rank => mine.init_fail = true,
                Fault::InitStall { rank: r } if r == rank => mine.init_stall = true,
                Fault::ShrinkFail { rank: r } if r == rank => mine.shrink_fail = true,
                Fault::ShrinkStall { rank: r } if r == rank => mine.shrink_stall = true,
                _ => {}
            }
        }
        mine
    }

    /// The fault of op number `op`, the first listed if several.
    pub(crate) fn op(&self, op: u64) -> Option<OpFault> {
        self.ops.iter().find(|(o, _)| *o == op).map(|(_, f)| *f)
    }
}

/// Parses the variable's value; an item it cannot read is an error naming
/// it (a typo must not silently disable a test's fault).
pub(crate) fn parse(text: &str) -> Result<Vec<Fault>, String> {
    let mut faults = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let fields: Vec<&str> = item.split(':').map(str::trim).collect();
        let fault = match fields.as_slice() {
            ["hang", rank, op] => rank
                .parse()
                .ok()
                .zip(op.parse().ok())
                .map(|(rank, op)| Fault::Hang { rank, op }),
            ["error", rank, op, code] => match (rank.parse(), op.parse(), code.parse()) {
                (Ok(rank), Ok(op), Ok(code)) => Some(Fault::Error { rank, op, code }),
                _ => None,
            },
            ["initfail", rank] => rank.parse().ok().map(|rank| Fault::InitFail { rank }),
            ["initstall", rank] => rank.parse().ok().map(|rank| Fault::InitStall { rank }),
            ["shrinkfail", rank] => rank.parse().ok().map(|rank| Fault::ShrinkFail { rank }),
            ["shrinkstall", rank] => rank.parse().ok().map(|rank| Fault::ShrinkStall { rank }),
            _ => None,
        };
        faults.push(fault.ok_or_else(|| format!("cannot read fault item '{item}'"))?);
    }
    Ok(faults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind() {
        let all = parse("hang:1:3, error:0:2:6,initfail:2,initstall:3,shrinkfail:4,shrinkstall:5")
            .unwrap();
        assert_eq!(
            all,
            vec![
                Fault::Hang { rank: 1, op: 3 },
                Fault::Error {
                    rank: 0,
                    op: 2,
                    code: 6
                },
                Fault::InitFail { rank: 2 },
                Fault::InitStall { rank: 3 },
                Fault::ShrinkFail { rank: 4 },
                Fault::ShrinkStall { rank: 5 },
            ]
        );
        assert!(RankFaults::for_rank(&all, 4).shrink_fail);
        assert!(RankFaults::for_rank(&all, 5).shrink_stall);
        assert!(!RankFaults::for_rank(&all, 5).shrink_fail);
        let r0 = RankFaults::for_rank(&all, 0);
        assert_eq!(r0.op(2), Some(OpFault::Error(6)));
        assert_eq!(r0.op(3), None);
        assert!(!r0.init_fail && !r0.init_stall);
        assert_eq!(RankFaults::for_rank(&all, 1).op(3), Some(OpFault::Hang));
        assert!(RankFaults::for_rank(&all, 2).init_fail);
        assert!(RankFaults::for_rank(&all, 3).init_stall);
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn rejects_unreadable_items() {
        assert!(parse("hang:1").is_err());
        assert!(parse("hang:x:1").is_err());
        assert!(parse("explode:1").is_err());
        assert!(parse("error:0:1").unwrap_err().contains("error:0:1"));
    }
}
