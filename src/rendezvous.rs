//! Building a communicator: find the store, claim a rank, publish this
//! rank's listen address, learn everyone else's, and start the transport.
//!
//! Each rank binds port 0 on the chosen interface and keeps that socket, then
//! publishes the port it got, so there is no reserve-then-bind race. Rank 0
//! hosts the store at MASTER_ADDR:MASTER_PORT (only on that address) unless
//! an external `ringwire-store` is used. Setup ends with a store barrier, so
//! no rank leaves (and rank 0 cannot take the store away) before every rank
//! has everything it needs.

use crate::comm::Communicator;
use crate::config::{DEFAULT_TCP_LANES, LocalLinks, Overrides, TransportKind, Tunables, TwoLevel};
use crate::env::{ElasticAttempt, StoreKind};
use crate::error::Error;
use crate::pending::{PendingCollective, pending};
use crate::security::secret::Secret;
use crate::security::{self, Security, TlsConfig};
use crate::store::{Store, StoreClient, StoreError, StoreServer, TcpStoreClient};
use crate::transport::Transport;
use crate::transport::engine_cores::engine_thread_cores;
use crate::transport::mesh::{LocalPeers, Mesh, MeshConfig};
use crate::wire::OpKind;
pub(crate) use crate::world::World;
use crate::{env, net};
use ringwire_uring::usable_core_ids;
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
}

