//! Going on after a lost rank (issue 45): `agree`, `shrink`, `revoke`,
//! `lost_ranks` with every rank alive, after a rank's links closed (its
//! communicator dropped, as its process exiting does), and after a revoke.
//! Ranks are threads of this process over real links (shared memory on
//! one host); tests/recovery_processes.rs kills processes.

mod common;

use common::{local_group, on_all};
use ringwire::{Communicator, Error, ReduceOp};
use std::time::Duration;

fn group(world: usize) -> Vec<Communicator> {
    let (store, comms) = local_group(world, |b| b.timeout(Duration::from_secs(20)));
    // The store is not needed after setup (shrink never uses it).
    drop(store);
    comms
}

#[test]
fn with_every_rank_alive_agree_ands_and_shrink_keeps_everyone() {
    for world in [1, 2, 4] {
        let comms = group(world);
        let agreed = on_all(&comms, |c| {
            let value = !(1u64 << c.rank());
            c.agree(value).wait().unwrap()
        });
        let want = (0..world).fold(u64::MAX, |v, r| v & !(1u64 << r));
        for a in &agreed {
            assert_eq!(a.value, want);
            assert_eq!(a.members, (0..world).collect::<Vec<_>>());
        }
        let shrunk = on_all(&comms, |c| c.shrink().wait().unwrap());
        for (rank, s) in shrunk.iter().enumerate() {
            assert_eq!((s.rank(), s.world_size()), (rank, world));
        }
        let sums = on_all(&shrunk, |s| {
            s.all_reduce(vec![1i32; 5], ReduceOp::Sum).wait().unwrap()
        });
        assert!(sums.iter().all(|v| v == &vec![world as i32; 5]));
    }
}

#[test]
fn survivors_of_a_lost_rank_shrink_and_go_on() {
    let world = 4;
    let lost = 2;
    let mut comms = group(world);
    // A first op links the ranks (a ring, and more).
    let sums = on_all(&comms, |c| {
        c.all_reduce(vec![1.0f32; 1000], ReduceOp::Sum)
            .wait()
            .unwrap()
    });
    assert!(sums.iter().all(|v| v[0] == world as f32));
    // The rank goes: its communicator, its links and its transport close.
    drop(comms.remove(lost));
    let survivors = comms;
    // Their next op fails, naming the lost rank or the abort it caused.
    let failed = on_all(&survivors, |c| {
        c.all_reduce(vec![1.0f32; 1000], ReduceOp::Sum).wait()
    });
    for f in &failed {
        assert!(
            matches!(
                f,
                Err(Error::PeerLost { .. } | Error::Aborted { .. } | Error::Failed { .. })
            ),
            "{f:?}"
        );
    }
    for c in &survivors {
        // A lost rank that this one had no link with shows once tried.
        let lost_ranks = c.lost_ranks();
        assert!(
            lost_ranks.is_empty() || lost_ranks == [lost],
            "{lost_ranks:?}"
        );
    }
    let shrunk = on_all(&survivors, |c| c.shrink().wait().unwrap());
    for (i, s) in shrunk.iter().enumerate() {
        // Old order, renumbered: 0, 1, 3 become 0, 1, 2.
        assert_eq!((s.rank(), s.world_size()), (i, world - 1));
        assert_eq!(s.world_ranks(), [0, 1, 3]);
    }
    let sums = on_all(&shrunk, |s| {
        s.all_reduce(vec![(s.rank() + 1) as f64; 333], ReduceOp::Sum)
            .wait()
            .unwrap()
    });
    assert!(
        sums.iter().all(|v| v.iter().all(|&x| x == 6.0)),
        "{:?}",
        sums[0][0]
    );
    // And agree on the shrunk one, every member's bit cleared.
    let agreed = on_all(&shrunk, |s| s.agree(!(1u64 << s.rank())).wait().unwrap());
    assert!(
        agreed
            .iter()
            .all(|a| a.value == !0b111 && a.members == [0, 1, 2])
    );
}

#[test]
fn a_lost_lowest_rank_that_no_one_linked_with_is_left_out() {
    // No op ran: no links. Rank 0 goes; the others would wait for its dial
    // (the lower rank dials) until the timeout, and its probe tells them
    // at once that its process is gone.
    let mut comms = group(4);
    drop(comms.remove(0));
    let shrunk = on_all(&comms, |c| c.shrink().wait());
    for (i, s) in shrunk.iter().enumerate() {
        let s = s
            .as_ref()
            .unwrap_or_else(|e| panic!("old rank {}: {e}", i + 1));
        assert_eq!((s.rank(), s.world_size()), (i, 3));
        assert_eq!(s.world_ranks(), [1, 2, 3]);
    }
    let shrunk: Vec<Communicator> = shrunk.into_iter().map(Result::unwrap).collect();
    on_all(&shrunk, |s| s.barrier().wait().unwrap());
}

#[test]
fn a_revoked_communicator_fails_every_op_and_shrinks_to_everyone() {
    let comms = group(3);
    on_all(&comms, |c| c.barrier().wait().unwrap());
    comms[1].revoke();
    let after = on_all(&comms, |c| c.barrier().wait());
    assert!(after.iter().all(Result::is_err), "{after:?}");
    let shrunk = on_all(&comms, |c| c.shrink().wait().unwrap());
    assert!(shrunk.iter().all(|s| s.world_size() == 3));
    on_all(&shrunk, |s| s.barrier().wait().unwrap());
}

#[test]
fn a_rank_cut_off_from_the_majority_says_so() {
    // Two of three go: the last cannot decide alone.
    let mut comms = group(3);
    on_all(&comms, |c| c.barrier().wait().unwrap());
    drop(comms.remove(2));
    drop(comms.remove(1));
    let alone = &comms[0];
    match alone.shrink().wait() {
        Err(Error::QuorumLost {
            reachable: 1,
            needed: 2,
            size: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // With a quorum of one (one host: no partition can split it), it goes on.
    let shrunk = alone.shrink_with_quorum(1).wait().unwrap();
    assert_eq!((shrunk.rank(), shrunk.world_size()), (0, 1));
}

/// Every other test of this file, again on the portable transport.
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP.
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// Every other test of this file, again with local ranks on Unix sockets.
#[test]
fn over_unix_links_too() {
    common::rerun_over_unix_links("over_unix_links_too");
}

/// A program that agrees every step (the loop decision 0039 recommends)
/// does not keep what each agreement left: the transport's inboxes stay
/// as many as a few agreements need, not one set per agreement.
#[test]
fn agreeing_every_step_keeps_no_inbox_per_agreement() {
    let comms = group(3);
    let counts = on_all(&comms, |c| {
        c.agree(1).wait().unwrap();
        let before = c.stats().inboxes;
        for step in 0..40 {
            let agreed = c.agree(step).wait().unwrap();
            assert_eq!(agreed.value, step);
        }
        (before, c.stats().inboxes)
    });
    for (rank, (before, after)) in counts.into_iter().enumerate() {
        // Forty agreements with two peers each kept would be 80 more.
        assert!(
            after <= before + 4,
            "rank {rank}: {before} inboxes, then {after}"
        );
    }
}
