//! [`GpuCommunicator`]: the CPU communicator's collectives on device
//! buffers, through NCCL. Each op checks its arguments, plans its NCCL
//! calls ([`Call`]) and hands them to `flight::CommShared::launch`.

use crate::buffer::{DeviceBuffer, DeviceElement};
use crate::enqueue::Call;
use crate::error::{GpuError, GpuOp};
use crate::flight::{CommShared, MadeBy};
use crate::init::{Options, Parent, init};
use crate::nccl::codes::{NcclDataType, NcclRedOp};
use crate::nccl::library::NcclLibrary;
use crate::pending::PendingCollective;
use crate::runtime::Memory;
use crate::runtime::{Device, Stream};
use ringwire::{Communicator, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

/// Collectives on device buffers among the ranks of a CPU communicator,
/// each on its own NCCL stream, ordered after the caller's stream, and
/// returning a [`PendingCollective`]. Cheap to clone; the NCCL
/// communicator is finalized when the last clone and handle are gone.
#[derive(Clone)]
pub struct GpuCommunicator {
    shared: Arc<CommShared>,
}

impl std::fmt::Debug for GpuCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GpuCommunicator(rank {} of {}, {:?}, {:?})",
            self.shared.rank, self.shared.size, self.shared.device, self.shared.lib
        )
    }
}

/// Options for [`GpuCommunicator::builder`].
pub struct GpuBuilder<'a> {
    cpu: &'a Communicator,
    device: Device,
    library: Option<Arc<NcclLibrary>>,
    timeout: Option<Duration>,
    init_timeout: Option<Duration>,
    compute: Option<Stream>,
}

impl GpuBuilder<'_> {
    /// The NCCL to use (default: [`NcclLibrary::global`]).
    pub fn library(mut self, library: Arc<NcclLibrary>) -> Self {
        self.library = Some(library);
        self
    }

    /// How long an op may run on the device before the communicator is
    /// aborted on every rank (default: the CPU communicator's timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long NCCL may take to initialise (default: the op timeout).
    pub fn init_timeout(mut self, timeout: Duration) -> Self {
        self.init_timeout = Some(timeout);
        self
    }

    /// The stream ops follow when a buffer names none (default: the
    /// device's default stream).
    pub fn compute_stream(mut self, stream: Stream) -> Self {
        self.compute = Some(stream);
        self
    }

    /// Makes the communicator: collective over the CPU communicator's
    /// ranks, each passing its own device.
    pub fn build(self) -> Result<GpuCommunicator, GpuError> {
        // A rank without NCCL still takes part in making the communicator,
        // so the others learn it at once instead of at their timeout.
        let lib = match self.library {
            Some(lib) => Ok(lib),
            None => NcclLibrary::global(),
        };
        let timeout = self.timeout.unwrap_or(self.cpu.timeout());
        let options = Options {
            timeout,
            init_timeout: self.init_timeout.unwrap_or(timeout),
            compute: self.compute,
        };
        let shared = init(self.cpu, &self.device, lib, options, None)?;
        Ok(GpuCommunicator { shared })
    }
}

impl GpuCommunicator {
    /// A GPU communicator over `cpu`'s ranks on `device`, with the
    /// defaults (see [`GpuCommunicator::builder`]). Every rank of `cpu`
    /// calls it.
    pub fn new(cpu: &Communicator, device: &Device) -> Result<GpuCommunicator, GpuError> {
        GpuCommunicator::builder(cpu, device).build()
    }

