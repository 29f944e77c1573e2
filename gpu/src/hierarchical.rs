//! All-reduce of device buffers across hosts without NCCL crossing them
//! (decision 0026): reduce-scatter within the host with NCCL; all-reduce
//! of each local rank's shard across hosts, among the ranks with the same
//! local rank, over ringwire's own transport (so every NIC carries a
//! share); all-gather within the host with NCCL. The shard crosses
//! device and host through two reused staging buffers (pinned for CUDA),
//! in chunks, so the copy of chunk k+1 to the host and of chunk k-1 back
//! run on the device while the network carries chunk k. The `n mod L`
//! elements that do not split evenly go, as in Horovod, by reduce to the
//! last local rank, across hosts with its shard, and back by broadcast.
//!
//! Ops run in order on one worker thread per communicator and return a
//! [`PendingCollective`] like every other op.

#![allow(unsafe_code)]

use crate::buffer::{DeviceBuffer, DeviceElement};
use crate::communicator::GpuCommunicator;
use crate::enqueue::Call;
use crate::error::{GpuError, GpuOp, OpAt};
use crate::nccl::codes::NcclRedOp;
use crate::nccl::library::NcclLibrary;
use crate::pending::{Completion, PendingCollective, Slot};
use crate::runtime::{Device, HostStaging, Stream};
use ringwire::{Communicator, DType, Element, ReduceOp};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

/// Default size of one staged chunk.
pub(crate) const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

type Job = Box<dyn FnOnce(&mut Staging) + Send>;

/// Two staging buffers and the stream that copies through them.
struct Staging {
    buffers: [Box<dyn HostStaging>; 2],
    copies: Stream,
}

/// Device all-reduce in three phases across hosts; see the module docs.
pub struct HierarchicalAllReduce {
    local: GpuCommunicator,
    cross: Communicator,
    rank: usize,
    world_size: usize,
    chunk_bytes: usize,
    jobs: Sender<Job>,
}

impl std::fmt::Debug for HierarchicalAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HierarchicalAllReduce(rank {} of {}: local rank {} of {}, {} hosts)",
            self.rank,
            self.world_size,
            self.local.rank(),
            self.local.world_size(),
            self.cross.world_size()
        )
    }
}

/// This host's name for grouping ranks: RINGWIRE_HOST_ID if set, else the
/// kernel's host name.
pub(crate) fn host_id() -> String {
    std::env::var("RINGWIRE_HOST_ID")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "localhost".into())
        })
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Options for [`HierarchicalAllReduce::builder`].
pub struct HierarchicalBuilder<'a> {
    cpu: &'a Communicator,
    device: Device,
    host: Option<String>,
    chunk_bytes: usize,
    library: Option<Arc<NcclLibrary>>,
}

impl HierarchicalBuilder<'_> {
    /// This rank's host (default: `RINGWIRE_HOST_ID`, else the kernel's
    /// host name).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Bytes per staged chunk (default 4 MiB, at least 4 KiB).
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }

    /// The NCCL to use within hosts (default: [`NcclLibrary::global`]).
    pub fn library(mut self, library: Arc<NcclLibrary>) -> Self {
        self.library = Some(library);
        self
    }

    /// Makes it: every rank of the CPU communicator calls this.
    pub fn build(self) -> Result<HierarchicalAllReduce, GpuError> {
        let host = self.host.unwrap_or_else(host_id);
        HierarchicalAllReduce::make(
            self.cpu,
            &self.device,
            &host,
            self.chunk_bytes,
            self.library,
        )
    }
}

