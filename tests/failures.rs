//! Failure handling in one process (ranks as threads over loopback): abort
//! propagation, mismatch reporting on every rank, the debug signature check,
//! "who has not arrived" on timeout, the flight recorder, and hostile bytes
//! on a rank's port while the job keeps computing correctly.

mod common;

use common::{local_group, on_all};
use ringwire::{Error, OpState, ReduceOp};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `abort` before any op, so no link exists yet: the ranks above the
/// aborting one are dialed to be told, the ones below hear it when they
/// dial it for their op.
#[test]
fn abort_before_the_first_op_reaches_ranks_never_linked() {
    for aborting in 0..3 {
        let (_store, comms) = local_group(3, |b| b.timeout(Duration::from_secs(20)));
        on_all(&comms, |c| {
            let start = Instant::now();
            if c.rank() == aborting {
                c.abort("stopping early");
                return;
            }
            let e = c
                .all_reduce(vec![1f32; 8], ReduceOp::Sum)
                .wait()
                .unwrap_err();
            assert!(
                e.to_string().contains("stopping early"),
                "rank {}: {e}",
                c.rank()
            );
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "rank {} waited for its timeout",
                c.rank()
            );
        });
    }
}

#[test]
fn abort_reaches_every_rank_and_fails_the_communicator() {
    let (_store, comms) = local_group(4, |b| b.timeout(Duration::from_secs(30)));
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let start = Instant::now();
    let results = on_all(&comms, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(200));
            c.abort("the trainer hit NaN");
            let e = c
                .all_reduce(vec![1f32; 8], ReduceOp::Sum)
                .wait()
                .unwrap_err();
            assert!(matches!(e, Error::Failed { .. }), "{e}");
            return None;
        }
        // Ranks 0, 1, 3 wait in an op rank 2 never joins.
        let e = c
            .all_reduce(vec![1f32; 1 << 16], ReduceOp::Sum)
            .wait()
            .unwrap_err();
        Some((
            e.to_string(),
            start.elapsed(),
            c.all_reduce(vec![1u8], ReduceOp::Sum).wait().unwrap_err(),
        ))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let Some((msg, took, later)) = r else {
            continue;
        };
        eprintln!("rank {rank} saw the abort after {took:?}: {msg}");
        assert!(
            msg.contains("aborted by rank 2") && msg.contains("NaN"),
            "rank {rank}: {msg}"
        );
        assert!(
            took < Duration::from_secs(20),
            "rank {rank} waited for its timeout instead"
        );
        assert!(
            matches!(later, Error::Failed { .. }),
            "rank {rank}: later ops must fail at once: {later}"
        );
    }
}