    /// Options: the library, timeouts, the compute stream.
    pub fn builder<'a>(cpu: &'a Communicator, device: &Device) -> GpuBuilder<'a> {
        GpuBuilder {
            cpu,
            device: device.clone(),
            library: None,
            timeout: None,
            init_timeout: None,
            compute: None,
        }
    }

    /// This rank (the CPU communicator's).
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// How many ranks.
    pub fn world_size(&self) -> usize {
        self.shared.size
    }

    /// The device its ops run on.
    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    /// The NCCL in use.
    pub fn library(&self) -> &Arc<NcclLibrary> {
        &self.shared.lib
    }

    /// The stream NCCL runs this communicator's ops on.
    pub fn nccl_stream(&self) -> &Stream {
        &self.shared.stream
    }

    /// Why the communicator failed, if it has.
    pub fn failure(&self) -> Option<String> {
        self.shared.progress();
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failure
            .clone()
    }

    /// Fails the communicator here and on every rank: pending and later
    /// ops end with [`GpuError::Aborted`], and NCCL's communicator is
    /// aborted (on a helper thread, under a deadline), also one that a
    /// failure kept for [`GpuCommunicator::shrink`].
    pub fn abort(&self, reason: &str) {
        self.shared.abort(reason);
    }

    /// A communicator of the ranks that pass the same `color`, ordered by
    /// `key` then rank, as [`Communicator::split`]; `None` for ranks that
    /// pass no color. Every rank calls it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<GpuCommunicator>, GpuError> {
        let at = self.shared.at(GpuOp::Init, 0);
        let cpu = self
            .shared
            .cpu
            .split(color, key)
            .map_err(|source| GpuError::Cpu {
                at,
                source: Box::new(source),
            })?;
        let Some(cpu) = cpu else { return Ok(None) };
        GpuCommunicator::builder(&cpu, &self.shared.device)
            .library(self.shared.lib.clone())
            .timeout(self.shared.timeout)
            .compute_stream(self.shared.compute.clone())
            .build()
            .map(Some)
    }

    /// Goes on after a lost rank (issue 45): `cpu` is the communicator
    /// [`Communicator::shrink`] made from this one's CPU communicator, and
    /// every member of `cpu` calls it. The result is a GPU communicator of
    /// `cpu`'s members on the same device, library, timeout and compute
    /// stream. Where every member's NCCL has `ncclCommShrink` (2.27.3 and
    /// newer) and the old communicator has no error of NCCL's own, it is
    /// made by `ncclCommShrink` with `NCCL_SHRINK_ABORT` (no new unique
    /// id; ops stuck on the lost rank are ended first); otherwise, or if
    /// that fails on any member, this NCCL communicator is aborted and a
    /// new one is made with a unique id sent over `cpu`. A `cpu` with
    /// members this one did not have (after [`Communicator::admit`]) takes
    /// the second way; a member that had no GPU communicator before calls
    /// [`GpuCommunicator::new`] on `cpu` instead, and takes part in the
    /// same exchange. Either way this communicator stays failed.
    pub fn shrink(&self, cpu: &Communicator) -> Result<GpuCommunicator, GpuError> {
        let shared = &self.shared;
        let parent = shared.park_for_shrink().map(|parked| Parent {
            parked,
            rank: shared.rank,
            size: shared.size,
            lineage: shared.lineage,
        });
        let options = Options {
            timeout: shared.timeout,
            init_timeout: shared.init_timeout,
            compute: Some(shared.compute.clone()),
        };
        let shared = init(cpu, &shared.device, Ok(shared.lib.clone()), options, parent)?;
        Ok(GpuCommunicator { shared })
    }

    /// Whether `ncclCommShrink` made this communicator (for tests: which
    /// way [`GpuCommunicator::shrink`] went).
    #[doc(hidden)]
    pub fn made_by_nccl_shrink(&self) -> bool {
        self.shared.made_by == MadeBy::Shrink
    }

    fn invalid<R: Send + 'static>(&self, op: GpuOp, detail: String) -> PendingCollective<R> {
        let seq = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_seq;
        PendingCollective::failed(GpuError::InvalidArgument {
            at: self.shared.at(op, seq),
            detail,
        })
    }

    fn check_memory(&self, memory: Memory, what: &str) -> Result<(), String> {
        let mine = self.shared.device.memory();
        if memory == mine {
            Ok(())
        } else {
            Err(format!(
                "the {what} is in {memory}, but this communicator's device uses {mine}"
            ))
        }
    }

    fn check_rank(&self, rank: usize, what: &str) -> Result<(), String> {
        if rank < self.shared.size {
            Ok(())
        } else {
            Err(format!(
                "{what} {rank} is not a rank of this communicator of {}",
                self.shared.size
            ))
        }
    }

    /// RINGWIRE_DEBUG=detail: every rank's (op, type, count, root) must
    /// match, checked over the CPU twin before NCCL sees the op.
    fn debug_check(
        &self,
        op: GpuOp,
        dtype: NcclDataType,
        count: usize,
        root: usize,
    ) -> Result<(), GpuError> {
        if !self.shared.debug_checks {
            return Ok(());
        }
        let seq = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_seq;
        let at = self.shared.at(op, seq);
        let mine = [op as i64, dtype.0 as i64, count as i64, root as i64];
        let mut all = vec![0i64; 4 * self.shared.size];
        self.shared
            .cpu
            .all_gather_slice(&mine, &mut all)
            .map_err(|source| GpuError::Cpu {
                at: at.clone(),
                source: Box::new(source),
            })?;
        for (peer, theirs) in all.chunks(4).enumerate() {
            if theirs != mine {
                let describe = |f: &[i64]| {
                    format!(
                        "op {}, dtype {}, count {}, root {}",
                        name_of(f[0]),
                        f[1],
                        f[2],
                        f[3]
                    )
                };
                return Err(GpuError::Mismatch {
                    at,
                    detail: format!(
                        "rank {} called {}; rank {peer} called {}",
                        self.shared.rank,
                        describe(&mine),
                        describe(theirs)
                    ),
                });
            }
        }
        Ok(())
    }

    fn launch<R: Send + 'static>(
        &self,
        op: GpuOp,
        value: R,
        streams: Vec<Option<Stream>>,
        check: (NcclDataType, usize, usize),
        calls: Vec<Call>,
    ) -> PendingCollective<R> {
        if let Err(e) = self.debug_check(op, check.0, check.1, check.2) {
            return PendingCollective::failed(e);
        }
        let streams = streams.into_iter().flatten().collect();
        self.shared.launch(op, value, streams, calls)
    }

    /// Queues planned calls that own no buffer (the hierarchical
    /// all-reduce's phases, whose buffer its own op holds).
    pub(crate) fn launch_calls(
        &self,
        op: GpuOp,
        streams: Vec<Stream>,
        calls: Vec<Call>,
    ) -> PendingCollective<()> {
        self.shared.launch(op, (), streams, calls)
    }

    /// Reduces `buf` across ranks in place; every rank gets the result.
    pub fn all_reduce<B: DeviceBuffer>(&self, buf: B, op: ReduceOp) -> PendingCollective<B> {
        if let Err(d) = self.check_memory(buf.memory(), "buffer") {
            return self.invalid(GpuOp::AllReduce, d);
        }
        let (ptr, count, dtype) = (buf.device_ptr(), buf.len(), B::Elem::NCCL);
        let calls = vec![Call::AllReduce {
            send: ptr,
            recv: ptr,
            count,
            dtype,
            op: NcclRedOp::from_reduce_op(op),
        }];
        let streams = vec![buf.stream()];
        self.launch(
            GpuOp::AllReduce,
            buf,
            streams,
            (dtype, count, op as usize),
            calls,
        )
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<B: DeviceBuffer>(&self, buf: B, root: usize) -> PendingCollective<B> {
        if let Err(d) = self
            .check_memory(buf.memory(), "buffer")
            .and_then(|()| self.check_rank(root, "root"))
        {
            return self.invalid(GpuOp::Broadcast, d);
        }
        let (ptr, count, dtype) = (buf.device_ptr(), buf.len(), B::Elem::NCCL);
        let calls = vec![Call::Broadcast {
            send: ptr,
            recv: ptr,
            count,
            dtype,
            root,
        }];
        let streams = vec![buf.stream()];
        self.launch(GpuOp::Broadcast, buf, streams, (dtype, count, root), calls)
    }

    /// Reduces every rank's `buf` into `root`'s, in place (other ranks'
    /// buffers are only read).
    pub fn reduce<B: DeviceBuffer>(
        &self,
        buf: B,
        op: ReduceOp,
        root: usize,
    ) -> PendingCollective<B> {
        if let Err(d) = self
            .check_memory(buf.memory(), "buffer")
            .and_then(|()| self.check_rank(root, "root"))
        {
            return self.invalid(GpuOp::Reduce, d);
        }
        let (ptr, count, dtype) = (buf.device_ptr(), buf.len(), B::Elem::NCCL);
        let calls = vec![Call::Reduce {
            send: ptr,
            recv: ptr,
            count,
            dtype,
            op: NcclRedOp::from_reduce_op(op),
            root,
        }];
        let streams = vec![buf.stream()];
        let check = (dtype, count, root * 8 + op as usize);
        self.launch(GpuOp::Reduce, buf, streams, check, calls)
    }

    /// Every rank's `input` (n elements) into every rank's `output`
    /// (n × world size), in rank order.
    pub fn all_gather<B: DeviceBuffer, O: DeviceBuffer<Elem = B::Elem>>(
        &self,
        input: B,
        output: O,
    ) -> PendingCollective<(B, O)> {
        let n = input.len();
        let checked = self
            .check_memory(input.memory(), "input")
            .and_then(|()| self.check_memory(output.memory(), "output"))
            .and_then(|()| {
                self.check_len(
                    output.len(),
                    n * self.shared.size,
                    "output",
                    "input × world size",
                )
            });
        if let Err(d) = checked {
            return self.invalid(GpuOp::AllGather, d);
        }
        let dtype = B::Elem::NCCL;
        let calls = vec![Call::AllGather {
            send: input.device_ptr(),
            recv: output.device_ptr(),
            count: n,
            dtype,
        }];
        let streams = vec![input.stream(), output.stream()];
        self.launch(
            GpuOp::AllGather,
            (input, output),
            streams,
            (dtype, n, 0),
            calls,
        )
    }

    /// Reduces `input` (n × world size) across ranks; rank r's `output`
    /// (n) gets block r.
    pub fn reduce_scatter<B: DeviceBuffer, O: DeviceBuffer<Elem = B::Elem>>(
        &self,
        input: B,
        output: O,
        op: ReduceOp,
    ) -> PendingCollective<(B, O)> {
        let n = output.len();
        let checked = self
            .check_memory(input.memory(), "input")
            .and_then(|()| self.check_memory(output.memory(), "output"))
            .and_then(|()| {
                self.check_len(
                    input.len(),
                    n * self.shared.size,
                    "input",
                    "output × world size",
                )
            });
        if let Err(d) = checked {
            return self.invalid(GpuOp::ReduceScatter, d);
        }
        let dtype = B::Elem::NCCL;
        let calls = vec![Call::ReduceScatter {
            send: input.device_ptr(),
            recv: output.device_ptr(),
            count: n,
            dtype,
            op: NcclRedOp::from_reduce_op(op),
        }];
        let streams = vec![input.stream(), output.stream()];
        self.launch(
            GpuOp::ReduceScatter,
            (input, output),
            streams,
            (dtype, n, op as usize),
            calls,
        )
    }

    /// Block p of `input` goes to rank p, whose `output` holds it at
    /// block (this rank); both hold world size equal blocks. NCCL calls
    /// grouped sends and receives (every NCCL since 2.7 has them).
    pub fn all_to_all<B: DeviceBuffer, O: DeviceBuffer<Elem = B::Elem>>(
        &self,
        input: B,
        output: O,
    ) -> PendingCollective<(B, O)> {
        let size = self.shared.size;
        let checked = self
            .check_memory(input.memory(), "input")
            .and_then(|()| self.check_memory(output.memory(), "output"))
            .and_then(|()| self.check_len(output.len(), input.len(), "output", "input"))
            .and_then(|()| {
                if input.len().is_multiple_of(size) {
                    Ok(())
                } else {
                    Err(format!(
                        "the input's {} elements do not split into {size} equal blocks",
                        input.len()
                    ))
                }
            });
        if let Err(d) = checked {
            return self.invalid(GpuOp::AllToAll, d);
        }
        let block = input.len() / size;
        let bytes = (block * size_of::<B::Elem>()) as u64;
        let dtype = B::Elem::NCCL;
        let mut calls = Vec::with_capacity(2 * size);
        for peer in 0..size {
            calls.push(Call::Send {
                buf: input.device_ptr() + peer as u64 * bytes,
                count: block,
                dtype,
                peer,
            });
            calls.push(Call::Recv {
                buf: output.device_ptr() + peer as u64 * bytes,
                count: block,
                dtype,
                peer,
            });
        }
        let streams = vec![input.stream(), output.stream()];
        self.launch(
            GpuOp::AllToAll,
            (input, output),
            streams,
            (dtype, block * size, 0),
            calls,
        )
    }

    /// Every rank's `input` (n) into `root`'s `output` (n × world size),
    /// in rank order; other ranks' `output` is not touched (it may be
    /// empty).
    pub fn gather<B: DeviceBuffer, O: DeviceBuffer<Elem = B::Elem>>(
        &self,
        input: B,
        output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        let (n, size, me) = (input.len(), self.shared.size, self.shared.rank);
        let checked = self
            .check_rank(root, "root")
            .and_then(|()| self.check_memory(input.memory(), "input"))
            .and_then(|()| {
                if me == root {
                    self.check_memory(output.memory(), "output")?;
                    self.check_len(
                        output.len(),
                        n * size,
                        "root's output",
                        "input × world size",
                    )
                } else {
                    Ok(())
                }
            });
        if let Err(d) = checked {
            return self.invalid(GpuOp::Gather, d);
        }
        let dtype = B::Elem::NCCL;
        let bytes = (n * size_of::<B::Elem>()) as u64;
        let mut calls = vec![Call::Send {
            buf: input.device_ptr(),
            count: n,
            dtype,
            peer: root,
        }];
        if me == root {
            for peer in 0..size {
                calls.push(Call::Recv {
                    buf: output.device_ptr() + peer as u64 * bytes,
                    count: n,
                    dtype,
                    peer,
                });
            }
        }
        let streams = vec![input.stream(), output.stream()];
        self.launch(
            GpuOp::Gather,
            (input, output),
            streams,
            (dtype, n, root),
            calls,
        )
    }

    /// Block p of `root`'s `input` (n × world size) into rank p's `output`
    /// (n); other ranks' `input` is not read (it may be empty).
    pub fn scatter<B: DeviceBuffer, O: DeviceBuffer<Elem = B::Elem>>(
        &self,
        input: B,
        output: O,
        root: usize,
    ) -> PendingCollective<(B, O)> {
        let (n, size, me) = (output.len(), self.shared.size, self.shared.rank);
        let checked = self
            .check_rank(root, "root")
            .and_then(|()| self.check_memory(output.memory(), "output"))
            .and_then(|()| {
                if me == root {
                    self.check_memory(input.memory(), "input")?;
                    self.check_len(input.len(), n * size, "root's input", "output × world size")
                } else {
                    Ok(())
                }
            });
        if let Err(d) = checked {
            return self.invalid(GpuOp::Scatter, d);
        }
        let dtype = B::Elem::NCCL;
        let bytes = (n * size_of::<B::Elem>()) as u64;
        let mut calls = Vec::new();
        if me == root {
            for peer in 0..size {
                calls.push(Call::Send {
                    buf: input.device_ptr() + peer as u64 * bytes,
                    count: n,
                    dtype,
                    peer,
                });
            }
        }
        calls.push(Call::Recv {
            buf: output.device_ptr(),
            count: n,
            dtype,
            peer: root,
        });
        let streams = vec![input.stream(), output.stream()];
        self.launch(
            GpuOp::Scatter,
            (input, output),
            streams,
            (dtype, n, root),
            calls,
        )
    }

    /// Sends `buf` to `peer`, which calls [`GpuCommunicator::recv`].
    pub fn send<B: DeviceBuffer>(&self, buf: B, peer: usize) -> PendingCollective<B> {
        if let Err(d) = self
            .check_memory(buf.memory(), "buffer")
            .and_then(|()| self.check_rank(peer, "peer"))
        {
            return self.invalid(GpuOp::Send, d);
        }
        let calls = vec![Call::Send {
            buf: buf.device_ptr(),
            count: buf.len(),
            dtype: B::Elem::NCCL,
            peer,
        }];
        let streams = vec![buf.stream()];
        // Point-to-point ops differ between the two sides: no debug check.
        self.shared.launch(
            GpuOp::Send,
            buf,
            streams.into_iter().flatten().collect(),
            calls,
        )
    }

    /// Receives into `buf` what `peer` sends.
    pub fn recv<B: DeviceBuffer>(&self, buf: B, peer: usize) -> PendingCollective<B> {
        if let Err(d) = self
            .check_memory(buf.memory(), "buffer")
            .and_then(|()| self.check_rank(peer, "peer"))
        {
            return self.invalid(GpuOp::Recv, d);
        }
        let calls = vec![Call::Recv {
            buf: buf.device_ptr(),
            count: buf.len(),
            dtype: B::Elem::NCCL,
            peer,
        }];
        let streams = vec![buf.stream()];
        self.shared.launch(
            GpuOp::Recv,
            buf,
            streams.into_iter().flatten().collect(),
            calls,
        )
    }

    /// Completes once every rank has reached it: a one-element all-reduce
    /// on memory the communicator owns (NCCL drops zero-element
    /// collectives, so a zero-byte one would not wait for anyone).
    pub fn barrier(&self) -> PendingCollective<()> {
        let ptr = self.shared.scratch.ptr();
        let dtype = NcclDataType::FLOAT32;
        let calls = vec![Call::AllReduce {
            send: ptr,
            recv: ptr,
            count: 1,
            dtype,
            op: NcclRedOp::SUM,
        }];
        self.launch(GpuOp::Barrier, (), Vec::new(), (dtype, 1, 0), calls)
    }

    /// Many ops on buffers of one type, fused into one NCCL group: one
    /// launch, one handle (a trainer's gradient bucket).
    pub fn group<B: DeviceBuffer>(&self) -> Group<'_, B> {
        Group {
            comm: self,
            calls: Vec::new(),
            buffers: Vec::new(),
            error: None,
            fingerprint: (0, 0),
        }
    }

    fn check_len(&self, got: usize, want: usize, what: &str, rule: &str) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "the {what} holds {got} elements; it must hold {want} ({rule})"
            ))
        }
    }
}

