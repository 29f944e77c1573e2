//! Lanes on engine threads (decision 0036): the driver hands the lanes'
//! entries to threads with rings of their own, which pass every
//! completion back; frames, zero-copy notifications, failures and the
//! engine's end must come out as they do on the caller-driven ring.

use super::*;

/// An engine of `links` links whose lanes run on `threads` engine threads.
fn threaded(links: usize, threads: usize) -> FrameEngine {
    let mut c = config(links, Duration::from_micros(20), 1);
    c.engine_threads = threads;
    let e = FrameEngine::new(c).unwrap();
    assert_eq!(
        e.thread_counters().len(),
        threads,
        "Linux 6.18 here runs engine threads"
    );
    e
}

/// Bytes the engine's threads moved, all together.
fn thread_bytes(e: &FrameEngine) -> u64 {
    e.thread_counters()
        .iter()
        .map(|c| c.bytes.load(Ordering::Relaxed))
        .sum()
}

#[test]
fn lanes_on_engine_threads_carry_frames_both_ways_and_the_threads_move_their_bytes() {
    for (threads, lanes) in [(1, 1), (2, 4), (3, 8)] {
        let ends = laned_between([threaded(2, threads), threaded(2, threads)], lanes, [1, 0]).0;
        let n = 60;
        let sinks = exchange(&ends, n);
        let laned = |side: usize| -> u64 {
            (0..n)
                .map(|i| payload(i + side).len())
                .filter(|&len| len >= FROM)
                .sum::<usize>() as u64
        };
        for (side, link) in [(0, 1), (1, 0)] {
            let frames = lock(&sinks[side].frames);
            assert_eq!(frames.len(), n);
            for (i, (from, p)) in frames.iter().enumerate() {
                assert_eq!(*from, link);
                assert!(
                    *p == payload(i + 1 - side),
                    "{threads} threads, {lanes} lanes: side {side}, frame {i} differs"
                );
            }
            assert!(lock(&sinks[side].failed).is_empty());
            // Every laned byte, sent and received, went through a thread,
            // and every thread took its share of lanes.
            let moved = thread_bytes(&ends[side]);
            assert!(
                moved >= laned(side) + laned(1 - side),
                "side {side}: threads moved {moved} bytes of {} laned",
                laned(side) + laned(1 - side)
            );
        }
        // Lanes may still be reading the next piece's header; once the
        // engines are gone, every entry a thread took has come back.
        let counters: Vec<_> = ends
            .iter()
            .flat_map(|e| e.thread_counters().to_vec())
            .collect();
        let leaks = ends.each_ref().map(|e| e.leak_flag());
        drop(ends);
        for (t, c) in counters.iter().enumerate() {
            assert!(
                c.entries.load(Ordering::Relaxed) > 0,
                "thread {t} submitted nothing"
            );
        }
        for (side, leaked) in leaks.iter().enumerate() {
            assert!(
                !leaked.load(Ordering::SeqCst),
                "side {side}: entries never came back"
            );
        }
    }
}

#[test]
fn zero_copy_notifications_pass_through_engine_threads_and_hold_their_caller() {
    // As on the driver's ring (tests/lanes.rs): every piece by SEND_ZC, a
    // caller that reuses its buffer, a receiver that reads late. The
    // notifications now come from the threads' rings, passed on with their
    // flags; one lost, or its flags, and the caller hangs or is let go
    // early (a later frame's bytes in an earlier one).
    let sender = engine_with(|c| {
        c.zero_copy_always = true;
        // Cut pieces too (tests/lanes.rs says why).
        c.zero_copy_from = Some(crate::engine::lanes::MIN_SLOW_PIECE);
        c.engine_threads = 2;
    });
    let ([ea, eb], counters) = laned_between([sender, threaded(1, 2)], 2, [0, 0]);
    let n = 24;
    let frame = |i: usize| -> Vec<u8> { (0..1 << 20).map(|j| (i * 13 + j / 4096) as u8).collect() };
    let sending = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..n {
            buf.copy_from_slice(&frame(i));
            send_one(&ea, 0, &buf, &Sink::default());
        }
        ea
    });
    std::thread::sleep(Duration::from_millis(300));
    let sink = Sink::default();
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == n);
    let ea = sending.join().unwrap();
    for (i, (_, p)) in lock(&sink.frames).iter().enumerate() {
        assert!(*p == frame(i), "frame {i} differs: let go early");
    }
    for (lane, c) in counters.iter().enumerate() {
        let pieces = c.pieces.load(Ordering::Relaxed);
        let zc = c.zero_copy_sends.load(Ordering::Relaxed);
        assert!(zc * 10 >= pieces * 9, "lane {lane}: {zc} of {pieces}");
        assert_eq!(c.copied_sends.load(Ordering::Relaxed), zc, "lane {lane}");
    }
    assert!(thread_bytes(&ea) >= (n as u64) << 20);
}

