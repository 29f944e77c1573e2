//! The public API: [`Communicator`] and its collectives.
//!
//! A communicator owns one executor thread. Each call checks its arguments,
//! takes the next sequence number, queues a job and returns a
//! [`PendingCollective`] at once; the executor runs jobs strictly in
//! submission order (the order every rank must call them in), so any number
//! of ops may be in flight and awaited in any order.

use crate::algo::{self, Step};
use crate::buffer::{Buffer, CollectiveBuffer};
use crate::config::Tunables;
use crate::error::{Error, OpContext};
use crate::exec::{self, OpSignature, Traffic};
use crate::pending::{CellPool, PendingCollective, queued};
use crate::recorder::{FlightRecorder, OpRecord};
use crate::rendezvous::World;
use crate::runner::{Help, Runner};
use crate::stats::{Stats, StatsRecorder};
use crate::wire::OpKind;
use crate::{Element, ReduceOp};
use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// What the executor thread owns.
struct Executor {
    world: Arc<World>,
    rank: usize,
    comm_id: u64,
    members: Arc<Vec<usize>>,
    tunables: Tunables,
    state: Arc<Mutex<Option<String>>>,
    stats: Arc<StatsRecorder>,
    recorder: Arc<FlightRecorder>,
    size: usize,
    /// The schedule of the op running now, kept between ops (one op runs
    /// at a time per communicator).
    steps: Mutex<Vec<Step>>,
    /// Work space of ops that must not touch their input (reduce-scatter,
    /// reduce on non-roots, all-to-all), kept between ops up to
    /// `KEPT_SCRATCH_BYTES`; 8-byte words so it can hold any element type.
    scratch: Mutex<Vec<u64>>,
    /// Per-rank counts of even all-to-alls, reused.
    counts: Mutex<Vec<usize>>,
    /// Scratch of `algo::pace` (a second step list, a mark per rank),
    /// reused.
    pacing: Mutex<(Vec<Step>, Vec<u8>)>,
}

/// Scratch space kept between ops; larger work spaces are freed after use.
const KEPT_SCRATCH_BYTES: usize = 64 << 20;

struct Queue {
    next_seq: u64,
    /// Point-to-point sequence numbers per (peer, is_send).
    p2p_seq: HashMap<(usize, bool), u64>,
}

struct Inner {
    world: Arc<World>,
    rank: usize,
    size: usize,
    comm_id: u64,
    members: Arc<Vec<usize>>,
    tunables: Tunables,
    queue: Mutex<Queue>,
    runner: Arc<Runner<Executor>>,
    /// Handle-and-job cells for reuse (owned-buffer ops allocate nothing).
    cells: Arc<CellPool>,
    failed: Arc<Mutex<Option<String>>>,
    stats: Arc<StatsRecorder>,
    /// Registered for the process's metrics while this lives.
    metrics: Arc<crate::metrics::Source>,
    recorder: Arc<FlightRecorder>,
    splits: Mutex<u64>,
    executor: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue lets the executor finish what was submitted (each
        // op bounded by its timeout) and exit; joining it means no thread
        // outlives the communicator.
        self.runner.close();
        if let Some(handle) = lock(&self.executor).take() {
            let _ = handle.join();
        }
        // Nothing runs on this communicator any more: what peers sent for
        // it (a program whose ranks disagree) would otherwise stay.
        self.world.transport.forget(self.comm_id);
        self.world.transport.forget(debug_comm_id(self.comm_id));
    }
}

impl crate::runner::Context for Executor {
    fn idle(&self) {
        self.world.transport.release();
    }

    fn home_core(&self) -> Option<usize> {
        self.world.home_core
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A group of ranks that run collectives together.
///
/// Cheap to clone (clones share the group and its op order); `Send + Sync`.
/// Every rank must call the same collectives in the same order with matching
/// arguments; a rank that does not gets an error naming both sides.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
    timeout: Duration,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.rank)
            .field("world_size", &self.inner.size)
            .field("comm_id", &format_args!("{:016x}", self.inner.comm_id))
            .finish()
    }
}

/// The description of one op, before it runs.
struct OpPlan {
    kind: OpKind,
    dtype: crate::DType,
    count: u64,
    reduce_op: Option<ReduceOp>,
    root: u32,
    /// Whether every rank passes the same count (then frames check it).
    uniform_count: bool,
}

/// What a job gets to run its schedule.
struct Ctx<'a> {
    ex: &'a Executor,
    sig: OpSignature,
    op: OpContext,
    started: Instant,
    timeout: Duration,
    traffic: Traffic,
    /// The op's schedule is paced (decision 0024); its body decides.
    pace: bool,
}

impl Ctx<'_> {
    /// Runs `steps` on `input` (read only) followed by `work`; see
    /// [`exec::run`].
    fn run<T: Element>(
        &mut self,
        steps: &[Step],
        input: &[T],
        work: &mut [T],
    ) -> Result<(), Error> {
        exec::run(
            &*self.ex.world.transport,
            &self.ex.members,
            &self.sig,
            &self.op,
            steps,
            input,
            work,
            self.started,
            self.timeout,
            &mut self.traffic,
        )
    }

    /// Elements per frame for dtype `T`.
    fn chunk<T: Element>(&self) -> usize {
        (self.ex.tunables.chunk_bytes / size_of::<T>()).max(1)
    }

    /// Builds the op's schedule (`build` gets an empty step list and the
    /// chunk length) in the executor's reused list and runs it on `work`:
    /// no allocation once the list has grown.
    fn run_schedule<T: Element>(
        &mut self,
        work: &mut [T],
        build: impl FnOnce(&mut Vec<Step>, usize),
    ) -> Result<(), Error> {
        self.run_schedule_from(&[], work, build)
    }

    /// [`Ctx::run_schedule`] for a schedule whose first `input.len()`
    /// elements are `input`, which its sends read in place.
    fn run_schedule_from<T: Element>(
        &mut self,
        input: &[T],
        work: &mut [T],
        build: impl FnOnce(&mut Vec<Step>, usize),
    ) -> Result<(), Error> {
        let ex = self.ex;
        with_kept(
            &ex.steps,
            |_| true,
            |steps| {
                steps.clear();
                build(steps, self.chunk::<T>());
                if self.pace {
                    with_kept(
                        &ex.pacing,
                        |_| true,
                        |(spare, marks)| algo::pace(steps, spare, marks, ex.size, input.len()),
                    );
                }
                self.run(steps, input, work)
            },
        )
    }

    /// Runs `f` on a work space of `len` elements (contents unspecified),
    /// reused between ops.
    fn with_scratch<T: Element, R>(
        &mut self,
        len: usize,
        f: impl FnOnce(&mut Self, &mut [T]) -> R,
    ) -> R {
        let ex = self.ex;
        let small_enough = |words: &Vec<u64>| words.len() * 8 <= KEPT_SCRATCH_BYTES;
        with_kept(&ex.scratch, small_enough, |words| {
            let bytes = len * size_of::<T>();
            if words.len() * 8 < bytes {
                words.resize(bytes.div_ceil(8), 0);
            }
            let work = <[T]>::mut_from_bytes(&mut words.as_mut_bytes()[..bytes])
                .expect("8-byte words hold any element type");
            f(self, work)
        })
    }

    fn rank_and_size(&self) -> (usize, usize) {
        (self.ex.rank, self.ex.size)
    }

    fn small<T: Element>(&self, work: &[T]) -> bool {
        size_of_val(work) < self.ex.tunables.small_message_bytes
    }
}

// ---- op bodies over borrowed slices: shared by the queued (owned-buffer)
// forms and the blocking slice forms run in place ----

fn invalid(op: OpKind, detail: String) -> Error {
    Error::InvalidArgument { op, detail }
}

