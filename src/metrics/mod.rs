//! Prometheus metrics: each communicator's counters in the Prometheus text
//! exposition format (version 0.0.4), encoded by the `prometheus-client`
//! crate (the Prometheus project's Rust client), so the format's rules
//! (escaping, `_total`, `le` buckets, `+Inf`) are not ours to get right.
//!
//! Why: a training job's operators watch it from Prometheus, not from its
//! logs; ops, bytes, latency and failures per communicator and op kind say
//! whether the job moves and where it stalls, and the link kinds say
//! whether local ranks talk over Unix sockets as they should.
//!
//! [`crate::Communicator::metrics`] gives one communicator's text;
//! [`gather`] every live communicator's of the process, as the HTTP server
//! (`server`, started by `RINGWIRE_METRICS_ADDR`) serves it at `/metrics`.
//! Communicators register a `Source` when they start and hold it; the
//! process-wide list keeps only weak references, so a dropped communicator
//! leaves the next scrape.
//!
//! Metrics, each labelled `rank` (in the communicator) and `comm` (its id,
//! 16 hex digits):
//!
//! - `ringwire_ops_total`, `ringwire_bytes_sent_total`,
//!   `ringwire_bytes_received_total` by `op` (`all_reduce`, `broadcast`,
//!   ..., `send_recv`): ops completed and their payload bytes;
//! - `ringwire_two_level_ops_total` by `op`: of those, the ops that ran
//!   in two levels (within each host, then across hosts; decision 0033);
//! - `ringwire_op_latency_seconds` by `op`: a histogram of completed ops'
//!   latency, fixed buckets from 10 us to 100 s (`stats.rs` says why);
//! - `ringwire_failures_total` by `kind` (`timeout`, `peer_lost`,
//!   `aborted`, `mismatch`, ...: `Error::kind`): ops that ended in error,
//!   or were refused because the communicator had failed (`failed`);
//! - `ringwire_held_ahead_bytes`, `ringwire_held_ahead_peak_bytes`,
//!   `ringwire_inboxes`: gauges of the rank's transport (over every
//!   communicator of the process, as `Stats` says);
//! - `ringwire_link_info` by `peer` and `kind` (`shm`, `unix`, `tcp`): 1 for each
//!   peer this rank has a link with (absent until the link is made).

mod server;

pub use server::server_addr;

use crate::stats::{
    Counters, EngineThreadStats, FAILURE_KINDS, LATENCY_BOUNDS_NS, LaneStats, OpCounters,
    StatsRecorder,
};
use crate::wire::OpKind;
use crate::world::World;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::sync::{Arc, Mutex, Weak};

/// The `Content-Type` of [`gather`]'s and
/// [`crate::Communicator::metrics`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What a communicator registers: enough to take its [`Sample`].
pub(crate) struct Source {
    world: Arc<World>,
    rank: usize,
    comm_id: u64,
    members: Arc<Vec<usize>>,
    stats: Arc<StatsRecorder>,
}

/// Every live communicator's source (dead ones are pruned as they are
/// found).
static LIVE: Mutex<Vec<Weak<Source>>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<Weak<Source>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Source {
    /// The source of a starting communicator, in the process's list until
    /// the communicator drops it; starts the HTTP server if this is the
    /// process's first communicator and `RINGWIRE_METRICS_ADDR` is set.
    /// `listed: false` (the groups of a two-level op, whose ops count
    /// in their parent's) keeps it out of the list: served, their bytes
    /// would count twice in any sum over communicators.
    pub(crate) fn register(
        world: Arc<World>,
        rank: usize,
        comm_id: u64,
        members: Arc<Vec<usize>>,
        stats: Arc<StatsRecorder>,
        listed: bool,
    ) -> Arc<Source> {
        let local_rank = world.local.map(|(local_rank, _)| local_rank);
        let source = Arc::new(Source {
            world,
            rank,
            comm_id,
            members,
            stats,
        });
        if !listed {
            return source;
        }
        {
            let mut live = live();
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&source));
        }
        server::start_once(local_rank);
        source
    }

    /// Its numbers now.
    pub(crate) fn sample(&self) -> Sample {
        let transport = &self.world.transport;
        let (held, peak) = transport.held_ahead();
        let links = (0..self.members.len())
            .filter(|&peer| peer != self.rank)
            .filter_map(|peer| Some((peer, transport.link_kind(self.members[peer])?)))
            .collect();
        let lanes = (0..self.members.len())
            .filter(|&peer| peer != self.rank)
            .map(|peer| (peer, transport.link_lane_stats(self.members[peer])))
            .filter(|(_, lanes)| !lanes.is_empty())
            .collect();
        let engine_threads = transport.engine_thread_stats();
        Sample {
            rank: self.rank,
            comm: format!("{:016x}", self.comm_id),
            counters: self.stats.counters(),
            held_ahead: held as u64,
            held_ahead_peak: peak as u64,
            inboxes: transport.inboxes() as u64,
            links,
            lanes,
            engine_threads,
        }
    }
}

