//! The engine over socket pairs with a toy framing (an 8-byte header: the
//! payload length, then the pad before it, as little-endian u32s):
//! ordering under many small and large frames in both directions, end of
//! stream, refused headers, callers on several threads, and frames padded
//! to whole 64-byte lines.

use super::*;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

const HEADER: usize = 8;

#[derive(Default)]
struct Sink {
    frames: Mutex<Vec<(usize, Vec<u8>)>>,
    failed: Mutex<Vec<(usize, String)>>,
}

impl FrameSink for Sink {
    fn payload(&self, _link: usize, header: &[u8]) -> Result<PayloadAt, String> {
        let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
        let pad = u32::from_le_bytes(header[4..].try_into().unwrap()) as usize;
        if len > 64 << 20 {
            return Err(format!("announced {len} bytes"));
        }
        Ok(PayloadAt { pad, len })
    }
    fn buffer(&self) -> AlignedBuf {
        AlignedBuf::new()
    }
    fn frame(&self, link: usize, header: &[u8], payload: AlignedBuf) {
        assert_eq!(header.len(), HEADER);
        lock(&self.frames).push((link, payload.bytes().to_vec()));
    }
    /// The toy key is the announced length.
    fn frame_key(&self, _link: usize, header: &[u8]) -> Option<FrameKey> {
        Some([
            u64::from(u32::from_le_bytes(header[..4].try_into().unwrap())),
            0,
            0,
        ])
    }
    fn link_failed(&self, link: usize, fault: LinkFault) {
        eprintln!("link {link} failed: {fault:?}");
        lock(&self.failed).push((link, format!("{fault:?}")));
    }
}

fn engine(links: usize) -> FrameEngine {
    spinning_engine(links, Duration::from_micros(20))
}

fn spinning_engine(links: usize, spin: Duration) -> FrameEngine {
    aligned_engine(links, spin, 1)
}

fn aligned_engine(links: usize, spin: Duration, frame_align: usize) -> FrameEngine {
    FrameEngine::new(config(links, spin, frame_align)).expect("io_uring works on the test machines")
}

fn config(links: usize, spin: Duration, frame_align: usize) -> EngineConfig {
    EngineConfig {
        links,
        header_len: HEADER,
        frame_align,
        staging: 4096,
        // Exercised on every large send of these tests: socket pairs refuse
        // SEND_ZC, loopback TCP copies, and both must fall back cleanly.
        zero_copy_from: Some(64 << 10),
        zero_copy_always: false,
        spin,
        max_lanes: 8,
        engine_threads: 0,
        thread_cores: Vec::new(),
    }
}

/// A socket as the engine takes it.
fn shared(socket: impl Into<OwnedFd>) -> SharedFd {
    Arc::new(socket.into())
}

/// Two one-link engines joined by the socket pair `(a, b)`: frames sent
/// on the first arrive on the second.
fn linked(a: impl Into<OwnedFd>, b: impl Into<OwnedFd>) -> (Arc<FrameEngine>, FrameEngine) {
    let (ea, eb) = (Arc::new(engine(1)), engine(1));
    ea.add_link(0, shared(a));
    eb.add_link(0, shared(b));
    (ea, eb)
}

/// Both ends of a loopback TCP connection.
fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}

/// Payload `i` of a stream: lengths from 0 to well past the staging buffer.
fn payload(i: usize) -> Vec<u8> {
    let len = match i % 5 {
        0 => 0,
        1 => i % 100,
        2 => 4000 + i,
        3 => 70_000 + i * 3,
        _ => 1 << 20,
    };
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

fn wait_for(e: &FrameEngine, sink: &Sink, mut done: impl FnMut(&Sink) -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = e.generation();
        if done(sink) {
            return;
        }
        assert!(Instant::now() < until, "timed out");
        e.progress(seen, until, sink);
    }
}

