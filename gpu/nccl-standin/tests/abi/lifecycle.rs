//! Init (blocking, non-blocking, inside a group), comm queries, finalize
//! and destroy.

use crate::collectives::{input, reference};
use crate::common::*;
use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{DataType, IN_PROGRESS, RedOp, SUCCESS};
use ringwire_nccl_standin::envcfg;
use std::ffi::c_int;
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(10);

#[test]
fn non_blocking_init_polls_in_progress_then_success() {
    const N: usize = 2;
    let id = unique_id();
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                s.spawn(move || {
                    envcfg::set_thread_override(envcfg::INPROGRESS_POLLS, Some("2"));
                    let (code, comm) = init(id, N, rank, false);
                    assert_eq!(code, IN_PROGRESS);
                    assert_ne!(comm, 0);
                    // The first two polls report in progress whatever the
                    // setup's state; then it settles to success.
                    let first = [async_error(comm), async_error(comm)];
                    let settled = poll_until_settled(comm, SETTLE);
                    let r = Rank::from_comm(comm, N, rank);
                    let (mut count, mut me, mut device) = (-1, -1, -1);
                    // SAFETY: writable ints.
                    let info = unsafe {
                        [
                            ncclCommCount(r.comm(), &mut count),
                            ncclCommUserRank(r.comm(), &mut me),
                            ncclCommCuDevice(r.comm(), &mut device),
                        ]
                    };
                    let dt = DataType::Float32;
                    let mut mem = input(dt, rank, 10);
                    let code = r.all_reduce(&mut mem, 0, 0, 10, dt, RedOp::Sum);
                    let want = reference(dt, RedOp::Sum, &[input(dt, 0, 10), input(dt, 1, 10)]);
                    let finalize = ncclCommFinalize(r.comm());
                    let finalized = poll_until_settled(comm, SETTLE);
                    let result = (
                        first,
                        settled,
                        info,
                        [count, me, device],
                        code,
                        mem == want,
                        finalize,
                        finalized,
                    );
                    r.destroy();
                    result
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (rank, result) in results.into_iter().enumerate() {
        let want = (
            [IN_PROGRESS; 2],
            SUCCESS,
            [SUCCESS; 3],
            [N as c_int, rank as c_int, 0],
            SUCCESS,
            true,
            IN_PROGRESS,
            SUCCESS,
        );
        assert_eq!(result, want, "rank {rank}");
    }
}

#[test]
fn zero_in_progress_polls_and_a_blocking_finalize() {
    envcfg::set_thread_override(envcfg::INPROGRESS_POLLS, Some("0"));
    let (code, comm) = init(unique_id(), 1, 0, false);
    envcfg::clear_thread_overrides();
    assert_eq!(code, IN_PROGRESS);
    assert_eq!(poll_until_settled(comm, SETTLE), SUCCESS);
    assert_eq!(ncclCommDestroy(handle(comm)), SUCCESS);

    let r = Rank::init(unique_id(), 1, 0);
    let mut mem = 5u64.to_ne_bytes().to_vec();
    mem.resize(16, 0);
    assert_eq!(
        r.all_reduce(&mut mem, 0, 8, 1, DataType::Uint64, RedOp::Prod),
        SUCCESS
    );
    assert_eq!(mem[8..], 5u64.to_ne_bytes());
    assert_eq!(ncclCommFinalize(r.comm()), SUCCESS);
    assert_eq!(r.async_error(), SUCCESS);
    r.destroy();
}

#[test]
fn one_thread_drives_two_ranks_through_groups() {
    let id = unique_id();
    let mut comms: [NcclComm; 2] = [std::ptr::null_mut(); 2];
    assert_eq!(ncclGroupStart(), SUCCESS);
    for (rank, comm) in comms.iter_mut().enumerate() {
        // SAFETY: a writable handle; NULL config is blocking.
        let code =
            unsafe { ncclCommInitRankConfig(comm, 2, id, rank as c_int, std::ptr::null_mut()) };
        assert_eq!(code, SUCCESS);
    }
    assert_eq!(ncclGroupEnd(), SUCCESS);
    let ranks: Vec<Rank> = (0..2)
        .map(|rank| Rank::from_comm(comms[rank].addr(), 2, rank))
        .collect();
    let dt = DataType::Int32;
    let inputs: Vec<Vec<u8>> = (0..2).map(|q| input(dt, q, 9)).collect();
    let mut outs = vec![vec![0u8; 36]; 2];
    assert_eq!(ncclGroupStart(), SUCCESS);
    assert_eq!(ncclGroupStart(), SUCCESS, "groups nest");
    for (rank, out) in outs.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the stream sync below. Both ops run
        // as one unit on the first op's stream.
        let code = unsafe {
            ncclAllReduce(
                inputs[rank].as_ptr().cast(),
                out.as_mut_ptr().cast(),
                9,
                dt as c_int,
                RedOp::Min as c_int,
                ranks[rank].comm(),
                ranks[0].stream(),
            )
        };
        assert_eq!(code, SUCCESS);
    }
    assert_eq!(ncclGroupEnd(), SUCCESS);
    assert_eq!(ncclGroupEnd(), SUCCESS);
    ranks[0].sync();
    let want = reference(dt, RedOp::Min, &inputs);
    assert_eq!(outs, vec![want.clone(), want]);
    assert_eq!(ncclGroupEnd(), ringwire_nccl_standin::codes::INVALID_USAGE);
    for r in ranks {
        r.destroy();
    }
}
