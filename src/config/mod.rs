//! Tunables of a communicator, with their environment variables and
//! defaults. Precedence: a builder call, then the `RINGWIRE_*` variable, then
//! the default.
//!
//! One variable belongs to the process rather than to a communicator and
//! has no builder call: `RINGWIRE_METRICS_ADDR`,
//! read once, when the process's first communicator starts.

internal_module!(settings);

use crate::env::{EnvError, parse_switch};
use crate::error::Error;
use crate::wire;
use std::time::Duration;

/// Which transport carries the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// The io_uring engine where io_uring works (and links are plaintext),
    /// else the portable transport; the log says which and why.
    Auto,
    /// Plain threads and blocking TCP sockets; runs everywhere.
    Portable,
    /// The io_uring engine; starting fails, saying why, where it cannot run.
    Uring,
}

impl TransportKind {
    fn parse(var: &'static str, value: &str) -> Result<TransportKind, Error> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(TransportKind::Auto),
            "portable" => Ok(TransportKind::Portable),
            "uring" | "io_uring" => Ok(TransportKind::Uring),
            _ => Err(invalid(
                var,
                value,
                "a transport: auto, uring or portable (what links local ranks, Unix sockets or TCP, is RINGWIRE_LOCAL_LINKS)",
            )),
        }
    }
}

/// What carries links between ranks on the same host (same kernel and
/// network namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalLinks {
    /// Unix-domain sockets: the same frames without the TCP stack, about
    /// twice the bandwidth on loopback (decision 0009). Plaintext jobs only:
    /// with TLS every link is TCP. The default before shared memory.
    Unix,
    /// TCP over loopback, like links between hosts.
    Tcp,
    /// Shared memory: two byte rings per pair in a sealed memfd segment,
    /// passed over the pair's Unix socket (which stays for wake-ups and to
    /// see a dead peer); no system call per frame. Where memory cannot be
    /// shared (memfd or mmap refused), a link stays a Unix socket, with a
    /// warning. Plaintext jobs only. The default: communicators whose
    /// ranks all share the host also run their small collectives on a
    /// shared-memory arena (decision 0030).
    Shm,
}

/// Whether collectives of communicators spanning several hosts run in two
/// levels (within each host, then across hosts, then within each host
/// again; decision 0033).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoLevel {
    /// Where the cost model (`algo::levels`) says two levels are faster,
    /// given the link rate between hosts (`Builder::inter_host_gbps`).
    Auto,
    /// Always, where the members form at least two hosts of the same
    /// number of ranks, two or more.
    Always,
    /// Never: every op runs one schedule over all members.
    Never,
}

impl TwoLevel {
    fn parse(var: &'static str, value: &str) -> Result<TwoLevel, Error> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(TwoLevel::Auto),
            "always" | "on" | "1" => Ok(TwoLevel::Always),
            "never" | "off" | "0" => Ok(TwoLevel::Never),
            _ => Err(invalid(var, value, "auto, always (on) or never (off)")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            TwoLevel::Auto => "auto",
            TwoLevel::Always => "always",
            TwoLevel::Never => "never",
        }
    }
}

/// The link rate between hosts the cost model assumes where neither a
/// setting nor the ranks' interfaces say, in gigabits per second (a
/// common cloud and cluster NIC).
pub const DEFAULT_INTER_HOST_GBPS: f64 = 25.0;

impl LocalLinks {
    fn parse(var: &'static str, value: &str) -> Result<LocalLinks, Error> {
        match value.trim().to_ascii_lowercase().as_str() {
            "shm" | "" => Ok(LocalLinks::Shm),
            "unix" => Ok(LocalLinks::Unix),
            "tcp" => Ok(LocalLinks::Tcp),
            _ => Err(invalid(
                var,
                value,
                "a kind of local link: shm, unix or tcp",
            )),
        }
    }
}

/// Whether the io_uring engine can run in this process, in words for logs
/// and errors (probed: `kernel.io_uring_disabled`, seccomp, kernel age).
pub fn uring_status() -> String {
    match ringwire_uring::probe() {
        Ok(support) => format!("{support} works here"),
        Err(why) => format!("io_uring cannot run here: {why}"),
    }
}