#[test]
fn a_failed_link_lets_zero_copy_callers_on_engine_threads_go() {
    // A peer that reads nothing; the link fails here while the threads'
    // lanes hold pieces owed notifications: the lanes are reset and the
    // caller let go with the link's error.
    let (main_a, main_b) = tcp_pair();
    let (ab_a, ab_b): (Vec<_>, Vec<_>) = (0..2).map(|_| tcp_pair()).unzip();
    let (ba_a, ba_b): (Vec<_>, Vec<_>) = (0..2).map(|_| tcp_pair()).unzip();
    let ea = Arc::new(engine_with(|c| {
        c.zero_copy_always = true;
        c.engine_threads = 2;
    }));
    let main_a = shared(main_a);
    ea.add_link_with_lanes(0, main_a.clone(), lanes_of(ab_a, ba_a));
    let _idle_peer = (main_b, ab_b, ba_b);
    let finished = send_until_it_fails(ea.clone());
    std::thread::sleep(Duration::from_millis(500));
    use nix::sys::socket::{Shutdown, shutdown};
    use std::os::fd::AsRawFd;
    shutdown(main_a.as_raw_fd(), Shutdown::Both).unwrap();
    let (sent, error) = finished
        .recv_timeout(Duration::from_secs(20))
        .expect("the caller was let go");
    assert!(sent < 64, "the peer read nothing, yet {sent} MiB went");
    assert!(!error.is_empty());
    assert!(
        ea.thread_counters()
            .iter()
            .all(|c| c.entries.load(Ordering::Relaxed) > 0)
    );
}

/// `raw_peer` with the engine's lanes on `threads` engine threads.
fn raw_threaded_peer(lanes: usize, threads: usize) -> (FrameEngine, TcpStream, Vec<TcpStream>) {
    raw_peer_of(threaded(1, threads), lanes)
}

/// Writes the header of a 512 KiB piece of frame 0 on `lane`, then only
/// `bytes` of its bytes.
fn part_of_a_piece(lane: &mut TcpStream, bytes: usize) {
    let head = PieceHeader {
        frame: 0,
        len: 1 << 19,
        offset: 0,
    };
    lane.write_all(&head.encode()).unwrap();
    lane.write_all(&vec![3u8; bytes]).unwrap();
}

#[test]
fn a_lane_on_an_engine_thread_that_closes_mid_frame_fails_the_link() {
    let (e, mut main, mut lanes) = raw_threaded_peer(2, 2);
    let sink = Sink::default();
    laned_header(&mut main, 1 << 20);
    part_of_a_piece(&mut lanes[0], 1000);
    drop(lanes.remove(0));
    let (got, _) = place_whole(&e, &sink, 1 << 20);
    assert!(matches!(got, Placement::Failed(_)), "{got:?}");
    assert!(
        lock(&sink.failed)[0].1.contains("Closed"),
        "{:?}",
        lock(&sink.failed)
    );
}

#[test]
fn pieces_in_any_order_on_engine_threads_land_in_place() {
    // Pieces out of order over both lanes (so both threads), read straight
    // into the caller's memory.
    let (e, mut main, mut lanes) = raw_threaded_peer(2, 2);
    let frame: Vec<u8> = (0..300_000).map(|j| (j * 7 % 253) as u8).collect();
    laned_header(&mut main, frame.len());
    piece(&mut lanes[1], 0, 200_000, &frame[200_000..]);
    piece(&mut lanes[0], 0, 100_000, &frame[100_000..200_000]);
    piece(&mut lanes[1], 0, 0, &frame[..100_000]);
    let sink = Sink::default();
    let (got, dest) = place_whole(&e, &sink, frame.len());
    assert!(matches!(got, Placement::Placed(_)), "{got:?}");
    assert!(dest == frame);
    assert!(
        e.thread_counters()
            .iter()
            .all(|c| c.bytes.load(Ordering::Relaxed) > 0)
    );
}

#[test]
fn an_engine_dropped_while_its_threads_read_mid_frame_ends() {
    // A laned frame half in: the threads' lane receives are in flight when
    // the engine goes. It shuts the links, the receives end, the threads
    // pass that on and stop, and the drop returns.
    let (e, mut main, mut lanes) = raw_threaded_peer(2, 2);
    laned_header(&mut main, 1 << 20);
    part_of_a_piece(&mut lanes[0], 5000);
    let sink = Sink::default();
    // Drive for a while: the header is read, the lanes' receives handed.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        e.progress(e.generation(), until, &sink);
    }
    let counters = e.thread_counters().to_vec();
    assert!(counters.iter().any(|c| c.bytes.load(Ordering::Relaxed) > 0));
    let leaked = e.leak_flag();
    drop(e);
    // Every completion of what the threads submitted came back: the
    // driver leaked nothing.
    assert!(!leaked.load(Ordering::SeqCst), "entries never came back");
    assert!(lock(&sink.frames).is_empty());
}
