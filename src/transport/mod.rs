//! Transports move frames between ranks. The executor only needs two calls:
//! send a frame to a peer (never blocking on that peer's progress: transports
//! buffer what arrives), and receive the next frame a peer sent on a given
//! communicator, with a deadline.
//!
//! `tcp` is the portable transport (plain threads and blocking sockets); it
//! runs wherever TCP does and is the baseline every faster transport is
//! measured against.

pub(crate) mod tcp;

use crate::wire::Header;
use std::time::Instant;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A received payload in 8-byte-aligned storage, so it can be viewed as a
/// slice of any element type without copying.
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn new() -> AlignedBuf {
        AlignedBuf {
            words: Vec::new(),
            len: 0,
        }
    }

    /// Makes room for `len` bytes and returns them for filling.
    pub(crate) fn prepare(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        self.len = len;
        &mut self.words.as_mut_bytes()[..len]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        self.words.len() * 8
    }

    /// Views the payload as elements; `None` if the length is not a whole
    /// number of elements.
    pub(crate) fn as_slice<T: FromBytes + Immutable + KnownLayout>(&self) -> Option<&[T]> {
        <[T]>::ref_from_bytes(&self.words.as_bytes()[..self.len]).ok()
    }
}

/// One frame received from a peer.
pub(crate) struct Incoming {
    pub(crate) header: Header,
    pub(crate) payload: AlignedBuf,
}

/// Why a transport call failed. The executor adds the op context.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// Nothing arrived before the deadline.
    Timeout,
    /// The link is gone (closed, reset, or never came up).
    Lost(String),
    /// Could not establish the link.
    Connect { addr: String, detail: String },
    /// Some rank aborted the communicator (`origin` is its world rank).
    Aborted {
        origin: usize,
        seq: u64,
        reason: String,
    },
}

/// What the executor needs from a transport. Peers are world ranks.
pub(crate) trait Transport: Send + Sync {
    /// Sends one frame; `header.payload_len` must equal `payload.len()`.
    fn send(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(), LinkError>;
    /// The next data frame from `peer` on communicator `comm_id`.
    fn recv(&self, comm_id: u64, peer: usize, deadline: Instant) -> Result<Incoming, LinkError>;
    /// Returns a payload buffer for reuse.
    fn recycle(&self, buf: AlignedBuf);
    /// Fails every op of communicator `comm_id` on every reachable rank:
    /// marks it here and floods an abort to the peers.
    fn abort(&self, comm_id: u64, seq: u64, reason: &str);
    /// Where this rank accepts links.
    fn listen_addr(&self) -> std::net::SocketAddr;
    /// A short name for logs (`portable`, `uring`).
    fn name(&self) -> &'static str;
}
