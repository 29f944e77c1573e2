//! Discovery of the launch environment: which launcher started this process,
//! this process's rank and the world size, and where the rendezvous store is.
//!
//! [`discover`] is a pure function of a variable lookup, so every launcher's
//! variables, the precedence between them and every error can be tested
//! without touching the process environment; [`discover_from_process`] runs
//! it on the real environment.
//!
//! Rank and world size come from the first launcher whose variables are set,
//! in this order:
//!
//! | launcher            | rank                    | world size                              | local rank / local size                                       |
//! |---------------------|-------------------------|-----------------------------------------|---------------------------------------------------------------|
//! | ringwire (explicit) | `RINGWIRE_RANK`         | `RINGWIRE_WORLD_SIZE`                   | `RINGWIRE_LOCAL_RANK` / `RINGWIRE_LOCAL_WORLD_SIZE`           |
//! | torchrun            | `RANK`                  | `WORLD_SIZE`                            | `LOCAL_RANK` / `LOCAL_WORLD_SIZE`                             |
//! | Open MPI            | `OMPI_COMM_WORLD_RANK`  | `OMPI_COMM_WORLD_SIZE`                  | `OMPI_COMM_WORLD_LOCAL_RANK` / `OMPI_COMM_WORLD_LOCAL_SIZE`   |
//! | Slurm (`srun`)      | `SLURM_PROCID`          | `SLURM_NTASKS` (else `SLURM_NPROCS`)    | `SLURM_LOCALID` / -                                           |
//! | PMI (MPICH, Hydra)  | `PMI_RANK`              | `PMI_SIZE`                              | `MPI_LOCALRANKID` / `MPI_LOCALNRANKS`                         |
//!
//! Setting only one of a launcher's rank and size is an error rather than a
//! reason to fall through to the next launcher: it is almost always a typo.
//! Variables set to the empty string count as unset.
//!
//! The store address is `RINGWIRE_MASTER_ADDR` / `RINGWIRE_MASTER_PORT`, else
//! `MASTER_ADDR` / `MASTER_PORT`, for every launcher; torchrun sets them.
//! Under Open MPI and Slurm, whichever of the two is still unset gets a
//! default (each on its own: a `MASTER_ADDR` given by hand still gets a
//! derived port), so `mpirun -np 4 prog` and `srun prog` need no variables:
//!
//! | launcher | address, every rank on one host                                                             | address, ranks on several hosts                                                            | port                                                                              |
//! |----------|---------------------------------------------------------------------------------------------|--------------------------------------------------------------------------------------------|-----------------------------------------------------------------------------------|
//! | Open MPI | `127.0.0.1` (`OMPI_COMM_WORLD_LOCAL_SIZE` = `OMPI_COMM_WORLD_SIZE`)                         | none: an error names `MASTER_ADDR` and how to pass it (`mpirun -x MASTER_ADDR=<host> ...`) | derived from `OMPI_MCA_ess_base_jobid` (Open MPI 4), else `PMIX_NAMESPACE` (5)    |
//! | Slurm    | `127.0.0.1` (`SLURM_STEP_NUM_NODES`, else `SLURM_NNODES`, else `SLURM_JOB_NUM_NODES`, is 1) | the first host of `SLURM_STEP_NODELIST`, else `SLURM_NODELIST`, else `SLURM_JOB_NODELIST`  | derived from `SLURM_JOB_ID` and `SLURM_STEP_ID` (the job id alone outside a step) |
//!
//! A job of one rank counts as one host. The step's node list comes first
//! because rank 0 of a step runs on the step's first node, which is not the
//! job's first when the step runs on part of the allocation (`srun -N1 -w
//! node03` inside a four-node job); the list's compressed form
//! (`node[01-04,07]`, `a1,b[2-3]`, `rack[1-2]-n3`) is read whole, and one
//! ringwire cannot read is an error naming the variable
//! ([`EnvError::BadHostList`]). A derived port ([`derived_port`]) is a
//! stable hash of the launcher's job id into [`DERIVED_PORTS`]: every rank
//! of the job computes the same one, and two jobs rarely share one (about 1
//! in 12768), but a port is never sure to be free. So
//! [`LaunchConfig::master_from`] says what was filled in and from what, for
//! the error rank 0 gives when it cannot bind the store; setting
//! `MASTER_PORT` picks another. PMI launchers get no defaults: the job
//! script must set both. `RINGWIRE_SOCKET_IFNAME` optionally names the
//! network interface to use.

