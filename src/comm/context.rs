//! The types a communicator is made of, below every room that runs ops:
//! the [`Communicator`] handle and its shared `Inner` (the queue, the
//! runner, stats), the [`Executor`] that runs its ops (its world, its
//! members, its reused work space, and the state of its arena and of its
//! two levels) and the [`Ctx`] one op builds and runs its schedules in.
//! They refer to one another (an executor's two levels hold communicators),
//! so they live in one file; the rooms that use them (`ops`, `forms`,
//! `arena`, `levels`, `diagnose`, `execute`, and `mod.rs`, the
//! communicator's methods) stand on this one and it on none of them.

use crate::algo::levels::Grid;
use crate::algo::select::Shape;
use crate::algo::{self, Step};
use crate::arena::exchange::CommArena;
use crate::config::Tunables;
use crate::error::{Error, OpContext};
use crate::exec::{self, OpSignature};
use crate::locks::lock;
use crate::pending::CellPool;
use crate::recorder::FlightRecorder;
use crate::runner::Runner;
use crate::stats::StatsRecorder;
use crate::stats::Traffic;
use crate::wire::OpKind;
use crate::world::World;
use crate::{Element, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// What the executor thread owns.
pub(super) struct Executor {
    pub(super) world: Arc<World>,
    pub(super) rank: usize,
    pub(super) comm_id: u64,
    pub(super) members: Arc<Vec<usize>>,
    pub(super) tunables: Tunables,
    pub(super) state: Arc<Mutex<Option<String>>>,
    pub(super) stats: Arc<StatsRecorder>,
    pub(super) recorder: Arc<FlightRecorder>,
    pub(super) size: usize,
    /// The schedule of the op running now, kept between ops (one op runs
    /// at a time per communicator).
    pub(super) steps: Mutex<Vec<Step>>,
    /// Work space of ops that must not touch their input (reduce-scatter,
    /// reduce on non-roots, all-to-all), kept between ops up to
    /// `KEPT_SCRATCH_BYTES`; 8-byte words so it can hold any element type.
    pub(super) scratch: Mutex<Vec<u64>>,
    /// Per-rank counts of even all-to-alls, reused.
    pub(super) counts: Mutex<Vec<usize>>,
    /// Scratch of `algo::pace` (a second step list, a mark per rank),
    /// reused.
    pub(super) pacing: Mutex<(Vec<Step>, Vec<u8>)>,
    /// Whether this communicator's small ops run on the arena (voted in
    /// its first op that could, `comm::arena`).
    pub(super) arena: Mutex<ArenaState>,
    /// How the vote went (`arena::VOTED_*`; 0 before it), for
    /// `Communicator::shared_memory_arena`.
    pub(super) arena_vote: std::sync::atomic::AtomicU8,
    /// The members as hosts of equal size, where they form two or more
    /// (from the hosts agreed at rendezvous; decision 0033).
    pub(super) grid: Option<Grid>,
    /// The groups of two-level ops, made at the first.
    pub(super) levels: Mutex<Option<Arc<Levels>>>,
}

/// Scratch space kept between ops; larger work spaces are freed after use.
pub(super) const KEPT_SCRATCH_BYTES: usize = 64 << 20;

impl crate::runner::Context for Executor {
    fn idle(&self) {
        self.world.transport.release();
    }

    fn home_core(&self) -> Option<usize> {
        self.world.home_core
    }
}

/// The description of one op, before it runs.
pub(super) struct OpPlan {
    pub(super) kind: OpKind,
    pub(super) dtype: crate::DType,
    pub(super) count: u64,
    pub(super) reduce_op: Option<ReduceOp>,
    pub(super) root: u32,
    /// Whether every rank passes the same count (then frames check it).
    pub(super) uniform_count: bool,
}

/// What a job gets to run its schedule.
pub(super) struct Ctx<'a> {
    pub(super) ex: &'a Executor,
    pub(super) sig: OpSignature,
    pub(super) op: OpContext,
    pub(super) started: Instant,
    pub(super) timeout: Duration,
    pub(super) traffic: Traffic,
    /// The op's schedule is paced (decision 0024); its body decides.
    pub(super) pace: bool,
}

