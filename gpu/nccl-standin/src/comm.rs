//! A communicator's state and every wait on it. One mutex and condvar per
//! comm guard the setup's outcome, the inbox, the error and abort flags and
//! the count of queued ops, so that abort (which sets its flag under the
//! lock and wakes all) reaches every waiter: setup, receives, hung ops and
//! a blocking finalize.
//!
//! `ncclCommShrink` with `NCCL_SHRINK_ABORT` revokes a comm: its queued
//! and later ops end at once without writing, as after an abort, but its
//! mesh stays open because the child is set up over it.

use crate::codes::{IN_PROGRESS, INVALID_USAGE, NcclResult, SUCCESS};
use crate::fault::RankFaults;
use crate::handles::Table;
use crate::inbox::Inbox;
use crate::lasterror;
use crate::mesh::Mesh;
use crate::wire::{self, Tag, kind_name};
use std::ffi::CStr;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Live communicators, by `ncclComm_t` (the calls look them up; a shrink
/// adds its child).
pub(crate) static COMMS: Table<Comm> = Table::new();

/// How long `NCCL_SHRINK_ABORT` waits for the revoked comm's ops.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the comm's setup stands.
pub(crate) enum Setup {
    Running,
    Ready(Arc<Mesh>),
    Failed(NcclResult),
    /// Aborted or destroyed: the sockets are closed.
    Closed,
}

pub(crate) struct State {
    setup: Setup,
    aborted: bool,
    /// Ops end at once (`NCCL_SHRINK_ABORT`); the mesh stays up.
    revoked: bool,
    /// Shrinks of this comm still being set up: its async error reports
    /// in progress meanwhile, as NCCL's does for the parent of a child
    /// being made.
    shrinking: usize,
    /// Shrinks started so far: numbers each one's frames.
    shrinks: u64,
    async_error: Option<NcclResult>,
    inbox: Inbox,
    pending: usize,
    finalizing: bool,
    last_error: Option<&'static CStr>,
}

/// The part of a comm its mesh's reader threads hold.
pub(crate) struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cv.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    /// A frame from `peer` arrived.
    pub(crate) fn deliver(&self, peer: usize, tag: Tag, payload: Vec<u8>) {
        self.lock().inbox.push(peer, tag, payload);
        self.cv.notify_all();
    }

    /// Aborted or revoked: ops give up.
    pub(crate) fn is_aborted(&self) -> bool {
        let state = self.lock();
        state.aborted || state.revoked
    }
}

/// Why a receive ended without data.
pub(crate) enum RecvError {
    Aborted,
    /// The peer's frame was another op's; the comm's error is now set.
    Mismatch,
}

/// Per-comm counters that number ops and match frames.
struct Counters {
    ops: u64,
    collectives: u64,
    sends: Vec<u64>,
    recvs: Vec<u64>,
}

/// Which sequence an op's frames are numbered in.
pub(crate) enum Sequence {
    Collective,
    SendTo(usize),
    RecvFrom(usize),
}

/// An `ncclComm_t`.
pub(crate) struct Comm {
    pub(crate) nranks: usize,
    pub(crate) rank: usize,
    pub(crate) blocking: bool,
    /// The bootstrap nonce every rank of this comm shares (from the unique
    /// id, or derived from the parent's for a shrunk comm).
    pub(crate) nonce: u64,
    pub(crate) faults: RankFaults,
    /// Polls of the async error that report in-progress whatever the setup.
    inprogress_polls: u32,
    polls: AtomicU32,
    counters: Mutex<Counters>,
    pub(crate) shared: Arc<Shared>,
}

