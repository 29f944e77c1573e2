//! Every environment variable ringwire reads, once: its default, the
//! builder method that sets the same thing, one line on what it does, the
//! decision behind it and the guide chapter that explains it.
//! `docs/reference/configuration.md` is generated from this table, and a
//! test fails when the two differ or when the code reads a variable the
//! table does not list, so no variable goes undocumented.

// The library reads a setting's builder method (to say when a builder call
// overrides a variable); the rest is read by the reference's generator, a
// test built with the `internals` feature.
#![cfg_attr(not(feature = "internals"), allow(dead_code))]

/// Where a variable belongs, and the heading it is listed under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// Set by the launcher, read at start: which rank, how many, where.
    Launch,
    /// Where the ranks meet and how setup waits.
    Rendezvous,
    /// How the collectives run: timeouts, sizes, waiting.
    Collectives,
    /// What links the ranks: transports, shared memory, lanes, two levels.
    Links,
    /// Failures and their diagnosis.
    Failures,
    /// Job secret and TLS.
    Security,
    /// Metrics and logging.
    Observing,
    /// ringwire-gpu's NCCL path.
    Gpu,
}

impl Section {
    /// Every section, in the reference's order.
    pub const ALL: [Section; 8] = [
        Section::Launch,
        Section::Rendezvous,
        Section::Collectives,
        Section::Links,
        Section::Failures,
        Section::Security,
        Section::Observing,
        Section::Gpu,
    ];

    /// The heading.
    pub fn title(self) -> &'static str {
        match self {
            Section::Launch => "Launch (set by the launcher)",
            Section::Rendezvous => "Rendezvous",
            Section::Collectives => "Collectives",
            Section::Links => "Links",
            Section::Failures => "Failures",
            Section::Security => "Security",
            Section::Observing => "Observing",
            Section::Gpu => "GPUs (ringwire-gpu)",
        }
    }
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// Where it is listed.
    pub section: Section,
    /// What holds when it is unset.
    pub default: &'static str,
    /// The `Builder` method (or other call) that sets the same thing and,
    /// when called, wins over the variable.
    pub builder: Option<&'static str>,
    /// What it does, in one line.
    pub meaning: &'static str,
    /// Every rank must give the same value (checked at setup).
    pub same_on_every_rank: bool,
    /// The decision record behind it, by number.
    pub decision: Option<u16>,
    /// The guide chapter that explains it (a file of `docs/guide/`).
    pub guide: &'static str,
}

const LAUNCHING: &str = "01-launching.md";
const COLLECTIVES: &str = "02-collectives.md";
const GPUS: &str = "04-gpus.md";
const ACROSS_HOSTS: &str = "05-across-hosts.md";
const FAILURES: &str = "06-failures.md";
const SECURITY: &str = "07-security.md";
const OBSERVING: &str = "08-observing.md";
const TUNING: &str = "09-tuning.md";

/// A variable the launcher sets and ringwire only reads.
const fn launch(name: &'static str, meaning: &'static str) -> Setting {
    Setting {
        name,
        section: Section::Launch,
        default: "",
        builder: None,
        meaning,
        same_on_every_rank: false,
        decision: None,
        guide: LAUNCHING,
    }
}

/// A variable of `section` with its default and builder method.
const fn setting(
    name: &'static str,
    section: Section,
    default: &'static str,
    builder: Option<&'static str>,
    meaning: &'static str,
) -> Setting {
    Setting {
        name,
        section,
        default,
        builder,
        meaning,
        same_on_every_rank: false,
        decision: None,
        guide: match section {
            Section::Launch | Section::Rendezvous => LAUNCHING,
            Section::Collectives => COLLECTIVES,
            Section::Links => ACROSS_HOSTS,
            Section::Failures => FAILURES,
            Section::Security => SECURITY,
            Section::Observing => OBSERVING,
            Section::Gpu => GPUS,
        },
    }
}

impl Setting {
    const fn decided_by(mut self, decision: u16) -> Setting {
        self.decision = Some(decision);
        self
    }

    const fn same_everywhere(mut self) -> Setting {
        self.same_on_every_rank = true;
        self
    }

    const fn explained_in(mut self, guide: &'static str) -> Setting {
        self.guide = guide;
        self
    }
}