mod hostlist;

use hostlist::first_host;
use std::fmt;

use thiserror::Error;

/// The program that started this process, as told by its variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// `RINGWIRE_RANK` / `RINGWIRE_WORLD_SIZE`, set by hand or by a script.
    Ringwire,
    /// PyTorch's `torchrun` (or anything setting `RANK` / `WORLD_SIZE`).
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// Slurm's `srun`.
    Slurm,
    /// A PMI launcher such as MPICH's or Intel MPI's `mpiexec`.
    Pmi,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Ringwire => "RINGWIRE_* variables",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Slurm => "Slurm",
            Launcher::Pmi => "PMI",
        })
    }
}

/// Everything a rank needs to join the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// This process's rank among those on the same host, if the launcher says.
    pub local_rank: Option<usize>,
    /// The number of ranks on this host, if the launcher says.
    pub local_world_size: Option<usize>,
    /// Host name or IP address of the rendezvous store (as given, unresolved).
    pub master_addr: String,
    /// TCP port of the rendezvous store.
    pub master_port: u16,
    /// Network interface to use for data traffic, if one was named.
    pub socket_ifname: Option<String>,
    /// Which launcher's variables gave the rank and size.
    pub launcher: Launcher,
    /// Which store is at `master_addr:master_port`: one that rank 0 hosts
    /// (ringwire's own), or a PyTorch TCPStore that torchrun's agent
    /// already hosts there.
    pub store: StoreKind,
    /// torchrun's run id and restart count (`TORCHELASTIC_RUN_ID`,
    /// `TORCHELASTIC_RESTART_COUNT`), when it set them: the job's store keys
    /// live under both, so a restarted attempt never reads the last one's.
    pub elastic: Option<ElasticAttempt>,
    /// How ringwire filled in `master_addr` or `master_port` where the
    /// variables left them out, as one sentence (no final period) that
    /// names the default, the job id a port was derived from and what to
    /// set instead, e.g. "MASTER_ADDR defaulted to 127.0.0.1 since every
    /// rank runs on this host (OMPI_COMM_WORLD_LOCAL_SIZE=4,
    /// OMPI_COMM_WORLD_SIZE=4), and MASTER_PORT 23817 was derived from Open
    /// MPI's job id (OMPI_MCA_ess_base_jobid=1987706881): another job on that
    /// host may hold it; set MASTER_PORT to choose a free port
    /// (`mpirun -x MASTER_PORT=<port> ...`)". `None` when both came from
    /// variables. For the error rank 0 gives when it cannot bind the store.
    pub master_from: Option<String>,
    /// The launcher's id for this job, the same on every rank and
    /// different for another job it runs at the same time: Open MPI's job
    /// id (`OMPI_MCA_ess_base_jobid`, else `PMIX_NAMESPACE`) or Slurm's
    /// `SLURM_JOB_ID.SLURM_STEP_ID`; `None` under other launchers. A
    /// derived `master_port` is [`derived_port`] of it.
    pub launcher_job_id: Option<String>,
}

/// Which kind of rendezvous store a job meets at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreKind {
    /// ringwire's own store, hosted by rank 0 (or a standalone
    /// `ringwire-store`).
    #[default]
    Ringwire,
    /// A PyTorch `TCPStore` someone else hosts (torchrun's agent sets
    /// `TORCHELASTIC_USE_AGENT_STORE=True`): every rank is a client of it.
    /// `RINGWIRE_STORE=torch` asks for it by hand, `RINGWIRE_STORE=ringwire`
    /// refuses it.
    Torch,
}

/// One attempt of a torchrun (elastic) job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ElasticAttempt {
    /// `TORCHELASTIC_RUN_ID` (torchrun's `--rdzv-id`; "none" by default).
    pub run_id: String,
    /// `TORCHELASTIC_RESTART_COUNT`: 0 on the first attempt.
    pub restart_count: u64,
}

