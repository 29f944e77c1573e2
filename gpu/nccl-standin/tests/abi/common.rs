//! Test helpers: ranks as threads, and safe wrappers that enqueue a call on
//! the rank's stream and wait for it (so the buffers outlive the op).

use ringwire_nccl_standin::abi::*;
use ringwire_nccl_standin::codes::{DataType, IN_PROGRESS, RedOp, SUCCESS};
use std::ffi::{CStr, c_int, c_void};
use std::time::{Duration, Instant};

/// One rank: its comm and its own stream (handles kept as numbers, so the
/// value can move between threads).
pub(crate) struct Rank {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    comm: usize,
    stream: usize,
}

pub(crate) fn handle(addr: usize) -> *mut c_void {
    std::ptr::without_provenance_mut(addr)
}

pub(crate) fn unique_id() -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: a writable id.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, SUCCESS);
    id
}

/// `ncclCommInitRankConfig` (blocking or not): its result and handle.
pub(crate) fn init(id: NcclUniqueId, nranks: usize, rank: usize, blocking: bool) -> (c_int, usize) {
    let mut comm: NcclComm = std::ptr::null_mut();
    let mut config = NcclConfig {
        size: size_of::<NcclConfig>(),
        magic: CONFIG_MAGIC,
        version: 23007,
        blocking: if blocking { c_int::MIN } else { 0 },
        cga_cluster_size: c_int::MIN,
        min_ctas: c_int::MIN,
        max_ctas: c_int::MIN,
        net_name: std::ptr::null(),
        split_share: c_int::MIN,
    };
    // SAFETY: a writable handle and a config that outlives the call.
    let code = unsafe {
        ncclCommInitRankConfig(&mut comm, nranks as c_int, id, rank as c_int, &mut config)
    };
    (code, comm.addr())
}

pub(crate) fn new_stream() -> usize {
    let mut stream = std::ptr::null_mut();
    // SAFETY: a writable handle.
    assert_eq!(unsafe { standinStreamCreate(&mut stream) }, 0);
    stream.addr()
}

pub(crate) fn new_event() -> usize {
    let mut event = std::ptr::null_mut();
    // SAFETY: a writable handle.
    assert_eq!(unsafe { standinEventCreate(&mut event) }, 0);
    event.addr()
}

