//! Making a GPU communicator: its own CPU communicator (split from the
//! caller's), rank 0's NCCL unique id broadcast over it, and a
//! non-blocking `ncclCommInitRankConfig` polled under a deadline that also
//! watches for another rank's failure, so no rank waits forever for a peer
//! that could not start.
//!
//! The id travels over the CPU communicator's links rather than the store:
//! under torchrun the store is torch's TCPStore, which is unauthenticated,
//! while ringwire's links are (decision 0026).

use crate::error::{GpuError, GpuOp, OpAt};
use crate::flight::{ABORT_DEADLINE, CommShared, State};
use crate::nccl::codes::NcclResult;
use crate::nccl::library::{NcclLibrary, RawComm, UniqueId};
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

pub(crate) fn init(
    cpu: &Communicator,
    device: &Device,
    lib: Result<Arc<NcclLibrary>, crate::Unavailable>,
    options: Options,
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
    let twin = cpu
        .split(Some(SPLIT_COLOR), rank as i64)
        .map_err(cpu_error)?
        .expect("every rank passes a color, so each gets a communicator");
    let twin = twin.with_timeout(options.init_timeout.max(cpu.timeout()));

    // Every rank says whether it has NCCL before anyone waits on NCCL.
    let mut loaded = vec![0u8; size];
    twin.all_gather_slice(&[u8::from(lib.is_ok())], &mut loaded)
        .map_err(cpu_error)?;
    let lib = lib?;
    let missing: Vec<usize> = (0..size).filter(|&r| loaded[r] == 0).collect();
    if !missing.is_empty() {
        return Err(GpuError::Aborted {
            at,
            reason: format!("rank(s) {missing:?} could not load NCCL (their errors say why)"),
        });
    }

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
            at,
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
            abort_bounded(&lib, device, comm, rank);
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
        if polls > 100 {
            std::thread::sleep(Duration::from_micros(500));
        } else {
            std::thread::yield_now();
        }
    }
    let comm = match (comm, result) {
        (Some(comm), NcclResult::SUCCESS) => comm,
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
            return Err(fail(error, comm));
        }
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
            return Err(fail(error, Some(comm)));
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
            return Err(fail(error, Some(comm)));
        }
    };
    let debug_checks = cpu.debug_checks();
    let shared = Arc::new(CommShared {
        lib,
        device: device.clone(),
        cpu: twin.with_timeout(options.timeout),
        rank,
        size,
        timeout: options.timeout,
        compute: options.compute.unwrap_or_else(|| device.default_stream()),
        stream,
        scratch,
        debug_checks,
        state: Mutex::new(State {
            comm: Some(comm),
            inflight: VecDeque::new(),
            next_seq: 1,
            last_done: None,
            failure: None,
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