/// One communicator's numbers at one moment.
#[derive(Debug)]
pub(crate) struct Sample {
    rank: usize,
    /// The communicator id, as 16 hex digits.
    comm: String,
    counters: Counters,
    held_ahead: u64,
    held_ahead_peak: u64,
    inboxes: u64,
    /// (peer rank, link kind) for each peer with a link up.
    links: Vec<(usize, &'static str)>,
    /// (peer rank, its link's send lanes) for each link with lanes.
    lanes: Vec<(usize, Vec<LaneStats>)>,
    /// The process's engine threads (decision 0036), in order.
    engine_threads: Vec<EngineThreadStats>,
}

/// Every live communicator's metrics in this process, in the Prometheus
/// text format (version 0.0.4, [`CONTENT_TYPE`]): each metric once, with a
/// series per communicator (ordered by communicator id, then rank). What
/// `GET /metrics` answers; for a program that serves metrics itself.
pub fn gather() -> String {
    // Upgrade under the lock, sample after it: a scrape never holds up a
    // communicator that starts.
    let sources: Vec<Arc<Source>> = {
        let mut live = live();
        live.retain(|w| w.strong_count() > 0);
        live.iter().filter_map(Weak::upgrade).collect()
    };
    let samples = sources.iter().map(|s| s.sample()).collect();
    drop(sources);
    encode(samples)
}

/// `samples` in the Prometheus text format.
pub(crate) fn encode(mut samples: Vec<Sample>) -> String {
    samples.sort_by(|a, b| (&a.comm, a.rank).cmp(&(&b.comm, b.rank)));
    let mut registry = Registry::with_prefix("ringwire");
    registry.register_collector(Box::new(Samples(samples)));
    let mut text = String::new();
    // Writing to a String cannot fail, nor can our collector.
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
        .expect("encoding metrics into a String");
    text
}

/// The op kinds exported (every one but `none`, which is no op).
fn ops() -> impl Iterator<Item = OpKind> {
    OpKind::ALL.into_iter().filter(|&op| op != OpKind::None)
}

/// The labels every series has.
type Base<'a> = ([(&'static str, usize); 1], [(&'static str, &'a str); 1]);

fn base(s: &Sample) -> Base<'_> {
    ([("rank", s.rank)], [("comm", s.comm.as_str())])
}

/// The collector of one scrape.
#[derive(Debug)]
struct Samples(Vec<Sample>);

type OpCounter = (&'static str, &'static str, fn(&OpCounters) -> u64);

type LaneCounter = (
    &'static str,
    &'static str,
    MetricType,
    fn(&LaneStats) -> u64,
);

/// Each send lane's numbers (decision 0034): of the process's link to the
/// peer, which every communicator over that link shares.
const LANE_COUNTERS: [LaneCounter; 6] = [
    (
        "lane_bytes_sent",
        "Bytes the kernel took on a send lane of the link to a peer (piece headers          included); the link is the process's, shared by its communicators.",
        MetricType::Counter,
        |l| l.bytes_sent,
    ),
    (
        "lane_pieces_sent",
        "Pieces of payloads wholly sent on a send lane.",
        MetricType::Counter,
        |l| l.pieces_sent,
    ),
    (
        "lane_zero_copy_sends",
        "Sends on a send lane by SEND_ZC (zero-copy).",
        MetricType::Counter,
        |l| l.zero_copy_sends,
    ),
    (
        "lane_copied_sends",
        "SEND_ZC sends on a send lane that the kernel reported it copied after all: the          lane's fallbacks to plain sends.",
        MetricType::Counter,
        |l| l.copied_sends,
    ),
    (
        "lane_unacked_bytes",
        "Bytes a send lane's socket held unacknowledged when last looked at (links with          more than one lane): its queue depth.",
        MetricType::Gauge,
        |l| l.unacked_bytes,
    ),
    (
        "lane_delivery_rate_bytes_per_second",
        "The delivery rate of a send lane (bytes acknowledged over the kernel's busy time of it), as the engine last kept it to place pieces by (links with more than one lane; 0: none yet).",
        MetricType::Gauge,
        |l| l.delivery_rate,
    ),
];

type ThreadCounter = (&'static str, &'static str, fn(&EngineThreadStats) -> f64);