impl Builder {
    /// A builder with nothing set.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// A builder filled from the launch environment (RINGWIRE_*, torchrun,
    /// Open MPI, Slurm or PMI variables; see the README).
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
        let tunables = self.overrides.resolve(&|var| std::env::var(var).ok())?;
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

fn store_err(e: StoreError, what: &str) -> Error {
    match e {
        StoreError::Timeout { .. } => Error::Rendezvous(format!("{what}: {e}")),
        other => Error::Store(other),
    }
}

fn rendezvous(
    b: &Builder,
    rank: usize,
    size: usize,
    t: &Tunables,
    sec: &Security,
) -> Result<World, Error> {
    // Connections refused from now on are named in a timeout's error.
    let started = std::time::Instant::now();
    let addrs = match &b.store {
        Some(StoreAddr::Resolved(a)) => vec![*a],
        Some(StoreAddr::HostPort(host, port)) => net::resolve(host, *port)?,
        None if size == 1 => {
            // One rank and no store: nothing to meet.
            let listener = net::bind_listener("127.0.0.1".parse().expect("literal"))?;
            let cores = engine_thread_cores(t.engine_threads, 0, 1, &usable_core_ids());
            let transport = start_transport(listener, None, 0, 0, Vec::new(), t, sec, cores)?;
            return Ok(World {
                rank,
                size,
                job_id: 0,
                transport,
                store: None,
                hosted_store: None,
                home_core: None,
                local: None,
                crowded: false,
                crowded_anywhere: false,
                tcp_anywhere: false,
                arena_everywhere: false,
                local_ranks: vec![false],
                hosts: vec![0],
                inter_host_gbps: crate::config::DEFAULT_INTER_HOST_GBPS,
            });
        }
        None => {
            return Err(Error::Rendezvous(
                "no store address: call Builder::store or set MASTER_ADDR and MASTER_PORT".into(),
            ));
        }
    };
    let torch = b.store_kind == StoreKind::Torch;
    let store = if rank == 0 && !torch && b.host_store.unwrap_or(true) {
        let mut last = None;
        let mut server = None;
        for a in &addrs {
            match StoreServer::bind_with(*a, sec.clone()) {
                Ok(s) => {
                    server = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        match (server, last) {
            (Some(s), _) => Some(s),
            (None, Some(e)) => {
                let advice = match (&b.master_from, &b.attempt) {
                    (Some(from), _) => from.clone(),
                    (None, Some(_)) => {
                        "Under torchrun, whose agent hosts a TCPStore on MASTER_PORT, leave \
                                        RINGWIRE_STORE unset or set it to torch to join that store"
                            .into()
                    }
                    (None, None) => {
                        "Is MASTER_PORT in use by another job? Pick a free MASTER_PORT, or point \
                                     MASTER_ADDR at this host's own address"
                            .into()
                    }
                };
                return Err(Error::Rendezvous(format!(
                    "rank 0 could not start the store on {addrs:?}: {e}. {advice}"
                )));
            }
            (None, None) => None,
        }
    } else {
        None
    };
    let mut client: Box<dyn Store> = if torch {
        if sec.secret.is_some() || sec.tls.is_some() {
            tracing::warn!(
                rank,
                "the PyTorch TCPStore has no authentication or encryption: the job secret and TLS protect \
                 ringwire's links, not the store"
            );
        }
        Box::new(TcpStoreClient::connect(&addrs, t.connect_timeout)?)
    } else {
        Box::new(StoreClient::connect_with(&addrs, t.connect_timeout, sec)?)
    };
    let mut prefix = format!("ringwire/{}/", b.job.as_deref().unwrap_or("default"));
    if let Some(attempt) = &b.attempt {
        // The world size too: torchrun restarts every worker when nodes
        // join or leave without counting a restart, and such a round has
        // another world size.
        prefix.push_str(&format!(
            "{}/attempt_{}/world_{size}/",
            attempt.run_id, attempt.restart_count
        ));
    }
    let key = |k: &str| format!("{prefix}{k}");

    // Claim the rank: a second process with the same rank finds it taken.
    let nonce = crate::testing::Rng::fresh_seed() ^ (rank as u64).rotate_left(17);
    let claim = nonce.to_le_bytes();
    let owner = client.compare_set(&key(&format!("rank/{rank}")), b"", &claim)?;
    if owner != claim {
        let elastic = if b.attempt.is_some() {
            " Under torchrun this is also what a new round after a membership change sees when it \
             keeps the last round's restart count and world size: set RINGWIRE_JOB_ID per round"
        } else {
            ""
        };
        return Err(Error::Rendezvous(format!(
            "two processes claim rank {rank}: give each process a distinct RANK (or RINGWIRE_RANK / \
             OMPI_COMM_WORLD_RANK / SLURM_PROCID), or use a fresh RINGWIRE_JOB_ID when reusing a store.{elastic}"
        )));
    }
    // A rank that cannot join publishes why in place of its address, so
    // the others fail at once with the reason instead of timing out.
    let refuse = |why: String| {
        let _ = client.set(&key(&format!("addr/{rank}")), format!("!{why}").as_bytes());
        Error::Rendezvous(why)
    };
    if rank == 0 {
        client.set(&key("job"), &nonce.to_le_bytes())?;
        client.set(&key("settings"), t.shared().as_bytes())?;
        client.set(&key("world_size"), size.to_string().as_bytes())?;
    }
    let root_size = client
        .get(&key("world_size"), t.connect_timeout)
        .map_err(|e| store_err(e, "waiting for rank 0 to join"))?;
    if root_size != size.to_string().as_bytes() {
        return Err(refuse(format!(
            "rank {rank} has WORLD_SIZE={size} but rank 0 has WORLD_SIZE={}: every rank needs the same world size",
            String::from_utf8_lossy(&root_size)
        )));
    }
    // Rank 0 set this before the world size just read, so it is there
    // unless rank 0 runs a ringwire that does not publish it.
    let root_settings = client.try_get(&key("settings"))?.unwrap_or_default();
    if let Some(why) = t.disagreement(rank, &String::from_utf8_lossy(&root_settings)) {
        return Err(refuse(why));
    }

    let ip = net::choose_local_ip(b.socket_ifname.as_deref(), &addrs)?;
    let listener = net::bind_listener(ip)?;
    let listen = listener
        .local_addr()
        .map_err(|e| Error::io("reading the listener address", e))?;
    // Published before the TCP address: whoever reads that finds this too.
    let local = (t.local_links != LocalLinks::Tcp && sec.tls.is_none())
        .then(|| local_listener(rank))
        .flatten();
    if let Some((_, published)) = &local {
        client.set(&key(&format!("local/{rank}")), published.as_bytes())?;
    }
    // The host this rank counts as (two-level collectives, decision 0033);
    // likewise published before the address.
    let host = b
        .host_id
        .clone()
        .or_else(host_identity)
        .unwrap_or_else(|| format!("rank {rank}"));
    client.set(&key(&format!("host/{rank}")), host.as_bytes())?;
    // And the rate of the interface it listens on (empty: not known).
    let gbps = net::link_gbps(ip).map_or_else(String::new, |g| g.to_string());
    client.set(&key(&format!("gbps/{rank}")), gbps.as_bytes())?;
    client.set(&key(&format!("addr/{rank}")), listen.to_string().as_bytes())?;

    let mut peers = Vec::with_capacity(size);
    let mut local_peers = Vec::with_capacity(size);
    let mut host_names: Vec<Vec<u8>> = Vec::with_capacity(size);
    let mut slowest_link: Option<f64> = None;
    for q in 0..size {
        let raw = client.get(&key(&format!("addr/{q}")), t.connect_timeout).map_err(|e| match e {
            StoreError::Timeout { .. } => Error::Rendezvous(format!(
                "rank {q} did not join within {:?}: it never published its address to the store at {}. \
                 Check that it started, and that it uses the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE{}",
                t.connect_timeout,
                client.server_addr(),
                crate::refusals::suffix_since(started)
            )),
            other => Error::Store(other),
        })?;
        let text = String::from_utf8_lossy(&raw);
        if let Some(why) = text.strip_prefix('!') {
            return Err(Error::Rendezvous(format!(
                "rank {q} could not join, so neither can this rank: {why}"
            )));
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| Error::Rendezvous(format!("rank {q} published a bad address {text:?}")))?;
        peers.push(addr);
        // Absent only from a ringwire that does not publish it: a host of
        // its own.
        host_names.push(
            client
                .try_get(&key(&format!("host/{q}")))?
                .unwrap_or_else(|| format!("rank {q}").into_bytes()),
        );
        let gbps = client
            .try_get(&key(&format!("gbps/{q}")))?
            .unwrap_or_default();
        if let Some(g) = std::str::from_utf8(&gbps)
            .ok()
            .and_then(|g| g.parse::<f64>().ok())
        {
            slowest_link = Some(slowest_link.map_or(g, |s: f64| s.min(g)));
        }
        let local_peer = match (&local, q == rank) {
            (Some((_, mine)), false) => client
                .try_get(&key(&format!("local/{q}")))?
                .and_then(|theirs| same_host_unix_addr(mine, &theirs)),
            _ => None,
        };
        local_peers.push(local_peer);
    }
    let job = client.get(&key("job"), t.connect_timeout)?;
    let job_id = u64::from_le_bytes(
        job.try_into()
            .map_err(|_| Error::Rendezvous("bad job id in the store".into()))?,
    );
    let tcp_links = (0..size).any(|q| q != rank && local_peers[q].is_none());
    let local_ranks: Vec<bool> = local_peers.iter().map(Option::is_some).collect();
    let crowded = b
        .local
        .is_some_and(|(_, on_host)| on_host > ringwire_uring::usable_cores());
    // Whether this host runs more ranks than it has cores, by the
    // launcher's count or the ranks found here: its waits should not spin.
    let found_here = 1 + local_peers.iter().flatten().count();
    let local = local.map(|(listener, _)| LocalPeers {
        listener,
        peers: local_peers,
        crowded: crowded || found_here > ringwire_uring::usable_cores(),
    });
    // Engine threads' cores: after those of the ranks found here (by the
    // launcher's count where it gave one).
    let (local_rank, on_host) = b.local.unwrap_or_else(|| {
        let before = local
            .as_ref()
            .map_or(0, |l| l.peers[..rank].iter().flatten().count());
        (before, found_here)
    });
    let cores = engine_thread_cores(t.engine_threads, local_rank, on_host, &usable_core_ids());
    let transport = start_transport(listener, local, rank, job_id, peers, t, sec, cores)?;

    // Whether some host is crowded, counted before the barrier so every
    // rank reads the same total after it: the algorithms it selects must
    // match on every rank.
    if crowded {
        client.add(&key("crowded_ranks"), 1)?;
    }
    // Likewise whether any link of the job is TCP: this rank's are where it
    // has no Unix address for the peer (both ends see a link alike).
    if tcp_links {
        client.add(&key("tcp_ranks"), 1)?;
    }
    // And whether every rank has an arena (its local links run on shared
    // memory and it could make one): communicators of one host then vote
    // on using it (comm/arena.rs), which every member must do alike.
    if transport.arena().is_some() {
        client.add(&key("arena_ranks"), 1)?;
    }

    // Store barrier: nobody leaves setup until everyone has every address.
    client.set(&key(&format!("ready/{rank}")), b"1")?;
    let ready: Vec<String> = (0..size).map(|q| key(&format!("ready/{q}"))).collect();
    let ready_refs: Vec<&str> = ready.iter().map(String::as_str).collect();
    if let Err(e) = client.wait(&ready_refs, t.connect_timeout) {
        let missing: Vec<usize> = (0..size)
            .filter(|&q| !matches!(client.try_get(&ready[q]), Ok(Some(_))))
            .collect();
        return Err(match e {
            StoreError::Timeout { .. } => Error::Rendezvous(format!(
                "ranks {missing:?} did not finish setup within {:?}{}",
                t.connect_timeout,
                crate::refusals::suffix_since(started)
            )),
            other => Error::Store(other),
        });
    }
    let crowded_anywhere = client.add(&key("crowded_ranks"), 0)? > 0;
    let tcp_anywhere = client.add(&key("tcp_ranks"), 0)? > 0;
    let arena_everywhere = client.add(&key("arena_ranks"), 0)? == size as i64;
    tracing::debug!(rank, %listen, "rendezvous complete");
    // Kept for failure reports only: a store that went away with its host
    // must not hold a failing op for a minute.
    client.set_reply_timeout(Duration::from_secs(2));
    Ok(World {
        rank,
        size,
        job_id,
        transport,
        store: Some((client, prefix)),
        hosted_store: store,
        home_core: None,
        local: None,
        crowded,
        crowded_anywhere,
        tcp_anywhere,
        arena_everywhere,
        local_ranks,
        hosts: number_hosts(&host_names),
        inter_host_gbps: slowest_link.unwrap_or(crate::config::DEFAULT_INTER_HOST_GBPS),
    })
}

/// Each rank's host as a number, hosts numbered in order of their first
/// rank: every rank reads the same names, so every rank numbers alike.
fn number_hosts(names: &[Vec<u8>]) -> Vec<u32> {
    let mut seen: Vec<&[u8]> = Vec::new();
    names
        .iter()
        .map(
            |name| match seen.iter().position(|s| *s == name.as_slice()) {
                Some(h) => h as u32,
                None => {
                    seen.push(name);
                    (seen.len() - 1) as u32
                }
            },
        )
        .collect()
}

/// What this process shares with the ranks its Unix sockets can reach:
/// the kernel (boot id) and the network namespace, whose abstract socket
/// names it can connect to.
fn host_identity() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let netns = std::fs::metadata("/proc/self/ns/net").ok()?;
    Some(format!("{}:{}:{}", boot.trim(), netns.dev(), netns.ino()))
}

/// A Unix listener for same-host peers, on a fresh abstract name (nothing
/// in the file system to clean up), and what to publish for it: the host
/// identity and the name. `None` (TCP for every peer) where there is no
/// identity or the bind fails.
fn local_listener(rank: usize) -> Option<(std::os::unix::net::UnixListener, String)> {
    use std::os::linux::net::SocketAddrExt;
    let identity = host_identity()?;
    let name = format!(
        "ringwire/{}/{rank}/{:016x}",
        std::process::id(),
        crate::testing::Rng::fresh_seed()
    );
    let bound = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| std::os::unix::net::UnixListener::bind_addr(&addr));
    match bound {
        Ok(listener) => Some((listener, format!("{identity} {name}"))),
        Err(e) => {
            tracing::debug!(rank, error = %e, "no unix listener; local links use TCP");
            None
        }
    }
}

/// The Unix address of a peer that published `theirs`, if it runs on this
/// host and network namespace (`mine` is this rank's own publication).
fn same_host_unix_addr(mine: &str, theirs: &[u8]) -> Option<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    let theirs = std::str::from_utf8(theirs).ok()?;
    let (my_host, _) = mine.split_once(' ')?;
    let (host, name) = theirs.split_once(' ')?;
    (host == my_host)
        .then(|| std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok())
        .flatten()
}

#[allow(clippy::too_many_arguments)] // who this rank is, and how its transport runs
fn start_transport(
    listener: std::net::TcpListener,
    local: Option<LocalPeers>,
    rank: usize,
    job_id: u64,
    peers: Vec<SocketAddr>,
    t: &Tunables,
    sec: &Security,
    thread_cores: Vec<usize>,
) -> Result<Box<dyn Transport>, Error> {
    let (uring, why) = t.transport.choose(sec.tls.is_some())?;
    let name = if uring { "uring" } else { "portable" };
    tracing::info!(rank, transport = name, %why, "transport chosen");
    let config = MeshConfig {
        uring,
        uring_required: t.transport == TransportKind::Uring,
        spin: t.spin,
        lanes: t.tcp_lanes,
        engine_threads: t.engine_threads,
        thread_cores,
        shm: t.local_links == LocalLinks::Shm && sec.tls.is_none(),
        max_payload: t.max_frame_bytes,
        handshake_timeout: t.connect_timeout.min(Duration::from_secs(10)),
        write_timeout: t.timeout,
        socket_buffer: t.socket_buffer,
        security: sec.clone(),
        heartbeat_interval: crate::config::HEARTBEAT_INTERVAL.min(t.heartbeat_timeout / 4),
        heartbeat_timeout: t.heartbeat_timeout,
        run_ahead_limit: t.run_ahead_bytes,
        run_ahead_total_limit: t.run_ahead_total_bytes,
    };
    let peers = if peers.is_empty() {
        vec![
            listener
                .local_addr()
                .map_err(|e| Error::io("listener address", e))?,
        ]
    } else {
        peers
    };
    Mesh::start(listener, local, rank, job_id, peers, config)
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .map_err(|e| Error::io(format!("starting the {name} transport"), e))
        .inspect(|t| {
            if t.name() != name {
                tracing::info!(rank, transport = t.name(), "transport running");
            }
        })
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
}
