//! Building a communicator: find the store, claim a rank, publish this
//! rank's listen address, learn everyone else's, and start the transport.
//!
//! Each rank binds port 0 on the chosen interface and keeps that socket, then
//! publishes the port it got, so there is no reserve-then-bind race. Rank 0
//! hosts the store at MASTER_ADDR:MASTER_PORT (only on that address) unless
//! an external `ringwire-store` is used. Setup ends with a store barrier, so
//! no rank leaves (and rank 0 cannot take the store away) before every rank
//! has everything it needs.
//!
//! Here: [`Builder`], its settings and the launch environment's; the steps
//! themselves are in `join.rs`.

mod join;
mod rejoin;

use crate::comm::Communicator;
use crate::config::{self, DEFAULT_TCP_LANES, LocalLinks, Overrides, TransportKind, TwoLevel};
use crate::env;
use crate::env::{ElasticAttempt, StoreKind};
use crate::error::Error;
use crate::pending::{PendingCollective, pending};
use crate::security::secret::Secret;
use crate::security::{self, Security, TlsConfig};
use crate::wire::OpKind;
use join::rendezvous;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Where the store is.
#[derive(Clone, Debug)]
enum StoreAddr {
    HostPort(String, u16),
    Resolved(SocketAddr),
}

/// Configures and builds a [`Communicator`].
///
/// ```no_run
/// # fn main() -> Result<(), ringwire::Error> {
/// let comm = ringwire::Communicator::builder()
///     .rank(0)
///     .world_size(2)
///     .store("10.0.0.1", 29500)
///     .timeout(std::time::Duration::from_secs(30))
///     .build()
///     .wait()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Builder {
    rank: Option<usize>,
    world_size: Option<usize>,
    store: Option<StoreAddr>,
    host_store: Option<bool>,
    socket_ifname: Option<String>,
    job: Option<String>,
    overrides: Overrides,
    /// Set by `secret` / `security`; else RINGWIRE_SECRET.
    secret: Option<Option<Secret>>,
    /// Set by `tls` / `security`; else RINGWIRE_TLS*.
    tls: Option<Option<TlsConfig>>,
    /// (local rank, ranks on this host), from the launch environment.
    local: Option<(usize, usize)>,
    /// ringwire's own store, or a PyTorch TCPStore someone else hosts.
    store_kind: StoreKind,
    /// torchrun's attempt: its keys live under the run id and restart count.
    attempt: Option<ElasticAttempt>,
    /// What the launch environment filled in for the store address (a
    /// loopback default, a port derived from the launcher's job id), for
    /// the error when rank 0 cannot listen there.
    master_from: Option<String>,
    /// Which host this rank counts as for two-level collectives
    /// (`Builder::host_id`, RINGWIRE_HOST_ID); else its kernel and network
    /// namespace.
    host_id: Option<String>,
    /// Join the running job in a lost rank's place (`Builder::rejoin`,
    /// RINGWIRE_REJOIN).
    rejoin: bool,
}