fn all_reduce_body<T: Element>(
    cx: &mut Ctx<'_>,
    data: &mut [T],
    op: ReduceOp,
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let (n, small) = (data.len(), cx.small(data));
    // Where ranks share cores, every op is CPU-bound: a tree reduce and
    // broadcast moves 2(p-1) frames against doubling's p*log2(p) (decision
    // 0013). Every rank agreed on `crowded_anywhere` at rendezvous.
    let tree = small && cx.ex.world.crowded_anywhere;
    // Mid sizes where some link is TCP: halving-doubling (decision 0022).
    // Every rank agreed on `tcp_anywhere` at rendezvous.
    let halving = algo::all_reduce_halving_pays(size, size_of_val(data), cx.ex.world.tcp_anywhere);
    cx.run_schedule(data, |steps, chunk| {
        if halving {
            algo::all_reduce_halving(steps, rank, size, n, chunk)
        } else if tree {
            algo::all_reduce_tree(steps, rank, size, n, chunk)
        } else if small {
            algo::all_reduce_doubling(steps, rank, size, n, chunk)
        } else {
            algo::all_reduce_ring(steps, rank, size, n, chunk)
        }
    })?;
    if op == ReduceOp::Avg {
        T::finish_avg(data, size);
    }
    Ok(())
}

fn broadcast_body<T: Element>(cx: &mut Ctx<'_>, data: &mut [T], root: usize) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let (n, small) = (data.len(), cx.small(data));
    // Where ranks share cores, the root waits for each receiver's word
    // (decision 0024). Every rank agreed on `crowded_anywhere` at rendezvous.
    cx.pace = algo::pacing_pays(cx.ex.world.crowded_anywhere, size_of_val(data));
    cx.run_schedule(data, |steps, chunk| {
        if small {
            algo::broadcast_tree(steps, rank, size, root, n, chunk)
        } else {
            algo::broadcast_chain(steps, rank, size, root, n, chunk)
        }
    })
}

fn reduce_body<T: Element>(
    cx: &mut Ctx<'_>,
    data: &mut [T],
    root: usize,
    op: ReduceOp,
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let n = data.len();
    // Large messages take the chain where it pays: its root receives and
    // reduces the buffer once, a tree's ceil(log2 p) times.
    let chain = !cx.small(data) && algo::reduce_chain_pays(size, n, cx.chunk::<T>());
    // A tree's leaves wait for their parents' word where ranks share cores
    // (decision 0024; a chain gained nothing).
    cx.pace = !chain && algo::pacing_pays(cx.ex.world.crowded_anywhere, size_of_val(data));
    if rank == root {
        cx.run_schedule(data, |steps, chunk| match chain {
            true => algo::reduce_chain(steps, rank, size, root, n, chunk),
            false => algo::reduce_tree(steps, rank, size, root, n, chunk),
        })?;
        if op == ReduceOp::Avg {
            T::finish_avg(data, size);
        }
    } else {
        // The caller's buffer is read in place and comes back as it was:
        // partial results pass through one chunk's slot (a leaf never
        // touches it; see `algo::reduce_tree_from` and `reduce_chain_from`).
        cx.with_scratch(cx.chunk::<T>().min(n), |cx, work: &mut [T]| {
            cx.run_schedule_from(data, work, |steps, chunk| match chain {
                true => algo::reduce_chain_from(steps, rank, size, root, n, chunk),
                false => algo::reduce_tree_from(steps, rank, size, root, n, chunk),
            })
        })?;
    }
    Ok(())
}

fn all_gather_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    output: &mut [T],
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let n = input.len();
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    cx.run_schedule(output, |steps, chunk| {
        algo::all_gather_ring(steps, rank, size, n, chunk)
    })
}

fn gather_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    output: &mut [T],
    root: usize,
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let n = input.len();
    // Large blocks to a root of 3+ ranks come when asked (decision 0023).
    let in_turn = algo::gather_in_turn_pays(size, size_of_val(input));
    let build =
        |steps: &mut Vec<Step>, chunk| algo::gather(steps, (rank, size, root), n, chunk, in_turn);
    if rank != root {
        // Sends read the input in place; nothing lands here.
        return cx.run_schedule_from(input, &mut [], build);
    }
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    cx.run_schedule(output, build)
}

fn scatter_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    output: &mut [T],
    root: usize,
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let n = output.len();
    let build = |steps: &mut Vec<Step>, chunk| algo::scatter(steps, rank, size, root, n, chunk);
    // The root waits for each rank's word where ranks share cores (decision
    // 0024), by the op's whole size, the same on every rank.
    cx.pace = algo::pacing_pays(cx.ex.world.crowded_anywhere, size_of_val(output) * size);
    if rank != root {
        return cx.run_schedule(output, build);
    }
    output.copy_from_slice(&input[rank * n..(rank + 1) * n]);
    cx.run_schedule_from(input, &mut [], build)
}

fn reduce_scatter_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    output: &mut [T],
    op: ReduceOp,
) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    let n = input.len();
    let mine = algo::block(n, size, rank);
    // The input stays as it is: each block is first combined with it as it
    // arrives (`algo::reduce_scatter_ring_from`). Two ranks reduce only their
    // own block, straight into the output. More also forward the other
    // blocks, chunk by chunk through one slot at the output's tail
    // (`algo::reduce_scatter_ring_into`), so they need no work space either.
    if size == 1 {
        output.copy_from_slice(input);
    } else if size == 2 {
        cx.run_schedule_from(input, output, |steps, chunk| {
            algo::reduce_scatter_ring_from(steps, rank, size, n, chunk, |_| n..n + mine.len())
        })?;
    } else {
        let (slot, work_len) = algo::reduce_scatter_slot(n, size, rank, cx.chunk::<T>());
        let build = |steps: &mut Vec<Step>, chunk| {
            algo::reduce_scatter_ring_into(steps, rank, size, n, chunk, slot)
        };
        if work_len == mine.len() {
            cx.run_schedule_from(input, output, build)?;
        } else {
            // An output shorter than a chunk: it and the slot in scratch.
            cx.with_scratch(work_len, |cx, work: &mut [T]| {
                cx.run_schedule_from(input, work, build)?;
                output.copy_from_slice(&work[..mine.len()]);
                Ok::<(), Error>(())
            })?;
        }
    }
    if op == ReduceOp::Avg {
        T::finish_avg(output, size);
    }
    Ok(())
}

fn all_to_all_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    send_counts: &[usize],
    output: &mut [T],
    recv_counts: &[usize],
) -> Result<(), Error> {
    let rank = cx.ex.rank;
    // The schedule addresses the input, then the output (see
    // `algo::all_to_all_v`): sends read the input where it is and receives
    // land in the output, so only this rank's own block is copied.
    let own_in: usize = send_counts[..rank].iter().sum();
    let own_out: usize = recv_counts[..rank].iter().sum();
    let own = send_counts[rank]; // equal to recv_counts[rank] (checked)
    output[own_out..own_out + own].copy_from_slice(&input[own_in..own_in + own]);
    cx.run_schedule_from(input, output, |steps, chunk| {
        algo::all_to_all_v(steps, rank, send_counts, recv_counts, chunk)
    })
}

/// All-to-all with `input.len() / size` elements to and from every rank
/// (the counts list is the communicator's, reused).
fn all_to_all_even_body<T: Element>(
    cx: &mut Ctx<'_>,
    input: &[T],
    output: &mut [T],
) -> Result<(), Error> {
    let ex = cx.ex;
    with_kept(
        &ex.counts,
        |_| true,
        |counts| {
            counts.clear();
            counts.resize(ex.size, input.len() / ex.size);
            all_to_all_body(cx, input, counts, output, counts)
        },
    )
}

/// Runs `f` on the value kept in `slot` (taken out, so `f` may run ops
/// that lock nothing of it) and puts it back if `keep` says so; one op runs
/// at a time per communicator, so the slot is never contended.
fn with_kept<V: Default, R>(
    slot: &Mutex<V>,
    keep: impl Fn(&V) -> bool,
    f: impl FnOnce(&mut V) -> R,
) -> R {
    let mut value = std::mem::take(&mut *lock(slot));
    let result = f(&mut value);
    if keep(&value) {
        *lock(slot) = value;
    }
    result
}

