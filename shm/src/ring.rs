//! A single-producer, single-consumer byte ring in shared memory: one
//! direction of a link. It carries a byte stream (ringwire's frames, laid
//! out as on a socket), so everything above treats it like a socket
//! without the system calls.
//!
//! Layout (offsets from the ring's start, every line 128 bytes, one writer
//! each):
//! - line 0, the producer's: `head` (bytes ever written), `producer_armed`
//!   (the producer sleeps until the consumer frees space);
//! - line 1, the consumer's: `tail` (bytes ever read), `consumer_armed`
//!   (the consumer sleeps until data comes);
//! - then `capacity` bytes of data, a byte at stream position `n` at
//!   `n % capacity`.
//!
//! Counters only grow (64 bits: they never wrap), so "how much" is a
//! subtraction and no index is ever ambiguous. A writer publishes with a
//! release store after its copy; a reader acquires before its copy.
//!
//! Sleeping is the caller's, on the link's socket; this only says when to
//! ring. A sleeper stores its `armed` word, fences, and looks again; a
//! publisher fences after its store and reads the other side's `armed`.
//! With a full fence on both sides (Dekker), at least one of them sees the
//! other: a sleeper never sleeps through data (or space) it was not told
//! about. The protocol is model-checked with loom (`cfg(loom)` tests).

#[cfg(loom)]
use loom::sync::atomic::{Ordering, fence};
#[cfg(not(loom))]
use std::sync::atomic::{Ordering, fence};

/// Byte offsets of the control words from a ring's start.
const HEAD: usize = 0;
const PRODUCER_ARMED: usize = 8;
const TAIL: usize = 128;
const CONSUMER_ARMED: usize = 136;

/// Bytes before a ring's data.
pub const RING_HEADER: usize = 256;

/// The memory one ring lives in: its control words and its data bytes.
pub trait RingMemory {
    /// The control word at `off` (one of the offsets above).
    fn load(&self, off: usize, order: Ordering) -> u64;
    /// Stores the control word at `off`.
    fn store(&self, off: usize, value: u64, order: Ordering);
    /// Copies into the data area at `at` (below its capacity).
    fn write(&self, at: usize, src: &[u8]);
    /// Copies out of the data area at `at`.
    fn read(&self, at: usize, dst: &mut [u8]);
    /// The data area's size.
    fn capacity(&self) -> usize;
}

/// The writing end.
#[derive(Debug)]
pub struct Producer<M> {
    mem: M,
    /// `head` as this end last stored it (it is its only writer).
    head: u64,
}

/// The reading end.
#[derive(Debug)]
pub struct Consumer<M> {
    mem: M,
    /// `tail` as this end last stored it.
    tail: u64,
}

impl<M: RingMemory> Producer<M> {
    /// The writing end of a fresh ring (its words zero) in `mem`.
    pub fn new(mem: M) -> Producer<M> {
        Producer { mem, head: 0 }
    }

    /// Bytes that fit now.
    pub fn free(&self) -> usize {
        let tail = self.mem.load(TAIL, Ordering::Acquire);
        self.mem.capacity() - (self.head - tail) as usize
    }

    /// Copies as much of `bytes` as fits and publishes it; how much.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.free());
        if n == 0 {
            return 0;
        }
        let cap = self.mem.capacity();
        let at = (self.head % cap as u64) as usize;
        let first = n.min(cap - at);
        self.mem.write(at, &bytes[..first]);
        if first < n {
            self.mem.write(0, &bytes[first..n]);
        }
        self.head += n as u64;
        self.mem.store(HEAD, self.head, Ordering::Release);
        n
    }

    /// After a push: whether the consumer sleeps waiting for data and must
    /// be rung (the publisher's half of the handshake).
    pub fn consumer_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        self.mem.load(CONSUMER_ARMED, Ordering::Relaxed) != 0
    }

    /// Before sleeping for space: says so, and whether there is space
    /// after all (then do not sleep). Call [`Producer::disarm`] after.
    pub fn arm(&self) -> bool {
        self.mem.store(PRODUCER_ARMED, 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.free() > 0
    }

    /// Takes back [`arm`](Self::arm): the consumer need not ring.
    pub fn disarm(&self) {
        self.mem.store(PRODUCER_ARMED, 0, Ordering::Relaxed);
    }

    /// Bytes ever written.
    pub fn written(&self) -> u64 {
        self.head
    }
}