#[test]
fn two_threads_share_each_engine_sending_and_receiving_at_once() {
    let (a, b) = UnixStream::pair().unwrap();
    let ends = [
        (Arc::new(engine(2)), Arc::new(Sink::default()), 1),
        (Arc::new(engine(2)), Arc::new(Sink::default()), 0),
    ];
    ends[0].0.add_link(1, shared(a));
    ends[1].0.add_link(0, shared(b));
    let n = 200;
    // Each side sends on one thread and receives on another: the two take
    // turns at driving, and frames reach the sink whichever thread drove.
    let mut threads = Vec::new();
    for (e, sink, link) in &ends {
        let (e2, sink2, link) = (e.clone(), sink.clone(), *link);
        threads.push(std::thread::spawn(move || {
            for i in 0..n {
                let p = payload(i);
                send_one(&e2, link, &p, &*sink2);
            }
        }));
        let (e2, sink2) = (e.clone(), sink.clone());
        threads.push(std::thread::spawn(move || {
            wait_for(&e2, &sink2, |s| lock(&s.frames).len() == n);
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    for (_, sink, link) in &ends {
        let frames = lock(&sink.frames);
        assert_eq!(frames.len(), n);
        for (i, (from, p)) in frames.iter().enumerate() {
            assert_eq!(*from, *link);
            assert!(*p == payload(i), "frame {i} differs (len {})", p.len());
        }
    }
}

#[test]
fn one_driver_sees_every_frame_in_order() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = (engine(1), Arc::new(engine(1)));
    ea.add_link(0, shared(a));
    eb.add_link(0, shared(b));
    let n = 300;
    let eb2 = eb.clone();
    let t = std::thread::spawn(move || {
        let sink = Sink::default();
        for i in 0..n {
            let p = payload(i);
            send_one(&eb2, 0, &p, &sink);
        }
    });
    let sink = Sink::default();
    wait_for(&ea, &sink, |s| lock(&s.frames).len() == n);
    t.join().unwrap();
    for (i, (link, p)) in lock(&sink.frames).iter().enumerate() {
        assert_eq!(*link, 0);
        assert!(*p == payload(i), "frame {i} differs (len {})", p.len());
    }
}

#[test]
fn end_of_stream_fails_the_link_and_later_sends() {
    let (a, b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    drop(b);
    wait_for(&e, &sink, |s| !lock(&s.failed).is_empty());
    assert!(lock(&sink.failed)[0].1.contains("Closed"));
    let far = Instant::now() + Duration::from_secs(5);
    let r = plain_send(&e, 0, &[0; HEADER], &[], far, &mut || {}, &sink);
    assert!(r.is_err(), "a send on a dead link must fail, got {r:?}");
}

#[test]
fn a_failed_send_leaves_what_the_peer_sent_before_it_closed_to_be_read() {
    // The peer writes a frame and exits; this side's send meets the closed
    // socket first. The frame is still delivered, and the link fails with
    // the end of stream after it, not with the send's error before it.
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let p = payload(2);
    let mut frame = (p.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(&p);
    std::io::Write::write_all(&mut b, &frame).unwrap();
    drop(b);
    let far = Instant::now() + Duration::from_secs(5);
    let r = plain_send(&e, 0, &[0; HEADER], &[], far, &mut || {}, &sink);
    assert!(r.is_err(), "a send to a closed peer must fail, got {r:?}");
    wait_for(&e, &sink, |s| !lock(&s.failed).is_empty());
    let frames = lock(&sink.frames).clone();
    assert!(frames == vec![(0, p)], "{} frames came", frames.len());
    assert!(
        lock(&sink.failed)[0].1.contains("Closed"),
        "{:?}",
        lock(&sink.failed)
    );
    let r = plain_send(&e, 0, &[0; HEADER], &[], far, &mut || {}, &sink);
    assert!(r.is_err(), "a send on a dead link must fail, got {r:?}");
}

#[test]
fn a_refused_header_fails_the_link_with_the_sinks_reason() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    std::io::Write::write_all(&mut b, &u64::MAX.to_le_bytes()).unwrap();
    wait_for(&e, &sink, |s| !lock(&s.failed).is_empty());
    assert!(lock(&sink.failed)[0].1.contains("announced"));
}

#[test]
fn a_stalled_send_is_released_by_shutting_the_link() {
    // Nobody reads `b`: a large send fills the socket and stalls; the stall
    // callback shuts the socket, and the send then fails instead of hanging.
    let (a, b) = UnixStream::pair().unwrap();
    let shut = a.try_clone().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let big = vec![7u8; 32 << 20];
    let soon = Instant::now() + Duration::from_millis(200);
    let mut stalled = false;
    let r = plain_send(
        &e,
        0,
        &(big.len() as u64).to_le_bytes(),
        &big,
        soon,
        &mut || {
            stalled = true;
            shut.shutdown(std::net::Shutdown::Both).unwrap();
        },
        &sink,
    );
    assert!(stalled);
    assert!(r.is_err());
    drop(b);
}

#[test]
fn owned_frames_flush() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let mut frame = 3u64.to_le_bytes().to_vec();
    frame.extend_from_slice(b"abc");
    e.send_owned(0, frame.clone());
    e.flush(Instant::now() + Duration::from_secs(5), &sink);
    let mut got = [0u8; 11];
    std::io::Read::read_exact(&mut b, &mut got).unwrap();
    assert_eq!(&got[..], &frame[..]);
}

#[test]
fn zero_copy_is_probed_once_per_link_and_dropped_where_the_kernel_copies() {
    let (a, b) = tcp_pair();
    let (ea, eb) = linked(a, b);
    let n = 12;
    let ea2 = ea.clone();
    let t = std::thread::spawn(move || {
        let sink = Sink::default();
        for i in 0..n {
            let p = payload(i * 5 + 4); // 1 MiB each
            send_one(&ea2, 0, &p, &sink);
        }
    });
    let sink = Sink::default();
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == n);
    t.join().unwrap();
    for (i, (_, p)) in lock(&sink.frames).iter().enumerate() {
        assert!(*p == payload(i * 5 + 4), "frame {i} differs");
    }
    // Loopback always copies (the receiver is local), and the kernel says
    // so in the probe's report: the link now sends plainly.
    assert_eq!(ea.zero_copy_links(), vec![(0, false)]);
}

#[test]
fn a_socket_that_refuses_zero_copy_falls_back_to_plain_sends() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = linked(a, b);
    let ea2 = ea.clone();
    let t = std::thread::spawn(move || {
        let sink = Sink::default();
        let p = payload(4);
        send_one(&ea2, 0, &p, &sink);
    });
    let sink = Sink::default();
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 1);
    t.join().unwrap();
    assert!(lock(&sink.frames)[0].1 == payload(4));
    assert_eq!(ea.zero_copy_links(), vec![(0, false)]);
}

/// Waits (up to 30 s) for the `len`-byte frame on link 0 and receives it
/// in place: how that ended, and the memory it went to.
fn place_whole(e: &FrameEngine, sink: &Sink, len: usize) -> (Placement<()>, Vec<u8>) {
    let mut dest = vec![0u8; len];
    let far = Instant::now() + Duration::from_secs(30);
    let got = e.receive_in_place(0, [len as u64, 0, 0], &mut dest, far, sink, &mut || None);
    (got, dest)
}