/// Each engine thread's numbers (decision 0036): the process's, shared by
/// its communicators. CPU seconds over bytes is the cost of moving them.
const THREAD_COUNTERS: [ThreadCounter; 4] = [
    (
        "engine_thread_entries",
        "Lane sends and receives an engine thread submitted.",
        |t| t.entries as f64,
    ),
    (
        "engine_thread_bytes",
        "Bytes an engine thread's lane sends and receives moved, both ways.",
        |t| t.bytes as f64,
    ),
    (
        "engine_thread_wakeups",
        "Times an engine thread woke from waiting on its ring.",
        |t| t.wakeups as f64,
    ),
    (
        "engine_thread_cpu_seconds",
        "CPU time an engine thread used, user and system (the kernel's copies of lane traffic): its busy time.",
        |t| t.cpu.as_secs_f64(),
    ),
];

const OP_COUNTERS: [OpCounter; 4] = [
    ("ops", "Ops completed, by op kind.", |c| c.ops),
    (
        "bytes_sent",
        "Payload bytes this rank sent in completed ops, by op kind.",
        |c| c.bytes_sent,
    ),
    (
        "bytes_received",
        "Payload bytes this rank received in completed ops, by op kind.",
        |c| c.bytes_received,
    ),
    (
        "two_level_ops",
        "Of the ops completed, those that ran in two levels (within each host, then across \
         hosts), by op kind.",
        |c| c.two_level,
    ),
];