impl HierarchicalAllReduce {
    /// Options: the host, the chunk size, the library.
    pub fn builder<'a>(cpu: &'a Communicator, device: &Device) -> HierarchicalBuilder<'a> {
        HierarchicalBuilder {
            cpu,
            device: device.clone(),
            host: None,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            library: None,
        }
    }

    /// Made by every rank of `cpu`: groups ranks by `host` (see
    /// [`host_id`]), makes an NCCL communicator among each host's ranks on
    /// `device` and a CPU communicator among the ranks with the same local
    /// rank. Every host must hold the same number of ranks.
    fn make(
        cpu: &Communicator,
        device: &Device,
        host: &str,
        chunk_bytes: usize,
        library: Option<Arc<NcclLibrary>>,
    ) -> Result<HierarchicalAllReduce, GpuError> {
        let (rank, world_size) = (cpu.rank(), cpu.world_size());
        let at = OpAt {
            op: GpuOp::Init,
            seq: 0,
            rank,
            world_size,
        };
        let cpu_error = |source| GpuError::Cpu {
            at: at.clone(),
            source: Box::new(source),
        };
        let id = fnv1a(host);
        let local_cpu = cpu
            .split(Some((id & 0x7fff_ffff) as u32), rank as i64)
            .map_err(cpu_error)?
            .expect("a color was given");
        // Same hash, same group: check the full id, and equal host sizes.
        let mut ids = vec![0i64; local_cpu.world_size()];
        local_cpu
            .all_gather_slice(&[id as i64], &mut ids)
            .map_err(cpu_error)?;
        let mut sizes = vec![0i64; world_size];
        cpu.all_gather_slice(&[local_cpu.world_size() as i64], &mut sizes)
            .map_err(cpu_error)?;
        let invalid = |detail: String| GpuError::InvalidArgument {
            at: at.clone(),
            detail,
        };
        if ids.iter().any(|&other| other != id as i64) {
            return Err(invalid(format!(
                "two hosts' ids hash alike ({host}); set RINGWIRE_HOST_ID"
            )));
        }
        if sizes.iter().any(|&s| s != sizes[0]) {
            return Err(invalid(format!(
                "the hierarchical all-reduce needs as many ranks on every host; ranks per host, by rank: {sizes:?}"
            )));
        }
        let cross = cpu
            .split(Some(local_cpu.rank() as u32), rank as i64)
            .map_err(cpu_error)?
            .expect("a color was given");
        let mut local = GpuCommunicator::builder(&local_cpu, device);
        if let Some(lib) = library {
            local = local.library(lib);
        }
        let local = local.build()?;
        let staging = (|| {
            let bytes = chunk_bytes.max(4096);
            Ok::<_, String>(Staging {
                buffers: [
                    device.0.alloc_staging(bytes)?,
                    device.0.alloc_staging(bytes)?,
                ],
                copies: device.new_stream()?,
            })
        })()
        .map_err(|detail| GpuError::Cuda {
            at: at.clone(),
            call: "cuMemHostAlloc/cuStreamCreate",
            detail,
        })?;
        let (jobs, queue) = channel::<Job>();
        let device = device.clone();
        std::thread::Builder::new()
            .name("ringwire-gpu-hier".into())
            .spawn(move || {
                let mut staging = staging;
                let _ = device.0.bind();
                while let Ok(job) = queue.recv() {
                    job(&mut staging);
                }
                // Every copy through the staging buffers was waited for.
                drop(staging);
            })
            .map_err(|e| invalid(format!("could not start the worker thread: {e}")))?;
        Ok(HierarchicalAllReduce {
            local,
            cross,
            rank,
            world_size,
            chunk_bytes: chunk_bytes.max(4096),
            jobs,
        })
    }

    /// The NCCL communicator among this host's ranks.
    pub fn local(&self) -> &GpuCommunicator {
        &self.local
    }

    /// The CPU communicator among the ranks with this local rank.
    pub fn cross(&self) -> &Communicator {
        &self.cross
    }

    /// All-reduces `buf` in place across every rank of every host.
    pub fn all_reduce<B>(&self, buf: B, op: ReduceOp) -> PendingCollective<B>
    where
        B: DeviceBuffer,
        B::Elem: Element,
    {
        let at = OpAt {
            op: GpuOp::HierarchicalAllReduce,
            seq: 0,
            rank: self.rank,
            world_size: self.world_size,
        };
        if buf.memory() != self.local.device().memory() {
            return PendingCollective::failed(GpuError::InvalidArgument {
                at,
                detail: format!(
                    "the buffer is in {}, the device uses {}",
                    buf.memory(),
                    self.local.device().memory()
                ),
            });
        }
        let plan = Plan::new::<B::Elem>(
            &buf,
            self.local.rank(),
            self.local.world_size(),
            self.chunk_bytes,
        );
        let stream = buf.stream();
        let slot = Arc::new(Slot::new(buf));
        let handle = PendingCollective::worker(slot.clone());
        let (local, cross, world) = (self.local.clone(), self.cross.clone(), self.world_size);
        let job: Job = Box::new(move |staging| {
            let result = run::<B::Elem>(
                &plan,
                &local,
                &cross,
                world,
                op,
                stream,
                staging,
                at.clone(),
            );
            if result.is_err() {
                // Phase 1 or 3 may still be on the device: free the buffer
                // only once the local stream has drained, else leak it.
                let drained =
                    local.nccl_stream().0.record().ok().is_some_and(|e| {
                        wait_event(e.as_ref(), std::time::Duration::from_secs(10))
                    });
                if !drained {
                    std::mem::forget(slot.take_value());
                }
            }
            slot.complete(result);
        });
        if self.jobs.send(job).is_err() {
            tracing::error!("the hierarchical all-reduce's worker is gone");
        }
        handle
    }
}

