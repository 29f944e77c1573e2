//! TCP links with several lanes each way (decision 0034): every collective
//! right over 1, 2, 4 and 8 lanes at lengths whose frames travel in pieces,
//! the dialer's lane count taken by both ends, and a lane cut mid-op failing
//! the op cleanly, naming the peer.

mod common;

use common::{local_group, local_group_per_rank, on_all};
use half::bf16;
use ringwire::{Communicator, ReduceOp};
use std::process::Command;
use std::time::Duration;

/// Whether this run's links get lanes at all (the io_uring engine's TCP
/// links do; the portable transport's do not).
fn engine(comms: &[Communicator]) -> bool {
    comms[0].transport_name() == "uring"
}

fn tcp_with_lanes(lanes: u8) -> impl Fn(ringwire::Builder) -> ringwire::Builder + Sync {
    move |b| {
        b.local_links(ringwire::LocalLinks::Tcp)
            .tcp_lane_count(lanes)
    }
}

#[test]
fn every_collective_is_right_over_1_2_4_and_8_lanes() {
    let seed = common::seed();
    for lanes in [1u8, 2, 4, 8] {
        let (_store, comms) = local_group(3, tcp_with_lanes(lanes));
        // 300 001 f32 are 1.2 MB (frames of a whole 1 MiB chunk, laned with
        // one lane or more, plus an uneven rest); a bit over 1 M elements
        // make several frames per step.
        for r in on_all(&comms, |c| {
            common::sweep::every_op_at::<f32>(c, seed, &[300_001, (1 << 20) + 7])?;
            common::sweep::every_op_at::<bf16>(c, seed, &[600_001])?;
            common::sweep::every_op_at::<i64>(c, seed, &[150_001])
        }) {
            r.unwrap_or_else(|e| panic!("{lanes} lanes: {e}"));
        }
        let want = if engine(&comms) {
            usize::from(lanes)
        } else {
            0
        };
        for (rank, c) in comms.iter().enumerate() {
            for peer in (0..3).filter(|&p| p != rank) {
                assert_eq!(c.link_lanes(peer), want, "rank {rank} to {peer}");
                // Every lane this rank writes carried pieces: with one, each
                // laned payload whole; with more, placement spread them.
                let stats = c.lane_stats(peer);
                assert_eq!(stats.len(), want, "rank {rank} to {peer}: {stats:?}");
                for (i, lane) in stats.iter().enumerate() {
                    assert!(
                        lane.pieces_sent > 0 && lane.bytes_sent >= lane.pieces_sent * 16,
                        "{lanes} lanes, rank {rank} to {peer}, lane {i}: {stats:?}"
                    );
                    // Each lane tried SEND_ZC once; loopback copies, the
                    // kernel said so, and the lane sent plainly after.
                    assert_eq!(
                        (lane.zero_copy_sends, lane.copied_sends),
                        (1, 1),
                        "{lanes} lanes, rank {rank} to {peer}, lane {i}: {stats:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn two_ranks_exchange_in_pieces_both_ways_at_once() {
    let seed = common::seed();
    let (_store, comms) = local_group(2, tcp_with_lanes(4));
    for r in on_all(&comms, |c| {
        common::sweep::every_op_at::<f32>(c, seed, &[700_001])
    }) {
        r.unwrap();
    }
}

#[test]
fn the_dialer_decides_how_many_lanes_a_link_has() {
    // Rank 0 dials rank 1 (lower ranks dial): it asks for 4, and rank 1,
    // set to 1 itself, takes 4.
    let (_store, comms) = local_group_per_rank(2, |rank, b| {
        tcp_with_lanes(if rank == 0 { 4 } else { 1 })(b)
    });
    let n = 1 << 20;
    let sums = on_all(&comms, |c| {
        c.all_reduce(vec![c.rank() as f32 + 1.0; n], ReduceOp::Sum)
            .wait()
            .unwrap()
    });
    assert!(sums.iter().all(|s| s.iter().all(|&v| v == 3.0)));
    if engine(&comms) {
        assert_eq!((comms[0].link_lanes(1), comms[1].link_lanes(0)), (4, 4));
    }
}

/// The TCP connections from `from` to the listener at `to`, busiest sender
/// first: (local port, bytes sent), as `ss` reports them.
fn connections_by_bytes_sent(to: std::net::SocketAddr) -> Vec<(u16, u64)> {
    let out = Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            "dport",
            "=",
            &to.port().to_string(),
        ])
        .output()
        .expect("ss runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut conns = Vec::new();
    let mut port = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some(local) = fields
            .get(2)
            .filter(|_| !line.starts_with(char::is_whitespace))
        {
            port = local.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
            continue;
        }
        let sent = fields
            .iter()
            .find_map(|f| f.strip_prefix("bytes_sent:"))
            .and_then(|v| v.parse::<u64>().ok());
        if let (Some(p), Some(sent)) = (port.take(), sent) {
            conns.push((p, sent));
        }
    }
    conns.sort_by_key(|&(_, sent)| std::cmp::Reverse(sent));
    conns
}

#[test]
fn every_collective_is_right_with_lanes_on_engine_threads() {
    // Decision 0036: each rank's lanes run on two engine threads of its
    // own, which submit the lanes' sends and receives on their rings.
    let seed = common::seed();
    let (_store, comms) = local_group(3, |b| tcp_with_lanes(4)(b).engine_threads(2));
    for r in on_all(&comms, |c| {
        common::sweep::every_op_at::<f32>(c, seed, &[300_001, (1 << 20) + 7])?;
        common::sweep::every_op_at::<i64>(c, seed, &[150_001])
    }) {
        r.unwrap();
    }
    if !engine(&comms) {
        assert!(comms[0].engine_thread_stats().is_empty());
        return;
    }
    for (rank, c) in comms.iter().enumerate() {
        let threads = c.engine_thread_stats();
        assert_eq!(threads.len(), 2, "rank {rank}: {threads:?}");
        for (i, t) in threads.iter().enumerate() {
            // Every thread carried lanes' bytes; this host has too few
            // cores to give 3 ranks and their 6 threads their own.
            assert!(
                t.entries > 0 && t.bytes > 0,
                "rank {rank} thread {i}: {t:?}"
            );
            assert!(t.cpu > Duration::ZERO, "rank {rank} thread {i}: {t:?}");
            if ringwire_uring::usable_cores() < 9 {
                assert_eq!(t.core, None, "rank {rank} thread {i}");
            }
        }
        let laned: u64 = (0..3)
            .filter(|&p| p != rank)
            .flat_map(|p| c.lane_stats(p))
            .map(|l| l.bytes_sent)
            .sum();
        let moved: u64 = threads.iter().map(|t| t.bytes).sum();
        assert!(
            moved >= laned,
            "rank {rank}: threads moved {moved}, lanes sent {laned}"
        );
    }
}

#[test]
fn a_lane_cut_mid_op_fails_the_op_naming_the_peer() {
    lane_cut_fails_the_op(0);
}

#[test]
fn a_lane_on_an_engine_thread_cut_mid_op_fails_the_op_naming_the_peer() {
    lane_cut_fails_the_op(2);
}

fn lane_cut_fails_the_op(engine_threads: usize) {
    let (_store, comms) = local_group(2, |b| {
        tcp_with_lanes(4)(b)
            .engine_threads(engine_threads)
            .timeout(Duration::from_secs(20))
    });
    if !engine(&comms) {
        return; // no lanes on the portable transport
    }
    let n = 4 << 20;
    on_all(&comms, |c| {
        c.all_reduce(vec![1.0f32; n], ReduceOp::Sum).wait().unwrap()
    });
    // Rank 0 dialed every connection of the link to rank 1's listener; its
    // busiest senders are the lanes it writes.
    let conns = connections_by_bytes_sent(comms[1].listen_addr());
    assert_eq!(conns.len(), 1 + 2 * 4, "the link's connections: {conns:?}");
    let lane = conns[0].0;
    let results = std::thread::scope(|s| {
        let ops: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    for _ in 0..200 {
                        c.all_reduce(vec![1.0f32; n], ReduceOp::Sum).wait()?;
                    }
                    Ok::<(), ringwire::Error>(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let killed = Command::new("ss")
            .args(["-K", "sport", "=", &lane.to_string()])
            .output()
            .expect("ss -K runs");
        assert!(killed.status.success(), "{killed:?}");
        ops.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().expect_err("the op fails once a lane is cut");
        let peer = format!("rank {}", 1 - rank);
        let text = e.to_string();
        assert!(text.contains(&peer), "rank {rank}: {text}");
    }
}