impl TransportKind {
    /// Which data plane to start: `Ok(true)` for the engine, with the
    /// reason for logs; an error when `Uring` was forced and cannot run.
    pub(crate) fn choose(self, tls: bool) -> Result<(bool, String), Error> {
        let probed = ringwire_uring::probe();
        match (self, probed, tls) {
            (TransportKind::Portable, _, _) => Ok((false, "asked for (portable)".into())),
            (TransportKind::Uring, Err(why), _) => Err(Error::Rendezvous(format!(
                "transport uring was asked for, but io_uring cannot run here: {why}; \
                 use RINGWIRE_TRANSPORT=portable (or auto, which falls back)"
            ))),
            (TransportKind::Uring, Ok(_), true) => Err(Error::Rendezvous(
                "transport uring was asked for with TLS, but the engine carries plaintext only \
                 (kernel TLS is unavailable here, decision 0004): use the portable transport for TLS"
                    .into(),
            )),
            (TransportKind::Auto, Ok(_), true) => Ok((
                false,
                "TLS is on, and TLS runs on the portable transport only".into(),
            )),
            (TransportKind::Auto, Err(why), _) => {
                Ok((false, format!("io_uring cannot run here: {why}")))
            }
            (_, Ok(support), false) => Ok((true, format!("{support}"))),
        }
    }
}

/// Resolved settings (see [`crate::Builder`] for each one's meaning).
#[derive(Clone, Debug)]
pub(crate) struct Tunables {
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) chunk_bytes: usize,
    pub(crate) small_message_bytes: usize,
    pub(crate) max_frame_bytes: u32,
    pub(crate) socket_buffer: Option<usize>,
    pub(crate) transport: TransportKind,
    pub(crate) local_links: LocalLinks,
    /// Two-level collectives across hosts (RINGWIRE_TWO_LEVEL; decision 0033).
    pub(crate) two_level: TwoLevel,
    /// The link rate between hosts the cost model assumes, in Gb/s
    /// (RINGWIRE_INTER_HOST_GBPS); `None`: what the ranks' interfaces
    /// report, agreed at rendezvous (`World::inter_host_gbps`).
    pub(crate) inter_host_gbps: Option<f64>,
    /// One-way lanes each way that TCP links on the uring engine add for
    /// the payloads of large frames (RINGWIRE_TCP_LANES: on (1), off (0) or
    /// a count up to 8; decisions 0018, 0034).
    pub(crate) tcp_lanes: u8,
    /// Engine threads that TCP lanes run on (RINGWIRE_ENGINE_THREADS;
    /// decision 0036; 0: the caller-driven ring). This rank's alone.
    pub(crate) engine_threads: usize,
    /// Waiters poll this long before sleeping (RINGWIRE_SPIN_US): a caller
    /// in `wait`, the executor between jobs, either plane for a frame.
    pub(crate) spin: Duration,
    pub(crate) heartbeat_timeout: Duration,
    /// Bytes a peer may deliver ahead of this rank (0: unbounded;
    /// RINGWIRE_RUN_AHEAD_BYTES; decision 0019).
    pub(crate) run_ahead_bytes: usize,
    /// Bytes all peers together may deliver ahead of this rank
    /// (RINGWIRE_RUN_AHEAD_TOTAL_BYTES; 0: no total limit).
    pub(crate) run_ahead_total_bytes: usize,
    pub(crate) debug_checks: bool,
    pub(crate) flight_recorder_ops: usize,
    /// Where a failing rank also writes its flight record
    /// (RINGWIRE_FLIGHT_RECORDER_DIR; unset: the log only).
    pub(crate) flight_recorder_dir: Option<std::path::PathBuf>,
}