/// Sends `p` on `link` as one frame, waiting until the kernel has it.
/// `sink` takes the frames that arrive while this thread drives.
fn send_one(e: &FrameEngine, link: usize, p: &[u8], sink: &dyn FrameSink) {
    let far = Instant::now() + Duration::from_secs(30);
    plain_send(
        e,
        link,
        &(p.len() as u64).to_le_bytes(),
        p,
        far,
        &mut || {},
        sink,
    )
    .unwrap();
}

/// [`FrameEngine::send`] never asked to stop, as a `Result`.
fn plain_send(
    e: &FrameEngine,
    link: usize,
    header: &[u8],
    payload: &[u8],
    give_up: Instant,
    on_stall: &mut dyn FnMut(),
    sink: &dyn FrameSink,
) -> SendResult {
    match e.send(
        link,
        header,
        payload,
        give_up,
        on_stall,
        sink,
        give_up,
        &mut || None::<()>,
    ) {
        Sent::Out => Ok(()),
        Sent::Failed(reason) => Err(reason),
        Sent::Stopped(()) => Err("stopped unasked".into()),
    }
}

#[test]
fn work_queued_while_the_driver_sleeps_in_the_kernel_wakes_it() {
    // A driver that does not spin goes straight to sleep in the kernel;
    // a send queued by another thread must end that sleep (the eventfd
    // read posted before it), not wait out the turn cap (10 s in tests).
    for spin in [Duration::ZERO, Duration::from_micros(20)] {
        let (a, b) = UnixStream::pair().unwrap();
        let make = || {
            FrameEngine::new(EngineConfig {
                links: 1,
                header_len: HEADER,
                frame_align: 1,
                staging: 4096,
                zero_copy_from: None,
                zero_copy_always: false,
                spin,
                max_lanes: 8,
                engine_threads: 0,
                thread_cores: Vec::new(),
            })
            .unwrap()
        };
        let (ea, eb) = (Arc::new(make()), make());
        ea.add_link(0, shared(a));
        eb.add_link(0, shared(b));
        let sink = Arc::new(Sink::default());
        let start = Instant::now();
        let sleeper = {
            let (e, sink) = (ea.clone(), sink.clone());
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(30);
                e.progress(e.generation(), until, &*sink);
                e.release(&*sink); // as every waiter leaving the engine does
            })
        };
        while !lock(&ea.state).driving && !sleeper.is_finished() {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20)); // let it reach the kernel
        send_one(&ea, 0, b"woken", &*sink);
        sleeper.join().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "spin {spin:?}: the sleeping driver missed the queued send's wake-up"
        );
        let peer = Sink::default();
        wait_for(&eb, &peer, |s| lock(&s.frames).len() == 1);
        assert_eq!(lock(&peer.frames)[0].1, b"woken");
    }
}

#[test]
fn a_polling_driver_reads_small_frames_without_ring_entries() {
    // Polls long enough never to sleep: small frames are read by plain
    // non-blocking receives, so the receiving driver puts nothing in the
    // ring (a ring receive would be posted, completed and withdrawn).
    let (a, b) = tcp_pair();
    let (ea, eb) = (
        Arc::new(engine(1)),
        spinning_engine(1, Duration::from_secs(20)),
    );
    ea.add_link(0, shared(a));
    eb.add_link(0, shared(b));
    let sender = {
        let ea = ea.clone();
        std::thread::spawn(move || {
            let sink = Sink::default();
            for i in 0..50 {
                send_one(&ea, 0, &payload(i * 5 + 1), &sink);
            }
        })
    };
    let sink = Sink::default();
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 50);
    eb.release(&sink);
    sender.join().unwrap();
    let got: Vec<Vec<u8>> = lock(&sink.frames).iter().map(|f| f.1.clone()).collect();
    let want: Vec<Vec<u8>> = (0..50).map(|i| payload(i * 5 + 1)).collect();
    assert_eq!(got, want, "every frame, in order");
    assert_eq!(
        lock(&eb.driver).pushed,
        0,
        "no ring entry on the receiving side"
    );
}

#[test]
fn a_polling_driver_that_sleeps_is_woken_by_a_frame() {
    // The spin (20 us) runs out long before the frame comes: the driver
    // must have its receives in the ring before it sleeps, or it would
    // sleep out the turn cap (10 s in tests).
    let (a, b) = tcp_pair();
    let (ea, eb) = linked(a, b);
    let eb = Arc::new(eb);
    let waiter = {
        let eb = eb.clone();
        std::thread::spawn(move || {
            let sink = Sink::default();
            let start = Instant::now();
            let until = start + Duration::from_secs(30);
            while lock(&sink.frames).is_empty() && Instant::now() < until {
                eb.progress(eb.generation(), until, &sink);
            }
            eb.release(&sink);
            (start.elapsed(), lock(&sink.frames).len())
        })
    };
    while !lock(&eb.state).driving && !waiter.is_finished() {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(50)); // past the spin, asleep
    send_one(&ea, 0, b"late", &Sink::default());
    let (took, frames) = waiter.join().unwrap();
    assert_eq!(frames, 1);
    assert!(
        took < Duration::from_secs(5),
        "the sleeping driver missed the frame's arrival ({took:?})"
    );
}