/// Every variable ringwire and ringwire-gpu read, in the reference's order.
pub const SETTINGS: &[Setting] = &[
    // Launch: the first launcher whose rank variable is set wins, in this order.
    launch("RINGWIRE_RANK", "this process's rank (explicit launch; checked before every launcher's)"),
    launch("RINGWIRE_WORLD_SIZE", "how many ranks (explicit launch)"),
    launch("RINGWIRE_LOCAL_RANK", "this process's rank among those of its host (explicit launch)"),
    launch("RINGWIRE_LOCAL_WORLD_SIZE", "how many ranks its host runs (explicit launch)"),
    launch("RANK", "the rank torchrun gives"),
    launch("WORLD_SIZE", "the world size torchrun gives"),
    launch("LOCAL_RANK", "the local rank torchrun gives"),
    launch("LOCAL_WORLD_SIZE", "the ranks of this host, as torchrun gives them"),
    launch("TORCHELASTIC_USE_AGENT_STORE", "torchrun's agent hosts a TCPStore on MASTER_PORT: every rank joins it"),
    launch("TORCHELASTIC_RUN_ID", "torchrun's run: with the restart count, keys each attempt apart in the store"),
    launch("TORCHELASTIC_RESTART_COUNT", "torchrun's attempt number"),
    launch("TORCHELASTIC_ERROR_FILE", "where `ringwire::error_file` writes a failing rank's error, for torchrun's report"),
    launch("OMPI_COMM_WORLD_RANK", "the rank Open MPI's mpirun gives"),
    launch("OMPI_COMM_WORLD_SIZE", "the world size mpirun gives"),
    launch("OMPI_COMM_WORLD_LOCAL_RANK", "the local rank mpirun gives"),
    launch("OMPI_COMM_WORLD_LOCAL_SIZE", "the ranks of this host, as mpirun gives them"),
    launch("OMPI_MCA_ess_base_jobid", "Open MPI 4's job id: the store's port is derived from it when MASTER_PORT is unset"),
    launch("PMIX_NAMESPACE", "Open MPI 5's job id (PMIx), used as `OMPI_MCA_ess_base_jobid`"),
    launch("SLURM_PROCID", "the rank srun gives"),
    launch("SLURM_NTASKS", "the world size srun gives"),
    launch("SLURM_NPROCS", "the world size, by its older name"),
    launch(
        "SLURM_LOCALID",
        "the local rank srun gives; unused, as srun gives no local size (pass `Builder::local_ranks`)",
    ),
    launch("SLURM_STEP_NUM_NODES", "the step's nodes: more than one puts the store on the first node of the node list"),
    launch("SLURM_NNODES", "the job's nodes, by its older name"),
    launch("SLURM_JOB_NUM_NODES", "the job's nodes, where the step's are not given"),
    launch("SLURM_STEP_NODELIST", "the step's node list (`node[01-04,07]`): its first node hosts the store"),
    launch("SLURM_NODELIST", "the job's node list, by its older name"),
    launch("SLURM_JOB_NODELIST", "the job's node list, where the step's is not given"),
    launch("SLURM_JOB_ID", "Slurm's job id: with the step, the store's derived port"),
    launch("SLURM_JOBID", "the job id, by its older name"),
    launch("SLURM_STEP_ID", "Slurm's step id"),
    launch("SLURM_STEPID", "the step id, by its older name"),
    launch("PMI_RANK", "the rank a PMI launcher (MPICH's Hydra, Intel MPI) gives"),
    launch("PMI_SIZE", "the world size a PMI launcher gives"),
    launch("MPI_LOCALRANKID", "the local rank Hydra gives"),
    launch("MPI_LOCALNRANKS", "the ranks of this host, as Hydra gives them"),
    // Rendezvous.
    setting("MASTER_ADDR", Section::Rendezvous, "127.0.0.1 with every rank on one host; Slurm's first node", Some("Builder::store"), "the store's host (torchrun sets it; set it under mpirun across hosts and PMI)"),
    setting("MASTER_PORT", Section::Rendezvous, "derived from the launcher's job id (20000-32767)", Some("Builder::store"), "the store's port (torchrun sets it)"),
    setting("RINGWIRE_MASTER_ADDR", Section::Rendezvous, "`MASTER_ADDR`", Some("Builder::store"), "wins over `MASTER_ADDR`"),
    setting("RINGWIRE_MASTER_PORT", Section::Rendezvous, "`MASTER_PORT`", Some("Builder::store"), "wins over `MASTER_PORT`"),
    setting("RINGWIRE_STORE", Section::Rendezvous, "`torch` under torchrun's agent store, else `ringwire`", Some("Builder::store_kind"), "`torch`: join the PyTorch TCPStore at the store address; `ringwire`: rank 0 hosts ringwire's own").decided_by(25),
    setting("RINGWIRE_HOST_STORE", Section::Rendezvous, "1", Some("Builder::host_store"), "0: rank 0 starts no store (a standalone `ringwire-store` runs one)"),
    setting("RINGWIRE_REJOIN", Section::Rendezvous, "0", Some("Builder::rejoin"), "1: join the running job in the place of its lost rank `RANK`, once its members call `Communicator::admit` (needs a store that outlives the ranks)").decided_by(40),
    setting("RINGWIRE_JOB_ID", Section::Rendezvous, "`default`, or the launcher's job id where ringwire filled in the store's address or port", Some("Builder::job"), "keeps jobs that share one store apart"),
    setting("RINGWIRE_SOCKET_IFNAME", Section::Rendezvous, "the interface that routes to the store", Some("Builder::socket_ifname"), "the interface whose address ranks listen on (as `GLOO_SOCKET_IFNAME`)"),
    setting("RINGWIRE_CONNECT_TIMEOUT", Section::Rendezvous, "the op timeout", Some("Builder::connect_timeout"), "seconds setup waits for the store and the other ranks"),
    // Collectives.
    setting("RINGWIRE_TIMEOUT", Section::Collectives, "60", Some("Builder::timeout"), "seconds an op may take before it fails (`comm.with_timeout` for one handle)").decided_by(5),
    setting("RINGWIRE_CHUNK_BYTES", Section::Collectives, "1M", Some("Builder::chunk_bytes"), "frame size (8 B to 64 MiB): larger buffers travel as pipelined chunks").same_everywhere().explained_in(TUNING),
    setting("RINGWIRE_SMALL_MESSAGE_BYTES", Section::Collectives, "1M", Some("Builder::small_message_bytes"), "below it, latency-bound schedules (doubling, trees); above, bandwidth-bound ones (ring, chains)").same_everywhere().explained_in(TUNING),
    setting("RINGWIRE_RUN_AHEAD_BYTES", Section::Collectives, "4M", Some("Builder::run_ahead_bytes"), "bytes one peer may send for ops this rank has not started before its link pauses (0: no limit)").decided_by(19),
    setting("RINGWIRE_RUN_AHEAD_TOTAL_BYTES", Section::Collectives, "64M", Some("Builder::run_ahead_total_bytes"), "the same for all peers together (0: no limit)").decided_by(19),
    setting("RINGWIRE_SPIN_US", Section::Collectives, "1000", Some("Builder::spin"), "microseconds a waiting thread polls before it sleeps (0: sleep at once, least CPU)").decided_by(8).explained_in(TUNING),
    // Links.
    setting("RINGWIRE_TRANSPORT", Section::Links, "`auto`", Some("Builder::transport"), "`auto` (io_uring where it works and TLS is off, else portable), `uring` or `portable`").decided_by(7),
    setting("RINGWIRE_LOCAL_LINKS", Section::Links, "`shm`", Some("Builder::local_links"), "what links ranks of one host: `shm` (shared memory), `unix` or `tcp`").decided_by(31),
    setting("RINGWIRE_SOCKET_BUFFER_BYTES", Section::Links, "1M on Unix sockets (engine and shared-memory links), else the kernel's", Some("Builder::socket_buffer_bytes"), "SO_SNDBUF/SO_RCVBUF of every link (0: the kernel's everywhere)").decided_by(15).explained_in(TUNING),
    setting("RINGWIRE_TCP_LANES", Section::Links, "on (1)", Some("Builder::tcp_lane_count"), "one-way connections each way per TCP link of the engine: on, off, or 2-8 (payloads in pieces)").decided_by(34),
    setting("RINGWIRE_ENGINE_THREADS", Section::Links, "0", Some("Builder::engine_threads"), "engine threads (0-64) that run this rank's TCP lanes, each on its own io_uring").decided_by(36),
    setting("RINGWIRE_TWO_LEVEL", Section::Links, "`auto`", Some("Builder::two_level"), "collectives across hosts in two levels: `auto` (a cost model decides), `always` or `never`").same_everywhere().decided_by(33),
    setting("RINGWIRE_INTER_HOST_GBPS", Section::Links, "the slowest rate the ranks' interfaces report, else 25", Some("Builder::inter_host_gbps"), "the link rate between hosts, in Gb/s, that the two-level cost model assumes").same_everywhere().decided_by(33),
    setting("RINGWIRE_HOST_ID", Section::Links, "the kernel and network namespace (ringwire-gpu: the host name)", Some("Builder::host_id"), "which host this rank counts as for two-level collectives (as `NCCL_HOSTID`)").decided_by(33),
    // Failures.
    setting("RINGWIRE_HEARTBEAT_TIMEOUT", Section::Failures, "10", Some("Builder::heartbeat_timeout"), "seconds a link may carry nothing before its peer is declared lost").decided_by(5),
    setting("RINGWIRE_DEBUG", Section::Failures, "off", Some("Builder::debug_checks"), "`detail`: ranks compare each op's signature first (as `TORCH_DISTRIBUTED_DEBUG=DETAIL`)").same_everywhere(),
    setting("RINGWIRE_FLIGHT_RECORDER_OPS", Section::Failures, "64", Some("Builder::flight_recorder_ops"), "how many recent ops each communicator remembers (`comm.flight_record()`)"),
    setting("RINGWIRE_FLIGHT_RECORDER_DIR", Section::Failures, "unset", None, "also write each failing rank's flight record to a file in this folder"),
    // Security.
    setting("RINGWIRE_SECRET", Section::Security, "none", Some("Builder::secret"), "job secret: every link and store connection proves it (HMAC-SHA256) first").decided_by(4),
    setting("RINGWIRE_SECRET_FILE", Section::Security, "unset", Some("Builder::secret"), "a file holding the job secret").decided_by(4),
    setting("RINGWIRE_TLS", Section::Security, "`off` (`mtls` when the files below are set)", Some("Builder::tls"), "`off`, `tls` (the accepting side shows a certificate) or `mtls` (both do)").decided_by(4),
    setting("RINGWIRE_TLS_CA", Section::Security, "unset", Some("Builder::tls"), "PEM file of the CA every rank's and the store's certificate must chain to").decided_by(4),
    setting("RINGWIRE_TLS_CERT", Section::Security, "unset", Some("Builder::tls"), "PEM file of this process's certificate chain").decided_by(4),
    setting("RINGWIRE_TLS_KEY", Section::Security, "unset", Some("Builder::tls"), "PEM file of this process's private key").decided_by(4),
    // Observing.
    setting("RINGWIRE_METRICS_ADDR", Section::Observing, "unset", None, "serve every communicator's Prometheus metrics at http://ADDR/metrics (local rank added to the port)"),
    setting("RINGWIRE_LOG", Section::Observing, "`warn`", None, "a `tracing` filter for the log the binaries and `ringwire::logging::init_from_env` print"),
    // GPUs.
    setting("RINGWIRE_NCCL_LIB", Section::Gpu, "`libnccl.so.2`, `libnccl.so`, then the nvidia-nccl wheel of a Python on PATH", Some("GpuBuilder::library"), "path of the NCCL library ringwire-gpu opens").decided_by(26),
];

/// Variables the code reads that are not settings: set by ringwire's own
/// tests and bench for their child processes, each with why.
pub const INTERNAL: &[(&str, &str)] = &[
    ("RINGWIRE_BENCH_CHILD", "ringwire-bench's --ranks: marks the rank processes it starts"),
    ("RINGWIRE_SHM_TEST_PARENT", "a ringwire-shm test: names the parent's socket to a child"),
    ("RINGWIRE_TEST_OPEN_FILES_CHILD", "a test of RLIMIT_NOFILE: runs its child part"),
];

/// The setting named `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}
