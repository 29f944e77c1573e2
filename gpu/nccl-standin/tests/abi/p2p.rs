//! Send and receive: grouped rings (with sends to self) and large crossed
//! sends that must not deadlock.

use crate::common::{P2p, run_ranks};
use ringwire_nccl_standin::abi::{ncclRecv, ncclSend};
use ringwire_nccl_standin::codes::{DataType, SUCCESS};
use std::ffi::c_int;

fn pattern(rank: usize, round: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (rank * 31 + round * 7 + i) as u8)
        .collect()
}

#[test]
fn grouped_ring_with_self_sends() {
    const N: usize = 3;
    const L: usize = 16;
    let failures = run_ranks(N, |r| {
        let mut failures = Vec::new();
        let (next, prev) = ((r.rank + 1) % N, (r.rank + N - 1) % N);
        for round in 0..3 {
            // [to next | to self | from prev | from self]
            let mut mem = pattern(r.rank, round, L);
            mem.extend(pattern(r.rank + 100, round, L));
            mem.resize(4 * L, 0);
            // Receives listed first: the group must still send first.
            let calls = [
                P2p {
                    send: false,
                    peer: prev,
                    at: 2 * L,
                    len: L,
                },
                P2p {
                    send: false,
                    peer: r.rank,
                    at: 3 * L,
                    len: L,
                },
                P2p {
                    send: true,
                    peer: next,
                    at: 0,
                    len: L,
                },
                P2p {
                    send: true,
                    peer: r.rank,
                    at: L,
                    len: L,
                },
            ];
            let code = r.group(&mut mem, &calls);
            if code != SUCCESS
                || mem[2 * L..3 * L] != pattern(prev, round, L)[..]
                || mem[3 * L..] != pattern(r.rank + 100, round, L)[..]
            {
                failures.push(format!("rank {} round {round}: code {code}", r.rank));
            }
        }
        failures
    });
    assert!(failures.iter().all(Vec::is_empty), "{failures:#?}");
}

#[test]
fn large_crossed_sends_outside_groups_do_not_deadlock() {
    const L: usize = 8 << 20;
    let ok = run_ranks(2, |r| {
        let peer = 1 - r.rank;
        let send = pattern(r.rank, 0, L);
        let mut recv = vec![0u8; L];
        let u8 = DataType::Uint8 as c_int;
        // SAFETY: both buffers outlive the stream sync below.
        let codes = unsafe {
            [
                ncclSend(
                    send.as_ptr().cast(),
                    L,
                    u8,
                    peer as c_int,
                    r.comm(),
                    r.stream(),
                ),
                ncclRecv(
                    recv.as_mut_ptr().cast(),
                    L,
                    u8,
                    peer as c_int,
                    r.comm(),
                    r.stream(),
                ),
            ]
        };
        r.sync();
        codes == [SUCCESS; 2] && recv == pattern(peer, 0, L)
    });
    assert_eq!(ok, vec![true, true]);
}
