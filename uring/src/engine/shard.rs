//! One engine thread's ring (decision 0036): what an engine thread
//! (`shard_thread.rs`) submits its lanes' entries to.
//!
//! Such a ring is set up for one thread only: `SINGLE_ISSUER` (the kernel
//! refuses submissions from any other task), `DEFER_TASKRUN` (completion
//! work runs when that thread asks for completions, not as task work that
//! interrupts it), `COOP_TASKRUN` and `SUBMIT_ALL`, and its own descriptor
//! registered (each `io_uring_enter` skips the descriptor lookup). The
//! caller-driven ring of decision 0007 cannot take these flags: any waiting
//! thread submits to it. Threads wake each other's rings with `MSG_RING`: a
//! message is a completion posted straight into the target ring.
#![allow(unsafe_code)]

use io_uring::{CompletionQueue, IoUring, SubmissionQueue, Submitter, opcode, squeue, types};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// A ring set up for one thread; `Err` where the kernel refuses the flags
/// (before Linux 6.1) or io_uring itself.
pub(crate) fn shard_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .setup_submit_all()
        .build(entries)
}

/// A shard ring in use on the thread that made it. It borrows the ring,
/// so it cannot leave that thread's frame.
pub(crate) struct ShardIo<'a> {
    submitter: Submitter<'a>,
    sq: SubmissionQueue<'a>,
    cq: CompletionQueue<'a>,
    fd: RawFd,
    registered_fd: bool,
}

impl<'a> ShardIo<'a> {
    /// Takes `ring` for this thread and registers its descriptor (where the
    /// kernel cannot, enters go by the plain descriptor).
    pub(crate) fn new(ring: &'a mut IoUring) -> ShardIo<'a> {
        let fd = ring.as_raw_fd();
        let (mut submitter, sq, cq) = ring.split();
        let registered_fd = submitter.register_ring_fd().is_ok();
        ShardIo {
            submitter,
            sq,
            cq,
            fd,
            registered_fd,
        }
    }

    /// The ring's descriptor, which other rings' messages name.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    pub(crate) fn registered_fd(&self) -> bool {
        self.registered_fd
    }

    /// Queues `entry` (submitted by the next `wait` or `submit`).
    ///
    /// # Safety
    /// Memory `entry` names must stay valid until its last completion has
    /// been taken from this ring.
    pub(crate) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller's contract, passed on.
        if unsafe { self.sq.push(entry) }.is_err() {
            self.submit()?;
            // SAFETY: as above.
            unsafe { self.sq.push(entry) }
                .map_err(|_| io::Error::other("a shard ring's queue stayed full"))?;
        }
        Ok(())
    }

    /// Submits what is queued without waiting.
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        self.sq.sync();
        self.submitter.submit()?;
        self.sq.sync();
        Ok(())
    }

    /// Posts a completion of `user_data` and `result` into the ring of
    /// descriptor `target` (another thread's shard ring, or any ring).
    #[cfg(test)]
    pub(crate) fn message(&mut self, target: RawFd, user_data: u64, result: i32) -> io::Result<()> {
        // Its own completion is not wanted: only a failure would say
        // anything, and the target's completion is the message.
        let entry = opcode::MsgRingData::new(types::Fd(target), result, user_data, None)
            .build()
            .flags(squeue::Flags::SKIP_SUCCESS)
            .user_data(MESSAGE_SENT);
        // SAFETY: a MSG_RING entry names no memory of this process: a
        // descriptor and two integers, copied into the entry.
        unsafe { self.push(&entry) }?;
        self.submit()
    }

    /// Queues a message that posts the completion `(user_data, result,
    /// flags)` whole into the ring of descriptor `target` (flags passed
    /// through: Linux 6.3+). The message's own completion, here, carries
    /// `tag`: its result says whether it was delivered.
    pub(crate) fn forward(
        &mut self,
        target: RawFd,
        (user_data, result, flags): Completion,
        tag: u64,
    ) -> io::Result<()> {
        let entry = opcode::MsgRingData::new(types::Fd(target), result, user_data, Some(flags))
            .build()
            .user_data(tag);
        // SAFETY: a MSG_RING entry names no memory: a descriptor and three
        // integers, copied into the entry.
        unsafe { self.push(&entry) }
    }

    /// Submits what is queued, waits up to `timeout` for at least one
    /// completion and appends every completion there is to `out`, whether
    /// the wait failed or not (what came must not wait for the next). The
    /// wait's failure, else a failed `message` of this ring's own, comes
    /// back as an error.
    pub(crate) fn wait(&mut self, timeout: Duration, out: &mut Vec<Completion>) -> io::Result<()> {
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        self.sq.sync();
        let waited = match self.submitter.submit_with_args(1, &args) {
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => Err(e),
            _ => Ok(()),
        };
        self.sq.sync();
        self.cq.sync();
        let mut message_failed = None;
        for cqe in &mut self.cq {
            if cqe.user_data() == MESSAGE_SENT {
                message_failed.get_or_insert(io::Error::from_raw_os_error(-cqe.result()));
                continue;
            }
            out.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
        waited?;
        message_failed.map_or(Ok(()), Err)
    }
}

