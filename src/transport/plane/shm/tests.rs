//! The shared-memory plane's links over rings in one process.

use super::offer::segment_len;
use super::*;
use crate::dtype::DType;
use crate::error::link::Loss;
use crate::transport::AlignedBuf;
use crate::transport::dispatch::check_header;
use crate::transport::inbox::Inboxes;
use crate::wire::OpKind;
use ringwire_shm::Segment;

/// Inboxes and a record of failures: the transport as a plane sees it.
struct TestFabric {
    inboxes: Inboxes,
    failed: Mutex<Option<LinkFailure>>,
}

impl Fabric for TestFabric {
    fn header(&self, _: usize, head: &[u8]) -> Result<Header, LinkFailure> {
        check_header(head, 1 << 30).map_err(LinkFailure::from)
    }
    fn arrived(&self, peer: usize, header: Header, payload: AlignedBuf, wake: bool) {
        self.inboxes.file(peer, header, payload, wake);
    }
    fn failed(&self, _: usize, failure: LinkFailure) {
        lock(&self.failed).get_or_insert(failure);
    }
    fn aborted(&self, _: u64) -> Option<LinkError> {
        None
    }
    fn failure(&self, peer: usize) -> Option<Loss> {
        lock(&self.failed).clone().map(|f| Loss::new(peer, f))
    }
    fn sent(&self, _: usize) {}
    fn heard(&self, _: usize) {}
    fn inboxes(&self) -> &Inboxes {
        &self.inboxes
    }
}

fn fabric(me: usize) -> TestFabric {
    TestFabric {
        inboxes: Inboxes::new(me, 2, (0, 0), Arc::new(|| {})),
        failed: Mutex::new(None),
    }
}

/// Rank 0's and rank 1's ends of one link on a fresh segment.
fn link_pair() -> (ShmLink, ShmLink, Arc<ShmLinks>) {
    let segment = Segment::create(segment_len()).expect("memfd");
    let mapping = Arc::new(segment.into_mapping());
    let (s0, s1) = UnixStream::pair().unwrap();
    let config = PlaneConfig {
        write_timeout: Duration::from_secs(5),
        spin: Duration::from_micros(50),
        engine_threads: 0,
        thread_cores: Vec::new(),
        crowded: false,
        tls: false,
        shm: true,
        handshake_timeout: Duration::from_secs(5),
    };
    let links = Arc::new(ShmLinks::new(0));
    let zero = shared(mapping.clone(), true, (s0, None), 1, &config, &links);
    let one = shared(mapping, false, (s1, None), 0, &config, &links);
    (
        ShmLink {
            shared: zero,
            peer_arena: None,
        },
        ShmLink {
            shared: one,
            peer_arena: None,
        },
        links,
    )
}

fn frame(step: u32, len: usize) -> (Header, Vec<u8>) {
    let header = Header::data(7, 1, OpKind::AllGather, DType::U8)
        .with_step(step, 0)
        .with_payload_len(len as u32);
    let payload = (0..len).map(|i| (i * 7 + step as usize) as u8).collect();
    (header, payload)
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// Rank 0 sends a frame of `step` as long as `dest`; rank 1 receives
/// a copy of step 3 into `dest`. What it got, and its inbox.
fn send_then_receive_step_3(step: u32, dest: &mut [u8]) -> (Received, Arc<Inbox>) {
    let (zero, one, _links) = link_pair();
    let (f0, f1) = (fabric(0), fabric(1));
    f1.inboxes.begin(7, 1, None);
    let inbox = f1.inboxes.inbox(7, 0);
    let (header, payload) = frame(step, dest.len());
    zero.send(&f0, 1, &header, &payload, soon()).unwrap();
    let got = one
        .recv_into(&f1, &inbox, 7, 0, (1, 3, 0), dest, soon())
        .unwrap();
    (got, inbox)
}

#[test]
fn the_frame_a_copy_waits_for_lands_in_its_destination() {
    let (payload, mut dest) = (frame(3, 100_000).1, vec![0u8; 100_000]);
    let (got, inbox) = send_then_receive_step_3(3, &mut dest);
    assert!(
        matches!(got, Received::Placed(h) if h.step == 3),
        "not placed"
    );
    assert_eq!(dest, payload);
    assert!(inbox.pop().is_none(), "placed, not filed");
}

#[test]
fn a_frame_for_another_step_is_filed_and_the_destination_untouched() {
    let (payload, mut dest) = (frame(4, 1000).1, vec![0xEEu8; 1000]);
    let (got, _) = send_then_receive_step_3(4, &mut dest);
    match got {
        Received::Frame(f) => {
            assert_eq!(f.header.step, 4);
            assert_eq!(f.payload.bytes(), &payload[..]);
        }
        Received::Placed(_) => panic!("a step-4 frame was placed as step 3"),
    }
    assert!(dest.iter().all(|&b| b == 0xEE));
}

#[test]
fn a_frame_part_way_placed_when_its_waiter_stops_is_finished_in_a_buffer() {
    let (zero, one, _links) = link_pair();
    let f1 = fabric(1);
    f1.inboxes.begin(7, 1, None);
    let (header, payload) = frame(3, 4096);
    let head = padded_head(&header);
    let mut dest = vec![0u8; payload.len()];
    let half = payload.len() / 2;
    {
        let mut tx = lock(&zero.shared.tx);
        assert_eq!(tx.push(&head.0[..head.1]), head.1);
        assert_eq!(tx.push(&payload[..half]), half);
    }
    let s = &*one.shared;
    let mut rx = lock(&s.rx);
    let mut place = Place {
        key: (7, 1, 3, 0),
        dest: &mut dest,
        placed: None,
    };
    assert!(s.drain_into(&mut rx, &f1, Some(&mut place)));
    assert!(rx.placing() && place.placed.is_none());
    rx.detach(place.dest, &f1);
    assert!(!rx.placing());
    // The rest arrives; a reader with no placement files it whole.
    {
        let mut tx = lock(&zero.shared.tx);
        assert_eq!(tx.push(&payload[half..]), payload.len() - half);
        let trail = header.trail_len();
        assert_eq!(tx.push(&[0u8; 64][..trail]), trail);
    }
    assert!(s.drain(&mut rx, &f1));
    let filed = f1.inboxes.inbox(7, 0).pop().expect("filed");
    assert_eq!(filed.payload.bytes(), &payload[..]);
    assert!(lock(&f1.failed).is_none());
}