/// Why the launch environment could not be worked out.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A required variable is not set.
    #[error("{var} is not set; {hint}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What sets it, or what to set instead.
        hint: String,
    },
    /// A variable does not hold what it should.
    #[error("{var}={value:?} is not {expected}")]
    NotANumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A `RINGWIRE_*` setting holds a word or value it does not take.
    #[error("{var}={value}: expected {expected}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// A rank is not below its world size.
    #[error(
        "{rank_var}={rank} is out of range for {size_var}={size}; ranks run from 0 to \
         {size_var} - 1"
    )]
    RankOutOfRange {
        /// The rank's variable.
        rank_var: &'static str,
        /// The rank.
        rank: usize,
        /// The world size's variable.
        size_var: &'static str,
        /// The world size.
        size: usize,
    },
    /// A world size of zero.
    #[error("{var}=0; a job needs at least one rank")]
    ZeroWorldSize {
        /// The variable.
        var: &'static str,
    },
    /// One of a launcher's rank and size variables is set, the other is not.
    #[error("{set_var}={value} is set but {missing_var} is not; set {missing_var} to {what}")]
    HalfSet {
        /// The variable that is set.
        set_var: &'static str,
        /// Its value.
        value: String,
        /// Its partner, which is not set.
        missing_var: &'static str,
        /// What the partner should hold.
        what: &'static str,
    },
    /// A Slurm node list that ringwire cannot read, where it would take
    /// the store's host from it.
    #[error(
        "{var}={value:?} is not a Slurm host list such as node[01-04,07]: {reason}; set \
         MASTER_ADDR to the host of rank 0 instead"
    )]
    BadHostList {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What could not be read.
        reason: String,
    },
    /// No launcher's variables are set at all.
    #[error(
        "no launch environment found: set RINGWIRE_RANK and RINGWIRE_WORLD_SIZE (plus \
         MASTER_ADDR and MASTER_PORT), or start the job with torchrun (sets RANK, WORLD_SIZE, \
         MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (sets OMPI_COMM_WORLD_RANK and \
         OMPI_COMM_WORLD_SIZE), Slurm's srun (sets SLURM_PROCID and SLURM_NTASKS) or a PMI \
         launcher such as MPICH's mpiexec (sets PMI_RANK and PMI_SIZE); with PMI, or with \
         mpirun across hosts, also export MASTER_ADDR (and MASTER_PORT) to every rank"
    )]
    NoLauncher,
}

/// The variables one launcher sets.
struct Vars {
    launcher: Launcher,
    rank: &'static str,
    /// Alternatives, first preferred.
    size: &'static [&'static str],
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

