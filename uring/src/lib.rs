//! ringwire's io_uring engine crate.
//!
//! - [`probe`] says whether io_uring works in this process (it is often
//!   disabled: `kernel.io_uring_disabled`, Docker's default seccomp profile,
//!   old kernels) and which operations the kernel offers;
//! - [`memlock`] reads the registered-memory budget;
//! - [`FrameEngine`] moves framed messages over connected sockets on one
//!   ring, driven by the threads that wait on it (see its module docs and
//!   `docs/decisions/0007-caller-driven-engine.md`);
//! - [`AlignedBuf`] is the payload storage both of ringwire's transports use.
//!
//! The crate denies `unsafe`; only `engine::driver` (the ring) allows it,
//! with a `// SAFETY:` note on every block.

mod aligned;
#[cfg(target_os = "linux")]
mod engine;
mod memlock;
mod probe;

pub use aligned::AlignedBuf;
#[cfg(target_os = "linux")]
pub use engine::{EngineConfig, FrameEngine, FrameSink, LinkFault, MAX_HEADER, SendResult};

pub use memlock::{MemlockLimit, memlock};
pub use probe::{Support, Unavailable, probe};
