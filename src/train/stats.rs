//! Per-step times as PyTorch DDP logs them (`Logger::set_runtime_stats`):
//! forward, backward compute, backward communication, the overlap of the
//! two, and what the step waited for communication after backward.

use std::time::{Duration, Instant};

/// The times of one synchronised step. A phase the trainer did not mark
/// ([`super::GradReducer::begin_forward`], `begin_backward`) is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// From `begin_forward` to the start of backward.
    pub forward: Option<Duration>,
    /// From the start of backward (`begin_backward`, else the first
    /// gradient marked ready) to `finish`.
    pub backward_compute: Option<Duration>,
    /// From the first bucket's launch to the end of `finish` (when every
    /// bucket was known done).
    pub backward_comm: Option<Duration>,
    /// Communication that ran while backward still computed: from the first
    /// launch to `finish` (PyTorch's `backward_compute_comm_overlap_time`).
    pub overlap: Duration,
    /// What `finish` waited for communication after backward ended: the
    /// exposed part.
    pub comm_wait: Duration,
}

impl StepStats {
    /// The share of communication hidden behind backward (0 to 1).
    pub fn hidden_fraction(&self) -> Option<f64> {
        let comm = self.backward_comm?.as_secs_f64();
        (comm > 0.0).then(|| (self.overlap.as_secs_f64() / comm).min(1.0))
    }
}

/// Time marks of the step in progress.
#[derive(Default)]
pub(crate) struct StepTimer {
    forward: Option<Instant>,
    backward: Option<Instant>,
    first_ready: Option<Instant>,
    first_launch: Option<Instant>,
    backward_end: Option<Instant>,
    last: StepStats,
}

impl StepTimer {
    pub(crate) fn forward_start(&mut self) {
        self.forward = Some(Instant::now());
    }

    pub(crate) fn backward_start(&mut self) {
        self.backward = Some(Instant::now());
    }

    pub(crate) fn ready(&mut self) {
        self.first_ready.get_or_insert_with(Instant::now);
    }

    pub(crate) fn launch(&mut self) {
        self.first_launch.get_or_insert_with(Instant::now);
    }

    pub(crate) fn backward_end(&mut self) {
        self.backward_end = Some(Instant::now());
    }

    /// The step ended (`finish` returns); its times become the last
    /// step's if it communicated.
    pub(crate) fn step_end(&mut self, synced: bool) {
        let end = Instant::now();
        let backward = self.backward.or(self.first_ready);
        if synced {
            let compute_end = self.backward_end.unwrap_or(end);
            self.last = StepStats {
                forward: self
                    .forward
                    .zip(backward)
                    .map(|(f, b)| b.saturating_duration_since(f)),
                backward_compute: backward.map(|b| compute_end.saturating_duration_since(b)),
                backward_comm: self.first_launch.map(|l| end.saturating_duration_since(l)),
                overlap: self
                    .first_launch
                    .map_or(Duration::ZERO, |l| compute_end.saturating_duration_since(l)),
                comm_wait: end.saturating_duration_since(compute_end),
            };
        }
        *self = StepTimer {
            last: self.last,
            ..StepTimer::default()
        };
    }

    pub(crate) fn last(&self) -> StepStats {
        self.last
    }
}
