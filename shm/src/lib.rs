//! ringwire's shared memory between processes of one host.
//!
//! - [`Segment`]: an anonymous memfd, backed up front and sealed against
//!   resizing, mapped shared; it has no name, so nothing outlives the job.
//! - [`send_fd`] / [`recv_fd`]: a segment travels to a peer as a descriptor
//!   over the link's (authenticated) Unix socket.
//! - [`Mapping`]: the only way to its memory: atomic words and bounded
//!   copies (the crate's unsafe code is there and in `fdpass`).
//! - [`arena`]: the layout of a process's arena and the protocol small
//!   collectives publish and read payloads by (model-checked too).
//! - [`Producer`] / [`Consumer`]: a single-producer single-consumer byte
//!   ring, one direction of a link, with the armed words a sleeper and its
//!   waker use (model-checked under `RUSTFLAGS="--cfg loom"`).

pub mod arena;
#[cfg(target_os = "linux")]
mod fdpass;
#[cfg(all(test, loom))]
mod loom_bell;
#[cfg(target_os = "linux")]
mod mapping;
pub mod ring;
#[cfg(target_os = "linux")]
mod segment;

#[cfg(target_os = "linux")]
pub use fdpass::{recv_fd, send_fd};
#[cfg(target_os = "linux")]
pub use mapping::Mapping;
#[cfg(target_os = "linux")]
pub use ring::MappedRing;
pub use ring::{Consumer, Producer, RING_HEADER, RingMemory};
#[cfg(target_os = "linux")]
pub use segment::Segment;
