//! Per-communicator counters: ops completed, bytes moved, and op latency
//! percentiles (hdrhistogram, microseconds); and, for the Prometheus
//! metrics (`crate::metrics`), the same per op kind with a fixed-bucket
//! latency histogram, and failures per kind of error.
//!
//! Everything is recorded under the one lock an op already took, into
//! fixed arrays indexed by op kind: no allocation per op.

use crate::error::Error;
use crate::wire::OpKind;
use hdrhistogram::Histogram;
use std::sync::Mutex;
use std::time::Duration;

/// Bytes moved by one op, for stats.
#[derive(Default, Clone, Copy)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    /// The op ran in two levels (its bytes are its groups', decision 0033).
    pub(crate) two_level: bool,
}

/// What one lane this rank writes to a peer has carried (decision 0034):
/// [`crate::Communicator::lane_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Bytes the kernel took on the lane (16-byte piece headers included).
    pub bytes_sent: u64,
    /// Pieces of payloads wholly sent on it.
    pub pieces_sent: u64,
    /// Bytes its socket held unacknowledged when last looked at (before a
    /// placement; links with more than one lane only): its queue depth.
    pub unacked_bytes: u64,
    /// Sends by SEND_ZC: each lane tries one for its first large piece and
    /// keeps to it while the kernel reports it sent in place.
    pub zero_copy_sends: u64,
    /// SEND_ZC sends the kernel reported it copied after all (loopback,
    /// veth, a NIC without the offload): the lane's fallbacks to plain
    /// sends.
    pub copied_sends: u64,
    /// The lane's delivery rate in bytes per second, as the engine last
    /// kept it to place pieces by: bytes acknowledged over the kernel's
    /// busy time of the lane (decision 0037; 0: none yet, or one lane).
    pub delivery_rate: u64,
}

/// What one engine thread of this process has done (decision 0036):
/// [`crate::Communicator::engine_thread_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineThreadStats {
    /// The core it is pinned to (`None`: the host had too few cores to
    /// give every rank's threads their own, and the scheduler places it).
    pub core: Option<usize>,
    /// Lane sends and receives it submitted.
    pub entries: u64,
    /// Bytes those moved, both ways (piece headers included).
    pub bytes: u64,
    /// Times it woke from waiting on its ring.
    pub wakeups: u64,
    /// CPU time it used, user and system: its busy time (the kernel's
    /// copies of lane traffic are system time, spent inside its waits).
    /// Over `bytes`, what moving a byte cost.
    pub cpu: Duration,
}

/// A snapshot of a communicator's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Ops that completed successfully.
    pub ops: u64,
    /// Payload bytes this rank sent (of an op on the shared-memory arena:
    /// the bytes it staged, once for every rank that read them).
    pub bytes_sent: u64,
    /// Payload bytes this rank received (on the arena: read from other
    /// ranks' staging).
    pub bytes_received: u64,
    /// Ops that ran in two levels: within each host, then across hosts
    /// (decision 0033). Their bytes are those of both levels' groups.
    pub two_level_ops: u64,
    /// Median op latency.
    pub p50: Duration,
    /// 99th-percentile op latency.
    pub p99: Duration,
    /// Slowest op.
    pub max: Duration,
    /// Most bytes peers had sent ahead of this rank at once (frames of ops
    /// it had not started, over every link of the process). Past
    /// [`crate::Builder::run_ahead_bytes`] per peer, a link is not read
    /// until this rank catches up, so this stays near that limit times the
    /// peers that run ahead (decision 0019).
    pub held_ahead_peak_bytes: u64,
    /// Bytes peers have sent ahead of this rank now (as
    /// `held_ahead_peak_bytes`).
    pub held_ahead_bytes: u64,
    /// Queues this process keeps for frames, one per (communicator, peer)
    /// pair that has received any: over every communicator of the process.
    /// A dropped communicator's go with it, and frames that come for it
    /// later are discarded without making new ones.
    pub inboxes: u64,
}

/// Upper bounds (inclusive, nanoseconds) of the buckets of the
/// `ringwire_op_latency_seconds` histogram; a last bucket takes the rest.
///
/// Fixed, so that the series of every rank, communicator and version add
/// up (`sum by (le)`): 1, 3, 10 per decade from 10 us to 100 s. A small op
/// between local ranks takes 10-100 us, a large one over TCP up to
/// seconds, and the default op timeout is 60 s; steps of about 3x keep
/// `histogram_quantile`'s error under that factor with 16 series per op
/// kind (finer steps cost series on every scrape for little: the
/// percentiles of `Communicator::stats` are the exact view).
pub(crate) const LATENCY_BOUNDS_NS: [u64; 15] = [
    10_000,
    30_000,
    100_000,
    300_000,
    1_000_000,
    3_000_000,
    10_000_000,
    30_000_000,
    100_000_000,
    300_000_000,
    1_000_000_000,
    3_000_000_000,
    10_000_000_000,
    30_000_000_000,
    100_000_000_000,
];

