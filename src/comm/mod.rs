//! The public API: [`Communicator`] and its collectives.
//!
//! A communicator owns one executor thread. Each call checks its arguments,
//! takes the next sequence number, queues a job and returns a
//! [`PendingCollective`] at once; the executor runs jobs strictly in
//! submission order (the order every rank must call them in), so any number
//! of ops may be in flight and awaited in any order.
//!
//! Rooms: `context` (the types: the handle, the executor, an op's
//! context), `ops` (each collective once: its checks and its body, whose
//! schedule `algo::select` picks), `forms` (the owned and blocking forms of
//! every collective, and numbering), `execute` (what wraps every op),
//! `diagnose` (the debug signature check, who
//! had not arrived at an op that timed out, the flight record's dump),
//! `arena` (ops on the shared-memory arena), `levels` (two-level ops
//! across hosts).

mod admit;
mod arena;
mod context;
mod diagnose;
mod execute;
mod forms;
mod levels;
mod ops;
mod recovery;

use crate::algo;
use crate::buffer::{Buffer, CollectiveBuffer};
use crate::config::Tunables;
use crate::error::Error;
use crate::locks::lock;
use crate::pending::{CellPool, PendingCollective, queued};
use crate::recorder::{FlightRecorder, OpRecord};
use crate::runner::{Help, Runner};
use crate::stats::{Stats, StatsRecorder};
use crate::wire::OpKind;
use crate::world::World;
use crate::{Element, ReduceOp};
pub use context::Communicator;
use context::{CommKind, Executor, Inner, Queue, mix};
use execute::{EXECUTOR_SPIN, P2p};
pub use recovery::Agreed;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Communicator {
    pub(crate) fn start(world: Arc<World>, tunables: Tunables) -> Result<Communicator, Error> {
        let members: Vec<usize> = (0..world.size).collect();
        let rank = world.rank;
        let comm_id = world.job_id;
        Communicator::start_group(
            world,
            tunables,
            rank,
            comm_id,
            Arc::new(members),
            CommKind::LISTED,
        )
    }

    /// A communicator of `members` (world ranks), of `kind`.
    pub(super) fn start_group(
        world: Arc<World>,
        tunables: Tunables,
        rank: usize,
        comm_id: u64,
        members: Arc<Vec<usize>>,
        kind: CommKind,
    ) -> Result<Communicator, Error> {
        let CommKind {
            listed,
            flat,
            newcomers,
            line,
        } = kind;
        let line = line.unwrap_or_else(|| members.clone());
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
            arena: Mutex::new(context::ArenaState::initial(
                !flat && arena::could(&world, &members),
            )),
            arena_vote: std::sync::atomic::AtomicU8::new(0),
            grid: algo::levels::Grid::of(
                &members.iter().map(|&w| world.hosts[w]).collect::<Vec<_>>(),
            )
            .filter(|_| !flat),
            levels: Mutex::new(None),
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
            listed,
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
                recoveries: Mutex::new(0),
                agreements_ended: Mutex::new(Vec::new()),
                flat,
                newcomers,
                line,
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

    /// The members' ranks in the job's first communicator (the one the
    /// builder made), in this communicator's rank order: entry `r` is
    /// where rank `r` of this one started, so after
    /// [`Communicator::split`] or [`Communicator::shrink`] a program sees
    /// which of the job's ranks are left (as torch.distributed's
    /// `get_process_group_ranks`).
    pub fn world_ranks(&self) -> Vec<usize> {
        self.inner.members.to_vec()
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
    /// communicator): `"shm"` or `"unix"` for a rank on the same host (see
    /// [`crate::LocalLinks`]), `"tcp"` otherwise; `None` until the link is
    /// made (on first use) or after it failed.
    pub fn link_kind(&self, peer: usize) -> Option<&'static str> {
        let world_rank = *self.inner.members.get(peer)?;
        self.inner.world.transport.link_kind(world_rank)
    }

    /// Whether this communicator's small collectives run on the
    /// shared-memory arena (`RINGWIRE_LOCAL_LINKS=shm`, every member on this
    /// host): `Some(true)` once its members voted for it (in the first op
    /// that could use it), `Some(false)` if they could not (no free slot,
    /// an arena that could not be made or mapped), `None` before the vote
    /// or where it never applies.
    pub fn shared_memory_arena(&self) -> Option<bool> {
        use std::sync::atomic::Ordering;
        match self
            .inner
            .runner
            .context()
            .arena_vote
            .load(Ordering::Acquire)
        {
            context::VOTED_YES => Some(true),
            context::VOTED_NO => Some(false),
            _ => None,
        }
    }

    /// Whether this rank's link to `peer` carries the payloads of large
    /// frames on one-way lanes beside its connection: TCP links of the
    /// io_uring engine do unless told not to (see
    /// [`crate::Builder::tcp_lanes`]). False until the link is made.
    pub fn link_has_lanes(&self, peer: usize) -> bool {
        self.link_lanes(peer) > 0
    }

    /// How many lanes each way the link to `peer` has (see
    /// [`crate::Builder::tcp_lane_count`]); 0 without lanes, or until the
    /// link is made.
    pub fn link_lanes(&self, peer: usize) -> usize {
        self.inner
            .members
            .get(peer)
            .map_or(0, |&r| self.inner.world.transport.link_lanes(r))
    }

    /// What each lane this rank writes to `peer` has carried, in lane
    /// order: bytes, pieces, and the bytes its socket holds
    /// unacknowledged (decision 0034). Counted over the process's link, so
    /// every communicator sharing it sees the same. Empty without lanes.
    pub fn lane_stats(&self, peer: usize) -> Vec<crate::LaneStats> {
        self.inner
            .members
            .get(peer)
            .map_or_else(Vec::new, |&r| self.inner.world.transport.link_lane_stats(r))
    }

    /// What each engine thread of this process has done (empty unless
    /// [`crate::Builder::engine_threads`] asked for some and they run):
    /// bytes moved, CPU and busy time. Shared by every communicator of the
    /// process.
    pub fn engine_thread_stats(&self) -> Vec<crate::EngineThreadStats> {
        self.inner.world.transport.engine_thread_stats()
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
        buf: B,
        op: ReduceOp,
    ) -> PendingCollective<B> {
        self.owned_in_place(ops::AllReduce(op), buf)
    }

    /// Copies `root`'s buffer into every rank's buffer (all ranks pass a
    /// buffer of the same length).
    pub fn broadcast<T: Element, B: CollectiveBuffer<T>>(
        &self,
        buf: B,
        root: usize,
    ) -> PendingCollective<B> {
        self.owned_in_place(ops::Broadcast { root }, buf)
    }

    /// Reduces every rank's buffer into `root`'s. Other ranks' buffers come
    /// back unchanged.
    pub fn reduce<T: Element, B: CollectiveBuffer<T>>(
        &self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> PendingCollective<B> {
        self.owned_in_place(ops::Reduce { root, op }, buf)
    }

    /// Gathers every rank's `input` into `output`, in rank order:
    /// `output.len()` must be `input.len() * world_size()`.
    pub fn all_gather<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        output: O,
    ) -> PendingCollective<(B, O)> {
        self.owned_in_to_out(ops::AllGather, input, output)
    }

    /// Gathers every rank's `input` into `output` in rank order, with
    /// blocks of different lengths: rank r contributes `counts[r]` elements
    /// (MPI's `Allgatherv`; torch's `all_gather` of uneven tensors). Every
    /// rank passes the same `counts`; `input.len()` must be
    /// `counts[rank()]` and `output.len()` their sum. Ranks whose counts
    /// differ fail with [`Error::Mismatch`].
    pub fn all_gather_v<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        output: O,
        counts: &[usize],
    ) -> PendingCollective<(B, O)> {
        let op = ops::AllGatherV {
            counts: counts.to_vec(),
        };
        self.owned_in_to_out(op, input, output)
    }

    /// Gathers every rank's `input` into `root`'s `output`, in rank order.
    /// Every rank passes an input of the same length; at the root `output`
    /// must hold `input.len() * world_size()` elements. Other ranks'
    /// `output` is not touched: pass an empty buffer (or one of the root's
    /// length, so every rank can run the same code). The root receives
    /// from every other rank directly; with 3+ ranks and blocks of
    /// 128 KiB or more it
    /// asks each in turn, so a rank's op then completes only once the root
    /// has reached it (decision 0023).
    pub fn gather<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        self.owned_in_to_out(ops::Gather { root }, input, output)
    }

    /// Sends block r of `root`'s `input` to rank r's `output`: every rank
    /// passes an output of the same length, and at the root `input` must
    /// hold `output.len() * world_size()` elements. Other ranks' `input`
    /// is not read: pass an empty buffer (or one of the root's length).
    /// The root sends to every other rank directly.
    pub fn scatter<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        self.owned_in_to_out(ops::Scatter { root }, input, output)
    }

    /// Reduces `input` across ranks and leaves block `rank()` of the result
    /// in `output`. Blocks split `input.len()` as evenly as possible, the
    /// first `len % world_size` ranks getting one extra element; see
    /// [`Communicator::block_len`]. `input` comes back unchanged.
    pub fn reduce_scatter<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        output: O,
        op: ReduceOp,
    ) -> PendingCollective<(B, O)> {
        self.owned_in_to_out(ops::ReduceScatter(op), input, output)
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
        output: O,
    ) -> PendingCollective<(B, O)> {
        self.owned_in_to_out(ops::AllToAll, input, output)
    }

    /// All-to-all with uneven splits: `send_counts[j]` elements of `input`
    /// (consecutively, in rank order) go to rank j, and `recv_counts[j]`
    /// elements from rank j land in `output` in rank order. Rank j's
    /// `send_counts[i]` must equal rank i's `recv_counts[j]`.
    pub fn all_to_all_v<T: Element, B: CollectiveBuffer<T>, O: CollectiveBuffer<T>>(
        &self,
        input: B,
        send_counts: &[usize],
        output: O,
        recv_counts: &[usize],
    ) -> PendingCollective<(B, O)> {
        let op = ops::AllToAllV {
            send_counts: send_counts.to_vec(),
            recv_counts: recv_counts.to_vec(),
        };
        self.owned_in_to_out(op, input, output)
    }

    /// Completes on each rank once every rank has entered the barrier.
    pub fn barrier(&self) -> PendingCollective<()> {
        self.submit(ops::plan::<u8>(OpKind::Barrier, 0), None, ops::barrier)
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
            ops::plan::<T>(OpKind::SendRecv, n),
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
            ops::plan::<T>(OpKind::SendRecv, n),
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
            ops::plan::<T>(OpKind::SendRecv, n_send + n_recv),
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
        self.blocking_in_place(ops::AllReduce(op), data)
    }

    /// Blocking [`Communicator::broadcast`] on a borrowed slice.
    pub fn broadcast_slice<T: Element>(&self, data: &mut [T], root: usize) -> Result<(), Error> {
        self.blocking_in_place(ops::Broadcast { root }, data)
    }

    /// Blocking [`Communicator::reduce`] on a borrowed slice.
    pub fn reduce_slice<T: Element>(
        &self,
        data: &mut [T],
        root: usize,
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.blocking_in_place(ops::Reduce { root, op }, data)
    }

    /// Blocking [`Communicator::all_gather`] on borrowed slices.
    pub fn all_gather_slice<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.blocking_in_to_out(ops::AllGather, input, output)
    }

    /// Blocking [`Communicator::all_gather_v`] on borrowed slices.
    pub fn all_gather_v_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
    ) -> Result<(), Error> {
        let op = ops::AllGatherV {
            counts: counts.to_vec(),
        };
        self.blocking_in_to_out(op, input, output)
    }

    /// Blocking [`Communicator::gather`] on borrowed slices.
    pub fn gather_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<(), Error> {
        self.blocking_in_to_out(ops::Gather { root }, input, output)
    }

    /// Blocking [`Communicator::scatter`] on borrowed slices.
    pub fn scatter_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<(), Error> {
        self.blocking_in_to_out(ops::Scatter { root }, input, output)
    }

    /// Blocking [`Communicator::reduce_scatter`] on borrowed slices.
    pub fn reduce_scatter_slice<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.blocking_in_to_out(ops::ReduceScatter(op), input, output)
    }

    /// Blocking [`Communicator::all_to_all`] on borrowed slices.
    pub fn all_to_all_slice<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.blocking_in_to_out(ops::AllToAll, input, output)
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
            CommKind::split(self.inner.flat),
        )
        .map(|mut c| {
            c.timeout = self.timeout;
            Some(c)
        })
    }
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
