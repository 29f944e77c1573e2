//! ringwire's io_uring engine crate.
//!
//! Today it holds what the engine will stand on, measured rather than
//! assumed: [`probe`] says whether io_uring works in this process (it is
//! often disabled: `kernel.io_uring_disabled`, Docker's default seccomp
//! profile, old kernels) and which operations the kernel offers, and
//! [`memlock`] reads the registered-memory budget. The engine itself (pinned
//! threads that run collective schedules from completions, registered
//! buffers, SEND_ZC) is planned in `docs/decisions/0006-engine-plan.md`.
//!
//! No `unsafe` yet: the io-uring crate's probing is safe. The engine's
//! `unsafe` will live in small modules here with a `// SAFETY:` note each.

#![forbid(unsafe_code)]

mod memlock;
mod probe;

pub use memlock::{MemlockLimit, memlock};
pub use probe::{Support, Unavailable, probe};