/// The `kind` labels of `ringwire_failures_total`: [`Error::kind`] of the
/// errors an op can end with, and `other` for any other (a variant added
/// later). All are exported, zeros too, so a rate or an alert sees the
/// first failure.
pub(crate) const FAILURE_KINDS: [&str; 10] = [
    "timeout",
    "peer_lost",
    "aborted",
    "mismatch",
    "internal",
    "failed",
    "connect",
    "invalid_argument",
    "io",
    "other",
];

/// One op kind's counters, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct OpCounters {
    /// Ops of this kind that completed successfully.
    pub(crate) ops: u64,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    /// Of them, those that ran in two levels (decision 0033).
    pub(crate) two_level: u64,
    /// Their latencies added up.
    pub(crate) latency_sum_ns: u64,
    /// Completed ops per latency bucket (not cumulative): bucket `i` holds
    /// those at most `LATENCY_BOUNDS_NS[i]` and above the bound before;
    /// the last, those above every bound.
    pub(crate) latency_buckets: [u64; LATENCY_BOUNDS_NS.len() + 1],
}

/// A communicator's counters per op kind and failures per kind of error.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Counters {
    /// Indexed by `OpKind as usize` (the wire byte, 0 to 10).
    pub(crate) per_op: [OpCounters; OpKind::ALL.len()],
    /// Indexed as [`FAILURE_KINDS`].
    pub(crate) failures: [u64; FAILURE_KINDS.len()],
}

impl Counters {
    /// The counters of `op`.
    pub(crate) fn op(&self, op: OpKind) -> &OpCounters {
        &self.per_op[op as usize]
    }
}

/// The bucket of [`LATENCY_BOUNDS_NS`] an op of `ns` nanoseconds falls in.
fn latency_bucket(ns: u64) -> usize {
    LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns)
}

/// Where a failure of `kind` ([`Error::kind`]) counts in
/// [`Counters::failures`].
fn failure_index(kind: &str) -> usize {
    FAILURE_KINDS
        .iter()
        .position(|&k| k == kind)
        .unwrap_or(FAILURE_KINDS.len() - 1)
}

struct Recorded {
    stats: Stats,
    hist: Histogram<u64>,
    counters: Counters,
}

pub(crate) struct StatsRecorder {
    inner: Mutex<Recorded>,
}

impl Default for StatsRecorder {
    fn default() -> Self {
        // 1 us to 1 hour at 3 significant digits; new_with_bounds only fails
        // for invalid bounds, which these are not.
        let hist = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        StatsRecorder {
            inner: Mutex::new(Recorded {
                stats: Stats::default(),
                hist,
                counters: Counters::default(),
            }),
        }
    }
}

