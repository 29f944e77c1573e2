//! `ncclCommShrink`: a child comm of the parent's ranks that are not
//! excluded, renumbered in the parent's order and set up over the parent's
//! mesh, with no unique id, as NCCL sets a child up over its parent's
//! bootstrap.
//!
//! Each staying rank opens a data listener and sends every other rank of
//! the parent (excluded ones too, so that a rank whose list differs learns
//! it) a frame with its port and its exclusion list. It then waits for the
//! frames of the ranks it keeps; a list that differs from its own fails
//! the shrink with `ncclInvalidUsage` rather than building a mesh the
//! others do not build. The child's mesh is made from those ports with a
//! nonce derived from the parent's, the same on every rank.

use crate::codes::{
    INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, NcclResult, SUCCESS, SYSTEM_ERROR,
};
use crate::comm::{COMMS, Comm};
use crate::envcfg;
use crate::fault::{Fault, RankFaults};
use crate::mesh::{self, Mesh};
use crate::wire::{self, KIND_SHRINK, Tag};
use std::ffi::c_void;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;

/// Writes the new handle (or NULL) to the caller's `*newcomm`.
pub(crate) type Publish = Box<dyn FnOnce(*mut c_void) + Send>;

/// One shrink of one rank.
struct Job {
    parent: Arc<Comm>,
    child: Arc<Comm>,
    /// The shrink's number among the parent's: numbers its frames.
    seq: u64,
    mesh: Arc<Mesh>,
    /// Parent ranks kept, in order: child rank `i` is `staying[i]`.
    staying: Vec<usize>,
    /// The sorted list the caller gave.
    excluded: Vec<usize>,
    fail: bool,
    stall: bool,
}