fn barrier_body(cx: &mut Ctx<'_>) -> Result<(), Error> {
    let (rank, size) = cx.rank_and_size();
    cx.run_schedule::<u8>(&mut [], |steps, _| algo::barrier(steps, rank, size))
}

impl Communicator {
    pub(crate) fn start(world: Arc<World>, tunables: Tunables) -> Result<Communicator, Error> {
        let members: Vec<usize> = (0..world.size).collect();
        let rank = world.rank;
        let comm_id = world.job_id;
        Communicator::start_group(world, tunables, rank, comm_id, Arc::new(members))
    }

    fn start_group(
        world: Arc<World>,
        tunables: Tunables,
        rank: usize,
        comm_id: u64,
        members: Arc<Vec<usize>>,
    ) -> Result<Communicator, Error> {
        let failed = Arc::new(Mutex::new(None));
        let stats = Arc::new(StatsRecorder::default());
        let recorder = Arc::new(FlightRecorder::new(tunables.flight_recorder_ops));
        let runner = Arc::new(Runner::new(Executor {
            world: world.clone(),
            rank,
            comm_id,
            members: members.clone(),
            tunables: tunables.clone(),
            state: failed.clone(),
            stats: stats.clone(),
            recorder: recorder.clone(),
            size: members.len(),
            steps: Mutex::new(Vec::new()),
            scratch: Mutex::new(Vec::new()),
            counts: Mutex::new(Vec::new()),
            pacing: Mutex::default(),
        }));
        // The executor's poll between jobs only saves a wake-up when jobs
        // come back to back; a long one would crowd the ranks' cores.
        let spin = tunables.spin.min(EXECUTOR_SPIN);
        let executor = runner.clone();
        let handle = std::thread::Builder::new()
            .name(format!("ringwire-exec-{}", world.rank))
            .spawn(move || executor.executor_loop(spin))
            .map_err(|e| Error::io("starting the executor thread", e))?;
        let timeout = tunables.timeout;
        let metrics = crate::metrics::Source::register(
            world.clone(),
            rank,
            comm_id,
            members.clone(),
            stats.clone(),
        );
        Ok(Communicator {
            inner: Arc::new(Inner {
                world,
                rank,
                size: members.len(),
                comm_id,
                members,
                tunables,
                runner,
                cells: CellPool::new(),
                queue: Mutex::new(Queue {
                    next_seq: 0,
                    p2p_seq: HashMap::new(),
                }),
                failed,
                stats,
                metrics,
                recorder,
                splits: Mutex::new(0),
                executor: Mutex::new(Some(handle)),
            }),
            timeout,
        })
    }