#[test]
fn frames_are_received_in_place_when_a_caller_waits_for_them() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = linked(a, b);
    let sink = Sink::default();
    // Large (received in place after the header) and small (cut from the
    // staging buffer) payloads; the key names each by its length.
    for i in [4, 7, 2, 9] {
        let p = payload(i);
        let ea2 = ea.clone();
        let sent = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            send_one(&ea2, 0, &sent, &Sink::default());
        });
        let (got, dest) = place_whole(&eb, &sink, p.len());
        t.join().unwrap();
        assert!(matches!(got, Placement::Placed(_)), "{i}: {got:?}");
        assert!(dest == p, "payload {i} differs");
    }
    assert!(
        lock(&sink.frames).is_empty(),
        "placed frames must not reach the sink"
    );
}

#[test]
fn a_frame_that_came_first_goes_to_the_sink_and_the_caller_stops() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = (engine(1), engine(1));
    ea.add_link(0, shared(a));
    eb.add_link(0, shared(b));
    let sink = Sink::default();
    let p = payload(3); // larger than staging, smaller than the socket buffer
    send_one(&ea, 0, &p, &sink);
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 1);
    let mut dest = vec![0u8; p.len()];
    let far = Instant::now() + Duration::from_secs(30);
    let got = eb.receive_in_place(
        0,
        [p.len() as u64, 0, 0],
        &mut dest,
        far,
        &sink,
        &mut || (!lock(&sink.frames).is_empty()).then_some("in the inbox"),
    );
    assert!(matches!(got, Placement::Stopped("in the inbox")), "{got:?}");
    assert!(
        dest.iter().all(|b| *b == 0),
        "nothing may be written after a stop"
    );
    // A later frame with the same key is not placed (the request is gone).
    send_one(&ea, 0, &p, &sink);
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 2);
}

#[test]
fn a_link_that_dies_fails_a_waiting_placement() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    // Half a large frame, then the peer goes away.
    let p = payload(3);
    std::io::Write::write_all(&mut b, &(p.len() as u64).to_le_bytes()).unwrap();
    std::io::Write::write_all(&mut b, &p[..p.len() / 2]).unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(b);
    });
    let (got, _) = place_whole(&e, &sink, p.len());
    closer.join().unwrap();
    assert!(matches!(got, Placement::Failed(_)), "{got:?}");
}

/// What a timed blocking read on an unrelated socket returns in a thread
/// that drove the engine (posting the link's receive) and then, if
/// `release`, released it, while a frame arrives on the link.
fn timed_read_after_driving(release: bool) -> std::io::ErrorKind {
    use std::io::{Read, Write};
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = Arc::new(engine(1));
    let sink = Arc::new(Sink::default());
    e.add_link(0, shared(a));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = {
        let (e, sink) = (e.clone(), sink.clone());
        std::thread::spawn(move || {
            e.tick(&*sink); // this thread's turn posts the link's receive
            if release {
                e.release(&*sink);
            }
            let (mut c, _d) = UnixStream::pair().unwrap();
            c.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            ready_tx.send(()).unwrap();
            c.read(&mut [0u8; 1]).unwrap_err().kind()
        })
    };
    ready_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let payload = [7u8; 10];
    b.write_all(&(payload.len() as u64).to_le_bytes()).unwrap();
    b.write_all(&payload).unwrap();
    let kind = thread.join().unwrap();
    // Whoever drives next takes the frame in.
    wait_for(&e, &sink, |s| lock(&s.frames).len() == 1);
    assert_eq!(lock(&sink.frames)[0].1, payload);
    kind
}