impl Collector for Samples {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in OP_COUNTERS {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &self.0 {
                for op in ops() {
                    let labels = (base(s), [("op", op.name())]);
                    metric
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&value(s.counters.op(op)), None)?;
                }
            }
        }

        let mut metric = encoder.encode_descriptor(
            "op_latency",
            "Latency of completed ops, by op kind.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for s in &self.0 {
            for op in ops() {
                let c = s.counters.op(op);
                let bounds = LATENCY_BOUNDS_NS
                    .iter()
                    .map(|&ns| ns as f64 / 1e9)
                    .chain([f64::INFINITY]);
                let buckets: Vec<(f64, u64)> = bounds.zip(c.latency_buckets).collect();
                let labels = (base(s), [("op", op.name())]);
                metric
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(
                        c.latency_sum_ns as f64 / 1e9,
                        c.ops,
                        &buckets,
                        None,
                    )?;
            }
        }

        let mut metric = encoder.encode_descriptor(
            "failures",
            "Ops that ended in error, or were refused because the communicator had failed, \
             by kind of error.",
            None,
            MetricType::Counter,
        )?;
        for s in &self.0 {
            for (kind, count) in FAILURE_KINDS.iter().zip(s.counters.failures) {
                let labels = (base(s), [("kind", *kind)]);
                metric
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&count, None)?;
            }
        }

        type Gauge = (&'static str, &'static str, fn(&Sample) -> u64);
        let gauges: [Gauge; 3] = [
            (
                "held_ahead_bytes",
                "Bytes peers have sent ahead of this rank now (frames of ops it has not \
                 started), over every communicator of the process.",
                |s| s.held_ahead,
            ),
            (
                "held_ahead_peak_bytes",
                "Most bytes peers have had sent ahead of this rank at once.",
                |s| s.held_ahead_peak,
            ),
            (
                "inboxes",
                "Frame queues this process keeps, one per (communicator, peer) that has \
                 received any, over every communicator of the process.",
                |s| s.inboxes,
            ),
        ];
        for (name, help, value) in gauges {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &self.0 {
                metric.encode_family(&base(s))?.encode_gauge(&value(s))?;
            }
        }

        let mut metric = encoder.encode_descriptor(
            "link",
            "What carries this rank's link to a peer (unix, tcp), for each link up.",
            None,
            MetricType::Info,
        )?;
        for s in &self.0 {
            for &(peer, kind) in &s.links {
                let labels = base(s);
                metric
                    .encode_family(&labels)?
                    .encode_info(&([("peer", peer)], [("kind", kind)]))?;
            }
        }

        for (name, help, ty, value) in LANE_COUNTERS {
            let mut metric = encoder.encode_descriptor(name, help, None, ty)?;
            for s in &self.0 {
                for (peer, lanes) in &s.lanes {
                    for (lane, stats) in lanes.iter().enumerate() {
                        let labels = (base(s), [("peer", *peer), ("lane", lane)]);
                        let mut family = metric.encode_family(&labels)?;
                        match ty {
                            MetricType::Gauge => family.encode_gauge(&value(stats))?,
                            _ => {
                                family.encode_counter::<NoLabelSet, _, u64>(&value(stats), None)?
                            }
                        }
                    }
                }
            }
        }

        for (name, help, value) in THREAD_COUNTERS {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &self.0 {
                for (thread, stats) in s.engine_threads.iter().enumerate() {
                    let labels = (base(s), [("thread", thread)]);
                    metric
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&value(stats), None)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StatsRecorder;
    use std::collections::HashMap;
    use std::time::Duration;

    fn sample(rank: usize, recorder: &StatsRecorder, links: Vec<(usize, &'static str)>) -> Sample {
        // The TCP links have two lanes.
        let lane = |i: u64| LaneStats {
            bytes_sent: 1000 * i,
            pieces_sent: i,
            unacked_bytes: 64 * i,
            zero_copy_sends: 1,
            copied_sends: i - 1,
            delivery_rate: 1_000_000 * i,
        };
        let lanes = links
            .iter()
            .filter(|(_, kind)| *kind == "tcp")
            .map(|&(peer, _)| (peer, vec![lane(1), lane(2)]))
            .collect();
        Sample {
            rank,
            comm: format!("{:016x}", 0xabcu64),
            counters: recorder.counters(),
            held_ahead: 7,
            held_ahead_peak: 9,
            inboxes: 2,
            links,
            lanes,
            // Two engine threads, the second unpinned.
            engine_threads: vec![
                EngineThreadStats {
                    core: Some(3),
                    entries: 10,
                    bytes: 1 << 30,
                    wakeups: 7,
                    cpu: Duration::from_millis(250),
                },
                EngineThreadStats::default(),
            ],
        }
    }

    /// The text's samples: `name{labels}` -> value, checking that every
    /// line is a comment or `name[{labels}] value`.
    fn samples(text: &str) -> HashMap<String, f64> {
        let mut out = HashMap::new();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect(line);
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect(line),
            };
            assert!(
                out.insert(series.to_string(), value).is_none(),
                "{series} twice"
            );
        }
        out
    }

    #[test]
    fn text_has_every_metric_once_with_a_series_per_communicator() {
        let recorder = StatsRecorder::default();
        let traffic = |sent, received| crate::stats::Traffic {
            sent,
            received,
            two_level: false,
        };
        recorder.record(
            OpKind::AllReduce,
            Duration::from_micros(50),
            traffic(64, 64),
        );
        let two_level = crate::stats::Traffic {
            two_level: true,
            ..traffic(64, 64)
        };
        recorder.record(OpKind::AllReduce, Duration::from_millis(2), two_level);
        recorder.record(OpKind::Broadcast, Duration::from_secs(500), traffic(4, 0));
        recorder.failed(&crate::Error::Failed { first: "x".into() });
        let text = encode(vec![
            sample(1, &recorder, vec![(0, "unix"), (2, "tcp")]),
            sample(0, &StatsRecorder::default(), vec![]),
        ]);
        for name in [
            "ringwire_ops_total counter",
            "ringwire_bytes_sent_total counter",
            "ringwire_bytes_received_total counter",
            "ringwire_two_level_ops_total counter",
            "ringwire_op_latency_seconds histogram",
            "ringwire_failures_total counter",
            "ringwire_held_ahead_bytes gauge",
            "ringwire_held_ahead_peak_bytes gauge",
            "ringwire_inboxes gauge",
            "ringwire_link_info gauge",
            "ringwire_lane_bytes_sent_total counter",
            "ringwire_lane_pieces_sent_total counter",
            "ringwire_lane_zero_copy_sends_total counter",
            "ringwire_lane_copied_sends_total counter",
            "ringwire_lane_unacked_bytes gauge",
            "ringwire_lane_delivery_rate_bytes_per_second gauge",
            "ringwire_engine_thread_entries_total counter",
            "ringwire_engine_thread_bytes_total counter",
            "ringwire_engine_thread_wakeups_total counter",
            "ringwire_engine_thread_cpu_seconds_total counter",
        ] {
            let ty = format!("# TYPE {name}\n");
            assert_eq!(text.matches(&ty).count(), 1, "{name}:\n{text}");
        }
        let s = samples(&text);
        let at = |series: &str| *s.get(series).unwrap_or_else(|| panic!("{series}:\n{text}"));
        let r1 = r#"rank="1",comm="0000000000000abc""#;
        let r0 = r#"rank="0",comm="0000000000000abc""#;
        assert_eq!(
            at(&format!(r#"ringwire_ops_total{{{r1},op="all_reduce"}}"#)),
            2.0
        );
        assert_eq!(
            at(&format!(r#"ringwire_ops_total{{{r0},op="all_reduce"}}"#)),
            0.0
        );
        assert_eq!(
            at(&format!(r#"ringwire_ops_total{{{r1},op="broadcast"}}"#)),
            1.0
        );
        assert_eq!(
            at(&format!(r#"ringwire_ops_total{{{r1},op="scatter"}}"#)),
            0.0
        );
        assert!(!text.contains(r#"op="none""#), "{text}");
        assert_eq!(
            at(&format!(
                r#"ringwire_bytes_sent_total{{{r1},op="all_reduce"}}"#
            )),
            128.0
        );
        assert_eq!(
            at(&format!(
                r#"ringwire_bytes_received_total{{{r1},op="broadcast"}}"#
            )),
            0.0
        );
        // Buckets are cumulative, by inclusive upper bound.
        let bucket = |op: &str, le: &str| {
            at(&format!(
                r#"ringwire_op_latency_seconds_bucket{{{r1},op="{op}",le="{le}"}}"#
            ))
        };
        assert_eq!(bucket("all_reduce", "1e-05"), 0.0);
        assert_eq!(bucket("all_reduce", "0.0001"), 1.0);
        assert_eq!(bucket("all_reduce", "0.001"), 1.0);
        assert_eq!(bucket("all_reduce", "0.003"), 2.0);
        assert_eq!(bucket("all_reduce", "+Inf"), 2.0);
        assert_eq!(bucket("broadcast", "100"), 0.0);
        assert_eq!(bucket("broadcast", "+Inf"), 1.0);
        let count = format!(r#"ringwire_op_latency_seconds_count{{{r1},op="all_reduce"}}"#);
        assert_eq!(at(&count), 2.0);
        let sum = at(&format!(
            r#"ringwire_op_latency_seconds_sum{{{r1},op="all_reduce"}}"#
        ));
        assert!((sum - 0.00205).abs() < 1e-12, "{sum}");
        assert_eq!(
            at(&format!(r#"ringwire_failures_total{{{r1},kind="failed"}}"#)),
            1.0
        );
        assert_eq!(
            at(&format!(
                r#"ringwire_failures_total{{{r1},kind="timeout"}}"#
            )),
            0.0
        );
        let two = |op: &str| {
            at(&format!(
                r#"ringwire_two_level_ops_total{{{r1},op="{op}"}}"#
            ))
        };
        assert_eq!((two("all_reduce"), two("broadcast")), (1.0, 0.0));
        assert_eq!(at(&format!("ringwire_held_ahead_bytes{{{r1}}}")), 7.0);
        assert_eq!(at(&format!("ringwire_held_ahead_peak_bytes{{{r0}}}")), 9.0);
        assert_eq!(at(&format!("ringwire_inboxes{{{r1}}}")), 2.0);
        assert_eq!(
            at(&format!(
                r#"ringwire_link_info{{{r1},peer="0",kind="unix"}}"#
            )),
            1.0
        );
        assert_eq!(
            at(&format!(
                r#"ringwire_link_info{{{r1},peer="2",kind="tcp"}}"#
            )),
            1.0
        );
        assert!(
            !text.contains(&format!("ringwire_link_info{{{r0}")),
            "{text}"
        );
        let lane = |name: &str, lane: usize| {
            at(&format!(
                r#"ringwire_lane_{name}{{{r1},peer="2",lane="{lane}"}}"#
            ))
        };
        assert_eq!(lane("bytes_sent_total", 1), 2000.0);
        assert_eq!(lane("pieces_sent_total", 0), 1.0);
        assert_eq!(lane("zero_copy_sends_total", 1), 1.0);
        assert_eq!(lane("copied_sends_total", 1), 1.0);
        assert_eq!(lane("unacked_bytes", 1), 128.0);
        assert_eq!(lane("delivery_rate_bytes_per_second", 1), 2e6);
        assert!(
            !text.contains(r#"peer="0",lane="#),
            "a Unix link has no lanes"
        );
        let thread = |name: &str, thread: usize| {
            at(&format!(
                r#"ringwire_engine_thread_{name}{{{r1},thread="{thread}"}}"#
            ))
        };
        assert_eq!(thread("bytes_total", 0), (1u64 << 30) as f64);
        assert_eq!(thread("entries_total", 0), 10.0);
        assert_eq!(thread("wakeups_total", 0), 7.0);
        assert_eq!(thread("cpu_seconds_total", 0), 0.25);
        assert_eq!(thread("cpu_seconds_total", 1), 0.0);
        // Rank 0's series come before rank 1's.
        let first = |r: &str| text.find(&format!("ringwire_ops_total{{{r}")).unwrap();
        assert!(first(r0) < first(r1));
    }
}
