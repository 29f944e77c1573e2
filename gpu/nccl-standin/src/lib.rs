//! A stand-in for NVIDIA's `libnccl.so.2`, for testing ringwire's NCCL path
//! on machines without a GPU.
//!
//! Built as a cdylib (`libringwire_nccl_standin.so`), it exports NCCL's C
//! ABI with nccl.h's numeric values (result codes, data types, reduction
//! operators, `ncclUniqueId`, `ncclConfig_t`), so the consumer loads it
//! exactly as it loads the real library. "Device" pointers are host
//! pointers. Ranks may be separate processes or threads of one process:
//! they meet through a bootstrap root on 127.0.0.1 started by
//! `ncclGetUniqueId`, then talk over a full mesh of TCP connections.
//!
//! It also exports a small host stream API (`standinStreamCreate`,
//! `standinEventRecord`, `standinStreamWaitEvent`, ...) standing in for
//! CUDA streams and events: NCCL calls enqueue their work on such a stream
//! and return, and completion is observed through events, as on a GPU.
//!
//! What it is not: it uses no GPU and no CUDA, and it is not fast (every
//! collective sends whole buffers to every rank that needs them). Only the
//! functions listed in `abi` exist; no `pncclXxx` aliases, no
//! `ncclCommSplit`, no user-defined reduction operators, no fp8.
//! `ncclCommShrink` is there (faithful to NCCL 2.27.3's checks: see
//! `abi::ncclCommShrink`), refused with `ncclInvalidUsage` when the
//! reported version is older than 2.27.3.
//!
//! # Behaviour a consumer may rely on
//!
//! - Handles (`ncclComm_t`, streams, events) are numbers in a table, never
//!   dereferenced: a stale or foreign one gives `ncclInvalidArgument` (1,
//!   `cudaErrorInvalidValue`, for the stream API), not a crash.
//! - Strings from `ncclGetErrorString` and `ncclGetLastError` live as long
//!   as the process.
//! - A NULL stream is one default stream for the whole process, in the
//!   NCCL calls and in the stream API alike. Ranks that are threads of one
//!   process must each use their own stream: on the shared one, the first
//!   rank's op would block the other ranks' ops queued behind it.
//! - Frames are matched per pair of ranks by the comm's collective count
//!   (collectives) or by the count of sends between the two ranks
//!   (send/recv), not by the op number, which differs between ranks whose
//!   send/recv calls differ. A frame with the expected number but another
//!   collective, data type or size is a mismatch: the async error becomes
//!   `ncclInvalidUsage` and the op ends without writing. Once a comm has an
//!   async error its later ops end at once without writing.
//! - A peer that disconnects does not fail the receivers waiting on it;
//!   only `ncclCommAbort` (or destroy) ends them.
//! - `ncclCommDestroy` with ops still queued (or the setup still running)
//!   acts as `ncclCommAbort`. `ncclCommDestroy(NULL)` and
//!   `ncclCommAbort(NULL)` return success, as in NCCL.
//! - A blocking init inside `ncclGroupStart`/`ncclGroupEnd` returns at once
//!   and is finished by the outermost `ncclGroupEnd`, so one thread can
//!   create several ranks; outside a group a blocking init with an
//!   `initstall` fault never returns.
//!
//! # Environment variables
//!
//! Read at comm init (`RINGWIRE_STANDIN_NCCL_VERSION` at each
//! `ncclGetVersion`), on the calling thread; in-process tests can override
//! them per thread with [`envcfg::set_thread_override`].
//!
//! - `RINGWIRE_STANDIN_NCCL_FAULT`: comma-separated faults.
//!   `hang:<rank>:<op>`: on that rank, op number `<op>` of the comm (every
//!   collective and send/recv counts, from 0, in call order; discarded
//!   `count == 0` calls do not) never completes and sends nothing, until
//!   the comm is aborted. `error:<rank>:<op>:<code>`: as `hang`, and the
//!   comm's async error becomes `<code>`, its last error "stand-in NCCL:
//!   injected error <code> at op <op> on rank <rank>". `initfail:<rank>`:
//!   init fails with `ncclUnhandledCudaError` (1) and no comm.
//!   `initstall:<rank>`: the setup never finishes (until aborted).
//!   `shrinkfail:<rank>`: `ncclCommShrink` on that parent rank fails with
//!   `ncclSystemError` before it sends anything (the other ranks wait for
//!   it until aborted). `shrinkstall:<rank>`: that rank's shrink never
//!   finishes until the parent or the child is aborted. A child's op
//!   faults name its own (new) rank. An item it cannot read makes init
//!   (or the shrink) fail with `ncclInvalidArgument`.
//! - `RINGWIRE_STANDIN_NCCL_INPROGRESS_POLLS`: the first N (default 2)
//!   `ncclCommGetAsyncError` polls of a non-blocking comm report
//!   `ncclInProgress` even when its setup is done.
//! - `RINGWIRE_STANDIN_NCCL_VERSION`: "X.Y.Z", what `ncclGetVersion`
//!   reports (default 2.30.7, code 23007).
//! - `NCCL_DEBUG`: WARN, INFO or TRACE print each logged error to stderr.

pub mod abi;
mod calls;
pub mod codes;
mod comm;
pub mod envcfg;
mod fault;
mod group;
mod handles;
mod hostmem;
mod hoststreams;
mod inbox;
mod lasterror;
mod mesh;
mod ops;
mod reduce;
mod rendezvous;
mod setup;
mod shrink;
mod stream;
mod wire;
