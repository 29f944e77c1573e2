//! The flight recorder: the last N ops of a communicator (op, seq, sizes,
//! start and end, state), dumped when an op fails and on demand, as
//! PyTorch's NCCL flight recorder does. When a job dies, the dumps of all
//! ranks side by side show which op each rank was in.

use crate::clock::coarse_now;
use crate::wire::OpKind;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Where an op is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpState {
    /// Submitted, waiting for earlier ops.
    Queued,
    /// Running its schedule.
    Running,
    /// Finished successfully.
    Completed,
    /// Finished with this error.
    Failed(String),
}

/// One op as the flight recorder saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Which collective.
    pub op: OpKind,
    /// Sequence number (per peer pair for send/recv).
    pub seq: u64,
    /// The element type's name (`f32`, ...).
    pub dtype: &'static str,
    /// Elements in this rank's input.
    pub count: u64,
    /// Payload bytes of this rank's input.
    pub bytes: u64,
    /// The peer, for send and recv.
    pub peer: Option<usize>,
    /// When it was queued, since the communicator was created.
    pub queued: Duration,
    /// When it started, if it did.
    pub started: Option<Duration>,
    /// When it ended, if it did.
    pub ended: Option<Duration>,
    /// Where it is now.
    pub state: OpState,
}

/// How many ops the recorder keeps by default (RINGWIRE_FLIGHT_RECORDER_OPS).
pub const DEFAULT_FLIGHT_RECORDER_OPS: usize = 64;

pub(crate) struct FlightRecorder {
    ops: Mutex<VecDeque<OpRecord>>,
    capacity: usize,
    created: Duration,
    created_wall: SystemTime,
}

impl FlightRecorder {
    pub(crate) fn new(capacity: usize) -> FlightRecorder {
        FlightRecorder {
            ops: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
            created: coarse_now(),
            created_wall: SystemTime::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<OpRecord>> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queued(
        &self,
        op: OpKind,
        seq: u64,
        dtype: &'static str,
        count: u64,
        bytes: u64,
        peer: Option<usize>,
    ) {
        if self.capacity == 0 {
            return;
        }
        let mut ops = self.lock();
        if ops.len() == self.capacity {
            ops.pop_front();
        }
        ops.push_back(OpRecord {
            op,
            seq,
            dtype,
            count,
            bytes,
            peer,
            queued: coarse_now().saturating_sub(self.created),
            started: None,
            ended: None,
            state: OpState::Queued,
        });
    }

    fn update(
        &self,
        op: OpKind,
        seq: u64,
        peer: Option<usize>,
        f: impl FnOnce(&mut OpRecord, Duration),
    ) {
        let now = coarse_now().saturating_sub(self.created);
        self.update_at(op, seq, peer, now, f);
    }

    fn update_at(
        &self,
        op: OpKind,
        seq: u64,
        peer: Option<usize>,
        now: Duration,
        f: impl FnOnce(&mut OpRecord, Duration),
    ) {
        if let Some(r) = self
            .lock()
            .iter_mut()
            .rev()
            .find(|r| r.op == op && r.seq == seq && r.peer == peer)
        {
            f(r, now);
        }
    }

    /// The op started; the time recorded, for [`FlightRecorder::ended_after`].
    pub(crate) fn started(&self, op: OpKind, seq: u64, peer: Option<usize>) -> Duration {
        let now = coarse_now().saturating_sub(self.created);
        self.update_at(op, seq, peer, now, |r, now| {
            r.started = Some(now);
            r.state = OpState::Running;
        });
        now
    }

    /// The op ended `took` after it started at `started` (as
    /// [`FlightRecorder::started`] said): no clock read of its own.
    pub(crate) fn ended_after(
        &self,
        (op, seq, peer): (OpKind, u64, Option<usize>),
        error: Option<String>,
        started: Duration,
        took: Duration,
    ) {
        self.update_at(op, seq, peer, started + took, |r, now| {
            r.ended = Some(now);
            r.state = error.map_or(OpState::Completed, OpState::Failed);
        });
    }

    pub(crate) fn ended(&self, op: OpKind, seq: u64, peer: Option<usize>, error: Option<String>) {
        self.update(op, seq, peer, |r, now| {
            r.ended = Some(now);
            r.state = error.map_or(OpState::Completed, OpState::Failed);
        });
    }

    pub(crate) fn records(&self) -> Vec<OpRecord> {
        self.lock().iter().cloned().collect()
    }

    /// A human-readable table of the recorded ops.
    pub(crate) fn dump(&self, rank: usize, world: usize) -> String {
        let since_epoch = self
            .created_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut s = format!(
            "flight recorder of rank {rank}/{world} (times in s since the communicator was created at unix time {since_epoch:.3}):\n"
        );
        let _ = writeln!(
            s,
            "{:>6} {:>14} {:>5} {:>12} {:>6} {:>10} {:>10} {:>10}  state",
            "seq", "op", "type", "elements", "peer", "queued", "started", "ended"
        );
        let t =
            |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.6}", d.as_secs_f64()));
        for r in self.lock().iter() {
            let state = match &r.state {
                OpState::Queued => "queued".to_string(),
                OpState::Running => "RUNNING".to_string(),
                OpState::Completed => "done".to_string(),
                OpState::Failed(e) => format!("FAILED: {e}"),
            };
            let _ = writeln!(
                s,
                "{:>6} {:>14} {:>5} {:>12} {:>6} {:>10} {:>10} {:>10}  {state}",
                r.seq,
                r.op.name(),
                r.dtype,
                r.count,
                r.peer.map_or("-".to_string(), |p| p.to_string()),
                t(Some(r.queued)),
                t(r.started),
                t(r.ended),
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_n_ops_with_their_states() {
        let fr = FlightRecorder::new(2);
        fr.queued(OpKind::AllReduce, 1, "f32", 10, 40, None);
        fr.queued(OpKind::Broadcast, 2, "f32", 10, 40, None);
        fr.queued(OpKind::SendRecv, 1, "u8", 3, 3, Some(4));
        fr.started(OpKind::Broadcast, 2, None);
        fr.ended(OpKind::Broadcast, 2, None, None);
        fr.started(OpKind::SendRecv, 1, Some(4));
        fr.ended(OpKind::SendRecv, 1, Some(4), Some("lost rank 4".into()));
        let r = fr.records();
        assert_eq!(r.len(), 2, "the oldest op fell out");
        assert_eq!(r[0].state, OpState::Completed);
        assert_eq!(r[1].state, OpState::Failed("lost rank 4".into()));
        let dump = fr.dump(0, 8);
        assert!(
            dump.contains("broadcast") && dump.contains("FAILED: lost rank 4"),
            "{dump}"
        );
        assert!(!dump.contains("all_reduce"));
    }
}