/// Where this rank's share of one buffer lies.
struct Plan {
    ptr: u64,
    elem: usize,
    /// Elements per local rank's shard.
    shard: usize,
    /// Elements left over (`n mod L`), reduced onto the last local rank.
    rest: usize,
    local_rank: usize,
    local_size: usize,
    chunk_elems: usize,
}

impl Plan {
    fn new<T: DeviceElement>(
        buf: &impl DeviceBuffer,
        local_rank: usize,
        local_size: usize,
        chunk: usize,
    ) -> Plan {
        let elem = size_of::<T>();
        Plan {
            ptr: buf.device_ptr(),
            elem,
            shard: buf.len() / local_size,
            rest: buf.len() % local_size,
            local_rank,
            local_size,
            chunk_elems: (chunk / elem).max(1),
        }
    }

    fn rest_ptr(&self) -> u64 {
        self.ptr + (self.shard * self.local_size * self.elem) as u64
    }

    /// The (device address, elements) ranges this rank carries across
    /// hosts: its shard, and the leftover on the last local rank.
    fn mine(&self) -> Vec<(u64, usize)> {
        let mut ranges = Vec::new();
        if self.shard > 0 {
            ranges.push((
                self.ptr + (self.local_rank * self.shard * self.elem) as u64,
                self.shard,
            ));
        }
        if self.rest > 0 && self.local_rank == self.local_size - 1 {
            ranges.push((self.rest_ptr(), self.rest));
        }
        ranges
    }
}