#[test]
fn a_released_thread_is_not_interrupted_by_later_completions() {
    // The hazard: the kernel runs a receive's completion work in the thread
    // that submitted it, waking it out of its own timed system calls.
    assert_eq!(
        timed_read_after_driving(false),
        std::io::ErrorKind::Interrupted,
        "control: without release the driving thread's read is interrupted"
    );
    // Released: the read times out as it would in any other thread.
    assert!(matches!(
        timed_read_after_driving(true),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
}

#[test]
fn release_takes_no_turn_when_nothing_is_in_flight() {
    let (a, _b) = UnixStream::pair().unwrap();
    let e = engine(1);
    let sink = Sink::default();
    // No link yet: a turn leaves nothing in the ring, and the release that
    // ends every small op is then a load, not a turn.
    e.tick(&sink);
    let quiet = e.generation();
    e.release(&sink);
    assert_eq!(e.generation(), quiet, "a quiet release took a turn");
    // A tick posts the link's receive: release must withdraw it.
    e.add_link(0, shared(a));
    e.tick(&sink);
    let busy = e.generation();
    e.release(&sink);
    assert!(e.generation() > busy, "release left a receive in flight");
    // Withdrawn, the ring is quiet again.
    let after = e.generation();
    e.release(&sink);
    assert_eq!(e.generation(), after);
}

#[test]
fn release_keeps_a_partly_received_payload_whole() {
    // A large payload arrives in pieces; the receiving thread releases
    // after every short turn, so its receive, mid-payload, is cancelled
    // with the count it had moved and posted again by the next turn.
    use std::io::Write;
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = Arc::new(engine(1));
    let sink = Arc::new(Sink::default());
    e.add_link(0, shared(a));
    let p = payload(4); // 1 MiB: received in place
    let mut frame = (p.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(&p);
    let writer = std::thread::spawn(move || {
        for piece in frame.chunks(100_000) {
            b.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        b
    });
    let until = Instant::now() + Duration::from_secs(30);
    let mut turns = 0;
    while lock(&sink.frames).is_empty() {
        assert!(Instant::now() < until, "timed out");
        e.progress(
            e.generation(),
            Instant::now() + Duration::from_millis(1),
            &*sink,
        );
        e.release(&*sink);
        turns += 1;
    }
    let _b = writer.join().unwrap();
    assert!(turns > 1);
    let frames = lock(&sink.frames);
    assert_eq!(frames.len(), 1);
    assert!(frames[0].1 == p, "the payload arrived torn");
    assert!(lock(&sink.failed).is_empty());
}

#[test]
fn posted_placements_land_in_place_while_the_caller_works_and_the_rest_are_withdrawn() {
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = linked(a, b);
    let sink = Sink::default();
    // The toy key is the length, so every piece has its own.
    let lens = [70_000usize, 1 << 20, 100, 5000];
    let frame = |len: usize| (0..len).map(|j| (j * 7 + len) as u8).collect::<Vec<u8>>();
    // The first frame comes before anything is posted: it goes to the sink.
    send_one(&ea, 0, &frame(lens[0]), &sink);
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 1);

    // Pieces in any order: the last frame's goes first in the region.
    let offsets = [lens[3], lens[3] + lens[0], lens[3] + lens[0] + lens[1], 0];
    let mut region = vec![0u8; lens.iter().sum()];
    let sender = {
        let ea = ea.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            for len in [lens[1], lens[2]] {
                send_one(&ea, 0, &frame(len), &Sink::default());
            }
        })
    };
    let far = Instant::now() + Duration::from_secs(30);
    let key = |i: usize| [lens[i] as u64, 0, 0];
    eb.with_placements(0, &mut region, &sink, |mut placed| {
        for i in 0..4 {
            placed.post(key(i), offsets[i], lens[i]).unwrap();
        }
        // The caller reaches the region around its untaken pieces only.
        assert!(placed.region_mut(offsets[1] + 10, 5).is_none());
        assert!(placed.region_mut(0, lens[3] + 1).is_none());
        assert!(placed.region_mut(lens.iter().sum(), 1).is_none());
        // Other work first: the frames arrive meanwhile and are placed.
        wait_for(&eb, &sink, |_| sender.is_finished());
        let (got, piece) = placed.take([9, 9, 9], 0, 1, far, &mut || None::<()>);
        assert!(
            matches!(got, Placement::Failed(_)) && piece.is_empty(),
            "only a posted frame may be taken: {got:?}"
        );
        let (got, piece) = placed.take(key(1), offsets[1], 7, far, &mut || None::<()>);
        assert!(
            matches!(got, Placement::Failed(_)) && piece.is_empty(),
            "a frame is taken as it was posted: {got:?}"
        );
        let (got, piece) = placed.take(key(0), offsets[0], lens[0], far, &mut || {
            (!lock(&sink.frames).is_empty()).then_some("in the sink")
        });
        assert!(matches!(got, Placement::Stopped("in the sink")), "{got:?}");
        assert!(
            piece.iter().all(|b| *b == 0),
            "a stopped piece stays untouched"
        );
        // Taken in the other order than posted.
        for i in [2, 1] {
            let (len, mut late) = (lens[i], || (Instant::now() >= far).then_some("late"));
            let (got, piece) = placed.take(key(i), offsets[i], len, far, &mut late);
            assert!(matches!(got, Placement::Placed(_)), "{len}: {got:?}");
            assert!(piece == frame(len), "piece of {len} bytes differs");
        }
        let whole = placed
            .region_mut(lens[3], lens[0] + lens[1] + lens[2])
            .unwrap();
        assert!(whole[lens[0]..] == [frame(lens[1]), frame(lens[2])].concat());
        // The last piece is never taken: the scope withdraws it.
    });
    sender.join().unwrap();
    assert_eq!(lock(&sink.frames).len(), 1, "placed frames skip the sink");
    // Its frame, sent after the scope, goes to the sink, not the region.
    send_one(&ea, 0, &frame(lens[3]), &sink);
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 2);
    assert!(lock(&sink.frames)[1].1 == frame(lens[3]));
    assert!(region[..lens[3]].iter().all(|b| *b == 0));
}

#[test]
fn pieces_that_overlap_an_untaken_one_or_leave_the_region_are_refused() {
    let e = engine(1);
    let (a, _b) = UnixStream::pair().unwrap();
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let far = Instant::now() + Duration::from_secs(30);
    let mut region = vec![0u8; 200];
    e.with_placements(0, &mut region, &sink, |mut placed| {
        placed.post([1, 0, 0], 0, 100).unwrap();
        let why = placed.post([2, 0, 0], 50, 100).unwrap_err();
        assert!(why.contains("overlaps"), "{why}");
        let why = placed.post([2, 0, 0], 150, 100).unwrap_err();
        assert!(why.contains("leaves"), "{why}");
        let why = placed.post([1, 0, 0], 100, 10).unwrap_err();
        assert!(why.contains("posted already"), "{why}");
        // A refused piece was not posted: taking it fails.
        let (got, piece) = placed.take([2, 0, 0], 50, 100, far, &mut || None::<()>);
        assert!(piece.is_empty());
        let Placement::Failed(reason) = got else {
            panic!("a refused piece was taken: {got:?}");
        };
        assert!(reason.contains("not posted"), "{reason}");
        // Once the first is taken (stopped at once: no frame comes), its
        // place may be posted again.
        let (got, _) = placed.take([1, 0, 0], 0, 100, far, &mut || Some("no frame"));
        assert!(matches!(got, Placement::Stopped("no frame")), "{got:?}");
        placed.post([2, 0, 0], 50, 100).unwrap();
    });
}

