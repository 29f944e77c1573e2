//! Received payload buffers kept for reuse, so receiving allocates nothing
//! in steady state, up to a cap that bounds resident memory.

use super::{AlignedBuf, lock};
use std::sync::Mutex;

/// Received payload buffers kept for reuse, in bytes. In steady state a
/// rank holds at most what a peer can send ahead of it (an op's frames from
/// each peer), so with this much pooled receiving allocates nothing; beyond
/// it buffers are freed, which bounds resident memory.
const POOL_BYTES: usize = 256 << 20;

/// Payload buffers for reuse (see `POOL_BYTES`).
#[derive(Default)]
pub(crate) struct Pool {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
}

impl Pool {
    /// A buffer to receive a payload into: a kept one, else a new empty one.
    pub(crate) fn take(&self) -> AlignedBuf {
        let mut kept = lock(&self.kept);
        let buf = kept.bufs.pop().unwrap_or_default();
        kept.bytes -= buf.capacity();
        buf
    }

    /// Keeps `buf` for reuse, unless the pool is full (then it is freed).
    pub(crate) fn recycle(&self, buf: AlignedBuf) {
        let mut kept = lock(&self.kept);
        if kept.bytes + buf.capacity() <= POOL_BYTES {
            kept.bytes += buf.capacity();
            kept.bufs.push(buf);
        }
    }
}