fn wait_event(event: &dyn crate::runtime::EventImpl, limit: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + limit;
    loop {
        match event.query() {
            Ok(true) => return true,
            Ok(false) if std::time::Instant::now() < until => std::thread::yield_now(),
            _ => return false,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run<T: DeviceElement + Element>(
    plan: &Plan,
    local: &GpuCommunicator,
    cross: &Communicator,
    world: usize,
    op: ReduceOp,
    stream: Option<Stream>,
    staging: &mut Staging,
    at: OpAt,
) -> Result<(), GpuError> {
    let dtype = T::NCCL;
    // Avg: sums throughout, one division on the host at the end of phase 2.
    let phase_op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    let nccl_op = NcclRedOp::from_reduce_op(phase_op);
    let last = plan.local_size - 1;
    let cuda = |call: &'static str, detail: String| GpuError::Cuda {
        at: at.clone(),
        call,
        detail,
    };

    // Phase 1: reduce-scatter (in place) and the leftover to the last rank.
    let mut calls = Vec::new();
    if plan.shard > 0 {
        calls.push(Call::ReduceScatter {
            send: plan.ptr,
            recv: plan.ptr + (plan.local_rank * plan.shard * plan.elem) as u64,
            count: plan.shard,
            dtype,
            op: nccl_op,
        });
    }
    if plan.rest > 0 {
        let p = plan.rest_ptr();
        calls.push(Call::Reduce {
            send: p,
            recv: p,
            count: plan.rest,
            dtype,
            op: nccl_op,
            root: last,
        });
    }
    let streams: Vec<Stream> = stream.into_iter().collect();
    local
        .launch_calls(GpuOp::HierarchicalAllReduce, streams, calls)
        .wait()?;

    // Phase 2: this rank's ranges across hosts, chunked through staging.
    let chunks: Vec<(u64, usize)> = plan
        .mine()
        .into_iter()
        .flat_map(|(ptr, n)| {
            (0..n)
                .step_by(plan.chunk_elems)
                .map(move |s| (ptr + (s * plan.elem) as u64, plan.chunk_elems.min(n - s)))
        })
        .collect();
    let copies = &staging.copies;
    let mut ready = Vec::with_capacity(chunks.len());
    let to_host = |k: usize, ready: &mut Vec<_>| -> Result<(), GpuError> {
        let (ptr, n) = chunks[k];
        // SAFETY: the range lies in the caller's buffer, which the op owns
        // until this job ends; staging buffer k % 2 is not touched by the
        // host until `ready[k]` has passed, nor by another copy (the
        // stream runs copies in order).
        unsafe {
            copies
                .0
                .copy_to_host(staging.buffers[k % 2].as_ref(), 0, ptr, n * plan.elem)
        }
        .map_err(|d| cuda("cuMemcpyDtoHAsync", d))?;
        ready.push(copies.0.record().map_err(|d| cuda("cuEventRecord", d))?);
        Ok(())
    };
    if !chunks.is_empty() {
        to_host(0, &mut ready)?;
    }
    for k in 0..chunks.len() {
        if k + 1 < chunks.len() {
            to_host(k + 1, &mut ready)?;
        }
        if !wait_event(ready[k].as_ref(), local_timeout(cross)) {
            return Err(cuda(
                "cuEventQuery",
                "a copy to the host did not finish".into(),
            ));
        }
        let (ptr, n) = chunks[k];
        let buffer = staging.buffers[k % 2].as_ref();
        // SAFETY: the staging buffer is page-aligned, holds at least n
        // elements (chunks are at most its size), any bit pattern is a
        // valid T, and no copy uses it now (see to_host).
        let host = unsafe { std::slice::from_raw_parts_mut(buffer.ptr().cast::<T>(), n) };
        cross
            .all_reduce_slice(host, phase_op)
            .map_err(|source| GpuError::Cpu {
                at: at.clone(),
                source: Box::new(source),
            })?;
        if op == ReduceOp::Avg {
            let integer = matches!(T::DTYPE, DType::I32 | DType::I64 | DType::U8);
            for x in host.iter_mut() {
                let v = x.to_f64() / world as f64;
                *x = T::from_f64(if integer { v.trunc() } else { v });
            }
        }
        // SAFETY: as in to_host, the other way round; the next copy into
        // this staging buffer is queued after this one on the same stream.
        unsafe { copies.0.copy_to_device(ptr, buffer, 0, n * plan.elem) }
            .map_err(|d| cuda("cuMemcpyHtoDAsync", d))?;
    }

    // Phase 3: all-gather (in place) and the leftover from the last rank,
    // after the copies back (the NCCL stream waits for the copy stream).
    let mut calls = Vec::new();
    if plan.shard > 0 {
        calls.push(Call::AllGather {
            send: plan.ptr + (plan.local_rank * plan.shard * plan.elem) as u64,
            recv: plan.ptr,
            count: plan.shard,
            dtype,
        });
    }
    if plan.rest > 0 {
        let p = plan.rest_ptr();
        calls.push(Call::Broadcast {
            send: p,
            recv: p,
            count: plan.rest,
            dtype,
            root: last,
        });
    }
    local
        .launch_calls(GpuOp::HierarchicalAllReduce, vec![copies.clone()], calls)
        .wait()?;
    Ok(())
}

fn local_timeout(cross: &Communicator) -> std::time::Duration {
    cross.timeout()
}