impl StatsRecorder {
    /// An op of kind `op` completed in `elapsed`, moving `traffic`.
    pub(crate) fn record(&self, op: OpKind, elapsed: Duration, traffic: Traffic) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = latency_bucket(ns);
        let mut guard = self.lock();
        let Recorded {
            stats,
            hist,
            counters,
        } = &mut *guard;
        stats.ops += 1;
        stats.bytes_sent += traffic.sent;
        stats.bytes_received += traffic.received;
        stats.two_level_ops += u64::from(traffic.two_level);
        hist.saturating_record(elapsed.as_micros().clamp(1, u128::from(u64::MAX)) as u64);
        let per_op = &mut counters.per_op[op as usize];
        per_op.ops += 1;
        per_op.bytes_sent += traffic.sent;
        per_op.bytes_received += traffic.received;
        per_op.two_level += u64::from(traffic.two_level);
        per_op.latency_sum_ns = per_op.latency_sum_ns.saturating_add(ns);
        per_op.latency_buckets[bucket] += 1;
    }

    /// An op ended with `error` (or was refused: the communicator had
    /// failed).
    pub(crate) fn failed(&self, error: &Error) {
        let index = failure_index(error.kind());
        self.lock().counters.failures[index] += 1;
    }

    /// The per-op-kind counters and failures so far.
    pub(crate) fn counters(&self) -> Counters {
        self.lock().counters
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Payload bytes sent and received so far (cheap: no percentiles).
    pub(crate) fn bytes(&self) -> (u64, u64) {
        let guard = self.lock();
        (guard.stats.bytes_sent, guard.stats.bytes_received)
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let guard = self.lock();
        let Recorded { stats, hist, .. } = &*guard;
        let us = Duration::from_micros;
        Stats {
            p50: us(hist.value_at_quantile(0.5)),
            p99: us(hist.value_at_quantile(0.99)),
            max: us(hist.max()),
            ..stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_kinds_index_their_counters() {
        for (i, op) in OpKind::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op}");
        }
    }

    #[test]
    fn latency_buckets_hold_their_upper_bound() {
        assert!(LATENCY_BOUNDS_NS.is_sorted());
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(10_000), 0);
        assert_eq!(latency_bucket(10_001), 1);
        assert_eq!(latency_bucket(1_000_000_000), 10);
        assert_eq!(latency_bucket(100_000_000_000), 14);
        assert_eq!(latency_bucket(100_000_000_001), 15);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BOUNDS_NS.len());
    }

    #[test]
    fn records_per_op_kind_and_failures_per_error_kind() {
        let recorder = StatsRecorder::default();
        let traffic = |sent, received| Traffic {
            sent,
            received,
            two_level: false,
        };
        recorder.record(OpKind::AllReduce, Duration::from_micros(20), traffic(8, 16));
        recorder.record(OpKind::AllReduce, Duration::from_secs(200), traffic(1, 2));
        recorder.record(OpKind::Barrier, Duration::from_micros(5), traffic(0, 0));
        recorder.failed(&Error::ShutDown(OpKind::Gather));
        recorder.failed(&Error::Failed { first: "x".into() });
        recorder.failed(&Error::Failed { first: "y".into() });
        let c = recorder.counters();
        let all_reduce = c.op(OpKind::AllReduce);
        assert_eq!(
            (
                all_reduce.ops,
                all_reduce.bytes_sent,
                all_reduce.bytes_received
            ),
            (2, 9, 18)
        );
        assert_eq!(all_reduce.latency_sum_ns, 200_000_020_000);
        assert_eq!(all_reduce.latency_buckets[1], 1);
        assert_eq!(all_reduce.latency_buckets[LATENCY_BOUNDS_NS.len()], 1);
        assert_eq!(all_reduce.latency_buckets.iter().sum::<u64>(), 2);
        assert_eq!(c.op(OpKind::Barrier).latency_buckets[0], 1);
        assert_eq!(c.op(OpKind::Broadcast), &OpCounters::default());
        assert_eq!(c.failures[failure_index("failed")], 2);
        assert_eq!(
            c.failures[FAILURE_KINDS.len() - 1],
            1,
            "shut_down counts as other"
        );
        assert_eq!(c.failures.iter().sum::<u64>(), 3);
        // The totals of `stats()` still count every op.
        assert_eq!(recorder.snapshot().ops, 3);
        assert_eq!(recorder.snapshot().bytes_received, 18);
    }

    #[test]
    fn failure_kinds_are_error_kinds() {
        let ctx = crate::error::OpContext {
            op: OpKind::AllReduce,
            seq: 0,
            dtype: "f32",
            count: 1,
            rank: 0,
        };
        let errors = [
            Error::Timeout {
                ctx: ctx.clone(),
                peer: 1,
                waited: Duration::ZERO,
                detail: String::new(),
            },
            Error::PeerLost {
                ctx: ctx.clone(),
                peer: 1,
                reason: String::new(),
                cause: crate::LinkFailure::Closed,
            },
            Error::Aborted {
                ctx: ctx.clone(),
                origin: 1,
                origin_seq: 0,
                reason: String::new(),
            },
            Error::Mismatch {
                ctx: ctx.clone(),
                peer: 1,
                detail: String::new(),
            },
            Error::Internal {
                ctx,
                detail: String::new(),
            },
            Error::Failed {
                first: String::new(),
            },
            Error::Connect {
                peer: 1,
                addr: String::new(),
                detail: String::new(),
                cause: crate::LinkFailure::NotDialed,
            },
            Error::InvalidArgument {
                op: OpKind::AllReduce,
                detail: String::new(),
            },
            Error::io("x", std::io::Error::other("y")),
        ];
        let kinds: Vec<&str> = errors.iter().map(Error::kind).collect();
        assert_eq!(kinds, FAILURE_KINDS[..FAILURE_KINDS.len() - 1]);
    }
}