#[test]
fn small_frames_stay_in_order_when_the_socket_fills_mid_frame() {
    // Small frames go out by plain non-blocking sends; once the socket is
    // full one goes out in part and the ring sends the rest. Nothing may
    // reorder or tear while the reader is away and then drains it all.
    // Over TCP, where a non-blocking send takes part of a frame when the
    // buffer has some room left.
    let (a, b) = tcp_pair();
    let (ea, eb) = linked(a, b);
    let n = 600;
    let frame = |i: usize| {
        (0..30_000 + i % 7)
            .map(|j| (i * 13 + j) as u8)
            .collect::<Vec<u8>>()
    };
    let sender = {
        let ea = ea.clone();
        std::thread::spawn(move || {
            for i in 0..n {
                send_one(&ea, 0, &frame(i), &Sink::default());
            }
        })
    };
    // 600 frames of 30 KB are several times what the socket holds.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!sender.is_finished(), "the socket should have filled up");
    let sink = Sink::default();
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == n);
    sender.join().unwrap();
    for (i, (_, p)) in lock(&sink.frames).iter().enumerate() {
        assert!(*p == frame(i), "frame {i} differs (len {})", p.len());
    }
}

#[test]
fn a_scope_that_ends_mid_frame_waits_until_the_piece_is_whole() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let p = payload(4); // 1 MiB: received in place after its header
    let mut region = vec![0u8; p.len()];
    let writer = {
        let p = p.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            b.write_all(&(p.len() as u64).to_le_bytes()).unwrap();
            b.write_all(&p[..p.len() / 2]).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            b.write_all(&p[p.len() / 2..]).unwrap();
            b // kept open until joined
        })
    };
    let started = Instant::now();
    e.with_placements(0, &mut region, &sink, |mut placed| {
        placed.post([p.len() as u64, 0, 0], 0, p.len()).unwrap();
        // Drive for 40 ms (the header and half the payload arrive, the
        // rest is awaited in place), then leave without taking the piece.
        let until = started + Duration::from_millis(40);
        while Instant::now() < until {
            e.progress(e.generation(), until, &sink);
        }
    });
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "the scope returned while the kernel still wrote into the region"
    );
    assert!(region == p, "the piece must be whole when the scope ends");
    assert!(
        lock(&sink.frames).is_empty(),
        "a placed frame skips the sink"
    );
    drop(writer.join().unwrap());
}

/// The toy header of a `len`-byte payload after `pad` zeros, and the zeros.
fn padded_head(len: usize, pad: usize) -> Vec<u8> {
    let mut head = (len as u32).to_le_bytes().to_vec();
    head.extend_from_slice(&(pad as u32).to_le_bytes());
    head.resize(HEADER + pad, 0);
    head
}

/// The whole frame as it should be on the wire with 64-byte lines.
fn padded_frame(p: &[u8], pad: usize) -> Vec<u8> {
    let mut frame = padded_head(p.len(), pad);
    frame.extend_from_slice(p);
    frame.resize(frame.len().div_ceil(64) * 64, 0);
    frame
}

#[test]
fn padded_frames_are_whole_lines_on_the_wire() {
    use std::io::Read;
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = Arc::new(aligned_engine(1, Duration::from_micros(20), 64));
    e.add_link(0, shared(a));
    // Small frames (sent directly) and large ones (through the ring), with
    // pads from 0 to 63, and an owned frame whose tail the engine adds.
    let frames: Vec<(Vec<u8>, usize)> = (0..40).map(|i| (payload(i), (i * 13) % 64)).collect();
    let expected: Vec<u8> = frames
        .iter()
        .flat_map(|(p, pad)| padded_frame(p, *pad))
        .chain(padded_frame(b"abc", 0))
        .collect();
    let sender = {
        let e = e.clone();
        std::thread::spawn(move || {
            let sink = Sink::default();
            let far = Instant::now() + Duration::from_secs(30);
            for (p, pad) in &frames {
                plain_send(
                    &e,
                    0,
                    &padded_head(p.len(), *pad),
                    p,
                    far,
                    &mut || {},
                    &sink,
                )
                .unwrap();
            }
            let mut owned = padded_head(3, 0);
            owned.extend_from_slice(b"abc");
            e.send_owned(0, owned);
            e.flush(far, &sink);
        })
    };
    let mut got = vec![0u8; expected.len()];
    b.read_exact(&mut got).unwrap();
    sender.join().unwrap();
    assert_eq!(got.len() % 64, 0);
    assert!(
        got == expected,
        "the bytes on the wire differ from the padded frames"
    );
}