    /// This process's rank in the communicator, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.inner.size
    }

    /// This process's rank among the job's processes on its host, for
    /// picking a device or a core: from the launcher when it gives both
    /// the local rank and the local world size (torchrun's `LOCAL_RANK`
    /// and `LOCAL_WORLD_SIZE`, Open MPI's, PMI's `MPI_LOCALRANKID` and
    /// `MPI_LOCALNRANKS`; not Slurm, which gives no local size), or from
    /// [`Builder::local_ranks`](crate::Builder::local_ranks); else `None`.
    /// A property of the process: the same in every communicator it is in.
    pub fn local_rank(&self) -> Option<usize> {
        self.inner.world.local.map(|(rank, _)| rank)
    }

    /// How many of the job's processes run on this host, known when
    /// [`Communicator::local_rank`] is; else `None`.
    pub fn local_world_size(&self) -> Option<usize> {
        self.inner.world.local.map(|(_, size)| size)
    }

    /// The name of the transport carrying this communicator's data.
    pub fn transport_name(&self) -> &'static str {
        self.inner.world.transport.name()
    }

    /// What carries this rank's link to `peer` (a rank of this
    /// communicator): `"unix"` for a rank on the same host (see
    /// [`crate::LocalLinks`]), `"tcp"` otherwise; `None` until the link is
    /// made (on first use) or after it failed.
    pub fn link_kind(&self, peer: usize) -> Option<&'static str> {
        let world_rank = *self.inner.members.get(peer)?;
        self.inner.world.transport.link_kind(world_rank)
    }

    /// Whether this rank's link to `peer` carries the payloads of large
    /// frames (1 MiB and up) on two one-way lanes beside its connection:
    /// TCP links of the io_uring engine do unless told not to (see
    /// [`crate::Builder::tcp_lanes`]). False until the link is made.
    pub fn link_has_lanes(&self, peer: usize) -> bool {
        self.inner
            .members
            .get(peer)
            .is_some_and(|&r| self.inner.world.transport.link_has_lanes(r))
    }

    /// A handle to the same communicator whose ops use `timeout` instead of
    /// the configured default. Ops queue in one order whichever handle
    /// submits them.
    pub fn with_timeout(&self, timeout: Duration) -> Communicator {
        Communicator {
            inner: self.inner.clone(),
            timeout,
        }
    }

    /// The per-op timeout of this handle.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A zeroed buffer for collectives: ordinary heap memory today, as fast
    /// as a `Vec<T>` of the same length (the engine registers its own
    /// staging buffers, not the caller's).
    pub fn alloc<T: Element>(&self, len: usize) -> Buffer<T> {
        Buffer::zeroed(len)
    }

    /// Op count, bytes moved and latency percentiles so far.
    pub fn stats(&self) -> Stats {
        let (held, peak) = self.inner.world.transport.held_ahead();
        Stats {
            held_ahead_bytes: held as u64,
            held_ahead_peak_bytes: peak as u64,
            inboxes: self.inner.world.transport.inboxes() as u64,
            ..self.inner.stats.snapshot()
        }
    }

    /// This communicator's metrics in the Prometheus text format (version
    /// 0.0.4, [`crate::metrics::CONTENT_TYPE`]): ops, payload bytes and a
    /// latency histogram per op kind, failures per kind of error, bytes
    /// held ahead, inboxes, and each link's kind, every series labelled
    /// with this `rank` and the communicator id (`comm`). Set
    /// `RINGWIRE_METRICS_ADDR` to have every live communicator served at
    /// `/metrics` instead ([`crate::metrics`]).
    pub fn metrics(&self) -> String {
        crate::metrics::encode(vec![self.inner.metrics.sample()])
    }

    /// Fails this communicator on purpose, here and on every rank: their
    /// running and future ops end with [`Error::Aborted`] naming this rank
    /// and `reason`; this rank's with [`Error::Failed`].
    pub fn abort(&self, reason: &str) {
        let seq = lock(&self.inner.queue).next_seq;
        let why = format!("rank {} called abort(): {reason}", self.inner.rank);
        lock(&self.inner.failed).get_or_insert_with(|| why.clone());
        self.inner
            .world
            .transport
            .abort(self.inner.comm_id, seq, &why, &self.inner.members);
    }

    /// The address this rank accepts links on (the port it published).
    pub fn listen_addr(&self) -> std::net::SocketAddr {
        self.inner.world.transport.listen_addr()
    }

    /// The last ops of this communicator (RINGWIRE_FLIGHT_RECORDER_OPS, 64 by
    /// default), oldest first: what ran, when, and how it ended.
    pub fn flight_record(&self) -> Vec<OpRecord> {
        self.inner.recorder.records()
    }

    /// [`Communicator::flight_record`] as a table, as logged when an op fails.
    pub fn dump_flight_record(&self) -> String {
        self.inner.recorder.dump(self.inner.rank, self.inner.size)
    }

    /// The error that failed this communicator, if one did: this rank's
    /// own, or else an abort another rank sent (which fails this rank's
    /// next op), as "aborted by world rank R at its op #S: reason". Cheap
    /// enough to poll: a GPU communicator's watchdog does.
    pub fn failure(&self) -> Option<String> {
        if let Some(own) = lock(&self.inner.failed).clone() {
            return Some(own);
        }
        self.inner
            .world
            .transport
            .abort_notice(self.inner.comm_id)
            .map(|(origin, seq, reason)| {
                format!("aborted by world rank {origin} at its op #{seq}: {reason}")
            })
    }

    /// Whether RINGWIRE_DEBUG=detail (or `Builder::debug_checks`) is on:
    /// ops check that every rank called the same collective first.
    pub fn debug_checks(&self) -> bool {
        self.inner.tunables.debug_checks
    }

    /// Stops taking ops and lets the queued ones finish, like torch's
    /// `destroy_process_group` (call it on every rank): ops submitted
    /// before it still run, so every rank's op order stays whole, and the
    /// returned handle completes once the last of them has ended. Ops
    /// submitted afterwards, on this handle or any clone, fail with
    /// [`Error::ShutDown`]. Dropping the communicator then returns at once;
    /// dropping the last clone with ops still queued instead blocks the
    /// dropping thread until they end (each bounded by its timeout), which
    /// async code should not do: `comm.shutdown().await` first. A second
    /// call's handle is complete at once.
    pub fn shutdown(&self) -> PendingCollective<()> {
        let helper: Arc<dyn Help> = self.inner.runner.clone();
        let (handle, last) = queued(
            OpKind::None,
            self.inner.tunables.spin,
            helper,
            &self.inner.cells,
            |_: &Executor| Ok(()),
        );
        // Under the queue lock, so no op is numbered and queued after it.
        let _queue = lock(&self.inner.queue);
        if self.inner.runner.push_last(last) {
            handle
        } else {
            PendingCollective::ready(Ok(()))
        }
    }

    /// Queues `job`; `p2p` says which peers a point-to-point op sends to
    /// and receives from (they count their sequence numbers per peer pair).
    fn submit<R: Send + 'static>(
        &self,
        plan: OpPlan,
        p2p: Option<P2p>,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error> + Send + 'static,
    ) -> PendingCollective<R> {
        let helper: Arc<dyn Help> = self.inner.runner.clone();
        // Large ops start on the executor at once; a small one is usually
        // run by its waiter (see `runner`).
        let urgent = plan.count * plan.dtype.size() as u64 >= LATENCY_BOUND_BYTES;
        let mut queue = lock(&self.inner.queue);
        let kind = plan.kind;
        let ticket = self.ticket(&mut queue, plan, p2p);
        let (seq, peer) = (ticket.seq, ticket.peer);
        let (handle, queued_job) = queued(
            kind,
            self.inner.tunables.spin,
            helper,
            &self.inner.cells,
            move |ex: &Executor| execute(ex, ticket, job),
        );
        // Under the queue lock, so jobs queue in sequence order. Refused
        // after `shutdown`: the dropped job fails the handle.
        if !self.inner.runner.push(queued_job, urgent) {
            let why = "not run: communicator shut down".to_string();
            self.inner.recorder.ended(kind, seq, peer, Some(why));
        }
        handle
    }

    /// [`Communicator::submit`] for a plan that passed its argument checks;
    /// a handle that has already failed with the check's error otherwise.
    fn submit_checked<R: Send + 'static>(
        &self,
        plan: Result<OpPlan, Error>,
        p2p: Option<P2p>,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error> + Send + 'static,
    ) -> PendingCollective<R> {
        match plan {
            Ok(plan) => self.submit(plan, p2p, job),
            Err(e) => PendingCollective::ready(Err(e)),
        }
    }

    /// Runs `job` on the calling thread right away if this communicator has
    /// nothing queued or running (the blocking forms: no job box, no
    /// handle, and the caller's slices are used in place); `None`, without
    /// calling `job`, if it is busy.
    fn run_now<R>(
        &self,
        plan: OpPlan,
        job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error>,
    ) -> Option<Result<R, Error>> {
        let mut queue = lock(&self.inner.queue);
        let claim = self.inner.runner.claim()?;
        let ticket = self.ticket(&mut queue, plan, None);
        drop(queue);
        let result = execute(claim.context(), ticket, job);
        drop(claim);
        Some(result)
    }

    /// Numbers an op (under the queue lock) and records it as queued.
    fn ticket(&self, queue: &mut Queue, plan: OpPlan, p2p: Option<P2p>) -> Ticket {
        let mut count = |key: (usize, bool)| {
            let s = queue.p2p_seq.entry(key).or_insert(0);
            *s += 1;
            *s
        };
        // A receive's frames carry the sender's count, matched here; an
        // exchange is numbered as its receive, its send carries its own.
        let (seq, send_seq, peer, from) = match p2p {
            None => {
                queue.next_seq += 1;
                (queue.next_seq, None, None, None)
            }
            Some(P2p::Send(to)) => (count((to, true)), None, Some(to), None),
            Some(P2p::Recv(from)) => (count((from, false)), None, Some(from), Some(from)),
            Some(P2p::Exchange { to, from }) => {
                let send_seq = count((to, true));
                (count((from, false)), Some(send_seq), Some(from), Some(from))
            }
        };
        self.inner.recorder.queued(
            plan.kind,
            seq,
            plan.dtype.name(),
            plan.count,
            plan.count * plan.dtype.size() as u64,
            peer,
        );
        Ticket {
            plan,
            seq,
            peer,
            receives_from: from.map(|p| self.inner.members[p]),
            send_seq,
            timeout: self.timeout,
        }
    }

    fn plan<T: Element>(&self, kind: OpKind, count: usize) -> OpPlan {
        OpPlan {
            kind,
            dtype: T::DTYPE,
            count: count as u64,
            reduce_op: None,
            root: 0,
            uniform_count: true,
        }
    }

    /// The plan of a rooted op, once `root` is checked to be a rank.
    fn rooted_plan<T: Element>(&self, op: OpKind, n: usize, root: usize) -> Result<OpPlan, Error> {
        if root >= self.inner.size {
            return Err(Error::InvalidArgument {
                op,
                detail: format!(
                    "root {root} is not a rank of this communicator (size {})",
                    self.inner.size
                ),
            });
        }
        let mut plan = self.plan::<T>(op, n);
        plan.root = root as u32;
        Ok(plan)
    }

    /// Element-wise reduction of `buf` across all ranks; every rank gets the
    /// result in its buffer.
    ///
    /// Small buffers use recursive doubling (a tree reduce and broadcast
    /// where some host runs more ranks than it has cores, see
    /// [`Builder::local_ranks`](crate::Builder::local_ranks)), large ones the
    /// pipelined ring (see `RINGWIRE_SMALL_MESSAGE_BYTES`). Every rank ends
    /// with the same bits.
    pub fn all_reduce<T: Element, B: CollectiveBuffer<T>>(
        &self,
        mut buf: B,
        op: ReduceOp,
    ) -> PendingCollective<B> {
        let plan = self.all_reduce_plan::<T>(buf.as_slice().len(), op);
        self.submit(plan, None, move |cx| {
            all_reduce_body(cx, buf.as_mut_slice(), op)?;
            Ok(buf)
        })
    }

    fn all_reduce_plan<T: Element>(&self, n: usize, op: ReduceOp) -> OpPlan {
        let mut plan = self.plan::<T>(OpKind::AllReduce, n);
        plan.reduce_op = Some(op);
        plan
    }

    /// Copies `root`'s buffer into every rank's buffer (all ranks pass a
    /// buffer of the same length).
    pub fn broadcast<T: Element, B: CollectiveBuffer<T>>(
        &self,
        mut buf: B,
        root: usize,
    ) -> PendingCollective<B> {
        self.submit_checked(
            self.broadcast_plan::<T>(buf.as_slice().len(), root),
            None,
            move |cx| {
                broadcast_body(cx, buf.as_mut_slice(), root)?;
                Ok(buf)
            },
        )
    }

    fn broadcast_plan<T: Element>(&self, n: usize, root: usize) -> Result<OpPlan, Error> {
        self.rooted_plan::<T>(OpKind::Broadcast, n, root)
    }

    /// Reduces every rank's buffer into `root`'s. Other ranks' buffers come
    /// back unchanged.
    pub fn reduce<T: Element, B: CollectiveBuffer<T>>(
        &self,
        mut buf: B,
        root: usize,
        op: ReduceOp,
    ) -> PendingCollective<B> {
        self.submit_checked(
            self.reduce_plan::<T>(buf.as_slice().len(), root, op),
            None,
            move |cx| {
                reduce_body(cx, buf.as_mut_slice(), root, op)?;
                Ok(buf)
            },
        )
    }

    fn reduce_plan<T: Element>(
        &self,
        n: usize,
        root: usize,
        op: ReduceOp,
    ) -> Result<OpPlan, Error> {
        let mut plan = self.rooted_plan::<T>(OpKind::Reduce, n, root)?;
        plan.reduce_op = Some(op);
        Ok(plan)
    }

    /// Gathers every rank's `input` into `output`, in rank order:
    /// `output.len()` must be `input.len() * world_size()`.
    pub fn all_gather<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        mut output: O,
    ) -> PendingCollective<(B, O)> {
        self.submit_checked(
            self.all_gather_plan::<T>(input.as_slice().len(), output.as_slice().len()),
            None,
            move |cx| {
                all_gather_body(cx, input.as_slice(), output.as_mut_slice())?;
                Ok((input, output))
            },
        )
    }

    fn all_gather_plan<T: Element>(&self, n: usize, out: usize) -> Result<OpPlan, Error> {
        let size = self.inner.size;
        if out != n * size {
            return Err(invalid(
                OpKind::AllGather,
                format!(
                    "output has {out} elements but must have input length {n} x world size {size} = {}",
                    n * size
                ),
            ));
        }
        Ok(self.plan::<T>(OpKind::AllGather, n))
    }

    /// Gathers every rank's `input` into `root`'s `output`, in rank order.
    /// Every rank passes an input of the same length; at the root `output`
    /// must hold `input.len() * world_size()` elements. Other ranks'
    /// `output` is not touched: pass an empty buffer (or one of the root's
    /// length, so every rank can run the same code). The root receives
    /// from every other rank directly; with 3+ ranks and blocks of
    /// [`GATHER_IN_TURN_BYTES`](crate::GATHER_IN_TURN_BYTES) or more it
    /// asks each in turn, so a rank's op then completes only once the root
    /// has reached it (decision 0023).
    pub fn gather<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        mut output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        let (n, out) = (input.as_slice().len(), output.as_slice().len());
        self.submit_checked(self.gather_plan::<T>(n, out, root), None, move |cx| {
            gather_body(cx, input.as_slice(), output.as_mut_slice(), root)?;
            Ok((input, output))
        })
    }

    fn gather_plan<T: Element>(&self, n: usize, out: usize, root: usize) -> Result<OpPlan, Error> {
        let plan = self.rooted_plan::<T>(OpKind::Gather, n, root)?;
        self.check_root_buffer(OpKind::Gather, ("output", "input"), out, n, root)?;
        Ok(plan)
    }

    /// Sends block r of `root`'s `input` to rank r's `output`: every rank
    /// passes an output of the same length, and at the root `input` must
    /// hold `output.len() * world_size()` elements. Other ranks' `input`
    /// is not read: pass an empty buffer (or one of the root's length).
    /// The root sends to every other rank directly.
    pub fn scatter<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        mut output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        let (ins, n) = (input.as_slice().len(), output.as_slice().len());
        self.submit_checked(self.scatter_plan::<T>(ins, n, root), None, move |cx| {
            scatter_body(cx, input.as_slice(), output.as_mut_slice(), root)?;
            Ok((input, output))
        })
    }

    fn scatter_plan<T: Element>(&self, ins: usize, n: usize, root: usize) -> Result<OpPlan, Error> {
        let plan = self.rooted_plan::<T>(OpKind::Scatter, n, root)?;
        self.check_root_buffer(OpKind::Scatter, ("input", "output"), ins, n, root)?;
        Ok(plan)
    }

    /// Checks the length of a gather's output or a scatter's input (`what`,
    /// `len` elements) against the `n` elements of the other buffer (`per`)
    /// of every rank: at the root it must hold every rank's block;
    /// elsewhere it is not used, and may be empty or of the root's length.
    fn check_root_buffer(
        &self,
        op: OpKind,
        (what, per): (&str, &str),
        len: usize,
        n: usize,
        root: usize,
    ) -> Result<(), Error> {
        let (size, rank) = (self.inner.size, self.inner.rank);
        let whole = n * size;
        if len == whole || (rank != root && len == 0) {
            return Ok(());
        }
        let detail = match rank == root {
            true => format!(
                "{what} has {len} elements but at the root must have {per} length {n} x world size {size} = {whole}"
            ),
            false => format!(
                "{what} has {len} elements; rank {rank} is not the root ({root}), so it must be \
                 empty or have the root's {per} length {n} x world size {size} = {whole}"
            ),
        };
        Err(invalid(op, detail))
    }

    /// Reduces `input` across ranks and leaves block `rank()` of the result
    /// in `output`. Blocks split `input.len()` as evenly as possible, the
    /// first `len % world_size` ranks getting one extra element; see
    /// [`Communicator::block_len`]. `input` comes back unchanged.
    pub fn reduce_scatter<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        mut output: O,
        op: ReduceOp,
    ) -> PendingCollective<(B, O)> {
        let (n, out) = (input.as_slice().len(), output.as_slice().len());
        self.submit_checked(self.reduce_scatter_plan::<T>(n, out, op), None, move |cx| {
            reduce_scatter_body(cx, input.as_slice(), output.as_mut_slice(), op)?;
            Ok((input, output))
        })
    }

    fn reduce_scatter_plan<T: Element>(
        &self,
        n: usize,
        out: usize,
        op: ReduceOp,
    ) -> Result<OpPlan, Error> {
        let (size, rank) = (self.inner.size, self.inner.rank);
        let mine = algo::block(n, size, rank).len();
        if out != mine {
            return Err(invalid(
                OpKind::ReduceScatter,
                format!(
                    "output has {out} elements but rank {rank}'s block of {n} over {size} ranks has {mine}"
                ),
            ));
        }
        let mut plan = self.plan::<T>(OpKind::ReduceScatter, n);
        plan.reduce_op = Some(op);
        Ok(plan)
    }

    /// The length of rank `rank`'s block when `len` elements are
    /// reduce-scattered over this communicator; 0 for a rank not in it
    /// (`rank >= world_size()`).
    pub fn block_len(&self, len: usize, rank: usize) -> usize {
        if rank >= self.inner.size {
            return 0;
        }
        algo::block(len, self.inner.size, rank).len()
    }

    /// Sends block j of `input` to rank j and receives rank j's block for
    /// this rank into block j of `output`; blocks are `input.len() /
    /// world_size()` elements (which must divide evenly, and `output` must be
    /// as long as `input`).
    pub fn all_to_all<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        mut output: O,
    ) -> PendingCollective<(B, O)> {
        let (n, out) = (input.as_slice().len(), output.as_slice().len());
        self.submit_checked(self.all_to_all_even_plan::<T>(n, out), None, move |cx| {
            all_to_all_even_body(cx, input.as_slice(), output.as_mut_slice())?;
            Ok((input, output))
        })
    }

    fn all_to_all_even_plan<T: Element>(&self, n: usize, out: usize) -> Result<OpPlan, Error> {
        let size = self.inner.size;
        if n % size != 0 || out != n {
            return Err(invalid(
                OpKind::AllToAll,
                format!(
                    "input has {n} elements and output {out}: both must be equal and divisible by the world size {size} \
                     (use all_to_all_v for uneven splits)"
                ),
            ));
        }
        let mut plan = self.plan::<T>(OpKind::AllToAll, n);
        plan.uniform_count = false;
        Ok(plan)
    }

    /// All-to-all with uneven splits: `send_counts[j]` elements of `input`
    /// (consecutively, in rank order) go to rank j, and `recv_counts[j]`
    /// elements from rank j land in `output` in rank order. Rank j's
    /// `send_counts[i]` must equal rank i's `recv_counts[j]`.
    pub fn all_to_all_v<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        send_counts: &[usize],
        mut output: O,
        recv_counts: &[usize],
    ) -> PendingCollective<(B, O)> {
        let (ins, outs) = (input.as_slice().len(), output.as_slice().len());
        let plan = self.all_to_all_plan::<T>(ins, send_counts, outs, recv_counts);
        let (send_counts, recv_counts) = (send_counts.to_vec(), recv_counts.to_vec());
        self.submit_checked(plan, None, move |cx| {
            all_to_all_body(
                cx,
                input.as_slice(),
                &send_counts,
                output.as_mut_slice(),
                &recv_counts,
            )?;
            Ok((input, output))
        })
    }

    fn all_to_all_plan<T: Element>(
        &self,
        ins: usize,
        send_counts: &[usize],
        outs: usize,
        recv_counts: &[usize],
    ) -> Result<OpPlan, Error> {
        let (size, rank) = (self.inner.size, self.inner.rank);
        let bad = |detail: String| Err(invalid(OpKind::AllToAll, detail));
        if send_counts.len() != size || recv_counts.len() != size {
            return bad(format!(
                "send_counts and recv_counts need one entry per rank ({size})"
            ));
        }
        let (sum_send, sum_recv) = (
            send_counts.iter().sum::<usize>(),
            recv_counts.iter().sum::<usize>(),
        );
        if sum_send != ins || sum_recv != outs {
            return bad(format!(
                "send_counts sum to {sum_send} (input has {ins}); recv_counts sum to {sum_recv} (output has {outs})"
            ));
        }
        if send_counts[rank] != recv_counts[rank] {
            return bad(format!(
                "this rank sends itself {} elements but expects {}",
                send_counts[rank], recv_counts[rank]
            ));
        }
        let mut plan = self.plan::<T>(OpKind::AllToAll, ins);
        plan.uniform_count = false;
        Ok(plan)
    }

    /// Completes on each rank once every rank has entered the barrier.
    pub fn barrier(&self) -> PendingCollective<()> {
        self.submit(self.plan::<u8>(OpKind::Barrier, 0), None, barrier_body)
    }

    /// Sends `buf` to rank `peer`, which must call [`Communicator::recv`]
    /// with a buffer of the same length and type. Sends and receives between
    /// one pair of ranks match in the order they are called.
    pub fn send<T: Element, B: CollectiveBuffer<T>>(
        &self,
        mut buf: B,
        peer: usize,
    ) -> PendingCollective<B> {
        if let Some(e) = self.check_peer(OpKind::SendRecv, peer) {
            return PendingCollective::ready(Err(e));
        }
        let n = buf.as_slice().len();
        self.submit(
            self.plan::<T>(OpKind::SendRecv, n),
            Some(P2p::Send(peer)),
            move |cx| {
                cx.run_schedule(buf.as_mut_slice(), |steps, chunk| {
                    algo::send(steps, peer, n, chunk)
                })?;
                Ok(buf)
            },
        )
    }

    /// Receives into `buf` what rank `peer` sends with [`Communicator::send`].
    pub fn recv<T: Element, B: CollectiveBuffer<T>>(
        &self,
        mut buf: B,
        peer: usize,
    ) -> PendingCollective<B> {
        if let Some(e) = self.check_peer(OpKind::SendRecv, peer) {
            return PendingCollective::ready(Err(e));
        }
        let n = buf.as_slice().len();
        // The sender's frames carry its send counter for this pair, which
        // matches this side's receive counter.
        self.submit(
            self.plan::<T>(OpKind::SendRecv, n),
            Some(P2p::Recv(peer)),
            move |cx| {
                cx.run_schedule(buf.as_mut_slice(), |steps, chunk| {
                    algo::recv(steps, peer, n, chunk)
                })?;
                Ok(buf)
            },
        )
    }

    /// Sends `send` to rank `to` and receives into `recv` what rank `from`
    /// sends, as one op (MPI's `Sendrecv`): the pair a pipeline stage or a
    /// halo exchange needs, safe however large when both sides call it at
    /// once. (A `send` then `recv` on both sides waits until the timeout
    /// once the messages pass the run-ahead limit, because a
    /// communicator's ops run in order; decision 0019.) Its send matches
    /// a [`Communicator::recv`] or `send_recv` on `to`, its receive a
    /// [`Communicator::send`] or `send_recv` on `from`; `to` and `from`
    /// may be the same rank, and the lengths may differ.
    pub fn send_recv<T: Element, S: CollectiveBuffer<T>, R: CollectiveBuffer<T>>(
        &self,
        send: S,
        to: usize,
        mut recv: R,
        from: usize,
    ) -> PendingCollective<(S, R)> {
        if let Some(e) = self
            .check_peer(OpKind::SendRecv, to)
            .or_else(|| self.check_peer(OpKind::SendRecv, from))
        {
            return PendingCollective::ready(Err(e));
        }
        let (n_send, n_recv) = (send.as_slice().len(), recv.as_slice().len());
        self.submit(
            self.plan::<T>(OpKind::SendRecv, n_send + n_recv),
            Some(P2p::Exchange { to, from }),
            move |cx| {
                // Frames from `from` are of an op begun here, so they are
                // read while this sends, whatever the run-ahead limit.
                cx.sig.send_count = Some(n_send as u64);
                cx.sig.count = Some(n_recv as u64);
                cx.run_schedule_from(send.as_slice(), recv.as_mut_slice(), |steps, chunk| {
                    algo::exchange(steps, to, n_send, from, n_recv, chunk)
                })?;
                Ok((send, recv))
            },
        )
    }

    fn check_peer(&self, op: OpKind, peer: usize) -> Option<Error> {
        if peer >= self.inner.size || peer == self.inner.rank {
            return Some(Error::InvalidArgument {
                op,
                detail: format!(
                    "peer {peer} must be another rank of this communicator (this is rank {} of {})",
                    self.inner.rank, self.inner.size
                ),
            });
        }
        None
    }

    // ---- blocking forms over borrowed slices ----
    //
    // When nothing else of this communicator is queued or running (the
    // usual case for blocking code), the op runs right here on the caller's
    // slices: no copies in or out, no allocation. Otherwise it queues
    // behind the others on copies of the slices.

    /// Blocking [`Communicator::all_reduce`] on a borrowed slice.
    pub fn all_reduce_slice<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<(), Error> {
        let plan = self.all_reduce_plan::<T>(data.len(), op);
        if let Some(done) = self.run_now(plan, |cx| all_reduce_body(cx, data, op)) {
            return done;
        }
        let out = self.all_reduce(data.to_vec(), op).wait()?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::broadcast`] on a borrowed slice.
    pub fn broadcast_slice<T: Element>(&self, data: &mut [T], root: usize) -> Result<(), Error> {
        let plan = self.broadcast_plan::<T>(data.len(), root)?;
        if let Some(done) = self.run_now(plan, |cx| broadcast_body(cx, data, root)) {
            return done;
        }
        let out = self.broadcast(data.to_vec(), root).wait()?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::reduce`] on a borrowed slice.
    pub fn reduce_slice<T: Element>(
        &self,
        data: &mut [T],
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let plan = self.reduce_plan::<T>(data.len(), root, op)?;
        if let Some(done) = self.run_now(plan, |cx| reduce_body(cx, data, root, op)) {
            return done;
        }
        let out = self.reduce(data.to_vec(), root, op).wait()?;
        data.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::all_gather`] on borrowed slices.
    pub fn all_gather_slice<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let plan = self.all_gather_plan::<T>(input.len(), output.len())?;
        if let Some(done) = self.run_now(plan, |cx| all_gather_body(cx, input, output)) {
            return done;
        }
        let (_, out) = self
            .all_gather(input.to_vec(), vec![T::default(); output.len()])
            .wait()?;
        output.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::gather`] on borrowed slices.
    pub fn gather_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<(), Error> {
        let plan = self.gather_plan::<T>(input.len(), output.len(), root)?;
        if let Some(done) = self.run_now(plan, |cx| gather_body(cx, input, output, root)) {
            return done;
        }
        // Queued behind other ops, on copies; only the root's output is
        // written (and copied back), as in place.
        let room = if self.inner.rank == root {
            output.len()
        } else {
            0
        };
        let (_, out) = self
            .gather(input.to_vec(), vec![T::default(); room], root)
            .wait()?;
        if self.inner.rank == root {
            output.copy_from_slice(&out);
        }
        Ok(())
    }

    /// Blocking [`Communicator::scatter`] on borrowed slices.
    pub fn scatter_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<(), Error> {
        let plan = self.scatter_plan::<T>(input.len(), output.len(), root)?;
        if let Some(done) = self.run_now(plan, |cx| scatter_body(cx, input, output, root)) {
            return done;
        }
        // Queued behind other ops, on copies; only the root's input is read.
        let input = if self.inner.rank == root {
            input.to_vec()
        } else {
            Vec::new()
        };
        let (_, out) = self
            .scatter(input, vec![T::default(); output.len()], root)
            .wait()?;
        output.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::reduce_scatter`] on borrowed slices.
    pub fn reduce_scatter_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        let plan = self.reduce_scatter_plan::<T>(input.len(), output.len(), op)?;
        if let Some(done) = self.run_now(plan, |cx| reduce_scatter_body(cx, input, output, op)) {
            return done;
        }
        let (_, out) = self
            .reduce_scatter(input.to_vec(), vec![T::default(); output.len()], op)
            .wait()?;
        output.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Communicator::all_to_all`] on borrowed slices.
    pub fn all_to_all_slice<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        let plan = self.all_to_all_even_plan::<T>(input.len(), output.len())?;
        if let Some(done) = self.run_now(plan, |cx| all_to_all_even_body(cx, input, output)) {
            return done;
        }
        let (_, out) = self
            .all_to_all(input.to_vec(), vec![T::default(); output.len()])
            .wait()?;
        output.copy_from_slice(&out);
        Ok(())
    }

    // ---- sub-groups ----

    /// Splits the communicator like `MPI_Comm_split`: ranks passing the same
    /// `color` form a new communicator, ordered by `key` (ties by current
    /// rank). `None` opts out and gets `None`. Collective: every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>, Error> {
        let size = self.inner.size;
        let mine = [color.map_or(-1, i64::from), key];
        let (_, all) = self
            .all_gather(mine.to_vec(), vec![0i64; 2 * size])
            .wait()?;
        let split_index = {
            let mut s = lock(&self.inner.splits);
            *s += 1;
            *s
        };
        let Some(color) = color else {
            return Ok(None);
        };
        let mut group: Vec<(i64, usize)> = (0..size)
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        group.sort();
        let members: Vec<usize> = group.iter().map(|&(_, r)| self.inner.members[r]).collect();
        let rank = group
            .iter()
            .position(|&(_, r)| r == self.inner.rank)
            .expect("this rank passed `color`, so it is in its own group");
        let comm_id = mix(mix(self.inner.comm_id, split_index), u64::from(color));
        Communicator::start_group(
            self.inner.world.clone(),
            self.inner.tunables.clone(),
            rank,
            comm_id,
            Arc::new(members),
        )
        .map(|mut c| {
            c.timeout = self.timeout;
            Some(c)
        })
    }
}