impl Ctx<'_> {
    /// Runs `steps` on `input` (read only) followed by `work`; see
    /// [`exec::run`].
    pub(super) fn run<T: Element>(
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
    pub(super) fn chunk<T: Element>(&self) -> usize {
        (self.ex.tunables.chunk_bytes / size_of::<T>()).max(1)
    }

    /// Builds the op's schedule (`build` gets an empty step list and the
    /// chunk length) in the executor's reused list and runs it on `work`:
    /// no allocation once the list has grown.
    pub(super) fn run_schedule<T: Element>(
        &mut self,
        work: &mut [T],
        build: impl FnOnce(&mut Vec<Step>, usize),
    ) -> Result<(), Error> {
        self.run_schedule_from(&[], work, build)
    }

    /// [`Ctx::run_schedule`] for a schedule whose first `input.len()`
    /// elements are `input`, which its sends read in place.
    pub(super) fn run_schedule_from<T: Element>(
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
    pub(super) fn with_scratch<T: Element, R>(
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

    pub(super) fn rank_and_size(&self) -> (usize, usize) {
        (self.ex.rank, self.ex.size)
    }

    /// What this communicator's algorithm choices depend on.
    pub(super) fn shape(&self) -> Shape {
        self.ex
            .world
            .shape(self.ex.size, self.ex.tunables.small_message_bytes)
    }
}

/// Runs `f` on the value kept in `slot` (taken out, so `f` may run ops
/// that lock nothing of it) and puts it back if `keep` says so; one op runs
/// at a time per communicator, so the slot is never contended.
pub(super) fn with_kept<V: Default, R>(
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

/// [`Executor::arena_vote`] once the members voted yes, or no.
pub(super) const VOTED_YES: u8 = 1;
pub(super) const VOTED_NO: u8 = 2;

/// Whether a communicator uses its arena.
pub(super) enum ArenaState {
    /// Not voted yet.
    Unvoted,
    /// Ops run over the links (voted no, the vote failed, or it could
    /// never).
    Off,
    On(CommArena),
}

impl ArenaState {
    /// The state a communicator starts in: whether it may ever vote.
    pub(super) fn initial(could: bool) -> ArenaState {
        match could {
            true => ArenaState::Unvoted,
            false => ArenaState::Off,
        }
    }
}

/// A communicator's two levels: the grid and the groups this rank is in.
pub(super) struct Levels {
    pub(super) grid: Grid,
    /// This rank's host: its members, ranks of the parent, by local rank.
    pub(super) host: Group,
    /// The ranks of this rank's local rank on every host, by host.
    pub(super) cross: Group,
}

/// One level's communicator and its members as ranks of the parent.
pub(super) struct Group {
    pub(super) comm: Communicator,
    pub(super) members: Vec<usize>,
}

pub(super) struct Queue {
    pub(super) next_seq: u64,
    /// Point-to-point sequence numbers per (peer, is_send).
    pub(super) p2p_seq: HashMap<(usize, bool), u64>,
}

pub(super) struct Inner {
    pub(super) world: Arc<World>,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) comm_id: u64,
    pub(super) members: Arc<Vec<usize>>,
    pub(super) tunables: Tunables,
    pub(super) queue: Mutex<Queue>,
    pub(super) runner: Arc<Runner<Executor>>,
    /// Handle-and-job cells for reuse (owned-buffer ops allocate nothing).
    pub(super) cells: Arc<CellPool>,
    pub(super) failed: Arc<Mutex<Option<String>>>,
    pub(super) stats: Arc<StatsRecorder>,
    /// Registered for the process's metrics while this lives.
    pub(super) metrics: Arc<crate::metrics::Source>,
    pub(super) recorder: Arc<FlightRecorder>,
    pub(super) splits: Mutex<u64>,
    /// Agreements (`agree`, `shrink`) run on this communicator so far.
    pub(super) recoveries: Mutex<u64>,
    /// The ids of agreements that ended, forgotten by the transport at the
    /// next one or when this communicator goes: their threads may take a
    /// last turn after an agreement returns, and a program that agrees
    /// every step must not keep an inbox per agreement.
    pub(super) agreements_ended: Mutex<Vec<u64>>,
    /// Made by admitting a replacement, or derived from such a one: its
    /// ops run over the links alone, without the arena or two levels,
    /// whose facts a replacement on another host does not share
    /// (decision 0040).
    pub(super) flat: bool,
    /// The ranks `admit` took in when it made this communicator:
    /// replacements that hold no training state yet.
    pub(super) newcomers: Vec<usize>,
    /// The world ranks of the communicator this one's line began with
    /// (the world, or a split), kept through shrinks and admissions: the
    /// places a replacement may take in it.
    pub(super) line: Arc<Vec<usize>>,
    pub(super) executor: Mutex<Option<JoinHandle<()>>>,
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
        for id in std::mem::take(&mut *lock(&self.agreements_ended)) {
            self.world.transport.forget(id);
        }
    }
}

/// A group of ranks that run collectives together.
///
/// Cheap to clone (clones share the group and its op order); `Send + Sync`.
/// Every rank must call the same collectives in the same order with matching
/// arguments; a rank that does not gets an error naming both sides.
///
/// Each collective comes in two forms: owned buffers go in and come back
/// through a [`PendingCollective`](crate::PendingCollective), so computation can overlap, and a
/// blocking form runs on borrowed slices.
///
/// ```no_run
/// use ringwire::{Communicator, ReduceOp};
///
/// # fn main() -> Result<(), ringwire::Error> {
/// let comm = Communicator::from_env().wait()?; // torchrun, mpirun, srun, ...
///
/// // Owned: starts now, returns at once.
/// let pending = comm.all_reduce(vec![1.0f32; 1024], ReduceOp::Sum);
/// let sums = pending.wait()?; // every element is the world size
/// assert_eq!(sums[0], comm.world_size() as f32);
///
/// // Blocking, in place.
/// let mut weights = vec![0.0f32; 16];
/// comm.broadcast_slice(&mut weights, 0)?;
///
/// // A sub-group of the even and one of the odd ranks, like MPI_Comm_split.
/// let half = comm.split(Some((comm.rank() % 2) as u32), 0)?.expect("every rank has a colour");
/// let (_, gathered) = half.all_gather(vec![comm.rank() as u8], vec![0u8; half.world_size()]).wait()?;
/// # let _ = gathered;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Communicator {
    pub(super) inner: Arc<Inner>,
    pub(super) timeout: Duration,
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

/// A 64-bit mixer (splitmix64's finaliser) to derive sub-group ids that all
/// members compute alike.
/// What kind of communicator `Communicator::start_group` makes.
#[derive(Clone, Debug)]
pub(crate) struct CommKind {
    /// Served in the process's metrics (not the groups of two-level ops,
    /// which count in their parent's).
    pub(crate) listed: bool,
    /// Runs over the links alone (see `Inner::flat`).
    pub(crate) flat: bool,
    /// Its ranks that `admit` took in (see `Inner::newcomers`).
    pub(crate) newcomers: Vec<usize>,
    /// The world ranks of the communicator its line began with (see
    /// `Inner::line`); `None`: its own members (a line begins here).
    pub(crate) line: Option<Arc<Vec<usize>>>,
}

impl CommKind {
    /// A communicator the program holds.
    pub(crate) const LISTED: CommKind = CommKind {
        listed: true,
        flat: false,
        newcomers: Vec::new(),
        line: None,
    };
    /// One of the groups a two-level op runs in.
    pub(crate) const IN_TWO_LEVELS: CommKind = CommKind {
        listed: false,
        flat: false,
        newcomers: Vec::new(),
        line: None,
    };

    /// A communicator split from one that is `flat` or not.
    pub(crate) fn split(flat: bool) -> CommKind {
        CommKind {
            listed: true,
            flat,
            newcomers: Vec::new(),
            line: None,
        }
    }

    /// A communicator shrunk from one that is `flat` or not, of `line`.
    pub(crate) fn shrunk(flat: bool, line: Arc<Vec<usize>>) -> CommKind {
        CommKind {
            listed: true,
            flat,
            newcomers: Vec::new(),
            line: Some(line),
        }
    }

    /// A communicator `admit` made, of `line`, with the ranks it took in.
    pub(crate) fn admitted(newcomers: Vec<usize>, line: Arc<Vec<usize>>) -> CommKind {
        CommKind {
            listed: true,
            flat: true,
            newcomers,
            line: Some(line),
        }
    }
}

pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The communicator id debug signature checks exchange their frames on.
pub(super) fn debug_comm_id(comm_id: u64) -> u64 {
    mix(comm_id, 0xDEB6)
}