pub(crate) fn last_error(comm: usize) -> String {
    let text = ncclGetLastError(handle(comm));
    // SAFETY: the stand-in returns a NUL-terminated string that lives forever.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Polls the comm's async error until it is not in progress, or panics
/// after `within`.
pub(crate) fn poll_until_settled(comm: usize, within: Duration) -> c_int {
    let deadline = Instant::now() + within;
    loop {
        let state = async_error(comm);
        if state != IN_PROGRESS {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "still in progress after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn async_error(comm: usize) -> c_int {
    let mut state = -1;
    // SAFETY: a writable result.
    let code = unsafe { ncclCommGetAsyncError(handle(comm), &mut state) };
    assert_eq!(code, SUCCESS);
    state
}

/// Polls `done` until true, or panics after `within`.
pub(crate) fn wait_for(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Rank {
    /// A blocking init and a new stream.
    pub(crate) fn init(id: NcclUniqueId, nranks: usize, rank: usize) -> Rank {
        let (code, comm) = init(id, nranks, rank, true);
        assert_eq!(code, SUCCESS, "init of rank {rank}: {}", last_error(0));
        Rank {
            rank,
            nranks,
            comm,
            stream: new_stream(),
        }
    }

    /// A rank around an existing comm, with a new stream.
    pub(crate) fn from_comm(comm: usize, nranks: usize, rank: usize) -> Rank {
        Rank {
            rank,
            nranks,
            comm,
            stream: new_stream(),
        }
    }

    pub(crate) fn comm(&self) -> NcclComm {
        handle(self.comm)
    }

    pub(crate) fn comm_addr(&self) -> usize {
        self.comm
    }

    pub(crate) fn stream(&self) -> *mut c_void {
        handle(self.stream)
    }

    pub(crate) fn sync(&self) {
        assert_eq!(standinStreamSynchronize(self.stream()), 0);
    }

    pub(crate) fn destroy(self) {
        assert_eq!(ncclCommDestroy(self.comm()), SUCCESS);
        assert_eq!(standinStreamDestroy(self.stream()), 0);
    }

    /// The async error, as `async_error`.
    pub(crate) fn async_error(&self) -> c_int {
        async_error(self.comm)
    }

    /// Runs `call` with `mem`'s base address, then waits for the stream.
    fn run(
        &self,
        mem: &mut [u8],
        ranges: &[(usize, usize)],
        call: impl FnOnce(*mut u8) -> c_int,
    ) -> c_int {
        for &(at, len) in ranges {
            assert!(
                at + len <= mem.len(),
                "range {at}+{len} outside {}",
                mem.len()
            );
        }
        let code = call(mem.as_mut_ptr());
        self.sync();
        code
    }

    /// `ncclAllReduce` from `mem[send..]` to `mem[recv..]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_reduce(
        &self,
        mem: &mut [u8],
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        op: RedOp,
    ) -> c_int {
        let len = count * dtype.size();
        self.run(mem, &[(send, len), (recv, len)], |base| {
            // SAFETY: both ranges lie in `mem`, borrowed until `run` has
            // waited for the stream.
            unsafe {
                ncclAllReduce(
                    base.add(send).cast(),
                    base.add(recv).cast(),
                    count,
                    dtype as c_int,
                    op as c_int,
                    self.comm(),
                    self.stream(),
                )
            }
        })
    }

    pub(crate) fn broadcast(
        &self,
        mem: &mut [u8],
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> c_int {
        let len = count * dtype.size();
        self.run(mem, &[(send, len), (recv, len)], |base| {
            // SAFETY: as in `all_reduce`.
            unsafe {
                ncclBroadcast(
                    base.add(send).cast(),
                    base.add(recv).cast(),
                    count,
                    dtype as c_int,
                    root as c_int,
                    self.comm(),
                    self.stream(),
                )
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &self,
        mem: &mut [u8],
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
    ) -> c_int {
        let len = count * dtype.size();
        self.run(mem, &[(send, len), (recv, len)], |base| {
            // SAFETY: as in `all_reduce`.
            unsafe {
                ncclReduce(
                    base.add(send).cast(),
                    base.add(recv).cast(),
                    count,
                    dtype as c_int,
                    op as c_int,
                    root as c_int,
                    self.comm(),
                    self.stream(),
                )
            }
        })
    }

    pub(crate) fn all_gather(
        &self,
        mem: &mut [u8],
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
    ) -> c_int {
        let len = count * dtype.size();
        self.run(mem, &[(send, len), (recv, len * self.nranks)], |base| {
            // SAFETY: as in `all_reduce`.
            unsafe {
                ncclAllGather(
                    base.add(send).cast(),
                    base.add(recv).cast(),
                    count,
                    dtype as c_int,
                    self.comm(),
                    self.stream(),
                )
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce_scatter(
        &self,
        mem: &mut [u8],
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        op: RedOp,
    ) -> c_int {
        let len = count * dtype.size();
        self.run(mem, &[(send, len * self.nranks), (recv, len)], |base| {
            // SAFETY: as in `all_reduce`.
            unsafe {
                ncclReduceScatter(
                    base.add(send).cast(),
                    base.add(recv).cast(),
                    count,
                    dtype as c_int,
                    op as c_int,
                    self.comm(),
                    self.stream(),
                )
            }
        })
    }

    /// One group of sends and receives of bytes within `mem`.
    pub(crate) fn group(&self, mem: &mut [u8], calls: &[P2p]) -> c_int {
        let ranges: Vec<(usize, usize)> = calls.iter().map(|c| (c.at, c.len)).collect();
        self.run(mem, &ranges, |base| {
            assert_eq!(ncclGroupStart(), SUCCESS);
            for c in calls {
                let ptr = base.wrapping_add(c.at).cast::<c_void>();
                let u8 = DataType::Uint8 as c_int;
                // SAFETY: each range lies in `mem`, borrowed until `run` has
                // waited for the stream.
                let code = unsafe {
                    if c.send {
                        ncclSend(ptr, c.len, u8, c.peer as c_int, self.comm(), self.stream())
                    } else {
                        ncclRecv(ptr, c.len, u8, c.peer as c_int, self.comm(), self.stream())
                    }
                };
                assert_eq!(code, SUCCESS);
            }
            ncclGroupEnd()
        })
    }
}

/// A send or receive of `len` bytes at `at`.
pub(crate) struct P2p {
    pub(crate) send: bool,
    pub(crate) peer: usize,
    pub(crate) at: usize,
    pub(crate) len: usize,
}

/// Runs `f` on `nranks` threads, one rank each (blocking init, own
/// stream), then destroys them.
pub(crate) fn run_ranks<T: Send>(nranks: usize, f: impl Fn(&Rank) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let f = &f;
        let ranks: Vec<_> = (0..nranks)
            .map(|rank| {
                s.spawn(move || {
                    let r = Rank::init(id, nranks, rank);
                    let out = f(&r);
                    r.destroy();
                    out
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Held by tests that log errors or read the process's last error (it is
/// one string for the whole process, and tests run in parallel).
pub(crate) static PROCESS_ERRORS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn lock_process_errors() -> std::sync::MutexGuard<'static, ()> {
    PROCESS_ERRORS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes this thread's comm inits see `spec` as the fault variable.
pub(crate) fn set_faults(spec: &str) {
    ringwire_nccl_standin::envcfg::set_thread_override(
        ringwire_nccl_standin::envcfg::FAULT,
        Some(spec),
    );
}

/// Enqueues an all-reduce of `count` f32 from `send` into `recv` without
/// waiting.
///
/// # Safety
/// Both buffers must stay valid until the rank's stream has passed the op.
pub(crate) unsafe fn all_reduce_async(r: &Rank, send: &[u8], recv: &mut [u8]) -> c_int {
    let count = send.len() / 4;
    assert_eq!(recv.len(), send.len());
    // SAFETY: the caller's contract.
    unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            count,
            DataType::Float32 as c_int,
            RedOp::Sum as c_int,
            r.comm(),
            r.stream(),
        )
    }
}

/// Records a new event on the rank's stream.
pub(crate) fn record(r: &Rank) -> usize {
    let event = new_event();
    assert_eq!(standinEventRecord(handle(event), r.stream()), 0);
    event
}

pub(crate) fn event_done(event: usize) -> bool {
    standinEventQuery(handle(event)) == 0
}