fn name_of(code: i64) -> &'static str {
    const OPS: [GpuOp; 14] = [
        GpuOp::Init,
        GpuOp::AllReduce,
        GpuOp::Broadcast,
        GpuOp::Reduce,
        GpuOp::AllGather,
        GpuOp::ReduceScatter,
        GpuOp::AllToAll,
        GpuOp::Gather,
        GpuOp::Scatter,
        GpuOp::Send,
        GpuOp::Recv,
        GpuOp::Barrier,
        GpuOp::Group,
        GpuOp::HierarchicalAllReduce,
    ];
    OPS.iter()
        .find(|o| **o as i64 == code)
        .map_or("?", |o| o.name())
}

/// Ops gathered for one launch; see [`GpuCommunicator::group`].
pub struct Group<'a, B: DeviceBuffer> {
    comm: &'a GpuCommunicator,
    calls: Vec<Call>,
    buffers: Vec<B>,
    error: Option<String>,
    /// (ops, elements), for the debug check.
    fingerprint: (usize, usize),
}

impl<B: DeviceBuffer> Group<'_, B> {
    fn add(
        &mut self,
        buf: B,
        call: impl FnOnce(u64, usize, NcclDataType) -> Call,
        root: Option<usize>,
    ) -> &mut Self {
        let mut checked = self.comm.check_memory(buf.memory(), "buffer");
        if let Some(root) = root {
            checked = checked.and_then(|()| self.comm.check_rank(root, "root or peer"));
        }
        if let Err(d) = checked {
            let index = self.buffers.len();
            self.error
                .get_or_insert(format!("op {index} of the group: {d}"));
        }
        self.calls
            .push(call(buf.device_ptr(), buf.len(), B::Elem::NCCL));
        self.fingerprint = (self.fingerprint.0 + 1, self.fingerprint.1 + buf.len());
        self.buffers.push(buf);
        self
    }

    /// An in-place all-reduce of `buf`.
    pub fn all_reduce(&mut self, buf: B, op: ReduceOp) -> &mut Self {
        let op = NcclRedOp::from_reduce_op(op);
        self.add(
            buf,
            |p, count, dtype| Call::AllReduce {
                send: p,
                recv: p,
                count,
                dtype,
                op,
            },
            None,
        )
    }

    /// A broadcast of `root`'s `buf`.
    pub fn broadcast(&mut self, buf: B, root: usize) -> &mut Self {
        self.add(
            buf,
            |p, count, dtype| Call::Broadcast {
                send: p,
                recv: p,
                count,
                dtype,
                root,
            },
            Some(root),
        )
    }

    /// An in-place reduce into `root`'s `buf`.
    pub fn reduce(&mut self, buf: B, op: ReduceOp, root: usize) -> &mut Self {
        let op = NcclRedOp::from_reduce_op(op);
        self.add(
            buf,
            |p, count, dtype| Call::Reduce {
                send: p,
                recv: p,
                count,
                dtype,
                op,
                root,
            },
            Some(root),
        )
    }

    /// A send of `buf` to `peer`.
    pub fn send(&mut self, buf: B, peer: usize) -> &mut Self {
        self.add(
            buf,
            |p, count, dtype| Call::Send {
                buf: p,
                count,
                dtype,
                peer,
            },
            Some(peer),
        )
    }

    /// A receive into `buf` from `peer`.
    pub fn recv(&mut self, buf: B, peer: usize) -> &mut Self {
        self.add(
            buf,
            |p, count, dtype| Call::Recv {
                buf: p,
                count,
                dtype,
                peer,
            },
            Some(peer),
        )
    }

    /// Queues the whole group; the handle gives the buffers back in the
    /// order they were added.
    pub fn launch(self) -> PendingCollective<Vec<B>> {
        if let Some(detail) = self.error {
            return self.comm.invalid(GpuOp::Group, detail);
        }
        let streams: Vec<Option<Stream>> =
            dedup_streams(self.buffers.iter().map(DeviceBuffer::stream));
        let (ops, elements) = self.fingerprint;
        let has_p2p = self
            .calls
            .iter()
            .any(|c| matches!(c, Call::Send { .. } | Call::Recv { .. }));
        if has_p2p {
            let streams = streams.into_iter().flatten().collect();
            return self
                .comm
                .shared
                .launch(GpuOp::Group, self.buffers, streams, self.calls);
        }
        self.comm.launch(
            GpuOp::Group,
            self.buffers,
            streams,
            (B::Elem::NCCL, elements, ops),
            self.calls,
        )
    }
}

fn dedup_streams(streams: impl Iterator<Item = Option<Stream>>) -> Vec<Option<Stream>> {
    let mut out: Vec<Option<Stream>> = Vec::new();
    for s in streams.flatten() {
        if !out.iter().flatten().any(|o| o.same(&s)) {
            out.push(Some(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn handles_cross_threads() {
        fn both<T: Send + Sync>() {}
        both::<super::GpuCommunicator>();
    }
}