/// A numbered op, ready to run.
struct Ticket {
    plan: OpPlan,
    seq: u64,
    peer: Option<usize>,
    /// A point-to-point receive's source (world rank).
    receives_from: Option<usize>,
    /// An exchange's send number (its `seq` is its receive's).
    send_seq: Option<u64>,
    timeout: Duration,
}

/// Whom a point-to-point op sends to and receives from (ranks of the
/// communicator).
#[derive(Clone, Copy, Debug)]
enum P2p {
    Send(usize),
    Recv(usize),
    Exchange { to: usize, from: usize },
}

/// Ops below this many bytes are latency-bound: queued, they do not wake
/// the executor (their waiter usually runs them, decision 0008), and on a
/// crowded host they run from a home core. Larger ones wake the executor at
/// once, so work nobody waits for yet starts before anyone does. (Which
/// algorithm an op uses is `small_message_bytes`, a separate threshold.)
const LATENCY_BOUND_BYTES: u64 = 64 << 10;

/// The executor polls at most this long after a job for the next one
/// (`RINGWIRE_SPIN_US` may be longer: it is sized for waits on peers).
const EXECUTOR_SPIN: Duration = Duration::from_micros(200);

/// Restores the thread's home core when an op that cleared it ends.
struct HomeCleared(Option<usize>);

