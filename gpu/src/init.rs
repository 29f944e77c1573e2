//! Making a GPU communicator: its own CPU communicator (split from the
//! caller's), rank 0's NCCL unique id broadcast over it, and a
//! non-blocking `ncclCommInitRankConfig` polled under a deadline that also
//! watches for another rank's failure, so no rank waits forever for a peer
//! that could not start.
//!
//! A shrink (decision 0041) first tries `ncclCommShrink` of the old
//! communicator where every rank can, and falls back to a new unique id.
//!
//! The id travels over the CPU communicator's links rather than the store:
//! under torchrun the store is torch's TCPStore, which is unauthenticated,
//! while ringwire's links are (decision 0026).

use crate::error::{GpuError, GpuOp, OpAt};
use crate::flight::{
    ABORT_DEADLINE, CommShared, MadeBy, Parked, State, spawn_abort, spawn_abort_then,
};
use crate::nccl::codes::NcclResult;
use crate::nccl::library::{NcclLibrary, RawComm, ShrinkSlot, UniqueId};
use crate::runtime::Device;
use ringwire::Communicator;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The color every rank passes to `split`, so the GPU communicator's CPU
/// twin holds the same ranks in the same order.
const SPLIT_COLOR: u32 = 0x6770_7521;

pub(crate) struct Options {
    pub(crate) timeout: Duration,
    pub(crate) init_timeout: Duration,
    /// The stream ops follow when a buffer names none (default: the
    /// device's default stream).
    pub(crate) compute: Option<crate::Stream>,
}

/// What the old communicator offers a shrink: its parked NCCL
/// communicator and where this rank stood in it.
pub(crate) struct Parent {
    pub(crate) parked: Parked,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) lineage: u64,
}

/// What each rank tells the others before any NCCL call: whether it
/// loaded NCCL, and the parent it could shrink (if any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Offer {
    loaded: bool,
    /// (rank, size, lineage) in the parent.
    parent: Option<(u32, u32, u64)>,
}

const OFFER_LEN: usize = 20;