impl Builder {
    /// A builder with nothing set.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// A builder filled from the launch environment (RINGWIRE_*, torchrun,
    /// Open MPI, Slurm or PMI variables; `docs/reference/configuration.md`
    /// lists them).
    pub fn from_env() -> Result<Builder, Error> {
        Builder::from_lookup(&|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`Builder::from_env`] over any source of variables.
    fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Builder, Error> {
        let cfg = env::discover(lookup)?;
        let mut b = Builder::new()
            .rank(cfg.rank)
            .world_size(cfg.world_size)
            .store(&cfg.master_addr, cfg.master_port);
        if let Some(ifname) = cfg.socket_ifname {
            b = b.socket_ifname(ifname);
        }
        b.local = cfg.local_rank.zip(cfg.local_world_size);
        b.store_kind = cfg.store;
        b.attempt = cfg.elastic;
        // A port derived from the launcher's job id may, rarely, be another
        // job's too: the job id then keeps the two jobs' keys apart, so the
        // second job fails at rank 0's bind instead of joining the first.
        if cfg.master_from.is_some()
            && let Some(job) = cfg.launcher_job_id
        {
            b = b.job(job);
        }
        b.master_from = cfg.master_from;
        if let Some(job) = lookup("RINGWIRE_JOB_ID") {
            b = b.job(job);
        }
        if let Some(id) = lookup("RINGWIRE_HOST_ID")
            && !id.trim().is_empty()
        {
            b = b.host_id(id.trim());
        }
        if let Some(value) = lookup("RINGWIRE_REJOIN")
            && !value.trim().is_empty()
        {
            let Some(on) = env::parse_switch(&value) else {
                return Err(Error::Env(env::EnvError::Invalid {
                    var: "RINGWIRE_REJOIN",
                    value,
                    expected: env::SWITCH_WORDS,
                }));
            };
            b = b.rejoin(on);
        }
        if let Some(value) = lookup("RINGWIRE_HOST_STORE")
            && !value.trim().is_empty()
        {
            let Some(host) = env::parse_switch(&value) else {
                return Err(Error::Env(env::EnvError::Invalid {
                    var: "RINGWIRE_HOST_STORE",
                    value,
                    expected: env::SWITCH_WORDS,
                }));
            };
            b = b.host_store(host);
        }
        Ok(b)
    }

    /// Joins the running job in the place of its lost rank [`Builder::rank`]
    /// instead of meeting the others at launch (also `RINGWIRE_REJOIN=1`):
    /// `build` waits until the job's members take this process in with
    /// [`Communicator::admit`], and returns the communicator they made;
    /// it waits as long as setup waits for the other ranks
    /// ([`Builder::connect_timeout`], `RINGWIRE_CONNECT_TIMEOUT`).
    /// The job's store must outlive the rank this one replaces: a
    /// standalone `ringwire-store`, or torchrun's agent store; rank 0's own
    /// store ends with rank 0. See the guide's "Surviving a lost rank".
    pub fn rejoin(mut self, on: bool) -> Builder {
        self.rejoin = on;
        self
    }

    /// This process's rank.
    pub fn rank(mut self, rank: usize) -> Builder {
        self.rank = Some(rank);
        self
    }

    /// The number of ranks.
    pub fn world_size(mut self, size: usize) -> Builder {
        self.world_size = Some(size);
        self
    }

    /// The rendezvous store's host (name, IPv4 or IPv6 address) and port.
    pub fn store(mut self, host: &str, port: u16) -> Builder {
        self.store = Some(StoreAddr::HostPort(host.to_string(), port));
        self
    }

    /// The rendezvous store's socket address.
    pub fn store_addr(mut self, addr: SocketAddr) -> Builder {
        self.store = Some(StoreAddr::Resolved(addr));
        self
    }

    /// Which store the ranks meet at: ringwire's own (the default: rank 0
    /// hosts it unless [`Builder::host_store`] says otherwise), or a PyTorch
    /// `TCPStore` at the store address that someone else hosts, as
    /// torchrun's agent does (`from_env` picks it when torchrun sets
    /// TORCHELASTIC_USE_AGENT_STORE=True). The TCPStore has no
    /// authentication: a job secret or TLS still protects every link, not
    /// the store. Env: RINGWIRE_STORE=torch|ringwire.
    pub fn store_kind(mut self, kind: StoreKind) -> Builder {
        self.store_kind = kind;
        self
    }

    /// This job is attempt `restart_count` of run `run_id` (torchrun's
    /// TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT, which `from_env`
    /// reads): its store keys live under both, so a restarted attempt never
    /// reads what the last one left in a store that outlives it.
    pub fn elastic_attempt(mut self, run_id: impl Into<String>, restart_count: u64) -> Builder {
        self.attempt = Some(ElasticAttempt {
            run_id: run_id.into(),
            restart_count,
        });
        self
    }

    /// Whether rank 0 starts the store (default true). Set false when a
    /// standalone `ringwire-store` (or another rank-0 process) serves it.
    pub fn host_store(mut self, host: bool) -> Builder {
        self.host_store = Some(host);
        self
    }

    /// The network interface whose address ranks listen on and publish (as
    /// GLOO_SOCKET_IFNAME does). Default: the interface the kernel routes
    /// to the store through. Env: RINGWIRE_SOCKET_IFNAME.
    pub fn socket_ifname(mut self, ifname: impl Into<String>) -> Builder {
        self.socket_ifname = Some(ifname.into());
        self
    }

    /// A name that keeps jobs sharing one standalone store apart. Env:
    /// RINGWIRE_JOB_ID.
    pub fn job(mut self, job: impl Into<String>) -> Builder {
        self.job = Some(job.into());
        self
    }

    /// Default per-op timeout (60 s). Env: RINGWIRE_TIMEOUT (seconds).
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.overrides.timeout = Some(timeout);
        self
    }