impl Drop for HomeCleared {
    fn drop(&mut self) {
        ringwire_uring::set_home_core(self.0);
    }
}

/// Runs one op on the calling thread (the executor, or a caller running it
/// itself) with everything around it: the failed-communicator check, the
/// flight record, the span, debug signature checks, stats, and on failure
/// who is missing, the abort flood and the flight-record dump.
fn execute<R>(
    ex: &Executor,
    ticket: Ticket,
    job: impl FnOnce(&mut Ctx<'_>) -> Result<R, Error>,
) -> Result<R, Error> {
    let Ticket {
        plan,
        seq,
        peer,
        receives_from,
        send_seq,
        timeout,
    } = ticket;
    if let Some(first) = lock(&ex.state).clone() {
        ex.recorder.ended(
            plan.kind,
            seq,
            peer,
            Some("not run: communicator failed".into()),
        );
        let refused = Error::Failed { first };
        ex.stats.failed(&refused);
        return Err(refused);
    }
    ex.recorder.started(plan.kind, seq, peer);
    // Peers' frames for this op stop counting as run ahead (decision 0019).
    // A send receives nothing, and its number counts sends to one peer, not
    // collectives: it begins nothing.
    let sends_only = peer.is_some() && receives_from.is_none();
    if !sends_only {
        ex.world.transport.begin(ex.comm_id, seq, receives_from);
    }
    // On a crowded host (more local ranks than cores) a home core steadies
    // latency-bound ops (no two ranks of a recursive-doubling round stacked
    // on one core), but large ones ran faster where the scheduler put them
    // (measured, docs/perf.md): drop the home for the op.
    let bytes = plan.count * plan.dtype.size() as u64;
    let _placement = (ex.world.crowded && bytes >= LATENCY_BOUND_BYTES)
        .then(|| HomeCleared(ringwire_uring::set_home_core(None)));
    let span = tracing::debug_span!(
        "collective",
        op = %plan.kind,
        seq,
        rank = ex.rank,
        bytes
    );
    let _entered = span.enter();
    let mut ctx = Ctx {
        ex,
        sig: OpSignature {
            comm_id: ex.comm_id,
            seq,
            op: plan.kind,
            dtype: plan.dtype,
            reduce_op: plan.reduce_op,
            root: plan.root,
            count: plan.uniform_count.then_some(plan.count),
            send_seq,
            send_count: None,
        },
        op: OpContext {
            op: plan.kind,
            seq,
            dtype: plan.dtype.name(),
            count: plan.count,
            rank: ex.rank,
        },
        started: Instant::now(),
        timeout,
        traffic: Traffic::default(),
        pace: false,
    };
    let mut result = match (ex.tunables.debug_checks && peer.is_none())
        .then(|| check_signature(&mut ctx, &plan))
    {
        Some(Err(e)) => Err(e),
        // A panic (a bug of ringwire's, or of a caller's buffer type) must
        // not leave the peers waiting in step with an op this rank dropped:
        // it fails the communicator as an internal error would.
        _ => panic::catch_unwind(AssertUnwindSafe(|| job(&mut ctx))).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(Error::Internal {
                ctx: ctx.op.clone(),
                detail: format!(
                    "the op panicked (in ringwire or in the caller's buffer type): {what}"
                ),
            })
        }),
    };
    if let Err(Error::Timeout {
        ctx: op_ctx,
        peer,
        waited,
        detail,
    }) = result
    {
        // After what the op said (a send's "to take a frame").
        let detail = detail + &who_is_missing(ex, seq);
        result = Err(Error::Timeout {
            ctx: op_ctx,
            peer,
            waited,
            detail,
        });
    } else if result.as_ref().is_err_and(Error::is_fatal) {
        // Ranks that failed otherwise did reach the op: say so, for the
        // ranks that time out.
        report_progress(ex, seq);
    }
    ex.recorder.ended(
        plan.kind,
        seq,
        peer,
        result.as_ref().err().map(ToString::to_string),
    );
    match &result {
        Ok(_) => {
            ex.stats
                .record(plan.kind, ctx.started.elapsed(), ctx.traffic);
            tracing::debug!(
                elapsed_us = ctx.started.elapsed().as_micros() as u64,
                "done"
            );
        }
        Err(e) => {
            ex.stats.failed(e);
            tracing::error!(error = %e, "collective failed");
            if e.is_fatal() {
                lock(&ex.state).get_or_insert_with(|| e.to_string());
                // Tell every rank, not only the neighbours of the failure,
                // so none waits for its timeout.
                ex.world
                    .transport
                    .abort(ex.comm_id, seq, &e.to_string(), &ex.members);
                dump_flight_record(ex);
            }
        }
    }
    result
}