impl<M: RingMemory> Consumer<M> {
    /// The reading end of a fresh ring in `mem`.
    pub fn new(mem: M) -> Consumer<M> {
        Consumer { mem, tail: 0 }
    }

    /// Bytes waiting.
    pub fn available(&self) -> usize {
        (self.mem.load(HEAD, Ordering::Acquire) - self.tail) as usize
    }

    /// Bytes written and not yet freed, as the published counters say:
    /// for an observer other than the reader (any end of the ring may ask).
    /// The tail is read first: both only grow, and the reader never passes
    /// the head, so a head read after it is never behind it. (Read the
    /// other way round, a reader freeing bytes written between the two
    /// loads put the tail past the head read before: the subtraction
    /// underflowed, a panic in debug builds that killed whichever thread
    /// asked, such as an agreement's receiver.)
    pub fn unread(&self) -> usize {
        let tail = self.mem.load(TAIL, Ordering::Acquire);
        let head = self.mem.load(HEAD, Ordering::Acquire);
        head.saturating_sub(tail) as usize
    }

    /// Copies up to `dst.len()` waiting bytes out and frees their room;
    /// how many.
    pub fn pop(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.available());
        if n == 0 {
            return 0;
        }
        let cap = self.mem.capacity();
        let at = (self.tail % cap as u64) as usize;
        let first = n.min(cap - at);
        self.mem.read(at, &mut dst[..first]);
        if first < n {
            self.mem.read(0, &mut dst[first..n]);
        }
        self.tail += n as u64;
        self.mem.store(TAIL, self.tail, Ordering::Release);
        n
    }

    /// After a pop: whether the producer sleeps waiting for space and must
    /// be rung.
    pub fn producer_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        self.mem.load(PRODUCER_ARMED, Ordering::Relaxed) != 0
    }

    /// Before sleeping for data: says so, and whether data came after all.
    /// Call [`Consumer::disarm`] after.
    pub fn arm(&self) -> bool {
        self.mem.store(CONSUMER_ARMED, 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.available() > 0
    }

    /// Takes back [`arm`](Self::arm): the producer need not ring.
    pub fn disarm(&self) {
        self.mem.store(CONSUMER_ARMED, 0, Ordering::Relaxed);
    }
}

/// A ring in a shared mapping: at byte `base`, `capacity` data bytes.
#[cfg(target_os = "linux")]
#[derive(Clone, Debug)]
pub struct MappedRing {
    mapping: std::sync::Arc<crate::Mapping>,
    base: usize,
    capacity: usize,
}

#[cfg(target_os = "linux")]
impl MappedRing {
    /// The ring at `base` of `mapping`, of `capacity` data bytes. Panics
    /// if it leaves the mapping or `base` is not 128-aligned.
    pub fn new(
        mapping: std::sync::Arc<crate::Mapping>,
        base: usize,
        capacity: usize,
    ) -> MappedRing {
        assert!(
            base.is_multiple_of(128)
                && capacity > 0
                && base + RING_HEADER + capacity <= mapping.len(),
            "a ring of {capacity} bytes at {base} of a {}-byte mapping",
            mapping.len()
        );
        MappedRing {
            mapping,
            base,
            capacity,
        }
    }
}

#[cfg(target_os = "linux")]
impl RingMemory for MappedRing {
    fn load(&self, off: usize, order: Ordering) -> u64 {
        self.mapping.atomic(self.base + off).load(order)
    }

    fn store(&self, off: usize, value: u64, order: Ordering) {
        self.mapping.atomic(self.base + off).store(value, order)
    }

    fn write(&self, at: usize, src: &[u8]) {
        self.mapping.write(self.base + RING_HEADER + at, src)
    }

    fn read(&self, at: usize, dst: &mut [u8]) {
        self.mapping.read(self.base + RING_HEADER + at, dst)
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(all(test, not(loom), target_os = "linux"))]
mod tests {
    use super::*;
    use crate::Segment;
    use std::sync::Arc;

    fn ring(capacity: usize) -> (Producer<MappedRing>, Consumer<MappedRing>) {
        let seg = Segment::create(RING_HEADER + capacity).unwrap();
        let mapping = Arc::new(seg.into_mapping());
        let mem = MappedRing::new(mapping, 0, capacity);
        (Producer::new(mem.clone()), Consumer::new(mem))
    }

