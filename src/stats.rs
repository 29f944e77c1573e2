//! Per-communicator counters: ops completed, bytes moved, and op latency
//! percentiles (hdrhistogram, microseconds).

use crate::exec::Traffic;
use hdrhistogram::Histogram;
use std::sync::Mutex;
use std::time::Duration;

/// A snapshot of a communicator's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Ops that completed successfully.
    pub ops: u64,
    /// Payload bytes this rank sent.
    pub bytes_sent: u64,
    /// Payload bytes this rank received.
    pub bytes_received: u64,
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

pub(crate) struct StatsRecorder {
    inner: Mutex<(Stats, Histogram<u64>)>,
}

impl Default for StatsRecorder {
    fn default() -> Self {
        // 1 us to 1 hour at 3 significant digits; new_with_bounds only fails
        // for invalid bounds, which these are not.
        let hist = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        StatsRecorder {
            inner: Mutex::new((Stats::default(), hist)),
        }
    }
}

impl StatsRecorder {
    pub(crate) fn record(&self, elapsed: Duration, traffic: Traffic) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (stats, hist) = &mut *guard;
        stats.ops += 1;
        stats.bytes_sent += traffic.sent;
        stats.bytes_received += traffic.received;
        hist.saturating_record(elapsed.as_micros().clamp(1, u128::from(u64::MAX)) as u64);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (stats, hist) = &*guard;
        let us = Duration::from_micros;
        Stats {
            p50: us(hist.value_at_quantile(0.5)),
            p99: us(hist.value_at_quantile(0.99)),
            max: us(hist.max()),
            ..stats.clone()
        }
    }
}
