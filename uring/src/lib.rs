//! ringwire's io_uring engine crate.
//!
//! - [`probe`] says whether io_uring works in this process (it is often
//!   disabled: `kernel.io_uring_disabled`, Docker's default seccomp profile,
//!   old kernels) and which operations the kernel offers;
//! - [`memlock`] reads the registered-memory budget;
//! - [`FrameEngine`] moves framed messages over connected sockets on one
//!   ring, driven by the threads that wait on it (see its module docs and
//!   `docs/decisions/0007-caller-driven-engine.md`);
//! - [`AlignedBuf`] is the payload storage both of ringwire's transports use;
//! - [`poll_yield`] yields between polls and moves a polling thread off a
//!   core another poller shares (see the `spin` module).
//!
//! - [`CountingAllocator`] counts heap allocations (tests, benchmarks).
//!
//! The crate denies `unsafe`; only `engine::driver` (the ring),
//! `engine::shard` (an engine thread's ring: MSG_RING entries), `refuse` (a
//! seccomp filter for tests) and `counting` (an allocator) allow it, with a
//! `// SAFETY:` note on every block.

mod aligned;
mod counting;
#[cfg(target_os = "linux")]
mod engine;
mod memlock;
mod probe;
#[cfg(target_os = "linux")]
mod refuse;
mod spin;

pub use aligned::AlignedBuf;
pub use counting::CountingAllocator;
#[cfg(target_os = "linux")]
pub use engine::{
    EngineConfig, FrameEngine, FrameKey, FrameSink, LaneCounter, LaneCounters, Lanes, LinkFault,
    MAX_FRAME_ALIGN, MAX_HEADER, PayloadAt, Placement, Placements, SendResult, Sent, SharedFd,
    ThreadCounters,
};

pub use memlock::{MemlockLimit, memlock};
pub use probe::{Support, Unavailable, probe};
pub use spin::{poll_yield, set_home_core, usable_core_ids, usable_cores};

/// For the fuzz targets (`fuzz/`): the lanes' rules, driven by bytes.
#[cfg(target_os = "linux")]
#[doc(hidden)]
pub use engine::fuzzing;

/// For tests: simulating hosts where io_uring is refused.
#[cfg(target_os = "linux")]
pub mod testing {
    pub use crate::refuse::{refuse_io_uring_on_this_thread, refuse_memfd_on_this_thread};
}