#[test]
fn padded_frames_arrive_whole_and_in_order_over_unix_and_tcp() {
    // Polling drivers read small frames directly; sleeping ones through
    // ring receives.
    for (tcp, spin) in [(false, 20), (true, 20), (false, 0), (true, 0)] {
        let spin = Duration::from_micros(spin);
        let (a, b): (OwnedFd, OwnedFd) = if tcp {
            let (a, b) = tcp_pair();
            (a.into(), b.into())
        } else {
            let (a, b) = UnixStream::pair().unwrap();
            (a.into(), b.into())
        };
        let ea = Arc::new(aligned_engine(1, spin, 64));
        let eb = aligned_engine(1, spin, 64);
        ea.add_link(0, shared(a));
        eb.add_link(0, shared(b));
        let n = 200;
        let sender = {
            let ea = ea.clone();
            std::thread::spawn(move || {
                let sink = Sink::default();
                let far = Instant::now() + Duration::from_secs(30);
                for i in 0..n {
                    let p = payload(i);
                    let head = padded_head(p.len(), (i * 7) % 64);
                    plain_send(&ea, 0, &head, &p, far, &mut || {}, &sink).unwrap();
                }
            })
        };
        // Some large frames (their lengths, the toy key, are unique) are
        // received in place, the rest through the sink.
        let sink = Sink::default();
        let mut placed = Vec::new();
        for i in 0..n {
            let p = payload(i);
            if i % 5 == 3 && i % 2 == 1 {
                let (got, dest) = place_whole(&eb, &sink, p.len());
                assert!(matches!(got, Placement::Placed(_)), "{got:?}");
                assert!(dest == p, "placed frame {i} differs (tcp: {tcp})");
                placed.push(i);
            }
        }
        wait_for(&eb, &sink, |s| lock(&s.frames).len() == n - placed.len());
        sender.join().unwrap();
        let expected = (0..n).filter(|i| !placed.contains(i)).map(payload);
        for (i, ((_, got), p)) in lock(&sink.frames).iter().zip(expected).enumerate() {
            assert!(*got == p, "frame {i} differs (tcp: {tcp}, len {})", p.len());
        }
        assert!(lock(&sink.failed).is_empty());
    }
}

#[test]
fn a_pad_past_the_frame_alignment_fails_the_link() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = aligned_engine(1, Duration::from_micros(20), 64);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    std::io::Write::write_all(&mut b, &padded_head(0, 64)).unwrap();
    wait_for(&e, &sink, |s| !lock(&s.failed).is_empty());
    assert!(
        lock(&sink.failed)[0].1.contains("pad of 64 bytes"),
        "{:?}",
        lock(&sink.failed)
    );
}

/// A send asked to stop 200 ms in ends withdrawn, in well under the 30 s
/// it would wait for the peer otherwise.
fn stops_soon(e: &FrameEngine, sink: &dyn FrameSink) {
    let started = Instant::now();
    let got = send_until(e, b"withdrawn", started + Duration::from_millis(200), sink);
    assert!(matches!(got, Sent::Stopped("stop")), "{got:?}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Sends `p` as one frame with `stop` answering from `stop_by` on.
fn send_until(
    e: &FrameEngine,
    p: &[u8],
    stop_by: Instant,
    sink: &dyn FrameSink,
) -> Sent<&'static str> {
    let far = Instant::now() + Duration::from_secs(30);
    let head = (p.len() as u64).to_le_bytes();
    let mut stop = || (Instant::now() >= stop_by).then_some("stop");
    e.send(
        0,
        &head,
        p,
        far,
        &mut || panic!("stalled"),
        sink,
        stop_by,
        &mut stop,
    )
}

/// Reads one frame (8-byte header, then the payload) from `b`.
fn read_frame(b: &mut UnixStream) -> Vec<u8> {
    use std::io::Read;
    let mut head = [0u8; HEADER];
    b.read_exact(&mut head).unwrap();
    let mut p = vec![0u8; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize];
    b.read_exact(&mut p).unwrap();
    p
}

/// A socket pair whose first end is full of whole 64-byte frames (8-byte
/// header, 56 bytes of 9s) before any engine has it: the pair, the frame,
/// and how many went in.
fn full_socket_pair() -> (UnixStream, UnixStream, Vec<u8>, usize) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut fill = a.try_clone().unwrap();
    fill.set_nonblocking(true).unwrap();
    let mut filler_frame = 56u64.to_le_bytes().to_vec();
    filler_frame.resize(64, 9);
    let mut fillers = 0;
    loop {
        match std::io::Write::write(&mut fill, &filler_frame) {
            Ok(64) => fillers += 1,
            Ok(n) => panic!("a partial write of {n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    (a, b, filler_frame, fillers)
}

/// Reads the `fillers` frames of [`full_socket_pair`] from `b`, checks that
/// nothing follows them (a withdrawn send left no byte behind, even after
/// a moment for a retry the kernel might still make), then that the link
/// carries a next frame and nothing failed.
fn only_fillers_then_next(
    e: &FrameEngine,
    b: &mut UnixStream,
    filler_frame: &[u8],
    fillers: usize,
    sink: &Sink,
) {
    for _ in 0..fillers {
        assert_eq!(read_frame(b), &filler_frame[8..]);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(drained(b), "bytes after the {fillers} fillers");
    send_one(e, 0, b"next", sink);
    assert_eq!(read_frame(b), b"next");
    assert!(drained(b));
    assert!(lock(&sink.failed).is_empty());
}

/// Whether `b` has nothing left to read.
fn drained(b: &mut UnixStream) -> bool {
    use std::io::Read;
    b.set_nonblocking(true).unwrap();
    let empty =
        matches!(b.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    b.set_nonblocking(false).unwrap();
    empty
}

#[test]
fn a_send_queued_behind_a_stalled_one_is_withdrawn_when_stopped() {
    // Nobody reads yet: a large frame goes out in part and waits, and a
    // small one queues behind it. Stopped, the small one is withdrawn; the
    // link carries on, and its bytes never appear.
    let (a, mut b) = UnixStream::pair().unwrap();
    let e = Arc::new(engine(1));
    e.add_link(0, shared(a));
    let big: Vec<u8> = (0..8 << 20).map(|i: usize| (i * 7) as u8).collect();
    let filler = {
        let (e, big) = (e.clone(), big.clone());
        std::thread::spawn(move || send_one(&e, 0, &big, &Sink::default()))
    };
    std::thread::sleep(Duration::from_millis(100)); // the large frame is under way
    let sink = Sink::default();
    stops_soon(&e, &sink);
    assert_eq!(read_frame(&mut b), big);
    filler.join().unwrap();
    send_one(&e, 0, b"next", &sink);
    assert_eq!(read_frame(&mut b), b"next");
    assert!(drained(&mut b));
    assert!(lock(&sink.failed).is_empty());
}

#[test]
fn a_send_waiting_on_a_full_socket_is_cancelled_when_stopped() {
    // The socket is full of whole frames before the engine has it, so the
    // send's first attempt moves nothing and its ring entry waits: stopped,
    // the engine cancels it and reports it withdrawn, and no byte of it
    // reaches the peer.
    let (a, mut b, filler_frame, fillers) = full_socket_pair();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    stops_soon(&e, &sink);
    only_fillers_then_next(&e, &mut b, &filler_frame, fillers, &sink);
}

#[test]
fn a_send_unwound_by_a_panic_is_withdrawn_before_its_payload_goes() {
    // As above, the socket is full and the send's ring entry waits; then
    // its `stop` panics. The unwind must not leave the entry with the
    // kernel (it would read the caller's freed payload once the peer
    // reads): it is cancelled before the panic leaves `send`, no byte of it
    // ever reaches the peer, and the link works on.
    let (a, mut b, filler_frame, fillers) = full_socket_pair();
    let e = engine(1);
    e.add_link(0, shared(a));
    let sink = Sink::default();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let payload = b"freed by the unwind".to_vec();
        let head = (payload.len() as u64).to_le_bytes();
        let panic_at = Instant::now() + Duration::from_millis(200);
        let far = Instant::now() + Duration::from_secs(30);
        let mut stop = || -> Option<()> {
            assert!(Instant::now() < panic_at, "a panic in stop");
            None
        };
        e.send(0, &head, &payload, far, &mut || {}, &sink, far, &mut stop)
    }));
    assert!(unwound.is_err(), "the stop closure panics");
    only_fillers_then_next(&e, &mut b, &filler_frame, fillers, &sink);
}

#[test]
fn a_placement_unwound_by_a_panic_is_withdrawn_and_its_memory_left_alone() {
    // A receive posted into the caller's memory, then the caller's `stop`
    // panics before the frame comes. The unwind withdraws it: the frame,
    // sent afterwards, goes to the sink, and the memory (which a real
    // caller would have freed) is never written.
    let (a, b) = UnixStream::pair().unwrap();
    let (ea, eb) = (engine(1), engine(1));
    ea.add_link(0, shared(a));
    eb.add_link(0, shared(b));
    let sink = Sink::default();
    let p = payload(3);
    let mut dest = vec![0u8; p.len()];
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let panic_at = Instant::now() + Duration::from_millis(100);
        let far = Instant::now() + Duration::from_secs(30);
        let mut stop = || -> Option<()> {
            assert!(Instant::now() < panic_at, "a panic in stop");
            None
        };
        eb.receive_in_place(0, [p.len() as u64, 0, 0], &mut dest, far, &sink, &mut stop)
    }));
    assert!(unwound.is_err(), "the stop closure panics");
    send_one(&ea, 0, &p, &sink);
    wait_for(&eb, &sink, |s| lock(&s.frames).len() == 1);
    assert!(lock(&sink.frames)[0].1 == p);
    assert!(
        dest.iter().all(|b| *b == 0),
        "the kernel wrote into memory an unwind handed back"
    );
}