/// The child's nonce: the same on every rank, different for each shrink.
fn child_nonce(parent: u64, seq: u64) -> u64 {
    // splitmix64's finaliser.
    let mut z = parent ^ (seq + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Starts the shrink of `parent` (checked by the caller): runs it at once
/// for a blocking child, else on a thread of its own, returning
/// `ncclInProgress` (the parent's async error says when it has ended).
pub(crate) fn start(
    parent: &Arc<Comm>,
    excluded: Vec<usize>,
    blocking: bool,
    faults: &[Fault],
    publish: Publish,
) -> NcclResult {
    let staying: Vec<usize> = (0..parent.nranks)
        .filter(|r| excluded.binary_search(r).is_err())
        .collect();
    let Some(child_rank) = staying.iter().position(|&r| r == parent.rank) else {
        return INVALID_ARGUMENT; // checked by the caller
    };
    let Some((seq, mesh)) = parent.begin_shrink() else {
        return INVALID_ARGUMENT; // checked by the caller
    };
    // Shrink faults name the parent's rank, the child's op faults its own.
    let mine = RankFaults::for_rank(faults, parent.rank);
    let child = Comm::new(
        staying.len(),
        child_rank,
        blocking,
        child_nonce(parent.nonce, seq),
        RankFaults::for_rank(faults, child_rank),
        envcfg::inprogress_polls(),
    );
    let job = Job {
        parent: Arc::clone(parent),
        child: Arc::new(child),
        seq,
        mesh,
        staying,
        excluded,
        fail: mine.shrink_fail,
        stall: mine.shrink_stall,
    };
    if blocking {
        return job.run(publish);
    }
    let parent = Arc::clone(parent);
    let started = std::thread::Builder::new()
        .name("standin-shrink".into())
        .spawn(move || job.run(publish));
    match started {
        Ok(_) => crate::codes::IN_PROGRESS,
        Err(e) => {
            let text = format!("stand-in NCCL: cannot start a shrink thread: {e}");
            parent.end_shrink(SYSTEM_ERROR, &text);
            SYSTEM_ERROR
        }
    }
}

impl Job {
    /// Sets the child up and hands it over: a blocking caller gets a
    /// handle only on success; a non-blocking one gets it either way (its
    /// async error then says why), as NCCL writes `*newcomm` when the job
    /// ends. An aborted parent takes the child down with it.
    fn run(self, publish: Publish) -> NcclResult {
        let outcome = self.establish();
        let (code, text) = match &outcome {
            Ok(_) => (SUCCESS, String::new()),
            Err((code, text)) => (*code, text.clone()),
        };
        self.child.finish_setup(outcome);
        if self.parent.is_closed() || (code != SUCCESS && self.child.blocking) {
            self.child.abort();
            publish(std::ptr::null_mut());
        } else {
            publish(COMMS.insert(Arc::clone(&self.child)));
        }
        self.parent.end_shrink(code, &text);
        code
    }

    fn establish(&self) -> Result<Mesh, (NcclResult, String)> {
        let (parent, child) = (&self.parent, &self.child);
        let stop = || child.is_aborted() || parent.is_closed();
        let me = parent.rank;
        if self.fail {
            let text = format!("stand-in NCCL: injected shrink failure on rank {me}");
            return Err((SYSTEM_ERROR, text));
        }
        if self.stall {
            while !stop() {
                std::thread::sleep(wire::POLL);
            }
            return Err((SYSTEM_ERROR, "stand-in NCCL: injected shrink stall".into()));
        }
        let system = |e: std::io::Error| {
            let text = format!("stand-in NCCL: cannot open a data listener on 127.0.0.1: {e}");
            (SYSTEM_ERROR, text)
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(system)?;
        let port = listener.local_addr().map_err(system)?.port();
        let payload = encode(port, &self.excluded);
        let tag = Tag {
            kind: KIND_SHRINK,
            dtype: 0,
            seq: self.seq,
            len: payload.len() as u64,
        };
        for peer in (0..parent.nranks).filter(|&p| p != me) {
            parent.send(&self.mesh, peer, tag, &payload);
        }
        let mut ports = Vec::with_capacity(self.staying.len());
        for &peer in &self.staying {
            if peer == me {
                ports.push(port);
                continue;
            }
            let Some(frame) = parent.recv_shrink(peer, self.seq, &stop) else {
                let text = "stand-in NCCL: ncclCommShrink aborted".to_string();
                return Err((SYSTEM_ERROR, text));
            };
            let (their_port, theirs) = decode(&frame).ok_or_else(|| {
                let text =
                    format!("stand-in NCCL: ncclCommShrink: a garbled frame from rank {peer}");
                (INTERNAL_ERROR, text)
            })?;
            if theirs != self.excluded {
                let text = format!(
                    "stand-in NCCL: ncclCommShrink: rank {me} excludes {:?} but rank {peer} \
                     excludes {theirs:?}",
                    self.excluded
                );
                return Err((INVALID_USAGE, text));
            }
            ports.push(their_port);
        }
        let shared = Arc::clone(&child.shared);
        let deliver: mesh::Deliver =
            Arc::new(move |peer, tag, payload| shared.deliver(peer, tag, payload));
        mesh::build(&listener, &ports, child.rank, child.nonce, &deliver, &stop)
            .map_err(|text| (SYSTEM_ERROR, text))
    }
}

/// A shrink frame: the data port (u16 LE), the list's length (u32 LE) and
/// its ranks (u32 LE each).
fn encode(port: u16, excluded: &[usize]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(6 + 4 * excluded.len());
    payload.extend_from_slice(&port.to_le_bytes());
    payload.extend_from_slice(&(excluded.len() as u32).to_le_bytes());
    for &r in excluded {
        payload.extend_from_slice(&u32::try_from(r).unwrap_or(u32::MAX).to_le_bytes());
    }
    payload
}

fn decode(frame: &[u8]) -> Option<(u16, Vec<usize>)> {
    let port = u16::from_le_bytes(frame.get(..2)?.try_into().ok()?);
    let count = u32::from_le_bytes(frame.get(2..6)?.try_into().ok()?) as usize;
    let list = frame.get(6..)?;
    if list.len() != 4 * count {
        return None;
    }
    let ranks = list
        .chunks_exact(4)
        .map(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as usize)
        .collect();
    Some((port, ranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let frame = encode(4242, &[1, 3]);
        assert_eq!(decode(&frame), Some((4242, vec![1, 3])));
        assert_eq!(decode(&frame[..frame.len() - 1]), None);
        assert_eq!(decode(&[1]), None);
    }

    #[test]
    fn each_shrink_of_a_comm_gets_its_own_nonce() {
        let nonces = [child_nonce(7, 0), child_nonce(7, 1), child_nonce(8, 0)];
        assert_ne!(nonces[0], nonces[1]);
        assert_ne!(nonces[0], nonces[2]);
        assert_eq!(child_nonce(7, 1), nonces[1]);
    }
}