/// Launchers in order of precedence.
const LAUNCHERS: [Vars; 5] = [
    Vars {
        launcher: Launcher::Ringwire,
        rank: "RINGWIRE_RANK",
        size: &["RINGWIRE_WORLD_SIZE"],
        local_rank: "RINGWIRE_LOCAL_RANK",
        local_size: Some("RINGWIRE_LOCAL_WORLD_SIZE"),
    },
    Vars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Vars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Vars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS", "SLURM_NPROCS"],
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
    Vars {
        launcher: Launcher::Pmi,
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
];

const RANK_WHAT: &str = "this process's rank (0 to the number of ranks - 1)";
const SIZE_WHAT: &str = "the number of ranks";
const INDEX_EXPECTED: &str = "a rank (a whole number counting from 0)";
const SIZE_EXPECTED: &str = "a number of ranks (a whole number, at least 1)";
const PORT_EXPECTED: &str = "a TCP port number (1 to 65535)";

/// Works out the launch configuration from the variables `lookup` returns.
pub fn discover(lookup: impl Fn(&str) -> Option<String>) -> Result<LaunchConfig, EnvError> {
    let get = |var: &'static str| {
        lookup(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(|v| (var, v))
    };
    let first = |vars: &[&'static str]| vars.iter().find_map(|&v| get(v));

    let mut found = None;
    for vars in &LAUNCHERS {
        match (get(vars.rank), first(vars.size)) {
            (None, None) => continue,
            (Some((set_var, value)), None) => {
                return Err(EnvError::HalfSet {
                    set_var,
                    value,
                    missing_var: vars.size[0],
                    what: SIZE_WHAT,
                });
            }
            (None, Some((set_var, value))) => {
                return Err(EnvError::HalfSet {
                    set_var,
                    value,
                    missing_var: vars.rank,
                    what: RANK_WHAT,
                });
            }
            (Some(rank), Some(size)) => {
                found = Some((vars, rank, size));
                break;
            }
        }
    }
    let Some((vars, (rank_var, rank), (size_var, size))) = found else {
        return Err(EnvError::NoLauncher);
    };
    let launcher = vars.launcher;
    let rank = parse_usize(rank_var, &rank, INDEX_EXPECTED)?;
    let world_size = parse_size(size_var, &size)?;
    check_rank(rank_var, rank, size_var, world_size)?;

    let local_rank = get(vars.local_rank)
        .map(|(var, v)| parse_usize(var, &v, INDEX_EXPECTED))
        .transpose()?;
    let local_world_size = vars
        .local_size
        .and_then(get)
        .map(|(var, v)| parse_size(var, &v))
        .transpose()?;
    if let (Some(lr), Some(ls), Some(ls_var)) = (local_rank, local_world_size, vars.local_size) {
        check_rank(vars.local_rank, lr, ls_var, ls)?;
    }

    let master = master_defaults(
        launcher,
        &get,
        (size_var, world_size),
        (vars.local_size, local_world_size),
    )?;
    let socket_ifname = get("RINGWIRE_SOCKET_IFNAME").map(|(_, v)| v);
    let store = store_kind(&get)?;
    let elastic = match get("TORCHELASTIC_RUN_ID") {
        None => None,
        Some((_, run_id)) => {
            let restart_count = match get("TORCHELASTIC_RESTART_COUNT") {
                None => 0,
                Some((var, v)) => v.parse().map_err(|_| EnvError::NotANumber {
                    var,
                    value: v,
                    expected: "a restart count (a whole number counting from 0)",
                })?,
            };
            Some(ElasticAttempt {
                run_id,
                restart_count,
            })
        }
    };

    Ok(LaunchConfig {
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr: master.addr,
        master_port: master.port,
        socket_ifname,
        launcher,
        store,
        elastic,
        master_from: master.from,
        launcher_job_id: master.job_id,
    })
}

/// `RINGWIRE_STORE` if set (`torch` or `ringwire`), else a TCPStore when
/// torchrun says its agent hosts one.
fn store_kind(
    get: &impl Fn(&'static str) -> Option<(&'static str, String)>,
) -> Result<StoreKind, EnvError> {
    if let Some((var, value)) = get("RINGWIRE_STORE") {
        return match value.to_ascii_lowercase().as_str() {
            "torch" | "tcpstore" => Ok(StoreKind::Torch),
            "ringwire" => Ok(StoreKind::Ringwire),
            _ => Err(EnvError::Invalid {
                var,
                value,
                expected: "torch (join a PyTorch TCPStore at MASTER_ADDR:MASTER_PORT) or \
                           ringwire (rank 0 hosts ringwire's own store)",
            }),
        };
    }
    let agent =
        get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|(_, v)| parse_switch(&v) == Some(true));
    Ok(if agent {
        StoreKind::Torch
    } else {
        StoreKind::Ringwire
    })
}

/// [`discover`] on this process's environment. A variable that is not valid
/// Unicode is read lossily (and then fails to parse, naming the variable).
pub fn discover_from_process() -> Result<LaunchConfig, EnvError> {
    discover(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
}

/// Parses an on/off setting the way every `RINGWIRE_*` switch takes it:
/// `1`, `on`, `true`, `yes` or `0`, `off`, `false`, `no`, in any case.
/// `None` for any other word.
pub fn parse_switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// What [`parse_switch`] takes, for error messages.
pub(crate) const SWITCH_WORDS: &str = "1, on, true or yes; or 0, off, false or no";

/// Parses a byte count: a whole number with an optional binary suffix,
/// `K`, `M` or `G` (also `KiB`, `MiB`, `GiB`; any case), as in `4096`,
/// `64K`, `16M`, `1G`. `None` when the text is not one or overflows.
/// The `RINGWIRE_*_BYTES` variables and the benchmark harness's sizes use it.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let unit = lower.strip_suffix("ib").unwrap_or(&lower);
    let (digits, shift) = match unit.as_bytes().last() {
        Some(b'k') => (&unit[..unit.len() - 1], 10),
        Some(b'm') => (&unit[..unit.len() - 1], 20),
        Some(b'g') => (&unit[..unit.len() - 1], 30),
        // "16iB" is not a size.
        _ if unit.len() != lower.len() => return None,
        _ => (unit, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn parse_usize(var: &'static str, value: &str, expected: &'static str) -> Result<usize, EnvError> {
    value.parse().map_err(|_| EnvError::NotANumber {
        var,
        value: value.to_owned(),
        expected,
    })
}

fn parse_size(var: &'static str, value: &str) -> Result<usize, EnvError> {
    match parse_usize(var, value, SIZE_EXPECTED)? {
        0 => Err(EnvError::ZeroWorldSize { var }),
        n => Ok(n),
    }
}

fn check_rank(
    rank_var: &'static str,
    rank: usize,
    size_var: &'static str,
    size: usize,
) -> Result<(), EnvError> {
    if rank >= size {
        return Err(EnvError::RankOutOfRange {
            rank_var,
            rank,
            size_var,
            size,
        });
    }
    Ok(())
}

/// The address every rank of a job that runs on one host meets at.
const LOOPBACK: &str = "127.0.0.1";

/// The ports a derived `MASTER_PORT` lies in (see [`derived_port`]).
///
/// Above 1023, so binding one needs no privilege. Below 32768, where
/// Linux's default ephemeral range (`net.ipv4.ip_local_port_range`,
/// 32768-60999) begins: the kernel hands those ports to outgoing
/// connections and to every bind of port 0 (ringwire's own ranks listen on
/// one), so a derived port there could be taken by any process at any
/// moment. 20000 leaves the crowded low ports (web servers, databases,
/// dashboards) alone. Choosing a port inside this range by hand is fine.
pub const DERIVED_PORTS: std::ops::RangeInclusive<u16> = 20000..=32767;

/// The store port derived from a launcher's id for a job (Open MPI's job
/// id, Slurm's `job.step`): the same id always gives the same port, on
/// every rank and every version of ringwire (ranks compute it apart, so it
/// must never change), and two ids rarely share one (about 1 in 12768).
///
/// A stable hash, not Rust's `DefaultHasher` (seeded per process, so
/// ranks would disagree): 64-bit FNV-1a, whose high half is then folded
/// into the low one (FNV's low bits depend only on the low bits of each
/// byte), taken modulo the size of [`DERIVED_PORTS`].
pub fn derived_port(job_id: &str) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 32;
    let (lo, hi) = (*DERIVED_PORTS.start(), *DERIVED_PORTS.end());
    let span = u64::from(hi - lo) + 1;
    lo + (h % span) as u16
}

/// The store's address and port, and how ringwire filled in what the
/// variables left out.
struct Master {
    addr: String,
    port: u16,
    from: Option<String>,
    job_id: Option<String>,
}

/// The id a launcher gives every rank of one job, and no other job it runs
/// at the same time.
struct LauncherJob {
    id: String,
    /// Where it came from, e.g. "Open MPI's job id (OMPI_MCA_ess_base_jobid=1987706881)".
    source: String,
}

/// Open MPI 4 (ORTE) sets `OMPI_MCA_ess_base_jobid`; Open MPI 5 (PRRTE)
/// does not, but both set the PMIx namespace, equal on every rank of one
/// mpirun and different between two mpiruns (it holds mpirun's pid in some
/// form). Slurm: the job id and the step id, so that two steps of one job
/// running at once (`srun ... & srun ... &`) get different ports.
fn launcher_job(
    launcher: Launcher,
    get: &impl Fn(&'static str) -> Option<(&'static str, String)>,
) -> Option<LauncherJob> {
    match launcher {
        Launcher::OpenMpi => {
            let (var, id) = get("OMPI_MCA_ess_base_jobid").or_else(|| get("PMIX_NAMESPACE"))?;
            Some(LauncherJob {
                source: format!("Open MPI's job id ({var}={id})"),
                id,
            })
        }
        Launcher::Slurm => {
            let (job_var, job) = get("SLURM_JOB_ID").or_else(|| get("SLURM_JOBID"))?;
            Some(match get("SLURM_STEP_ID").or_else(|| get("SLURM_STEPID")) {
                Some((step_var, step)) => LauncherJob {
                    id: format!("{job}.{step}"),
                    source: format!("Slurm's job and step ({job_var}={job}, {step_var}={step})"),
                },
                None => LauncherJob {
                    source: format!("Slurm's job id ({job_var}={job})"),
                    id: job,
                },
            })
        }
        Launcher::Ringwire | Launcher::Torchrun | Launcher::Pmi => None,
    }
}

/// The store address: `RINGWIRE_MASTER_*`, else `MASTER_*`, else (under
/// Open MPI and Slurm) the defaults the module docs describe. Each of the
/// address and the port is filled in on its own.
fn master_defaults(
    launcher: Launcher,
    get: &impl Fn(&'static str) -> Option<(&'static str, String)>,
    (size_var, world_size): (&'static str, usize),
    (local_size_var, local_world_size): (Option<&'static str>, Option<usize>),
) -> Result<Master, EnvError> {
    let job = launcher_job(launcher, get);
    let given_port = get("RINGWIRE_MASTER_PORT").or_else(|| get("MASTER_PORT"));
    let (addr, addr_from) = match get("RINGWIRE_MASTER_ADDR").or_else(|| get("MASTER_ADDR")) {
        Some((_, addr)) => (addr, None),
        None => {
            // What the error says about the port when the address is missing.
            let port_note = match (&given_port, &job) {
                (Some(_), _) => PortNote::Given,
                (None, Some(_)) => PortNote::Derived,
                (None, None) => PortNote::Missing,
            };
            let (addr, why) = default_addr(
                launcher,
                get,
                (size_var, world_size),
                (local_size_var, local_world_size),
                port_note,
            )?;
            (addr, Some(why))
        }
    };
    let (port, port_from) = match given_port {
        Some((var, value)) => (parse_port(var, value)?, None),
        None => {
            let Some(job) = &job else {
                return Err(EnvError::Missing {
                    var: "MASTER_PORT",
                    hint: master_hint(
                        launcher,
                        "MASTER_PORT",
                        "a free TCP port on the machine running rank 0 (e.g. 29500)",
                    ),
                });
            };
            let port = derived_port(&job.id);
            let how = match launcher {
                Launcher::Slurm => "export MASTER_PORT=<port> before srun",
                _ => "mpirun -x MASTER_PORT=<port> ...",
            };
            let why = format!(
                "MASTER_PORT {port} was derived from {}: another job on that host may hold it; \
                 set MASTER_PORT to choose a free port ({how})",
                job.source
            );
            (port, Some(why))
        }
    };
    let from = match (addr_from, port_from) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(one),
        (Some(addr), Some(port)) => Some(format!("{addr}, and {port}")),
    };
    Ok(Master {
        addr,
        port,
        from,
        job_id: job.map(|j| j.id),
    })
}

/// What an error about a missing address says about the port.
#[derive(Clone, Copy)]
enum PortNote {
    Given,
    Derived,
    Missing,
}

/// The default store address, and the words that say why, for a launcher
/// that gives one: loopback when every rank runs on this host (Open MPI,
/// Slurm), else the first host of Slurm's node list.
fn default_addr(
    launcher: Launcher,
    get: &impl Fn(&'static str) -> Option<(&'static str, String)>,
    (size_var, world_size): (&'static str, usize),
    (local_size_var, local_world_size): (Option<&'static str>, Option<usize>),
    port_note: PortNote,
) -> Result<(String, String), EnvError> {
    let loopback = |why: String| {
        Ok((
            LOOPBACK.to_owned(),
            format!("MASTER_ADDR defaulted to {LOOPBACK} since {why}"),
        ))
    };
    match launcher {
        Launcher::OpenMpi | Launcher::Slurm if world_size == 1 => {
            loopback(format!("the job has one rank ({size_var}=1)"))
        }
        Launcher::OpenMpi => {
            let lsv = local_size_var.unwrap_or("OMPI_COMM_WORLD_LOCAL_SIZE");
            let why = match local_world_size {
                Some(local) if local == world_size => {
                    return loopback(format!(
                        "every rank runs on this host ({lsv}={local}, {size_var}={world_size})"
                    ));
                }
                Some(local) => format!(
                    "the ranks span several hosts ({lsv}={local} on this one, \
                     {size_var}={world_size})"
                ),
                None => {
                    format!("{lsv} is not set, so whether every rank runs on this host is unknown")
                }
            };
            let pass = match port_note {
                PortNote::Given => "mpirun -x MASTER_ADDR=<rank 0's host> ...",
                PortNote::Derived => {
                    "mpirun -x MASTER_ADDR=<rank 0's host> ... (MASTER_PORT is derived from Open \
                     MPI's job id; add -x MASTER_PORT=<port> to choose it)"
                }
                PortNote::Missing => {
                    "mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<free port> ..."
                }
            };
            Err(EnvError::Missing {
                var: "MASTER_ADDR",
                hint: format!(
                    "set MASTER_ADDR (or RINGWIRE_MASTER_ADDR) to the host name or IP address of \
                     the machine running rank 0: {why}, so it cannot default to this host. mpirun \
                     does not set it; pass it to every rank: {pass}"
                ),
            })
        }
        Launcher::Slurm => {
            let first = |vars: &[&'static str]| vars.iter().find_map(|&v| get(v));
            // Under srun the step's variables describe where this step's
            // ranks run; the job's may name more nodes (a step on part of
            // an allocation, `srun -N1 -w node03`).
            let nodes = first(&[
                "SLURM_STEP_NUM_NODES",
                "SLURM_NNODES",
                "SLURM_JOB_NUM_NODES",
            ])
            .map(|(var, v)| parse_size(var, &v).map(|n| (var, n)))
            .transpose()?;
            if let Some((var, 1)) = nodes {
                return loopback(format!("every rank runs on one node ({var}=1)"));
            }
            let Some((list_var, list)) = first(&[
                "SLURM_STEP_NODELIST",
                "SLURM_NODELIST",
                "SLURM_JOB_NODELIST",
            ]) else {
                return Err(EnvError::Missing {
                    var: "MASTER_ADDR",
                    hint: master_hint(
                        launcher,
                        "MASTER_ADDR",
                        "the host name or IP address of the machine running rank 0",
                    ),
                });
            };
            let host = first_host(&list).map_err(|reason| EnvError::BadHostList {
                var: list_var,
                value: list.clone(),
                reason,
            })?;
            let why = format!(
                "MASTER_ADDR defaulted to {host}, the first host of {list_var}={list}, where \
                 Slurm starts rank 0"
            );
            Ok((host, why))
        }
        Launcher::Ringwire | Launcher::Torchrun | Launcher::Pmi => Err(EnvError::Missing {
            var: "MASTER_ADDR",
            hint: master_hint(
                launcher,
                "MASTER_ADDR",
                "the host name or IP address of the machine running rank 0",
            ),
        }),
    }
}

fn parse_port(var: &'static str, value: String) -> Result<u16, EnvError> {
    match value.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(EnvError::NotANumber {
            var,
            value,
            expected: PORT_EXPECTED,
        }),
    }
}

fn master_hint(launcher: Launcher, var: &str, what: &str) -> String {
    let mut hint = format!("set {var} (or RINGWIRE_{var}) to {what}");
    match launcher {
        Launcher::Ringwire | Launcher::Torchrun => {}
        Launcher::OpenMpi => hint.push_str(
            "; mpirun does not set it, so export it in the job script and pass it to every \
             rank (mpirun -x MASTER_ADDR -x MASTER_PORT)",
        ),
        Launcher::Slurm => hint.push_str(
            "; srun sets neither it nor, here, the node list or job id ringwire derives it \
             from (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, SLURM_JOB_ID), so export it in \
             the batch script before srun (e.g. the first host of `scontrol show hostnames \
             $SLURM_JOB_NODELIST`)",
        ),
        Launcher::Pmi => hint.push_str(
            "; PMI launchers do not set it, so export it to every rank \
             (mpiexec -genv MASTER_ADDR ... -genv MASTER_PORT ...)",
        ),
    }
    hint
}

#[cfg(test)]
mod tests;