mod lanes;

#[test]
fn a_failed_link_lets_a_zero_copy_send_on_its_socket_go() {
    // As for lanes (tests/lanes.rs), on a link without them: a SEND_ZC of
    // the link's own socket waits for its notification, which a peer that
    // reads nothing never brings. The link fails here; its socket is reset
    // and the caller is let go with the error.
    let (a, _idle_peer) = tcp_pair();
    let e = Arc::new(
        FrameEngine::new(EngineConfig {
            zero_copy_always: true,
            ..config(1, Duration::from_micros(20), 1)
        })
        .unwrap(),
    );
    let a = shared(a);
    e.add_link(0, a.clone());
    let finished = send_until_it_fails(e.clone());
    std::thread::sleep(Duration::from_millis(500));
    use nix::sys::socket::{Shutdown, shutdown};
    use std::os::fd::AsRawFd;
    shutdown(a.as_raw_fd(), Shutdown::Both).unwrap();
    let (sent, error) = finished
        .recv_timeout(Duration::from_secs(20))
        .expect("the caller was let go");
    assert!(sent < 64, "the peer read nothing, yet {sent} MiB went");
    assert!(!error.is_empty());
    assert_eq!(
        e.zero_copy_links(),
        vec![(0, true)],
        "kept by zero_copy_always"
    );
}

/// Sends frames of 1 MiB on link 0 from a thread of its own until one
/// fails: how many went, and the error, come on the channel.
fn send_until_it_fails(e: Arc<FrameEngine>) -> std::sync::mpsc::Receiver<(usize, String)> {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let payload = vec![7u8; 1 << 20];
        let far = Instant::now() + Duration::from_secs(60);
        let header = (payload.len() as u64).to_le_bytes();
        let sink = Sink::default();
        let mut sent = 0;
        let error = loop {
            match plain_send(&e, 0, &header, &payload, far, &mut || {}, &sink) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
        };
        done.send((sent, error)).unwrap();
    });
    finished
}