    #[test]
    fn bytes_come_out_in_order_across_the_wrap() {
        let (mut p, mut c) = ring(100);
        let stream: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        let mut buf = [0u8; 37];
        while got.len() < stream.len() {
            sent += p.push(&stream[sent..(sent + 64).min(stream.len())]);
            let n = c.pop(&mut buf);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, stream);
    }

    /// An observer's `unread` while the writer and the reader race: never
    /// more than was ever written (before, the head was read first and the
    /// reader could free past it: an underflow, a panic in debug builds
    /// and a number near 2^64 in release ones).
    #[test]
    fn unread_seen_from_the_side_stays_within_the_ring() {
        let (mut p, mut c) = ring(64);
        let observer = Consumer::new(c.mem.clone());
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = [0u8; 7];
                for _ in 0..400_000 {
                    p.push(&[1; 13]);
                    c.pop(&mut buf);
                }
                done.store(true, Ordering::Relaxed);
            });
            let mut looks = 0u64;
            while !done.load(Ordering::Relaxed) || looks == 0 {
                assert!(observer.unread() <= 13 * 400_000);
                looks += 1;
            }
        });
    }

    #[test]
    fn a_full_ring_takes_nothing_until_the_reader_frees_room() {
        let (mut p, mut c) = ring(64);
        assert_eq!(p.push(&[1; 100]), 64);
        assert_eq!(p.push(&[2; 10]), 0);
        assert_eq!(p.free(), 0);
        let mut buf = [0u8; 10];
        assert_eq!(c.pop(&mut buf), 10);
        assert_eq!(p.free(), 10);
        assert_eq!(p.push(&[3; 20]), 10);
    }

    #[test]
    fn an_armed_reader_is_seen_by_the_writer_and_an_armed_writer_by_the_reader() {
        let (mut p, mut c) = ring(64);
        assert!(!c.arm(), "nothing to read: sleep");
        p.push(&[1; 64]);
        assert!(p.consumer_sleeping(), "the writer must ring");
        c.disarm();
        assert!(!p.consumer_sleeping());
        assert!(!p.arm(), "full: sleep");
        c.pop(&mut [0u8; 8]);
        assert!(c.producer_sleeping(), "the reader must ring");
        p.disarm();
        assert!(!c.producer_sleeping());
    }

    /// The child half of `two_processes_stream_through_a_ring`: connects
    /// to the parent's socket, takes the segment, and writes the stream.
    #[test]
    fn writer_child() {
        let Ok(addr) = std::env::var("RINGWIRE_SHM_TEST_PARENT") else {
            return; // only in the child
        };
        use std::os::linux::net::SocketAddrExt;
        let sock = std::os::unix::net::UnixStream::connect_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(addr.as_bytes()).unwrap(),
        )
        .unwrap();
        let mut len = [0u8; 8];
        let (_, fd) = crate::recv_fd(&sock, &mut len).unwrap();
        let len = u64::from_le_bytes(len) as usize;
        let mapping = Arc::new(Segment::open(fd.unwrap(), len).unwrap().into_mapping());
        let mut p = Producer::new(MappedRing::new(mapping, 0, len - RING_HEADER));
        let stream = stream();
        let mut sent = 0;
        while sent < stream.len() {
            let n = p.push(&stream[sent..(sent + 1000).min(stream.len())]);
            if n == 0 {
                std::thread::yield_now();
            }
            sent += n;
        }
    }

    fn stream() -> Vec<u8> {
        (0..1usize << 20).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn two_processes_stream_through_a_ring() {
        use std::os::linux::net::SocketAddrExt;
        if std::env::var_os("RINGWIRE_SHM_TEST_PARENT").is_some() {
            return;
        }
        let name = format!("ringwire-shm-test-{}", std::process::id());
        let listener = std::os::unix::net::UnixListener::bind_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
        )
        .unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env("RINGWIRE_SHM_TEST_PARENT", &name)
            .args([
                "--exact",
                "ring::tests::writer_child",
                "--test-threads",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (sock, _) = listener.accept().unwrap();
        let len = RING_HEADER + 4096;
        let mut seg = Segment::create(len).unwrap();
        let fd = seg.take_fd().unwrap();
        crate::send_fd(
            &sock,
            std::os::fd::AsFd::as_fd(&fd),
            &(len as u64).to_le_bytes(),
        )
        .unwrap();
        drop(fd);
        let mut c = Consumer::new(MappedRing::new(Arc::new(seg.into_mapping()), 0, 4096));
        let want = stream();
        let mut got = Vec::with_capacity(want.len());
        let mut buf = [0u8; 777];
        while got.len() < want.len() {
            let n = c.pop(&mut buf);
            if n == 0 {
                std::thread::yield_now();
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == want, "the stream arrived garbled");
        assert!(child.wait().unwrap().success(), "the writer failed");
    }
}

/// The protocol under loom: every interleaving (and every visibility
/// loom's memory model allows) of a writer and a reader, with threads for
/// processes. `RUSTFLAGS="--cfg loom" cargo test -p ringwire-shm --release
/// ring::loom_model`.
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use crate::loom_bell::Bell;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    /// A ring's memory as loom sees it: the data bytes are cells, so a
    /// read of a byte not yet published (or a write over one not yet
    /// read) is a race loom reports.
    struct Mem {
        words: [AtomicU64; 4],
        data: Vec<UnsafeCell<u8>>,
    }

    fn index(off: usize) -> usize {
        match off {
            HEAD => 0,
            PRODUCER_ARMED => 1,
            TAIL => 2,
            CONSUMER_ARMED => 3,
            _ => unreachable!("a control word"),
        }
    }

    impl RingMemory for Arc<Mem> {
        fn load(&self, off: usize, order: Ordering) -> u64 {
            self.words[index(off)].load(order)
        }
        fn store(&self, off: usize, value: u64, order: Ordering) {
            self.words[index(off)].store(value, order)
        }
        #[allow(unsafe_code)]
        fn write(&self, at: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: loom checks, in every interleaving, that no other
                // access to this byte runs at the same time (the property
                // under test); the pointer is its cell's, valid here.
                self.data[at + i].with_mut(|p| unsafe { *p = b });
            }
        }
        #[allow(unsafe_code)]
        fn read(&self, at: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: as for `write`.
                *d = self.data[at + i].with(|p| unsafe { *p });
            }
        }
        fn capacity(&self) -> usize {
            self.data.len()
        }
    }

    fn mem(capacity: usize) -> Arc<Mem> {
        Arc::new(Mem {
            words: [
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ],
            data: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
        })
    }

    #[test]
    fn bytes_are_never_read_before_published_nor_overwritten_before_read() {
        loom::model(|| {
            let m = mem(2);
            let mut p = Producer::new(m.clone());
            let writer = loom::thread::spawn(move || {
                let stream = [1u8, 2, 3];
                let mut sent = 0;
                while sent < stream.len() {
                    let n = p.push(&stream[sent..]);
                    if n == 0 {
                        loom::thread::yield_now();
                    }
                    sent += n;
                }
            });
            let mut c = Consumer::new(m);
            let mut got = Vec::new();
            let mut buf = [0u8; 2];
            while got.len() < 3 {
                let n = c.pop(&mut buf);
                if n == 0 {
                    loom::thread::yield_now();
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, [1, 2, 3]);
            writer.join().unwrap();
        });
    }

    #[test]
    fn a_sleeper_is_always_rung() {
        // The reader sleeps when it sees nothing; the writer may have to
        // sleep when the ring is full. Neither may sleep for ever: loom
        // reports a deadlock if one can.
        loom::model(|| {
            let m = mem(1);
            let (to_reader, to_writer) = (Arc::new(Bell::default()), Arc::new(Bell::default()));
            let mut p = Producer::new(m.clone());
            let (bell_r, bell_w) = (to_reader.clone(), to_writer.clone());
            let writer = loom::thread::spawn(move || {
                let mut sent = 0;
                while sent < 2 {
                    let n = p.push(&[7]);
                    sent += n;
                    if n > 0 && p.consumer_sleeping() {
                        bell_r.ring();
                    }
                    if n == 0 {
                        if !p.arm() {
                            bell_w.sleep();
                        }
                        p.disarm();
                    }
                }
            });
            let mut c = Consumer::new(m);
            let mut got = 0;
            while got < 2 {
                let n = c.pop(&mut [0u8; 1]);
                got += n;
                if n > 0 && c.producer_sleeping() {
                    to_writer.ring();
                }
                if n == 0 {
                    if !c.arm() {
                        to_reader.sleep();
                    }
                    c.disarm();
                }
            }
            writer.join().unwrap();
        });
    }
}