/// The communicator id debug signature checks exchange their frames on.
fn debug_comm_id(comm_id: u64) -> u64 {
    mix(comm_id, 0xDEB6)
}

/// RINGWIRE_DEBUG=detail: before each collective, the ranks all-gather the
/// op's signature and compare, so a mismatch is named precisely (kind, type,
/// count, reduce op, root) before any data moves.
fn check_signature(cx: &mut Ctx<'_>, plan: &OpPlan) -> Result<(), Error> {
    let ex = cx.ex;
    let (rank, size) = (ex.rank, ex.size);
    let count = if plan.uniform_count {
        plan.count as i64
    } else {
        -1
    };
    let reduce = plan.reduce_op.map_or(0, |r| r as i64);
    let mine = [
        plan.kind as i64,
        plan.dtype as i64,
        count,
        reduce,
        i64::from(plan.root),
        cx.sig.seq as i64,
    ];
    let mut all = vec![0i64; mine.len() * size];
    all[rank * mine.len()..(rank + 1) * mine.len()].copy_from_slice(&mine);
    let sig = OpSignature {
        comm_id: debug_comm_id(ex.comm_id),
        seq: cx.sig.seq,
        op: plan.kind,
        dtype: crate::DType::I64,
        reduce_op: None,
        root: 0,
        count: Some(mine.len() as u64),
        send_seq: None,
        send_count: None,
    };
    // Its frames go on a communicator of their own: begun like any op's, or
    // they would count as run ahead for ever (decision 0019).
    ex.world.transport.begin(sig.comm_id, sig.seq, None);
    let steps = algo::schedule(|o| algo::all_gather_ring(o, rank, size, mine.len(), mine.len()));
    exec::run(
        &*ex.world.transport,
        &ex.members,
        &sig,
        &cx.op,
        &steps,
        &[],
        &mut all,
        cx.started,
        cx.timeout,
        &mut cx.traffic,
    )?;
    let describe = |s: &[i64]| {
        let kind = OpKind::from_u8(s[0] as u8).map_or("?", OpKind::name);
        let dtype = crate::DType::from_u8(s[1] as u8).map_or("?", crate::DType::name);
        let mut d = format!("{kind}({dtype}, ");
        d += &if s[2] < 0 {
            "uneven counts".to_string()
        } else {
            s[2].to_string()
        };
        if let Some(r) = ReduceOp::from_u8(s[3] as u8) {
            d += &format!(", {r}");
        }
        if matches!(
            OpKind::from_u8(s[0] as u8),
            Some(OpKind::Broadcast | OpKind::Reduce | OpKind::Gather | OpKind::Scatter)
        ) {
            d += &format!(", root {}", s[4]);
        }
        d + &format!(") as op #{}", s[5])
    };
    for r in 0..size {
        let theirs = &all[r * mine.len()..(r + 1) * mine.len()];
        if theirs != mine {
            return Err(Error::Mismatch {
                ctx: cx.op.clone(),
                peer: r,
                detail: format!(
                    "rank {rank} called {} but rank {r} called {}",
                    describe(&mine),
                    describe(theirs)
                ),
            });
        }
    }
    Ok(())
}