/// A completion as `(user_data, result, flags)`.
pub(crate) type Completion = (u64, i32, u32);

/// The `user_data` of this ring's own message entries (seen only when one
/// fails).
const MESSAGE_SENT: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    /// Waits for the next completion, failing the test after 10 s.
    fn next(io: &mut ShardIo<'_>, got: &mut Vec<Completion>) -> (u64, i32) {
        let until = Instant::now() + Duration::from_secs(10);
        while got.is_empty() {
            assert!(Instant::now() < until, "no completion in 10 s");
            io.wait(Duration::from_millis(100), got).unwrap();
        }
        let (user_data, result, _) = got.remove(0);
        (user_data, result)
    }

    #[test]
    fn two_shard_threads_wake_each_other_through_their_rings() {
        // Each thread makes its own ring; they trade descriptors, then
        // bounce a counter through MSG_RING, each message a completion in
        // the other's ring.
        let (to_b, from_a) = mpsc::channel::<RawFd>();
        let (to_a, from_b) = mpsc::channel::<RawFd>();
        let rounds = 200u64;
        let b = std::thread::spawn(move || {
            let mut ring = shard_ring(8).unwrap();
            let mut io = ShardIo::new(&mut ring);
            to_a.send(io.fd()).unwrap();
            let a = from_a.recv().unwrap();
            let mut got = Vec::new();
            for i in 0..rounds {
                let (user_data, result) = next(&mut io, &mut got);
                assert_eq!((user_data, result), (i, i as i32 * 2));
                io.message(a, user_data + 1000, result + 1).unwrap();
            }
            io.registered_fd()
        });
        let mut ring = shard_ring(8).unwrap();
        let mut io = ShardIo::new(&mut ring);
        to_b.send(io.fd()).unwrap();
        let b_fd = from_b.recv().unwrap();
        let mut got = Vec::new();
        for i in 0..rounds {
            io.message(b_fd, i, i as i32 * 2).unwrap();
            assert_eq!(next(&mut io, &mut got), (i + 1000, i as i32 * 2 + 1));
        }
        // Linux 6.18 here: every flag taken and the descriptors registered.
        assert!(io.registered_fd() && b.join().unwrap());
    }

    #[test]
    fn a_wait_with_nothing_to_complete_returns_after_its_timeout() {
        let mut ring = shard_ring(8).unwrap();
        let mut io = ShardIo::new(&mut ring);
        let mut got = Vec::new();
        io.wait(Duration::from_millis(30), &mut got).unwrap();
        assert!(got.is_empty());
    }

    #[test]
    fn a_message_to_a_descriptor_that_is_no_ring_fails() {
        let mut ring = shard_ring(8).unwrap();
        let mut io = ShardIo::new(&mut ring);
        let not_a_ring = std::fs::File::open("/dev/null").unwrap();
        io.message(not_a_ring.as_raw_fd(), 1, 0).unwrap();
        // A completion that comes with the failure is not held back by it.
        let nop = opcode::Nop::new().build().user_data(42);
        // SAFETY: a NOP names no memory.
        unsafe { io.push(&nop) }.unwrap();
        io.submit().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut got = Vec::new();
        let err = io.wait(Duration::from_millis(200), &mut got).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADFD), "{err}");
        assert_eq!(got, vec![(42, 0, 0)]);
    }
}