impl Offer {
    fn encode(self) -> [u8; OFFER_LEN] {
        let mut bytes = [0u8; OFFER_LEN];
        bytes[0] = u8::from(self.loaded);
        if let Some((rank, size, lineage)) = self.parent {
            bytes[1] = 1;
            bytes[4..8].copy_from_slice(&rank.to_le_bytes());
            bytes[8..12].copy_from_slice(&size.to_le_bytes());
            bytes[12..20].copy_from_slice(&lineage.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> Offer {
        let field =
            |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
        let lineage = u64::from_le_bytes(bytes[12..20].try_into().unwrap_or_default());
        Offer {
            loaded: bytes[0] != 0,
            parent: (bytes[1] != 0).then(|| (field(4), field(8), lineage)),
        }
    }
}

/// The ranks of the parent to exclude, when every rank offers the same
/// parent and their places in it keep the parent's order (NCCL numbers
/// the child in that order); `None` when a shrink cannot make this
/// communicator.
fn shrink_plan(offers: &[Offer]) -> Option<(Vec<usize>, u64)> {
    let (_, size, lineage) = offers.first()?.parent?;
    let mut kept = Vec::with_capacity(offers.len());
    for offer in offers {
        let (rank, s, l) = offer.parent?;
        if s != size
            || l != lineage
            || kept.last().is_some_and(|&last| last >= rank)
            || rank >= size
        {
            return None;
        }
        kept.push(rank);
    }
    let excluded: Vec<usize> = (0..size as usize)
        .filter(|r| !kept.contains(&(*r as u32)))
        .collect();
    if excluded.is_empty() {
        return None;
    }
    let child = mix(lineage, excluded.iter().map(|&r| r as u64));
    Some((excluded, child))
}

/// FNV-1a over `seed` and `values`: lineages the same on every rank.
fn mix(seed: u64, values: impl Iterator<Item = u64>) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for value in values {
        for byte in value.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

pub(crate) fn init(
    cpu: &Communicator,
    device: &Device,
    lib: Result<Arc<NcclLibrary>, crate::Unavailable>,
    options: Options,
    parent: Option<Parent>,
) -> Result<Arc<CommShared>, GpuError> {
    let (rank, size) = (cpu.rank(), cpu.world_size());
    let at = OpAt {
        op: GpuOp::Init,
        seq: 0,
        rank,
        world_size: size,
    };
    let cpu_error = |source| GpuError::Cpu {
        at: at.clone(),
        source: Box::new(source),
    };
    let twin = match make_twin(cpu, &options) {
        Ok(twin) => twin,
        Err(e) => {
            release(parent, &lib, device, rank);
            return Err(cpu_error(e));
        }
    };

    // Every rank says whether it has NCCL (and what it could shrink)
    // before anyone waits on NCCL.
    let offer = Offer {
        loaded: lib.is_ok(),
        parent: parent
            .as_ref()
            .filter(|p| {
                lib.as_ref().is_ok_and(|l| l.has_shrink())
                    && lib
                        .as_ref()
                        .is_ok_and(|l| l.async_error(&p.parked.comm) == NcclResult::SUCCESS)
            })
            .map(|p| (p.rank as u32, p.size as u32, p.lineage)),
    };
    let mut offers = vec![0u8; OFFER_LEN * size];
    let gathered = twin.all_gather_slice(&offer.encode(), &mut offers);
    let lib = match (gathered, lib) {
        (Ok(()), Ok(lib)) => lib,
        (gathered, lib) => {
            release(parent, &lib, device, rank);
            gathered.map_err(cpu_error)?;
            return Err(lib.expect_err("one of the two failed").into());
        }
    };
    let offers: Vec<Offer> = offers.chunks_exact(OFFER_LEN).map(Offer::decode).collect();
    let missing: Vec<usize> = (0..size).filter(|&r| !offers[r].loaded).collect();
    if !missing.is_empty() {
        release(parent, &Ok(lib.clone()), device, rank);
        return Err(GpuError::Aborted {
            at,
            reason: format!("rank(s) {missing:?} could not load NCCL (their errors say why)"),
        });
    }

    let mut twin = twin;
    match (parent, shrink_plan(&offers)) {
        (Some(parent), Some((excluded, lineage))) => {
            match shrink(&twin, &lib, device, parent, &excluded, &at, &options) {
                Ok(comm) => {
                    let made_by = MadeBy::Shrink;
                    return finish(cpu, &twin, lib, device, comm, options, lineage, made_by, at);
                }
                Err(why) => {
                    // Every rank comes here (see `shrink`): the whole
                    // communicator falls back to a new one, over a new twin.
                    tracing::warn!(
                        rank,
                        %why,
                        "ncclCommShrink did not make the communicator; making a new one"
                    );
                    twin = make_twin(cpu, &options).map_err(cpu_error)?;
                }
            }
        }
        (Some(parent), None) => release(Some(parent), &Ok(lib.clone()), device, rank),
        (None, _) => {}
    }
    let (comm, id) = init_with_id(&twin, &lib, device, &at, &options)?;
    let lineage = mix(
        0,
        id.internal.chunks(8).map(|c| {
            let mut word = [0u8; 8];
            word[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(word)
        }),
    );
    finish(
        cpu,
        &twin,
        lib,
        device,
        comm,
        options,
        lineage,
        MadeBy::UniqueId,
        at,
    )
}

/// Aborts the parked parent (and drains its ops) on a helper thread; with
/// no library to abort it, leaks it and its ops' buffers, never freeing
/// memory the device may still write.
fn release(
    parent: Option<Parent>,
    lib: &Result<Arc<NcclLibrary>, crate::Unavailable>,
    device: &Device,
    rank: usize,
) {
    let Some(parent) = parent else { return };
    let Parked { comm, inflight, .. } = parent.parked;
    match lib {
        Ok(lib) => spawn_abort(lib, device, Some(comm), inflight, rank),
        Err(_) => std::mem::forget((comm, inflight)),
    }
}

/// The GPU communicator's own CPU communicator: a split of `cpu` with the
/// same ranks in the same order.
fn make_twin(cpu: &Communicator, options: &Options) -> Result<Communicator, ringwire::Error> {
    let twin = cpu
        .split(Some(SPLIT_COLOR), cpu.rank() as i64)?
        .expect("every rank passes a color, so each gets a communicator");
    Ok(twin.with_timeout(options.init_timeout.max(cpu.timeout())))
}

/// `ncclCommShrink` of the parked parent with `NCCL_SHRINK_ABORT`, polled
/// under the init deadline, then an all-gather over `twin` of whether it
/// worked on every rank. A rank whose shrink fails aborts `twin`, which
/// ends the others' wait and fails their all-gather: every rank then
/// returns `Err` and falls back together, and a child made on some ranks
/// is aborted. The parent is aborted in every case, after the shrink.
fn shrink(
    twin: &Communicator,
    lib: &Arc<NcclLibrary>,
    device: &Device,
    parent: Parent,
    excluded: &[usize],
    at: &OpAt,
    options: &Options,
) -> Result<RawComm, String> {
    let rank = at.rank;
    let Parked {
        comm: parent_comm,
        inflight,
        ..
    } = parent.parked;
    let made = shrink_locally(twin, lib, device, &parent_comm, excluded, options);
    // A shrink given up on may still write its child: once the parent's
    // abort has returned (NCCL ends the child's job with it), the slot is
    // read and what it holds aborted; if the abort hangs, the slot leaks.
    let (made, abandoned) = match made {
        Ok(child) => (Ok(child), None),
        Err((why, slot)) => (Err(why), slot),
    };
    let (lib2, device2) = (lib.clone(), device.clone());
    spawn_abort_then(
        lib,
        device,
        Some(parent_comm),
        inflight,
        rank,
        move |returned| {
            // (A slot dropped untaken leaks: see `ShrinkSlot`.)
            if let Some(slot) = abandoned.filter(|_| returned)
                && let Some(child) = slot.take()
            {
                spawn_abort(&lib2, &device2, Some(child), Vec::new(), rank);
            }
        },
    );
    let child = match made {
        Ok(child) => child,
        Err(why) => {
            twin.abort(&format!("ncclCommShrink failed on rank {rank}: {why}"));
            return Err(why);
        }
    };
    let mut worked = vec![0u8; twin.world_size()];
    match twin.all_gather_slice(&[1], &mut worked) {
        Ok(()) if worked.iter().all(|&w| w == 1) => Ok(child),
        outcome => {
            spawn_abort(lib, device, Some(child), Vec::new(), rank);
            Err(match outcome {
                Err(e) => format!("another rank's shrink failed: {e}"),
                Ok(()) => "another rank's shrink failed".into(),
            })
        }
    }
}

/// The child, or why not, with the slot NCCL may still write when the
/// shrink was given up on while in progress.
type Shrunk = Result<RawComm, (String, Option<ShrinkSlot>)>;

fn shrink_locally(
    twin: &Communicator,
    lib: &Arc<NcclLibrary>,
    device: &Device,
    parent: &RawComm,
    excluded: &[usize],
    options: &Options,
) -> Shrunk {
    device
        .0
        .bind()
        .map_err(|e| (format!("cuCtxSetCurrent: {e}"), None))?;
    let (mut result, slot) = lib
        .shrink_non_blocking(parent, excluded, true)
        .ok_or(("the library has no ncclCommShrink".to_string(), None))?;
    let deadline = Instant::now() + options.init_timeout;
    let mut polls = 0u32;
    while result == NcclResult::IN_PROGRESS {
        result = lib.async_error(parent);
        if result != NcclResult::IN_PROGRESS {
            break;
        }
        if let Some(reason) = twin.failure() {
            return Err((format!("given up: {reason}"), Some(slot)));
        }
        if Instant::now() > deadline {
            let why = format!("still in progress after {:?}", options.init_timeout);
            return Err((why, Some(slot)));
        }
        polls += 1;
        nap(polls);
    }
    if result != NcclResult::SUCCESS {
        let last = lib.last_error(Some(parent));
        if let Some(child) = slot.take() {
            spawn_abort(lib, device, Some(child), Vec::new(), twin.rank());
        }
        let why = format!("{result} ({}): {last}", lib.error_string(result));
        return Err((why, None));
    }
    let child = slot
        .take()
        .ok_or(("NCCL wrote no communicator".to_string(), None))?;
    // The child's own state: NCCL reports its setup's result there.
    let mut state = lib.async_error(&child);
    while state == NcclResult::IN_PROGRESS && Instant::now() < deadline {
        polls += 1;
        nap(polls);
        state = lib.async_error(&child);
    }
    if state != NcclResult::SUCCESS {
        let last = lib.last_error(Some(&child));
        spawn_abort(lib, device, Some(child), Vec::new(), twin.rank());
        return Err((format!("the new communicator: {state}: {last}"), None));
    }
    Ok(child)
}

fn nap(polls: u32) {
    if polls > 100 {
        std::thread::sleep(Duration::from_micros(500));
    } else {
        std::thread::yield_now();
    }
}

/// Rank 0's unique id broadcast over `twin`, and a non-blocking
/// `ncclCommInitRankConfig` polled under the init deadline.
fn init_with_id(
    twin: &Communicator,
    lib: &Arc<NcclLibrary>,
    device: &Device,
    at: &OpAt,
    options: &Options,
) -> Result<(RawComm, UniqueId), GpuError> {
    let (rank, size) = (at.rank, at.world_size);
    let cpu_error = |source| GpuError::Cpu {
        at: at.clone(),
        source: Box::new(source),
    };
    // [0]: ncclGetUniqueId's result on rank 0; [1..129]: the id.
    let mut message = vec![0u8; 129];
    if rank == 0 {
        match lib.unique_id() {
            Ok(id) => message[1..].copy_from_slice(&id.internal),
            Err(code) => message[0] = code.0.clamp(1, 255) as u8,
        }
    }
    twin.broadcast_slice(&mut message, 0).map_err(cpu_error)?;
    if message[0] != 0 {
        let code = NcclResult(message[0] as i32);
        return Err(GpuError::Nccl {
            at: at.clone(),
            code,
            text: format!(
                "rank 0 could not make the communicator's unique id (ncclGetUniqueId): {}",
                lib.error_string(code)
            ),
            last_error: if rank == 0 {
                lib.last_error(None)
            } else {
                String::new()
            },
        });
    }
    let mut id = UniqueId { internal: [0; 128] };
    id.internal.copy_from_slice(&message[1..]);

    let fail = |error: GpuError, comm: Option<RawComm>| {
        // Peers still initialising would wait for this rank until their
        // deadline: the CPU abort tells them at once.
        twin.abort(&error.to_string());
        if let Some(comm) = comm {
            abort_bounded(lib, device, comm, rank);
        }
        error
    };
    if let Err(detail) = device.0.bind() {
        let error = GpuError::Cuda {
            at: at.clone(),
            call: "cuCtxSetCurrent",
            detail,
        };
        return Err(fail(error, None));
    }
    let (comm, mut result) = lib.init_rank_non_blocking(size, id, rank);
    let deadline = Instant::now() + options.init_timeout;
    let started = Instant::now();
    let mut polls = 0u32;
    while result == NcclResult::IN_PROGRESS {
        let Some(c) = comm.as_ref() else { break };
        result = lib.async_error(c);
        if result != NcclResult::IN_PROGRESS {
            break;
        }
        if let Some(reason) = twin.failure() {
            let error = GpuError::Aborted {
                at: at.clone(),
                reason: format!("another rank failed while NCCL initialised: {reason}"),
            };
            return Err(fail(error, comm));
        }
        if Instant::now() > deadline {
            let error = GpuError::Timeout {
                at: at.clone(),
                waited: started.elapsed(),
                state: "NCCL still initialising: some rank has not joined (is every rank \
                        making its GPU communicator?)"
                    .into(),
            };
            return Err(fail(error, comm));
        }
        polls += 1;
        nap(polls);
    }
    match (comm, result) {
        (Some(comm), NcclResult::SUCCESS) => Ok((comm, id)),
        (comm, code) => {
            let code = if code == NcclResult::SUCCESS {
                NcclResult::INTERNAL_ERROR
            } else {
                code
            };
            let error = GpuError::Nccl {
                at: at.clone(),
                code,
                text: lib.error_string(code),
                last_error: lib.last_error(comm.as_ref()),
            };
            Err(fail(error, comm))
        }
    }
}

/// Checks the new NCCL communicator's rank and size, makes its stream and
/// scratch memory, and hands it to the watchdog.
#[allow(clippy::too_many_arguments)]
fn finish(
    cpu: &Communicator,
    twin: &Communicator,
    lib: Arc<NcclLibrary>,
    device: &Device,
    comm: RawComm,
    options: Options,
    lineage: u64,
    made_by: MadeBy,
    at: OpAt,
) -> Result<Arc<CommShared>, GpuError> {
    let (rank, size) = (at.rank, at.world_size);
    let fail = |error: GpuError, comm: RawComm| {
        twin.abort(&error.to_string());
        abort_bounded(&lib, device, comm, rank);
        error
    };
    match lib.comm_info(&comm) {
        Ok((count, user_rank, _)) if count == size && user_rank == rank => {}
        other => {
            let error = GpuError::Nccl {
                at: at.clone(),
                code: NcclResult::INTERNAL_ERROR,
                text: format!("NCCL's communicator disagrees about rank and size: {other:?}"),
                last_error: String::new(),
            };
            return Err(fail(error, comm));
        }
    }
    let resources = (|| {
        let stream = device.new_stream()?;
        let scratch = device.0.alloc(8)?;
        Ok::<_, String>((stream, scratch))
    })();
    let (stream, scratch) = match resources {
        Ok(r) => r,
        Err(detail) => {
            let error = GpuError::Cuda {
                at,
                call: "cuStreamCreate/cuMemAlloc",
                detail,
            };
            return Err(fail(error, comm));
        }
    };
    let debug_checks = cpu.debug_checks();
    let shared = Arc::new(CommShared {
        lib,
        device: device.clone(),
        cpu: twin.with_timeout(options.timeout),
        rank,
        size,
        lineage,
        made_by,
        timeout: options.timeout,
        init_timeout: options.init_timeout,
        compute: options.compute.unwrap_or_else(|| device.default_stream()),
        stream,
        scratch,
        debug_checks,
        state: Mutex::new(State {
            comm: Some(comm),
            parked: None,
            inflight: VecDeque::new(),
            next_seq: 1,
            last_done: None,
            failure: None,
            lost_check: None,
            lost_since: None,
        }),
        submit: Mutex::new(()),
    });
    crate::watchdog::register(&shared);
    Ok(shared)
}

/// `ncclCommAbort` on a helper thread, waited for at most
/// [`ABORT_DEADLINE`] (a hung abort is leaked, not waited on forever).
fn abort_bounded(lib: &Arc<NcclLibrary>, device: &Device, comm: RawComm, rank: usize) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (lib, device) = (lib.clone(), device.clone());
    let spawned = std::thread::Builder::new()
        .name("ringwire-nccl-abort".into())
        .spawn(move || {
            let _ = device.0.bind();
            let _ = tx.send(lib.abort(comm));
        });
    if spawned.is_ok() && rx.recv_timeout(ABORT_DEADLINE).is_err() {
        tracing::error!(
            rank,
            "ncclCommAbort did not return within {ABORT_DEADLINE:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(parent: Option<(u32, u32, u64)>) -> Offer {
        Offer {
            loaded: true,
            parent,
        }
    }

    #[test]
    fn offers_round_trip() {
        for o in [offer(None), offer(Some((3, 7, u64::MAX - 5)))] {
            assert_eq!(Offer::decode(&o.encode()), o);
        }
        let none = Offer {
            loaded: false,
            parent: None,
        };
        assert_eq!(Offer::decode(&none.encode()), none);
    }

    #[test]
    fn a_shrink_needs_one_parent_in_its_order_and_someone_left_out() {
        let p = |rank| offer(Some((rank, 4, 99)));
        let (excluded, lineage) = shrink_plan(&[p(0), p(1), p(3)]).unwrap();
        assert_eq!(excluded, vec![2]);
        assert_ne!(lineage, 99);
        // The same survivors get the same lineage; others another.
        assert_eq!(shrink_plan(&[p(0), p(1), p(3)]).unwrap().1, lineage);
        assert_ne!(shrink_plan(&[p(0), p(3)]).unwrap().1, lineage);
        // Nobody left out, another order, another parent, a newcomer.
        assert_eq!(shrink_plan(&[p(0), p(1), p(2), p(3)]), None);
        assert_eq!(shrink_plan(&[p(1), p(0)]), None);
        assert_eq!(shrink_plan(&[p(0), offer(Some((1, 4, 98)))]), None);
        assert_eq!(shrink_plan(&[p(0), offer(Some((1, 5, 99)))]), None);
        assert_eq!(shrink_plan(&[p(0), offer(None)]), None);
        assert_eq!(shrink_plan(&[p(0), p(4)]), None);
    }
}

#[cfg(all(test, feature = "cuda"))]
mod gpu_tests {
    use super::*;

    /// On a GPU: NCCL's non-blocking init of a two-rank communicator whose
    /// peer never joins stays in progress, and abort ends it within its
    /// deadline (the path a stuck init takes).
    #[test]
    #[ignore = "needs a GPU: run gpu/scripts/gpu-test.sh"]
    fn an_init_whose_peer_never_joins_stays_in_progress_until_aborted() {
        let lib = NcclLibrary::global().expect("NCCL");
        let device = Device::cuda(0).expect("CUDA device 0");
        device.0.bind().expect("bind");
        let id = lib.unique_id().expect("unique id");
        let (comm, result) = lib.init_rank_non_blocking(2, id, 0);
        let comm = comm.expect("a non-blocking init returns its comm at once");
        assert!(
            result == NcclResult::IN_PROGRESS || result == NcclResult::SUCCESS,
            "{result}"
        );
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            assert_eq!(lib.async_error(&comm), NcclResult::IN_PROGRESS);
            std::thread::sleep(Duration::from_millis(50));
        }
        let started = Instant::now();
        abort_bounded(&lib, &device, comm, 0);
        eprintln!("ncclCommAbort of a stuck init took {:?}", started.elapsed());
        assert!(started.elapsed() < ABORT_DEADLINE);
    }
}