impl Comm {
    pub(crate) fn new(
        nranks: usize,
        rank: usize,
        blocking: bool,
        nonce: u64,
        faults: RankFaults,
        inprogress_polls: u32,
    ) -> Comm {
        Comm {
            nranks,
            rank,
            blocking,
            nonce,
            faults,
            inprogress_polls,
            polls: AtomicU32::new(0),
            counters: Mutex::new(Counters {
                ops: 0,
                collectives: 0,
                sends: vec![0; nranks],
                recvs: vec![0; nranks],
            }),
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    setup: Setup::Running,
                    aborted: false,
                    revoked: false,
                    shrinking: 0,
                    shrinks: 0,
                    async_error: None,
                    inbox: Inbox::new(nranks),
                    pending: 0,
                    finalizing: false,
                    last_error: None,
                }),
                cv: Condvar::new(),
            }),
        }
    }

    /// Numbers a new op: its index among the comm's ops, and its sequence
    /// number in `sequence`.
    pub(crate) fn next_op(&self, sequence: Sequence) -> (u64, u64) {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let index = c.ops;
        c.ops += 1;
        let counter = match sequence {
            Sequence::Collective => &mut c.collectives,
            Sequence::SendTo(peer) => &mut c.sends[peer],
            Sequence::RecvFrom(peer) => &mut c.recvs[peer],
        };
        let seq = *counter;
        *counter += 1;
        (index, seq)
    }

    /// Logs `text` as this comm's (and the process's) last error.
    pub(crate) fn set_last_error(&self, text: &str) {
        let interned = lasterror::set(text);
        self.shared.lock().last_error = Some(interned);
    }

    pub(crate) fn last_error(&self) -> Option<&'static CStr> {
        self.shared.lock().last_error
    }

    /// Records the setup's outcome (a mesh, or an error code and text).
    pub(crate) fn finish_setup(&self, outcome: Result<Mesh, (NcclResult, String)>) {
        let mut state = self.shared.lock();
        match outcome {
            Ok(mesh) if state.aborted => {
                mesh.close(Shutdown::Both);
                state.setup = Setup::Closed;
            }
            Ok(mesh) => state.setup = Setup::Ready(Arc::new(mesh)),
            Err(_) if state.aborted => state.setup = Setup::Closed,
            Err((code, text)) => {
                state.setup = Setup::Failed(code);
                state.last_error = Some(lasterror::set(&text));
            }
        }
        drop(state);
        self.shared.cv.notify_all();
    }

    /// Waits for the setup to end: success, its error, or in-progress if
    /// the comm was aborted first.
    pub(crate) fn wait_setup(&self) -> NcclResult {
        let mut state = self.shared.lock();
        loop {
            match state.setup {
                Setup::Ready(_) => return SUCCESS,
                Setup::Failed(code) => return code,
                Setup::Closed => return IN_PROGRESS,
                Setup::Running if state.aborted => return IN_PROGRESS,
                Setup::Running => state = self.shared.wait(state),
            }
        }
    }

    /// The mesh once the setup is done; `None` if the comm cannot run ops
    /// (aborted, setup failed, or an async error set).
    pub(crate) fn wait_ready(&self) -> Option<Arc<Mesh>> {
        let mut state = self.shared.lock();
        loop {
            if state.aborted || state.revoked || state.async_error.is_some() {
                return None;
            }
            match &state.setup {
                Setup::Ready(mesh) => return Some(Arc::clone(mesh)),
                Setup::Running => state = self.shared.wait(state),
                Setup::Failed(_) | Setup::Closed => return None,
            }
        }
    }

    /// Blocks until the comm is aborted or revoked (a hung op or setup).
    pub(crate) fn wait_aborted(&self) {
        let mut state = self.shared.lock();
        while !state.aborted && !state.revoked {
            state = self.shared.wait(state);
        }
    }

    /// Aborted or revoked: ops give up.
    pub(crate) fn is_aborted(&self) -> bool {
        self.shared.is_aborted()
    }

    /// Aborted or destroyed: its sockets are closed (a revoked comm is not).
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().aborted
    }

    /// Whether the comm may be shrunk, as NCCL's `ncclCommEnsureReady`
    /// decides: its setup done and no async error.
    pub(crate) fn ready_to_shrink(&self) -> Result<(), (NcclResult, &'static str)> {
        let state = self.shared.lock();
        match state.setup {
            Setup::Running => {
                return Err((crate::codes::INVALID_ARGUMENT, "its init has not finished"));
            }
            Setup::Failed(code) => return Err((code, "its init failed")),
            Setup::Closed => return Err((crate::codes::INVALID_ARGUMENT, "it was aborted")),
            Setup::Ready(_) => {}
        }
        if state.shrinking > 0 {
            return Err((
                crate::codes::INVALID_ARGUMENT,
                "a shrink of it is still in progress",
            ));
        }
        match state.async_error {
            Some(code) => Err((code, "it has an async error")),
            None => Ok(()),
        }
    }

    /// `NCCL_SHRINK_ABORT`: revokes the comm and waits, as NCCL waits for
    /// its device stream, until none of its ops is queued any more. NCCL's
    /// abort flag ends even a kernel stuck on a full connection; an op of
    /// this stand-in stuck in a socket write to a stopped peer does not
    /// see the flag, so the wait gives up after [`DRAIN_LIMIT`].
    pub(crate) fn revoke_and_drain(&self) {
        let deadline = std::time::Instant::now() + DRAIN_LIMIT;
        let mut state = self.shared.lock();
        state.revoked = true;
        self.shared.cv.notify_all();
        while state.pending > 0 && !state.aborted {
            let now = std::time::Instant::now();
            if now >= deadline {
                break;
            }
            state = self
                .shared
                .cv
                .wait_timeout(state, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Starts a shrink: its number, and the mesh to set the child up over.
    pub(crate) fn begin_shrink(&self) -> Option<(u64, Arc<Mesh>)> {
        let mut state = self.shared.lock();
        let Setup::Ready(mesh) = &state.setup else {
            return None;
        };
        let mesh = Arc::clone(mesh);
        let seq = state.shrinks;
        state.shrinks += 1;
        state.shrinking += 1;
        Some((seq, mesh))
    }

    /// A shrink ended: its error, if any, becomes the comm's async error
    /// (NCCL sets the parent's to the child job's result).
    pub(crate) fn end_shrink(&self, outcome: NcclResult, text: &str) {
        let mut state = self.shared.lock();
        state.shrinking = state.shrinking.saturating_sub(1);
        if outcome != SUCCESS && outcome != IN_PROGRESS {
            state.async_error.get_or_insert(outcome);
            state.last_error = Some(lasterror::set(text));
        }
        drop(state);
        self.shared.cv.notify_all();
    }

    /// Waits for shrink frame `seq` from `peer`, until this comm is closed
    /// or `stop` says so (checked every [`wire::POLL`]).
    pub(crate) fn recv_shrink(
        &self,
        peer: usize,
        seq: u64,
        stop: &dyn Fn() -> bool,
    ) -> Option<Vec<u8>> {
        loop {
            // `stop` may lock this comm too: called without the lock.
            if stop() {
                return None;
            }
            let mut state = self.shared.lock();
            if state.aborted {
                return None;
            }
            if let Some(payload) = state.inbox.take_shrink(peer, seq) {
                return Some(payload);
            }
            let _ = self.shared.cv.wait_timeout(state, wire::POLL);
        }
    }

    /// Sets the async error (the first one stays) and logs `text`.
    pub(crate) fn set_async_error(&self, code: NcclResult, text: &str) {
        let interned = lasterror::set(text);
        let mut state = self.shared.lock();
        state.last_error = Some(interned);
        state.async_error.get_or_insert(code);
        drop(state);
        self.shared.cv.notify_all();
    }

    /// Sends a frame to `peer` (to itself through the inbox). A write error
    /// is ignored: a peer that went away leaves its receivers waiting, as a
    /// hung NCCL would.
    pub(crate) fn send(&self, mesh: &Mesh, peer: usize, tag: Tag, payload: &[u8]) {
        if peer == self.rank {
            self.shared.deliver(peer, tag, payload.to_vec());
        } else {
            mesh.send(peer, tag, payload);
        }
    }

    /// Waits for the frame `expected` from `peer`, until abort.
    pub(crate) fn recv(&self, peer: usize, expected: Tag) -> Result<Vec<u8>, RecvError> {
        let mut state = self.shared.lock();
        loop {
            if state.aborted || state.revoked {
                return Err(RecvError::Aborted);
            }
            match state.inbox.take(peer, expected) {
                Some(Ok(payload)) => return Ok(payload),
                Some(Err(got)) => {
                    drop(state);
                    let text = format!(
                        "stand-in NCCL: mismatched collective: rank {} expected {} #{} \
                         (data type {}, {} bytes) from rank {peer}, got {} #{} (data type {}, {} bytes)",
                        self.rank,
                        kind_name(expected.kind),
                        expected.seq,
                        expected.dtype,
                        expected.len,
                        kind_name(got.kind),
                        got.seq,
                        got.dtype,
                        got.len,
                    );
                    self.set_async_error(INVALID_USAGE, &text);
                    return Err(RecvError::Mismatch);
                }
                None => state = self.shared.wait(state),
            }
        }
    }

    /// An op of this comm was put on a stream.
    pub(crate) fn begin_op(&self) {
        self.shared.lock().pending += 1;
    }

    /// An op of this comm left its stream (ran, or gave up).
    pub(crate) fn end_op(&self) {
        let mut state = self.shared.lock();
        state.pending = state.pending.saturating_sub(1);
        drop(state);
        self.shared.cv.notify_all();
    }

    /// `ncclCommGetAsyncError`.
    pub(crate) fn async_error(&self) -> NcclResult {
        let earlier_polls = self.polls.fetch_add(1, Ordering::Relaxed);
        let state = self.shared.lock();
        if matches!(state.setup, Setup::Running)
            || state.shrinking > 0
            || (!self.blocking && earlier_polls < self.inprogress_polls)
        {
            return IN_PROGRESS;
        }
        if let Setup::Failed(code) = state.setup {
            return code;
        }
        if let Some(code) = state.async_error {
            return code;
        }
        if state.finalizing && state.pending > 0 {
            return IN_PROGRESS;
        }
        SUCCESS
    }

    /// `ncclCommFinalize`: blocking comms wait for their queued ops;
    /// non-blocking ones report in-progress until then.
    pub(crate) fn finalize(&self) -> NcclResult {
        let mut state = self.shared.lock();
        state.finalizing = true;
        if !self.blocking {
            return IN_PROGRESS;
        }
        while state.pending > 0 && !state.aborted {
            state = self.shared.wait(state);
        }
        SUCCESS
    }

    /// `ncclCommAbort`: wakes every waiter, closes the sockets. Returns at
    /// once; ops and setup threads still holding the comm see the flag and
    /// give up without writing.
    pub(crate) fn abort(&self) {
        self.close(Shutdown::Both);
    }

    /// `ncclCommDestroy`: a clean close if no op is queued and the setup
    /// is over (the peers still read what was sent), else an abort.
    pub(crate) fn destroy(&self) {
        let busy = {
            let state = self.shared.lock();
            state.pending > 0 || matches!(state.setup, Setup::Running)
        };
        self.close(if busy {
            Shutdown::Both
        } else {
            Shutdown::Write
        });
    }

    fn close(&self, how: Shutdown) {
        let mut state = self.shared.lock();
        state.aborted = true;
        let setup = std::mem::replace(&mut state.setup, Setup::Closed);
        drop(state);
        self.shared.cv.notify_all();
        if let Setup::Ready(mesh) = setup {
            mesh.close(how);
        }
        // As NCCL joins a child's job when its parent is aborted: when
        // this returns, a shrink of this comm has ended and written its
        // `*newcomm` (NULL), so the caller may free it.
        let mut state = self.shared.lock();
        while state.shrinking > 0 {
            state = self.shared.wait(state);
        }
    }
}