    /// How long setup waits for the store and for every rank to join
    /// (default: the op timeout). Env: RINGWIRE_CONNECT_TIMEOUT (seconds).
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.overrides.connect_timeout = Some(timeout);
        self
    }

    /// Bytes per frame (1 MiB); larger buffers travel as pipelined chunks.
    /// Every rank must use the same value (setup fails on every rank,
    /// naming it, where one differs from rank 0). Env: RINGWIRE_CHUNK_BYTES.
    pub fn chunk_bytes(mut self, bytes: usize) -> Builder {
        self.overrides.chunk_bytes = Some(bytes);
        self
    }

    /// Size below which all-reduce uses recursive doubling and broadcast the
    /// binomial tree (1 MiB). Every rank must use the same value (checked
    /// at setup, like the chunk size). Env: RINGWIRE_SMALL_MESSAGE_BYTES.
    pub fn small_message_bytes(mut self, bytes: usize) -> Builder {
        self.overrides.small_message_bytes = Some(bytes);
        self
    }

    /// This rank's index among the ranks on its host, and how many ranks
    /// the host runs (what torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE say;
    /// `from_env` reads them and the Open MPI, Slurm and PMI equivalents).
    /// Where a host runs more ranks than it has cores, polling threads
    /// keep to their rank's core, and every rank of the job runs small
    /// all-reduces as a tree reduce and broadcast, which moves fewer
    /// frames than recursive doubling (decision 0013).
    pub fn local_ranks(mut self, local_rank: usize, local_world_size: usize) -> Builder {
        self.local = Some((local_rank, local_world_size));
        self
    }

    /// Which host this rank counts as when collectives run in two levels
    /// (within each host, then across hosts; decision 0033), like
    /// `NCCL_HOSTID`. By default ranks on one kernel and network namespace
    /// form a host. It changes only that grouping: which peers are reached
    /// over Unix sockets or shared memory still depends on where they run.
    /// Env: RINGWIRE_HOST_ID.
    pub fn host_id(mut self, id: impl Into<String>) -> Builder {
        self.host_id = Some(id.into());
        self
    }

    /// Explicit SO_SNDBUF / SO_RCVBUF on every link. By default TCP links
    /// autotune, the io_uring engine's Unix links get 1 MiB and the
    /// portable plane's keep the kernel's default (decision 0015); 0 keeps
    /// the kernel's default on every link. Env:
    /// RINGWIRE_SOCKET_BUFFER_BYTES.
    pub fn socket_buffer_bytes(mut self, bytes: usize) -> Builder {
        self.overrides.socket_buffer = Some(bytes);
        self
    }

    /// How long a link may stay silent (no data, no heartbeat) before its
    /// peer is declared dead: a stopped or hung process, or a partition
    /// (10 s). Env: RINGWIRE_HEARTBEAT_TIMEOUT (seconds).
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Builder {
        self.overrides.heartbeat_timeout = Some(timeout);
        self
    }

    /// How many bytes one peer may deliver for ops this rank has not started
    /// yet before this rank stops reading its link, so a rank that falls
    /// behind (a slow root in a loop of `reduce`s, a slow pipeline stage)
    /// holds the senders back through TCP's window instead of buffering
    /// without bound (4 MiB; 0 never stops reading; decision 0019). A
    /// sender held back longer than its op timeout fails naming this rank.
    /// Env: RINGWIRE_RUN_AHEAD_BYTES.
    pub fn run_ahead_bytes(mut self, bytes: usize) -> Builder {
        self.overrides.run_ahead_bytes = Some(bytes);
        self
    }

    /// Bytes all peers together may send for ops this rank has not started
    /// yet: past it, every peer that has sent any such bytes is not read
    /// until this rank catches up, so a rank that many peers run ahead of
    /// (the slow root of a wide communicator) holds at most this much
    /// rather than [`Builder::run_ahead_bytes`] times the peers (64 MiB; 0
    /// for no total limit; no limit at all while `run_ahead_bytes` is 0).
    /// Env: RINGWIRE_RUN_AHEAD_TOTAL_BYTES.
    pub fn run_ahead_total_bytes(mut self, bytes: usize) -> Builder {
        self.overrides.run_ahead_total_bytes = Some(bytes);
        self
    }

    /// How long a waiting thread polls (yielding its core between polls)
    /// before it sleeps: the caller in `wait()`, the executor between ops,
    /// the engine for a frame, the portable transport's readers (1 ms;
    /// zero sleeps at once: least CPU, highest small-op latency).
    /// Env: RINGWIRE_SPIN_US (microseconds).
    pub fn spin(mut self, spin: Duration) -> Builder {
        self.overrides.spin = Some(spin);
        self
    }

    /// How many recent ops each communicator remembers for
    /// [`crate::Communicator::flight_record`] and the dump logged on
    /// failure (64; 0 keeps none). Env: RINGWIRE_FLIGHT_RECORDER_OPS.
    pub fn flight_recorder_ops(mut self, ops: usize) -> Builder {
        self.overrides.flight_recorder_ops = Some(ops);
        self
    }

    /// Before each collective, check across ranks that every rank called the
    /// same op with the same type, count, reduce op and root (one small
    /// all-gather per op; like TORCH_DISTRIBUTED_DEBUG=DETAIL). Env:
    /// RINGWIRE_DEBUG=detail. Every rank must use the same value (checked at
    /// setup).
    pub fn debug_checks(mut self, on: bool) -> Builder {
        self.overrides.debug_checks = Some(on);
        self
    }

    /// What carries links to ranks on the same host (same kernel and
    /// network namespace): shared memory by default (where memfd works;
    /// else that link stays a Unix-domain socket), Unix-domain sockets, or
    /// TCP like links between hosts. Env: RINGWIRE_LOCAL_LINKS=shm|unix|tcp.
    pub fn local_links(mut self, kind: LocalLinks) -> Builder {
        self.overrides.local_links = Some(kind);
        self
    }

    /// Whether collectives of communicators spanning several hosts run in
    /// two levels: within each host, across hosts (each local rank's share,
    /// side by side), within each host again (decision 0033). `Auto` (the
    /// default) asks a cost model, given [`Builder::inter_host_gbps`].
    /// Hosts are kernels and network namespaces, or [`Builder::host_id`].
    /// Env: RINGWIRE_TWO_LEVEL=auto|always|never. Every rank must use the
    /// same value (checked at setup).
    pub fn two_level(mut self, mode: TwoLevel) -> Builder {
        self.overrides.two_level = Some(mode);
        self
    }

    /// The rate of each host's link to the others, in gigabits per second,
    /// that the two-level cost model assumes. By default the slowest rate
    /// the ranks' interfaces report (the one each listens on; its driver's
    /// `speed`), else 25. Env: RINGWIRE_INTER_HOST_GBPS. Every rank must
    /// use the same value.
    pub fn inter_host_gbps(mut self, gbps: f64) -> Builder {
        self.overrides.inter_host_gbps = Some(gbps);
        self
    }

    /// Whether TCP links run by the io_uring engine carry the payloads of
    /// large frames (1 MiB and up: whole default chunks) on extra one-way
    /// connections, so that neither end's sends process the other's
    /// arriving data (docs/decisions/0018). On by default, with one lane
    /// each way; the dialing rank of each link asks, and the other takes as
    /// many as it would ask for itself if its engine runs.
    /// Env: RINGWIRE_TCP_LANES=on|off|N.
    pub fn tcp_lanes(mut self, on: bool) -> Builder {
        self.overrides.tcp_lanes = Some(if on { DEFAULT_TCP_LANES } else { 0 });
        self
    }

    /// How many lanes each way a TCP link of the io_uring engine has (0 to
    /// 8; more are taken as 8). With more than one, payloads of 256 KiB and
    /// up travel in pieces, each on the lane with the fewest bytes yet to
    /// deliver, so
    /// a link can fill a network faster than one TCP stream on one core
    /// moves, and one slow stream does not hold the rest to its pace
    /// (docs/decisions/0034). Env: RINGWIRE_TCP_LANES=N.
    pub fn tcp_lane_count(mut self, lanes: u8) -> Builder {
        self.overrides.tcp_lanes = Some(lanes);
        self
    }

    /// How many engine threads run this rank's TCP lanes (0, the default,
    /// to 64). Each owns an io_uring of its own and is pinned to a core
    /// no local rank is homed on, where the host has enough of them; the
    /// kernel's copies of lane traffic then run on those cores instead of
    /// the waiting caller's, so a link can fill a network one core cannot
    /// (docs/decisions/0036). Small frames and every link's main
    /// connection stay on the caller-driven ring. Worth it only with more
    /// than one lane ([`Builder::tcp_lane_count`]) and spare cores.
    /// Env: RINGWIRE_ENGINE_THREADS=N.
    pub fn engine_threads(mut self, threads: usize) -> Builder {
        self.overrides.engine_threads = Some(threads);
        self
    }

    /// Which transport to use. Env: RINGWIRE_TRANSPORT=auto|uring|portable.
    pub fn transport(mut self, kind: TransportKind) -> Builder {
        self.overrides.transport = Some(kind);
        self
    }

    /// Requires the job secret `secret` on every link and store connection
    /// (mutual HMAC-SHA256 challenge-response; the secret never crosses the
    /// wire). Every rank and the store need the same one. Env:
    /// RINGWIRE_SECRET or RINGWIRE_SECRET_FILE.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Builder {
        self.secret = Some(Secret::new(secret));
        self
    }

    /// Runs every link and store connection inside TLS or mutual TLS (see
    /// [`TlsConfig`]). Every rank and the store need the same mode and CA.
    /// Env: RINGWIRE_TLS=off|tls|mtls, RINGWIRE_TLS_CA, RINGWIRE_TLS_CERT,
    /// RINGWIRE_TLS_KEY.
    pub fn tls(mut self, tls: TlsConfig) -> Builder {
        self.tls = Some(Some(tls));
        self
    }

    /// Sets both the secret and TLS (a [`Security`] with neither turns both
    /// off, whatever the environment says).
    pub fn security(mut self, security: Security) -> Builder {
        self.secret = Some(security.secret);
        self.tls = Some(security.tls);
        self
    }

    /// The security settings: the builder's, else the environment's.
    /// A sentence for each `RINGWIRE_*` variable set in `lookup` that a
    /// builder call overrides, so a setting the user made is never ignored
    /// without a word (logged as a warning at start).
    fn overridden(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
        let mut notes = self.overrides.overridden(lookup);
        let differs = |var: &'static str, ours: Option<&str>| {
            let ours = ours?;
            let theirs = lookup(var)?;
            (theirs.trim() != ours).then(|| config::overridden_note(lookup, var, ours))?
        };
        let host_store = self.host_store.map(|h| if h { "1" } else { "0" });
        let store_switch = lookup("RINGWIRE_HOST_STORE")
            .and_then(|v| env::parse_switch(&v))
            .map(|h| if h { "1" } else { "0" });
        if host_store.is_some() && store_switch.is_some_and(|s| Some(s) != host_store) {
            notes.extend(config::overridden_note(
                lookup,
                "RINGWIRE_HOST_STORE",
                host_store.unwrap_or(""),
            ));
        }
        notes.extend(differs("RINGWIRE_JOB_ID", self.job.as_deref()));
        notes.extend(differs("RINGWIRE_HOST_ID", self.host_id.as_deref()));
        if let Some(StoreAddr::HostPort(host, port)) = &self.store {
            let port = port.to_string();
            for (var, ours) in [
                ("RINGWIRE_MASTER_ADDR", host.as_str()),
                ("RINGWIRE_MASTER_PORT", port.as_str()),
            ] {
                notes.extend(differs(var, Some(ours)));
            }
            if lookup("RINGWIRE_MASTER_ADDR").is_none() {
                notes.extend(differs("MASTER_ADDR", Some(host)));
            }
            if lookup("RINGWIRE_MASTER_PORT").is_none() {
                notes.extend(differs("MASTER_PORT", Some(&port)));
            }
        }
        if self.secret.is_some() {
            for var in ["RINGWIRE_SECRET", "RINGWIRE_SECRET_FILE"] {
                notes.extend(config::overridden_note(
                    lookup,
                    var,
                    "its own secret (or none)",
                ));
            }
        }
        if self.tls.is_some() {
            for var in [
                "RINGWIRE_TLS",
                "RINGWIRE_TLS_CA",
                "RINGWIRE_TLS_CERT",
                "RINGWIRE_TLS_KEY",
            ] {
                notes.extend(config::overridden_note(lookup, var, "its own TLS setting"));
            }
        }
        notes
    }

    fn resolve_security(&self) -> Result<Security, Error> {
        let env = |v: &str| std::env::var(v).ok();
        let bad = |e: security::SecurityError| Error::Rendezvous(e.0);
        let secret = match &self.secret {
            Some(s) => s.clone(),
            None => security::secret_from_lookup(&env).map_err(bad)?,
        };
        let tls = match &self.tls {
            Some(t) => t.clone(),
            None => security::tls_from_lookup(&env).map_err(bad)?,
        };
        Ok(Security { secret, tls })
    }

    /// Starts the rendezvous on a background thread; await the result or
    /// `wait()` for it.
    pub fn build(self) -> PendingCollective<Communicator> {
        let (handle, completer) = pending(OpKind::None);
        let spawned = std::thread::Builder::new()
            .name("ringwire-rendezvous".into())
            .spawn(move || completer.complete(self.build_blocking()));
        match spawned {
            Ok(_) => handle,
            Err(e) => PendingCollective::ready(Err(Error::io("starting the rendezvous thread", e))),
        }
    }

    fn build_blocking(self) -> Result<Communicator, Error> {
        let lookup = |var: &str| std::env::var(var).ok();
        for note in self.overridden(&lookup) {
            tracing::warn!("{note}");
        }
        let tunables = self.overrides.resolve(&lookup)?;
        let size = self.world_size.ok_or_else(|| {
            Error::Rendezvous(
                "world size not set: call Builder::world_size or set WORLD_SIZE".into(),
            )
        })?;
        let rank = self.rank.ok_or_else(|| {
            Error::Rendezvous("rank not set: call Builder::rank or set RANK".into())
        })?;
        if size == 0 {
            return Err(Error::Rendezvous(
                "world size 0: a communicator needs at least one rank".into(),
            ));
        }
        if rank >= size {
            return Err(Error::Rendezvous(format!(
                "rank {rank} is out of range for world size {size}: ranks are 0..{}",
                size - 1
            )));
        }
        let security = self.resolve_security()?;
        security.warn_if_unauthenticated();
        // Fail before claiming a rank at the store if the transport asked
        // for cannot run.
        tunables.transport.choose(security.tls.is_some())?;
        if self.rejoin {
            let (mut world, admission) = rejoin::rejoin(&self, rank, size, &tunables, &security)?;
            world.local = self.local;
            world.home_core = self.local.map(|(local_rank, _)| local_rank);
            return Communicator::start_admitted(Arc::new(world), tunables, &admission);
        }
        let mut world = rendezvous(&self, rank, size, &tunables, &security)?;
        if let Some((local_rank, _)) = self.local {
            world.home_core = Some(local_rank);
        }
        world.local = self.local;
        tracing::info!(
            rank,
            world_size = size,
            transport = world.transport.name(),
            crowded_host = world.crowded,
            crowded_job = world.crowded_anywhere,
            tcp_links_in_job = world.tcp_anywhere,
            "ringwire communicator ready"
        );
        Communicator::start(Arc::new(world), tunables)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(extra: &[(&str, &str)]) -> Result<Builder, Error> {
        let mut vars = vec![
            ("RINGWIRE_RANK", "0"),
            ("RINGWIRE_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        vars.extend_from_slice(extra);
        Builder::from_lookup(&crate::testing::env_lookup(&vars))
    }

    #[test]
    fn host_store_takes_the_switch_words_and_names_a_bad_one() {
        assert_eq!(launch(&[]).unwrap().host_store, None);
        for (word, host) in [
            ("1", true),
            ("Yes", true),
            ("on", true),
            ("false", false),
            ("OFF", false),
            ("0", false),
        ] {
            let b = launch(&[("RINGWIRE_HOST_STORE", word)]).unwrap();
            assert_eq!(b.host_store, Some(host), "RINGWIRE_HOST_STORE={word}");
        }
        match launch(&[("RINGWIRE_HOST_STORE", "rank0")]) {
            Err(Error::Env(env::EnvError::Invalid { var, value, .. })) => {
                assert_eq!((var, value.as_str()), ("RINGWIRE_HOST_STORE", "rank0"));
            }
            other => panic!("expected an invalid-setting error, got {other:?}"),
        }
    }

    #[test]
    fn a_builder_call_that_overrides_a_set_variable_is_named() {
        let vars = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |var: &str| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
        };
        let b = Builder::new().timeout(Duration::from_secs(120)).job("mine");
        // Nothing set: nothing to say.
        assert!(b.overridden(&vars(&[])).is_empty());
        let notes = b.overridden(&vars(&[
            ("RINGWIRE_TIMEOUT", "5"),
            ("RINGWIRE_SPIN_US", "40"),
            ("RINGWIRE_JOB_ID", "theirs"),
        ]));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("RINGWIRE_TIMEOUT=5") && notes[0].contains("Builder::timeout"));
        assert!(notes[0].contains("120 s"), "{}", notes[0]);
        assert!(notes[1].contains("RINGWIRE_JOB_ID=theirs") && notes[1].contains("mine"));
        // An invalid value is otherwise never read: the note says so.
        let notes = b.overridden(&vars(&[("RINGWIRE_TIMEOUT", "soon")]));
        assert!(notes[0].contains("invalid") && notes[0].contains("RINGWIRE_TIMEOUT=soon"));
        // The same job id overrides nothing; a secret is never shown.
        assert!(
            b.overridden(&vars(&[("RINGWIRE_JOB_ID", "mine")]))
                .is_empty()
        );
        let b = Builder::new().secret("s3cret");
        let notes = b.overridden(&vars(&[("RINGWIRE_SECRET", "other-secret")]));
        assert_eq!(notes.len(), 1);
        assert!(!notes[0].contains("other-secret") && notes[0].contains("(hidden)"));
    }
}