/// After a timeout: which ranks reached op `seq`? Each rank that times out
/// posts how far it got to the store; ranks that post nothing within a
/// moment are hung, stopped or dead (like torch's monitored_barrier).
fn who_is_missing(ex: &Executor, seq: u64) -> String {
    let Some((store, prefix)) = &ex.world.store else {
        return String::new();
    };
    let key = |r: usize| progress_key(prefix, ex.comm_id, r);
    if !report_progress(ex, seq) {
        return String::new();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut behind: Vec<String>;
    loop {
        behind = Vec::new();
        for r in (0..ex.size).filter(|&r| r != ex.rank) {
            match store.try_get(&key(r)) {
                Ok(Some(v)) => {
                    let theirs: u64 = String::from_utf8_lossy(&v).parse().unwrap_or(0);
                    if theirs < seq {
                        behind.push(format!("rank {r} (at op #{theirs})"));
                    }
                }
                Ok(None) => behind.push(format!("rank {r} (no report: hung, stopped or dead?)")),
                Err(_) => return String::new(),
            }
        }
        if behind.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if behind.is_empty() {
        "; every rank reached this op".into()
    } else {
        format!(
            "; ranks that had not reached op #{seq}: {}",
            behind.join(", ")
        )
    }
}

fn progress_key(prefix: &str, comm_id: u64, rank: usize) -> String {
    format!("{prefix}progress/{comm_id:016x}/{rank}")
}

/// Posts to the store that this rank reached op `seq` (and failed in it).
fn report_progress(ex: &Executor, seq: u64) -> bool {
    let Some((store, prefix)) = &ex.world.store else {
        return false;
    };
    store
        .set(
            &progress_key(prefix, ex.comm_id, ex.rank),
            seq.to_string().as_bytes(),
        )
        .is_ok()
}

/// Logs the flight record (and writes it to RINGWIRE_FLIGHT_RECORDER_DIR
/// when set) after a failure.
fn dump_flight_record(ex: &Executor) {
    let dump = ex.recorder.dump(ex.rank, ex.size);
    tracing::error!("{dump}");
    if let Ok(dir) = std::env::var("RINGWIRE_FLIGHT_RECORDER_DIR") {
        let path = std::path::Path::new(&dir)
            .join(format!("ringwire-{:016x}-rank{}.txt", ex.comm_id, ex.rank));
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &dump)) {
            tracing::warn!(path = %path.display(), error = %e, "could not write the flight record");
        }
    }
}

/// A 64-bit mixer (splitmix64's finaliser) to derive sub-group ids that all
/// members compute alike.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Communicator {
    /// A [`crate::Builder`] with nothing set.
    pub fn builder() -> crate::Builder {
        crate::Builder::new()
    }

    /// Joins the job described by the launch environment (RINGWIRE_*,
    /// torchrun, Open MPI, Slurm or PMI variables). Await it or `wait()`.
    pub fn from_env() -> PendingCollective<Communicator> {
        match crate::Builder::from_env() {
            Ok(b) => b.build(),
            Err(e) => PendingCollective::ready(Err(e)),
        }
    }
}