#[test]
fn a_size_mismatch_fails_every_rank_naming_both_sides() {
    let (_store, comms) = local_group(4, |b| b.timeout(Duration::from_secs(20)));
    let errs = on_all(&comms, |c| {
        let n = if c.rank() == 3 { 999 } else { 1000 };
        c.all_reduce(vec![1.0f32; n], ReduceOp::Sum)
            .wait()
            .unwrap_err()
            .to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(
            e.contains("1000") && e.contains("999") && e.contains("rank 3"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn an_order_mismatch_names_both_ops() {
    let (_store, comms) = local_group(2, |b| b.timeout(Duration::from_secs(20)));
    let errs = on_all(&comms, |c| {
        let e = if c.rank() == 0 {
            c.all_reduce(vec![1i32; 10], ReduceOp::Sum).wait()
        } else {
            c.broadcast(vec![1i32; 10], 0).wait()
        };
        e.unwrap_err().to_string()
    });
    for e in &errs {
        assert!(
            e.contains("all_reduce #1") && e.contains("broadcast #1"),
            "{e}"
        );
    }
}

#[test]
fn debug_mode_checks_signatures_before_moving_data() {
    let (_store, comms) = local_group(3, |b| b.debug_checks(true).timeout(Duration::from_secs(20)));
    // Matching ops pass the check and compute.
    let ok = on_all(&comms, |c| {
        c.all_reduce(vec![2i64; 5], ReduceOp::Prod).wait().unwrap()
    });
    assert!(ok.iter().all(|v| v == &vec![8i64; 5]));
    // Reduce ops differ: the frames alone would not show it.
    let errs = on_all(&comms, |c| {
        let op = if c.rank() == 1 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        c.all_reduce(vec![1.0f32; 64], op)
            .wait()
            .unwrap_err()
            .to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(
            e.contains("all_reduce(f32, 64, max) as op #2")
                && e.contains("all_reduce(f32, 64, sum) as op #2"),
            "rank {rank}: {e}"
        );
    }
}

/// Ranks that disagree on a gather's root are told so by the debug check,
/// each side's root named (without it both descriptions would read alike).
#[test]
fn debug_mode_names_both_roots_of_a_gather() {
    let (_store, comms) = local_group(3, |b| b.debug_checks(true).timeout(Duration::from_secs(20)));
    let errs = on_all(&comms, |c| {
        let root = usize::from(c.rank() == 2);
        c.gather(vec![1f32; 4], vec![0f32; 12], root)
            .wait()
            .unwrap_err()
            .to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(
            e.contains("gather(f32, 4, root 0)") && e.contains("gather(f32, 4, root 1)"),
            "rank {rank}: {e}"
        );
    }
}

/// Runs `op` on every rank and checks each ends (done or failed) within
/// 10 s, a third of the 30 s timeout the callers set: an error that comes
/// only with the timeout fails the test. The results, errors as text.
fn each_fails_soon(
    comms: &[ringwire::Communicator],
    op: impl Fn(&ringwire::Communicator) -> Result<(), Error> + Sync,
) -> Vec<Result<(), String>> {
    let results = on_all(comms, |c| {
        let start = Instant::now();
        (op(c).map_err(|e| e.to_string()), start.elapsed())
    });
    for (rank, (result, took)) in results.iter().enumerate() {
        assert!(
            took < &Duration::from_secs(10),
            "rank {rank} took {took:?}: {result:?}"
        );
    }
    results.into_iter().map(|(r, _)| r).collect()
}

/// Ranks that disagree on a gather's length across the size from which it
/// goes in turn (so they disagree on its form too) still fail at once,
/// the root naming both lengths, rather than each waiting for the other
/// (a root for data, a leaf to be asked) until the timeout. (Leaves that
/// sent at once may have finished before the root found out.)
#[test]
fn a_gather_whose_ranks_disagree_on_its_form_fails_at_once() {
    let (large, small) = (ringwire::algo::GATHER_IN_TURN_BYTES / 4, 10);
    for (root_len, leaf_len) in [(small, large), (large, small)] {
        let (_store, comms) = local_group(3, |b| b.timeout(Duration::from_secs(30)));
        let results = each_fails_soon(&comms, |c| {
            let len = if c.rank() == 0 { root_len } else { leaf_len };
            let room = if c.rank() == 0 { 3 * len } else { 0 };
            c.gather(vec![1f32; len], vec![0f32; room], 0)
                .wait()
                .map(|_| ())
        });
        let root = results[0]
            .as_ref()
            .expect_err("the root found the mismatch");
        assert!(
            root.contains(&format!("{root_len} elements"))
                && root.contains(&format!("{leaf_len} elements")),
            "root ({root_len} vs {leaf_len}): {root}"
        );
    }
}

/// Where ranks share cores, ranks that disagree on a broadcast's length
/// across the size from which it is paced disagree on pacing too (decision
/// 0024); they still fail at once, naming both lengths, instead of a paced
/// root waiting for a word its unpaced receivers never send.
#[test]
fn a_broadcast_whose_ranks_disagree_on_pacing_fails_at_once() {
    let (paced, unpaced) = (ringwire::algo::PACE_FROM_BYTES / 4, 1000);
    for (root_len, other_len) in [(paced, unpaced), (unpaced, paced)] {
        let (_store, comms) = common::local_group_per_rank(3, |rank, b| {
            let b = b.timeout(Duration::from_secs(30));
            match rank {
                0 => b.local_ranks(0, 1 << 16), // more ranks than cores
                _ => b,
            }
        });
        let results = each_fails_soon(&comms, |c| {
            let len = if c.rank() == 0 { root_len } else { other_len };
            c.broadcast(vec![1f32; len], 0).wait().map(|_| ())
        });
        let named = results.iter().any(|r| {
            r.as_ref().is_err_and(|e| {
                e.contains(&format!("{root_len} elements"))
                    && e.contains(&format!("{other_len} elements"))
            })
        });
        assert!(named, "no rank named both lengths: {results:?}");
    }
}

#[test]
fn a_timeout_says_who_had_not_arrived_and_the_recorder_shows_it() {
    let (_store, comms) = local_group(3, |b| {
        b.timeout(Duration::from_millis(400))
            .heartbeat_timeout(Duration::from_secs(30))
    });
    on_all(&comms, |c| c.barrier().wait().unwrap());
    let errs = on_all(&comms, |c| {
        if c.rank() == 2 {
            return None; // never calls
        }
        let e = c
            .all_reduce(vec![1f32; 4], ReduceOp::Sum)
            .wait()
            .unwrap_err();
        Some((e, c.flight_record(), c.dump_flight_record()))
    });
    for (rank, r) in errs.into_iter().enumerate() {
        let Some((e, record, dump)) = r else { continue };
        let msg = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }), "rank {rank}: {msg}");
        assert!(msg.contains("rank 2 (no report"), "rank {rank}: {msg}");
        assert!(
            !msg.contains("rank 0 (") && !msg.contains("rank 1 ("),
            "ranks 0 and 1 did arrive: {msg}"
        );
        assert_eq!(record.len(), 2);
        assert_eq!(record[0].state, OpState::Completed);
        assert!(matches!(record[1].state, OpState::Failed(_)));
        assert!(
            dump.contains("barrier") && dump.contains("FAILED"),
            "{dump}"
        );
    }
}

/// Bytes a stranger might send.
fn garbage(i: usize) -> Vec<u8> {
    let mut rng = ringwire::testing::Rng::new(i as u64);
    match i % 6 {
        0 => (0..rng.below(4096) as usize)
            .map(|_| rng.next_u64() as u8)
            .collect(),
        1 => b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        // A valid header announcing a 4 GiB data frame.
        2 => ringwire::wire::Header::data(
            1,
            1,
            ringwire::wire::OpKind::AllReduce,
            ringwire::DType::F32,
        )
        .with_payload_len(u32::MAX)
        .encode()
        .to_vec(),
        // Half a header, then silence.
        3 => ringwire::wire::Header::control(ringwire::wire::FrameKind::Heartbeat, 0, 0, 0)
            .encode()[..20]
            .to_vec(),
        // A hello claiming a rank out of range.
        4 => ringwire::wire::encode_hello(0, 0, &ringwire::wire::Hello::new(7, 99, 3))
            .unwrap_or_default(),
        // Connect and say nothing.
        _ => Vec::new(),
    }
}

/// A stranger that sends a byte now and then, each within the socket's
/// read timeout, is cut off once the whole handshake has taken longer than
/// the handshake timeout (here 2 s, from the connect timeout).
#[test]
fn a_stranger_that_drips_bytes_is_cut_off_at_the_handshake_timeout() {
    let (_store, comms) = local_group(2, |b| b.connect_timeout(Duration::from_secs(2)));
    let mut stranger = TcpStream::connect(comms[1].listen_addr()).unwrap();
    let start = Instant::now();
    let closed = loop {
        // Plausible frame bytes (the magic's first), one every 500 ms.
        if stranger.write_all(b"R").is_err() {
            break start.elapsed();
        }
        stranger
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut byte = [0u8; 1];
        match std::io::Read::read(&mut stranger, &mut byte) {
            Ok(0) => break start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break start.elapsed(),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the stranger was kept for 20 s"
        );
    };
    assert!(
        closed >= Duration::from_millis(1500),
        "cut off early: {closed:?}"
    );
    // The job is unharmed.
    on_all(&comms, |c| c.barrier().wait().unwrap());
}

#[test]
fn strangers_on_a_rank_port_do_not_disturb_the_job() {
    let (_store, comms) = local_group(3, |b| b.timeout(Duration::from_secs(30)));
    let target = comms[1].listen_addr();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let hammer = s.spawn(|| {
            let mut sent = 0;
            let mut open = Vec::new();
            for i in 0..400 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if let Ok(mut c) = TcpStream::connect(target) {
                    let _ = c.write_all(&garbage(i));
                    sent += 1;
                    if i % 6 == 3 || i % 6 == 5 {
                        open.push(c); // stall: keep it open without finishing
                    }
                }
                if open.len() > 40 {
                    open.clear();
                }
            }
            sent
        });
        let results = on_all(&comms, |c| {
            for i in 0..40 {
                let got = c
                    .all_reduce(vec![c.rank() as f32 + i as f32; 4096], ReduceOp::Sum)
                    .wait()
                    .unwrap();
                assert!(
                    got.iter().all(|v| *v == 3.0 + 3.0 * i as f32),
                    "iteration {i}"
                );
            }
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(results.len(), 3);
        assert!(hammer.join().unwrap() > 0);
    });
    // Still healthy afterwards.
    let sums = on_all(&comms, |c| {
        c.all_reduce(vec![1u8; 3], ReduceOp::Sum).wait().unwrap()
    });
    assert!(sums.iter().all(|s| s == &vec![3u8; 3]));
}

/// Every other test of this file, again on the portable transport (the
/// default run uses the io_uring engine where it works).
#[test]
fn on_the_portable_transport_too() {
    common::rerun_on_portable("on_the_portable_transport_too");
}

/// Every other test of this file, again with local ranks linked over TCP
/// (how ranks on different hosts fail; the default links them with Unix
/// sockets).
#[test]
fn over_tcp_local_links_too() {
    common::rerun_over_tcp_local_links("over_tcp_local_links_too");
}

/// Every other test of this file, again with local ranks on shared memory.
#[test]
fn over_unix_links_too() {
    common::rerun_over_unix_links("over_unix_links_too");
}

/// What a rank sent before it left reaches the peer, even when the peer
/// finds it gone by a send of its own first (another communicator's send
/// hitting the closed socket, as the agreement's late decision or a
/// heartbeat can): the loss ends only ops that need more from it.
#[test]
fn what_a_departed_rank_sent_before_it_left_is_still_received() {
    use ringwire::LocalLinks;
    // Over TCP, 4 MiB goes on lanes where the engine runs. (A large send
    // to a rank in no op waits for it to read where the socket is small:
    // 64 KiB stays within Unix sockets' and the rings' room.)
    let cases = [
        (LocalLinks::Tcp, [1000usize, 1 << 20]),
        (LocalLinks::Unix, [1000, 1 << 14]),
        (LocalLinks::Shm, [1000, 1 << 14]),
    ];
    for (links, lens) in cases {
        for len in lens {
            let (_store, mut comms) =
                local_group(2, |b| b.timeout(Duration::from_secs(20)).local_links(links));
            // Another communicator over the same links.
            let mut others = on_all(&comms, |c| c.split(Some(0), 0).unwrap().unwrap());
            let leaver = comms.pop().unwrap();
            let stayer = comms.pop().unwrap();
            let data: Vec<f32> = (0..len).map(|i| i as f32).collect();
            leaver.send(data.clone(), 0).wait().unwrap();
            // Rank 1 leaves: its communicators, links and transport close.
            drop(leaver);
            drop(others.pop());
            std::thread::sleep(Duration::from_millis(100));
            // Sends on the other communicator meet the closed socket.
            for _ in 0..3 {
                let _ = others[0].send(vec![1u8; 64], 1).wait();
                std::thread::sleep(Duration::from_millis(20));
            }
            let got = stayer
                .recv(vec![0f32; len], 1)
                .wait()
                .unwrap_or_else(|e| panic!("{links:?}, {len} floats: {e}"));
            assert_eq!(got, data, "{links:?}, {len} floats");
            // What needs more of it fails naming it, and does not wait.
            match stayer.recv(vec![0f32; 4], 1).wait() {
                Err(Error::PeerLost { peer: 1, .. }) => {}
                other => panic!("{links:?}: {other:?}"),
            }
        }
    }
}