impl Tunables {
    /// The settings every rank must share, as `name=value;...` for the
    /// store: they choose how collectives cut and route their data (and
    /// debug checks add an exchange per op), so ranks that differ would
    /// pair frames of different schedules mid-job.
    pub(crate) fn shared(&self) -> String {
        self.shared_fields()
            .iter()
            .map(|(name, _, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// Why these settings cannot run with `rank0`'s (its [`Self::shared`]
    /// text), naming the first setting that differs and how it is set.
    pub(crate) fn disagreement(&self, rank: usize, rank0: &str) -> Option<String> {
        let theirs = |name: &str| {
            rank0
                .split(';')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        self.shared_fields().into_iter().find_map(|(name, how, mine)| {
            let theirs = theirs(name).unwrap_or("(not set: an older ringwire)");
            (theirs != mine).then(|| {
                format!(
                    "rank {rank} has {how} = {mine} but rank 0 has {theirs}: every rank needs the same value"
                )
            })
        })
    }

    fn shared_fields(&self) -> [(&'static str, &'static str, String); 5] {
        [
            (
                "chunk_bytes",
                "RINGWIRE_CHUNK_BYTES (or Builder::chunk_bytes)",
                self.chunk_bytes.to_string(),
            ),
            (
                "small_message_bytes",
                "RINGWIRE_SMALL_MESSAGE_BYTES (or Builder::small_message_bytes)",
                self.small_message_bytes.to_string(),
            ),
            (
                "debug_checks",
                "RINGWIRE_DEBUG (or Builder::debug_checks)",
                if self.debug_checks { "detail" } else { "off" }.to_string(),
            ),
            (
                "two_level",
                "RINGWIRE_TWO_LEVEL (or Builder::two_level)",
                self.two_level.name().to_string(),
            ),
            (
                "inter_host_gbps",
                "RINGWIRE_INTER_HOST_GBPS (or Builder::inter_host_gbps)",
                self.inter_host_gbps
                    .map_or_else(|| "auto".to_string(), |g| g.to_string()),
            ),
        ]
    }
}

/// Default per-op timeout, as in torch.distributed's gloo backend it is
/// finite; unlike it, one minute rather than thirty.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Frames are at most this large; bigger buffers go as several chunks.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
/// All-reduce below this many bytes uses recursive doubling (fewer rounds),
/// at or above it the ring (less data per rank); broadcast switches from the
/// tree to the pipelined chain at the same size. Measured crossover on
/// local ranks (2 and 4, Unix and TCP links): between 512 KiB and 1 MiB
/// (docs/perf.md).
pub const DEFAULT_SMALL_MESSAGE_BYTES: usize = 1 << 20;

/// How long a waiting thread polls (yielding its core between polls)
/// before it sleeps: long enough to cover a small op's round trip between
/// local ranks, the occasional peer that was held up, and a peer woken
/// from sleep on a virtual machine (a halted vCPU took about 300 us to run
/// again here), so a steady stream of small ops runs without a sleep and a
/// wake-up per frame (decision 0008; 1 ms rather than 200 us: docs/perf.md,
/// fourth session).
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// A link silent this long (no data, no heartbeat) is declared dead.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle links send a heartbeat this often.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// How far one peer may run ahead of this rank, in bytes of ops not started
/// here (decision 0019). Measured: 4 MiB ran rooted loops at 4 ranks
/// 1.1-1.5x faster than 64 MiB or 16 MiB and lost nowhere (docs/perf.md,
/// sixteenth session); frames of the op a rank is in never count, so large
/// ops are not held back by it.
pub(crate) const DEFAULT_RUN_AHEAD_BYTES: usize = 4 << 20;

/// Default limit on what all peers together may deliver for ops not
/// started here: past it, every peer holding any is paused (decision 0019,
/// seventeenth session). Without it a rank that many peers run ahead of
/// (the slow root of a wide communicator) could hold the per-peer limit
/// times the peers; this bounds it at 16 peers' worth.
pub(crate) const DEFAULT_RUN_AHEAD_TOTAL_BYTES: usize = 64 << 20;

/// `RINGWIRE_METRICS_ADDR`: where to serve every live communicator's
/// Prometheus metrics over HTTP (`GET /metrics`), e.g. `127.0.0.1:9464`,
/// or `127.0.0.1:0` for a free port (`ringwire::metrics::server_addr`
/// says which). The server binds exactly this address (`0.0.0.0:9464`
/// only when given that) and starts with the process's first
/// communicator; unset or empty, nothing is served. An address that does
/// not bind is logged as a warning, not an error: the job runs on
/// without metrics.
pub(crate) const METRICS_ADDR_VAR: &str = "RINGWIRE_METRICS_ADDR";

/// Optional overrides, as set on the builder.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub(crate) timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) chunk_bytes: Option<usize>,
    pub(crate) small_message_bytes: Option<usize>,
    pub(crate) socket_buffer: Option<usize>,
    pub(crate) transport: Option<TransportKind>,
    pub(crate) local_links: Option<LocalLinks>,
    pub(crate) two_level: Option<TwoLevel>,
    pub(crate) inter_host_gbps: Option<f64>,
    pub(crate) tcp_lanes: Option<u8>,
    pub(crate) engine_threads: Option<usize>,
    pub(crate) heartbeat_timeout: Option<Duration>,
    pub(crate) run_ahead_bytes: Option<usize>,
    pub(crate) spin: Option<Duration>,
    pub(crate) flight_recorder_ops: Option<usize>,
    pub(crate) run_ahead_total_bytes: Option<usize>,
    pub(crate) debug_checks: Option<bool>,
}

/// The error for a variable holding what it does not take.
fn invalid(var: &'static str, value: &str, expected: &'static str) -> Error {
    Error::Env(EnvError::Invalid {
        var,
        value: value.to_owned(),
        expected,
    })
}

/// `var` parsed by `parse`; unset or blank is `None`, anything `parse`
/// refuses an error naming the variable, its value and `expected`.
fn env_parsed<T>(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    parse: impl Fn(&str) -> Option<T>,
    expected: &'static str,
) -> Result<Option<T>, Error> {
    match lookup(var) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => parse(v.trim())
            .map(Some)
            .ok_or_else(|| invalid(var, &v, expected)),
    }
}

/// An on/off variable ([`parse_switch`]'s words).
/// Lanes each way on a TCP link of the engine unless asked otherwise: one,
/// as decision 0018 measured; more pay only where a link is faster than one
/// stream on one core moves (decision 0034).
pub(crate) const DEFAULT_TCP_LANES: u8 = 1;

/// Most engine threads a rank may ask for.
pub(crate) const MAX_ENGINE_THREADS: usize = 64;

/// RINGWIRE_TCP_LANES: a switch (on: the default count) or a count.
fn parse_lanes(value: &str) -> Option<u8> {
    match value.trim().parse::<u8>() {
        Ok(n) => (n <= wire::MAX_LANES).then_some(n),
        Err(_) => parse_switch(value).map(|on| if on { DEFAULT_TCP_LANES } else { 0 }),
    }
}

/// A byte count, with the suffixes `crate::env::parse_bytes` takes.
fn env_bytes(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<u64>, Error> {
    let expected = "a number of bytes, e.g. 262144, 256K, 4M or 1G";
    env_parsed(lookup, var, crate::env::parse_bytes, expected)
}

fn env_number(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<u64>, Error> {
    env_parsed(lookup, var, |v| v.parse().ok(), "a whole number")
}

fn env_seconds(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<Duration>, Error> {
    let seconds = |v: &str| {
        let s = v.parse::<f64>().ok()?;
        (s.is_finite() && s > 0.0)
            .then(|| Duration::try_from_secs_f64(s).ok())
            .flatten()
    };
    env_parsed(lookup, var, seconds, "a positive number of seconds")
}

/// A sentence for a variable set in `lookup` that a builder call
/// overrides: its value, the builder method and the value that wins. `None`
/// when the variable is unset (or blank).
pub(crate) fn overridden_note(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    wins: &str,
) -> Option<String> {
    let theirs = lookup(var).filter(|v| !v.trim().is_empty())?;
    let by = settings::find(var).and_then(|s| s.builder).unwrap_or("a Builder call");
    // A secret is never written to the log.
    let shown = if var == "RINGWIRE_SECRET" { "(hidden)" } else { theirs.as_str() };
    let mut note = format!("{var}={shown} is set, but {by} gave {wins}, which wins");
    // The variable's value is otherwise never read: say if it is invalid.
    let alone = |v: &str| (v == var).then(|| theirs.clone());
    if let Err(e) = Overrides::default().resolve(&alone) {
        note.push_str(&format!(" (and the variable is invalid: {e})"));
    }
    Some(note)
}

impl Overrides {
    /// A sentence for each `RINGWIRE_*` variable set in `lookup` that a
    /// builder call overrides (see [`overridden_note`]).
    pub(crate) fn overridden(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
        let secs = |d: Option<Duration>| d.map(|d| format!("{} s", d.as_secs_f64()));
        let shown = |v: Option<String>| v;
        let set: [(&'static str, Option<String>); 17] = [
            ("RINGWIRE_TIMEOUT", secs(self.timeout)),
            ("RINGWIRE_CONNECT_TIMEOUT", secs(self.connect_timeout)),
            ("RINGWIRE_CHUNK_BYTES", self.chunk_bytes.map(|b| b.to_string())),
            ("RINGWIRE_SMALL_MESSAGE_BYTES", self.small_message_bytes.map(|b| b.to_string())),
            ("RINGWIRE_SOCKET_BUFFER_BYTES", self.socket_buffer.map(|b| b.to_string())),
            ("RINGWIRE_TRANSPORT", shown(self.transport.map(|t| format!("{t:?}")))),
            ("RINGWIRE_LOCAL_LINKS", shown(self.local_links.map(|l| format!("{l:?}")))),
            ("RINGWIRE_TWO_LEVEL", self.two_level.map(|t| t.name().to_string())),
            ("RINGWIRE_INTER_HOST_GBPS", self.inter_host_gbps.map(|g| format!("{g} Gb/s"))),
            ("RINGWIRE_TCP_LANES", self.tcp_lanes.map(|l| l.to_string())),
            ("RINGWIRE_ENGINE_THREADS", self.engine_threads.map(|n| n.to_string())),
            ("RINGWIRE_HEARTBEAT_TIMEOUT", secs(self.heartbeat_timeout)),
            ("RINGWIRE_RUN_AHEAD_BYTES", self.run_ahead_bytes.map(|b| b.to_string())),
            (
                "RINGWIRE_RUN_AHEAD_TOTAL_BYTES",
                self.run_ahead_total_bytes.map(|b| b.to_string()),
            ),
            ("RINGWIRE_SPIN_US", self.spin.map(|s| format!("{} us", s.as_micros()))),
            ("RINGWIRE_FLIGHT_RECORDER_OPS", self.flight_recorder_ops.map(|n| n.to_string())),
            ("RINGWIRE_DEBUG", self.debug_checks.map(|d| if d { "detail" } else { "off" }.into())),
        ];
        set.into_iter()
            .filter_map(|(var, ours)| overridden_note(lookup, var, &ours?))
            .collect()
    }

    /// Fills the unset fields from `RINGWIRE_*` variables, then defaults.
    pub(crate) fn resolve(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Tunables, Error> {
        let timeout = match self.timeout {
            Some(t) => t,
            None => env_seconds(lookup, "RINGWIRE_TIMEOUT")?.unwrap_or(DEFAULT_TIMEOUT),
        };
        let connect_timeout = match self.connect_timeout {
            Some(t) => t,
            None => env_seconds(lookup, "RINGWIRE_CONNECT_TIMEOUT")?.unwrap_or(timeout),
        };
        let chunk_bytes = match self.chunk_bytes {
            Some(c) => c,
            None => env_bytes(lookup, "RINGWIRE_CHUNK_BYTES")?
                .map_or(DEFAULT_CHUNK_BYTES, |c| c as usize),
        };
        if !(8..=(64 << 20)).contains(&chunk_bytes) {
            let var = match self.chunk_bytes {
                Some(_) => "Builder::chunk_bytes",
                None => "RINGWIRE_CHUNK_BYTES",
            };
            return Err(invalid(
                var,
                &chunk_bytes.to_string(),
                "a chunk size between 8 B and 64 MiB",
            ));
        }
        let small_message_bytes = match self.small_message_bytes {
            Some(c) => c,
            None => env_bytes(lookup, "RINGWIRE_SMALL_MESSAGE_BYTES")?
                .map_or(DEFAULT_SMALL_MESSAGE_BYTES, |c| c as usize),
        };
        let socket_buffer = match self.socket_buffer {
            Some(c) => Some(c),
            None => env_bytes(lookup, "RINGWIRE_SOCKET_BUFFER_BYTES")?.map(|c| c as usize),
        };
        let transport = match self.transport {
            Some(t) => t,
            None => match lookup("RINGWIRE_TRANSPORT") {
                Some(v) => TransportKind::parse("RINGWIRE_TRANSPORT", &v)?,
                None => TransportKind::Auto,
            },
        };
        let local_links = match self.local_links {
            Some(l) => l,
            None => match lookup("RINGWIRE_LOCAL_LINKS") {
                Some(v) => LocalLinks::parse("RINGWIRE_LOCAL_LINKS", &v)?,
                None => LocalLinks::Shm,
            },
        };
        let two_level = match self.two_level {
            Some(t) => t,
            None => match lookup("RINGWIRE_TWO_LEVEL") {
                Some(v) => TwoLevel::parse("RINGWIRE_TWO_LEVEL", &v)?,
                None => TwoLevel::Auto,
            },
        };
        let inter_host_gbps = match self.inter_host_gbps {
            Some(g) => Some(g),
            None => env_parsed(
                lookup,
                "RINGWIRE_INTER_HOST_GBPS",
                |v| v.parse::<f64>().ok(),
                "a positive number of gigabits per second, e.g. 25 or 100",
            )?,
        };
        if let Some(g) = inter_host_gbps
            && !(g.is_finite() && g > 0.0)
        {
            let var = match self.inter_host_gbps {
                Some(_) => "Builder::inter_host_gbps",
                None => "RINGWIRE_INTER_HOST_GBPS",
            };
            return Err(invalid(
                var,
                &g.to_string(),
                "a positive number of gigabits per second, e.g. 25 or 100",
            ));
        }
        let tcp_lanes = match self.tcp_lanes {
            Some(l) => l.min(wire::MAX_LANES),
            None => env_parsed(
                lookup,
                "RINGWIRE_TCP_LANES",
                parse_lanes,
                "1, on, true or yes; 0, off, false or no; or a number of lanes each way up to 8",
            )?
            .unwrap_or(DEFAULT_TCP_LANES),
        };
        let engine_threads = match self.engine_threads {
            Some(n) => n.min(MAX_ENGINE_THREADS),
            None => env_parsed(
                lookup,
                "RINGWIRE_ENGINE_THREADS",
                |v| v.parse::<usize>().ok().filter(|&n| n <= MAX_ENGINE_THREADS),
                "a number of engine threads, 0 (none) to 64",
            )?
            .unwrap_or(0),
        };
        let spin = match self.spin {
            Some(s) => s,
            None => {
                env_number(lookup, "RINGWIRE_SPIN_US")?.map_or(DEFAULT_SPIN, Duration::from_micros)
            }
        };
        let heartbeat_timeout = match self.heartbeat_timeout {
            Some(t) => t,
            None => env_seconds(lookup, "RINGWIRE_HEARTBEAT_TIMEOUT")?
                .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT),
        };
        let run_ahead_bytes = match self.run_ahead_bytes {
            Some(b) => b,
            None => env_bytes(lookup, "RINGWIRE_RUN_AHEAD_BYTES")?
                .map_or(DEFAULT_RUN_AHEAD_BYTES, |b| b as usize),
        };
        let run_ahead_total_bytes = match self.run_ahead_total_bytes {
            Some(b) => b,
            None => env_bytes(lookup, "RINGWIRE_RUN_AHEAD_TOTAL_BYTES")?
                .map_or(DEFAULT_RUN_AHEAD_TOTAL_BYTES, |b| b as usize),
        };
        let debug_checks = match self.debug_checks {
            Some(d) => d,
            // `detail` as torch's TORCH_DISTRIBUTED_DEBUG says it, or a switch.
            None => env_parsed(
                lookup,
                "RINGWIRE_DEBUG",
                |v| match v.to_ascii_lowercase().as_str() {
                    "detail" => Some(true),
                    other => parse_switch(other),
                },
                "detail (check every op's signature across ranks), or a switch: 1, on, true, yes; 0, off, false, no",
            )?
            .unwrap_or(false),
        };
        let flight_recorder_ops = match self.flight_recorder_ops {
            Some(n) => n,
            None => env_number(lookup, "RINGWIRE_FLIGHT_RECORDER_OPS")?
                .map_or(crate::recorder::DEFAULT_FLIGHT_RECORDER_OPS, |n| n as usize),
        };
        Ok(Tunables {
            timeout,
            connect_timeout,
            chunk_bytes,
            small_message_bytes,
            // A frame holds one chunk; leave room so every dtype fits.
            max_frame_bytes: (chunk_bytes as u32).max(64 << 20),
            socket_buffer,
            transport,
            local_links,
            two_level,
            inter_host_gbps,
            tcp_lanes,
            engine_threads,
            spin,
            heartbeat_timeout,
            run_ahead_bytes,
            run_ahead_total_bytes,
            debug_checks,
            flight_recorder_ops,
            flight_recorder_dir: lookup("RINGWIRE_FLIGHT_RECORDER_DIR").map(Into::into),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::env_lookup as vars;

    #[test]
    fn shared_settings_name_the_first_that_differs() {
        let base = Overrides::default().resolve(&vars(&[])).unwrap();
        assert_eq!(base.disagreement(1, &base.shared()), None);
        for (var, value, named) in [
            ("RINGWIRE_CHUNK_BYTES", "4096", "RINGWIRE_CHUNK_BYTES"),
            (
                "RINGWIRE_SMALL_MESSAGE_BYTES",
                "64",
                "RINGWIRE_SMALL_MESSAGE_BYTES",
            ),
            ("RINGWIRE_DEBUG", "detail", "RINGWIRE_DEBUG"),
            ("RINGWIRE_TWO_LEVEL", "never", "RINGWIRE_TWO_LEVEL"),
            (
                "RINGWIRE_INTER_HOST_GBPS",
                "100",
                "RINGWIRE_INTER_HOST_GBPS",
            ),
        ] {
            let other = Overrides::default()
                .resolve(&vars(&[(var, value)]))
                .unwrap();
            let why = other.disagreement(3, &base.shared()).unwrap();
            assert!(why.starts_with("rank 3 has "), "{why}");
            assert!(why.contains(named), "{why}");
            assert!(why.contains(value), "{why}");
            // Symmetric: rank 0's side of it.
            assert!(base.disagreement(3, &other.shared()).is_some());
        }
        // A rank 0 that publishes no such setting (an older build).
        let why = base.disagreement(2, "chunk_bytes=1048576").unwrap();
        assert!(why.contains("RINGWIRE_SMALL_MESSAGE_BYTES"), "{why}");
    }

    #[test]
    fn two_level_settings_parse_and_refuse_nonsense() {
        let t = |pairs: &[(&str, &str)]| Overrides::default().resolve(&vars(pairs));
        let base = t(&[]).unwrap();
        assert_eq!(base.two_level, TwoLevel::Auto);
        assert_eq!(base.inter_host_gbps, None, "read from the interfaces");
        for (word, mode) in [
            ("always", TwoLevel::Always),
            ("ON", TwoLevel::Always),
            ("never", TwoLevel::Never),
            ("0", TwoLevel::Never),
            ("auto", TwoLevel::Auto),
        ] {
            let got = t(&[("RINGWIRE_TWO_LEVEL", word)]).unwrap().two_level;
            assert_eq!(got, mode, "{word}");
        }
        assert!(t(&[("RINGWIRE_TWO_LEVEL", "sometimes")]).is_err());
        let gbps = t(&[("RINGWIRE_INTER_HOST_GBPS", "100")]).unwrap();
        assert_eq!(gbps.inter_host_gbps, Some(100.0));
        for bad in ["0", "-5", "fast", "inf", "NaN"] {
            let e = t(&[("RINGWIRE_INTER_HOST_GBPS", bad)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("RINGWIRE_INTER_HOST_GBPS"), "{bad}: {e}");
        }
    }

    #[test]
    fn builder_beats_env_beats_default() {
        let env = vars(&[
            ("RINGWIRE_TIMEOUT", "2.5"),
            ("RINGWIRE_SMALL_MESSAGE_BYTES", "4096"),
        ]);
        let t = Overrides::default().resolve(&env).unwrap();
        assert_eq!(t.timeout, Duration::from_millis(2500));
        assert_eq!(t.connect_timeout, Duration::from_millis(2500));
        assert_eq!(t.small_message_bytes, 4096);
        assert_eq!(t.chunk_bytes, DEFAULT_CHUNK_BYTES);
        assert_eq!(t.spin, DEFAULT_SPIN);
        assert_eq!(t.run_ahead_bytes, DEFAULT_RUN_AHEAD_BYTES);
        assert_eq!(t.run_ahead_total_bytes, DEFAULT_RUN_AHEAD_TOTAL_BYTES);
        let o = Overrides {
            small_message_bytes: Some(10),
            ..Overrides::default()
        };
        assert_eq!(o.resolve(&env).unwrap().small_message_bytes, 10);
        let env = vars(&[
            ("RINGWIRE_SPIN_US", "40"),
            ("RINGWIRE_FLIGHT_RECORDER_OPS", "8"),
        ]);
        let o = Overrides {
            spin: Some(Duration::ZERO),
            flight_recorder_ops: Some(0),
            ..Overrides::default()
        };
        let t = o.resolve(&env).unwrap();
        assert_eq!((t.spin, t.flight_recorder_ops), (Duration::ZERO, 0));
        let t = Overrides::default().resolve(&env).unwrap();
        assert_eq!(
            (t.spin, t.flight_recorder_ops),
            (Duration::from_micros(40), 8)
        );
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_RUN_AHEAD_TOTAL_BYTES", "8M")]))
            .unwrap();
        assert_eq!(t.run_ahead_total_bytes, 8 << 20);
        let o = Overrides {
            run_ahead_total_bytes: Some(0),
            ..Overrides::default()
        };
        assert_eq!(o.resolve(&env).unwrap().run_ahead_total_bytes, 0);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_TIMEOUT", "soon")]))
            .unwrap_err();
        assert!(err.to_string().contains("RINGWIRE_TIMEOUT=soon"), "{err}");
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_TRANSPORT", "quic")]))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("RINGWIRE_TRANSPORT=quic"), "{msg}");
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_TRANSPORT", "uring")]))
            .unwrap();
        assert_eq!(t.transport, TransportKind::Uring);
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_SPIN_US", "soon")]))
            .unwrap_err();
        assert!(err.to_string().contains("RINGWIRE_SPIN_US=soon"), "{err}");
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_SPIN_US", "40")]))
            .unwrap();
        assert_eq!(t.spin, Duration::from_micros(40));
        assert_eq!(t.local_links, LocalLinks::Shm);
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_LOCAL_LINKS", "unix")]))
            .unwrap();
        assert_eq!(t.local_links, LocalLinks::Unix);
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_LOCAL_LINKS", "TCP")]))
            .unwrap();
        assert_eq!(t.local_links, LocalLinks::Tcp);
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_LOCAL_LINKS", "rdma")]))
            .unwrap_err();
        assert!(
            err.to_string().contains("RINGWIRE_LOCAL_LINKS=rdma"),
            "{err}"
        );
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_CHUNK_BYTES", "1")]))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Env(EnvError::Invalid {
                    var: "RINGWIRE_CHUNK_BYTES",
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("RINGWIRE_CHUNK_BYTES=1"), "{err}");
        let builder = Overrides {
            chunk_bytes: Some(1 << 30),
            ..Overrides::default()
        };
        let err = builder.resolve(&vars(&[])).unwrap_err();
        assert!(
            err.to_string().contains("Builder::chunk_bytes=1073741824"),
            "{err}"
        );
        // "tcp" names a kind of link, not a transport: the error says where it goes.
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_TRANSPORT", "tcp")]))
            .unwrap_err();
        assert!(err.to_string().contains("RINGWIRE_LOCAL_LINKS"), "{err}");
        let err = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_SOCKET_BUFFER_BYTES", "4MB")]))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("RINGWIRE_SOCKET_BUFFER_BYTES=4MB"), "{msg}");
        assert!(msg.contains("4M"), "{msg}");
    }

    #[test]
    fn engine_threads_are_a_count_up_to_64_and_none_unless_asked() {
        let resolve =
            |v: &str| Overrides::default().resolve(&vars(&[("RINGWIRE_ENGINE_THREADS", v)]));
        assert_eq!(resolve("").unwrap().engine_threads, 0);
        assert_eq!(resolve("2").unwrap().engine_threads, 2);
        assert_eq!(resolve("64").unwrap().engine_threads, 64);
        for bad in ["65", "two", "-1"] {
            match resolve(bad) {
                Err(Error::Env(EnvError::Invalid { var, expected, .. })) => {
                    assert_eq!(var, "RINGWIRE_ENGINE_THREADS");
                    assert!(expected.contains("0 (none) to 64"), "{expected}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // The builder's wins, and is held to the same bound.
        let asked = Overrides {
            engine_threads: Some(100),
            ..Overrides::default()
        };
        let t = asked
            .resolve(&vars(&[("RINGWIRE_ENGINE_THREADS", "1")]))
            .unwrap();
        assert_eq!(t.engine_threads, MAX_ENGINE_THREADS);
    }

    #[test]
    fn switches_take_the_same_words_and_name_a_bad_one() {
        let on_words = ["1", "on", "true", "yes", " ON ", "Yes"];
        let off_words = ["0", "off", "false", "no", "OFF", "False"];
        type Setting = fn(&Tunables) -> bool;
        let read: [(&str, Setting); 2] = [
            ("RINGWIRE_TCP_LANES", |t| t.tcp_lanes > 0),
            ("RINGWIRE_DEBUG", |t| t.debug_checks),
        ];
        for (var, setting) in read {
            for (words, want) in [(on_words, true), (off_words, false)] {
                for word in words {
                    let t = Overrides::default().resolve(&vars(&[(var, word)])).unwrap();
                    assert_eq!(setting(&t), want, "{var}={word:?}");
                }
            }
            match Overrides::default().resolve(&vars(&[(var, "sometimes")])) {
                Err(Error::Env(EnvError::Invalid {
                    var: named,
                    value,
                    expected,
                })) => {
                    assert_eq!((named, value.as_str()), (var, "sometimes"));
                    assert!(
                        expected.contains("off, false or no")
                            || expected.contains("0, off, false, no"),
                        "{expected}"
                    );
                }
                other => panic!("{var}: expected an invalid-setting error, got {other:?}"),
            }
        }
        // Unset, and torch's word for the debug checks.
        let t = Overrides::default().resolve(&vars(&[])).unwrap();
        assert!(t.tcp_lanes == DEFAULT_TCP_LANES && !t.debug_checks);
        // A lane count, up to 8.
        for (word, want) in [("4", 4), ("8", 8), ("0", 0), ("on", DEFAULT_TCP_LANES)] {
            let t = Overrides::default()
                .resolve(&vars(&[("RINGWIRE_TCP_LANES", word)]))
                .unwrap();
            assert_eq!(t.tcp_lanes, want, "{word}");
        }
        let nine = Overrides::default().resolve(&vars(&[("RINGWIRE_TCP_LANES", "9")]));
        assert!(
            matches!(nine, Err(Error::Env(EnvError::Invalid { .. }))),
            "{nine:?}"
        );
        let t = Overrides::default()
            .resolve(&vars(&[("RINGWIRE_DEBUG", "DETAIL")]))
            .unwrap();
        assert!(t.debug_checks);
    }

    #[test]
    fn byte_settings_take_suffixes() {
        let t = Overrides::default()
            .resolve(&vars(&[
                ("RINGWIRE_CHUNK_BYTES", "256K"),
                ("RINGWIRE_SMALL_MESSAGE_BYTES", "64KiB"),
                ("RINGWIRE_SOCKET_BUFFER_BYTES", "2m"),
            ]))
            .unwrap();
        assert_eq!(t.chunk_bytes, 256 << 10);
        assert_eq!(t.small_message_bytes, 64 << 10);
        assert_eq!(t.socket_buffer, Some(2 << 20));
    }
}
