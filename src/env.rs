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
    Missing { var: &'static str, hint: String },
    /// A variable does not hold what it should.
    #[error("{var}={value:?} is not {expected}")]
    NotANumber {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A `RINGWIRE_*` setting holds a word or value it does not take.
    #[error("{var}={value}: expected {expected}")]
    Invalid {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A rank is not below its world size.
    #[error(
        "{rank_var}={rank} is out of range for {size_var}={size}; ranks run from 0 to \
         {size_var} - 1"
    )]
    RankOutOfRange {
        rank_var: &'static str,
        rank: usize,
        size_var: &'static str,
        size: usize,
    },
    /// A world size of zero.
    #[error("{var}=0; a job needs at least one rank")]
    ZeroWorldSize { var: &'static str },
    /// One of a launcher's rank and size variables is set, the other is not.
    #[error("{set_var}={value} is set but {missing_var} is not; set {missing_var} to {what}")]
    HalfSet {
        set_var: &'static str,
        value: String,
        missing_var: &'static str,
        what: &'static str,
    },
    /// A Slurm node list that ringwire cannot read, where it would take
    /// the store's host from it.
    #[error(
        "{var}={value:?} is not a Slurm host list such as node[01-04,07]: {reason}; set \
         MASTER_ADDR to the host of rank 0 instead"
    )]
    BadHostList {
        var: &'static str,
        value: String,
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

/// One piece of a host name pattern in a Slurm host list.
#[derive(Debug)]
enum HostPiece<'a> {
    /// Characters taken as they are.
    Text(&'a str),
    /// A bracket group, `[01-04,7]`: each range's first and last number and
    /// the digits its first number was written with (zero padding is kept).
    Ranges(Vec<(u64, u64, usize)>),
}

/// Parses a Slurm host list, as in `SLURM_JOB_NODELIST`: comma-separated
/// items, each a host name in which bracket groups stand for numbers
/// (`node[01-04,07]`, `a1,b[2-3]`, `rack[1-2]-n3`, `r[1-2]n[01-02]`).
/// Returns the items' patterns, or why the list is malformed.
fn parse_hostlist(list: &str) -> Result<Vec<Vec<HostPiece<'_>>>, String> {
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i <= bytes.len() {
        match bytes.get(i) {
            None | Some(b',') => {
                if text_start < i {
                    pieces.push(HostPiece::Text(&list[text_start..i]));
                }
                if pieces.is_empty() {
                    return Err(format!("an empty host name at byte {i}"));
                }
                items.push(std::mem::take(&mut pieces));
                text_start = i + 1;
            }
            Some(b'[') => {
                if text_start < i {
                    pieces.push(HostPiece::Text(&list[text_start..i]));
                }
                let Some(close) = list[i + 1..].find(['[', ']']).map(|k| i + 1 + k) else {
                    return Err(format!("the '[' at byte {i} is never closed"));
                };
                if bytes[close] == b'[' {
                    return Err(format!("a '[' at byte {close} inside brackets"));
                }
                pieces.push(HostPiece::Ranges(parse_ranges(&list[i + 1..close])?));
                i = close;
                text_start = close + 1;
            }
            Some(b']') => return Err(format!("the ']' at byte {i} closes no '['")),
            Some(b) if b.is_ascii_whitespace() || b.is_ascii_control() => {
                return Err(format!("a space or control character at byte {i}"));
            }
            Some(_) => {}
        }
        i += 1;
    }
    Ok(items)
}

/// The inside of a bracket group: `01-04,07`.
fn parse_ranges(inside: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    if inside.is_empty() {
        return Err("empty brackets []".to_owned());
    }
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    inside
        .split(',')
        .map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            match (number(lo), number(hi)) {
                (Some(first), Some(last)) if first <= last => Ok((first, last, lo.len())),
                (Some(_), Some(_)) => Err(format!("the range {part} in [{inside}] runs backwards")),
                _ => Err(format!(
                    "{part:?} in [{inside}] is neither a number nor a range such as 01-04"
                )),
            }
        })
        .collect()
}

/// The first host of a Slurm host list (where Slurm starts rank 0), once
/// the whole list parses.
fn first_host(list: &str) -> Result<String, String> {
    let items = parse_hostlist(list)?;
    Ok(items[0]
        .iter()
        .map(|piece| match piece {
            HostPiece::Text(text) => (*text).to_owned(),
            HostPiece::Ranges(ranges) => {
                let (first, _, width) = ranges[0];
                format!("{first:0width$}")
            }
        })
        .collect())
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
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn run(vars: &[(&str, &str)]) -> Result<LaunchConfig, EnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        discover(|k| map.get(k).cloned())
    }

    #[test]
    fn byte_counts_take_binary_suffixes() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            (" 64K ", 64 << 10),
            ("64k", 64 << 10),
            ("4M", 4 << 20),
            ("4MiB", 4 << 20),
            ("4mib", 4 << 20),
            ("1G", 1 << 30),
            ("2GiB", 2 << 30),
        ] {
            assert_eq!(parse_bytes(text), Some(bytes), "{text:?}");
        }
        for text in [
            "",
            "K",
            "MiB",
            "4iB",
            "4 M",
            "-4M",
            "+4",
            "4.5M",
            "4T",
            "0x10",
            "4MB",
            "99999999999G",
        ] {
            assert_eq!(parse_bytes(text), None, "{text:?}");
        }
    }

    const MASTER: [(&str, &str); 2] = [("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];

    fn with_master<'a>(vars: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v = vars.to_vec();
        v.extend_from_slice(&MASTER);
        v
    }

    #[test]
    fn ringwire_variables() {
        let c = run(&with_master(&[
            ("RINGWIRE_RANK", "2"),
            ("RINGWIRE_WORLD_SIZE", "4"),
            ("RINGWIRE_LOCAL_RANK", "0"),
            ("RINGWIRE_LOCAL_WORLD_SIZE", "2"),
            ("RINGWIRE_SOCKET_IFNAME", "eth0"),
        ]))
        .unwrap();
        assert_eq!(
            c,
            LaunchConfig {
                rank: 2,
                world_size: 4,
                local_rank: Some(0),
                local_world_size: Some(2),
                master_addr: "10.0.0.1".into(),
                master_port: 29500,
                socket_ifname: Some("eth0".into()),
                launcher: Launcher::Ringwire,
                store: StoreKind::Ringwire,
                elastic: None,
                master_from: None,
                launcher_job_id: None,
            }
        );
    }

    #[test]
    fn torchrun_agent_store_and_attempt() {
        let torchrun = [("RANK", "1"), ("WORLD_SIZE", "4")];
        let c = run(&with_master(&torchrun)).unwrap();
        assert_eq!((c.store, c.elastic), (StoreKind::Ringwire, None));

        let mut vars = with_master(&torchrun);
        vars.extend([
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RUN_ID", "job-7"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ]);
        let c = run(&vars).unwrap();
        assert_eq!(c.store, StoreKind::Torch);
        let attempt = c.elastic.unwrap();
        assert_eq!(
            (attempt.run_id.as_str(), attempt.restart_count),
            ("job-7", 2)
        );

        // RINGWIRE_STORE overrides the agent's word either way.
        vars.push(("RINGWIRE_STORE", "ringwire"));
        assert_eq!(run(&vars).unwrap().store, StoreKind::Ringwire);
        let mut by_hand = with_master(&torchrun);
        by_hand.push(("RINGWIRE_STORE", "Torch"));
        assert_eq!(run(&by_hand).unwrap().store, StoreKind::Torch);
        by_hand.push(("TORCHELASTIC_USE_AGENT_STORE", "False"));
        assert_eq!(run(&by_hand).unwrap().store, StoreKind::Torch);

        let mut bad = with_master(&torchrun);
        bad.push(("RINGWIRE_STORE", "redis"));
        assert!(matches!(
            run(&bad),
            Err(EnvError::Invalid {
                var: "RINGWIRE_STORE",
                ..
            })
        ));
        let mut bad = with_master(&torchrun);
        bad.extend([
            ("TORCHELASTIC_RUN_ID", "x"),
            ("TORCHELASTIC_RESTART_COUNT", "one"),
        ]);
        assert!(matches!(
            run(&bad),
            Err(EnvError::NotANumber {
                var: "TORCHELASTIC_RESTART_COUNT",
                ..
            })
        ));
    }

    #[test]
    fn torchrun_variables() {
        let c = run(&with_master(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
        ]))
        .unwrap();
        assert_eq!(c.launcher, Launcher::Torchrun);
        assert_eq!((c.rank, c.world_size), (5, 8));
        assert_eq!((c.local_rank, c.local_world_size), (Some(1), Some(4)));
        assert_eq!(c.socket_ifname, None);
    }

    #[test]
    fn open_mpi_variables() {
        let c = run(&with_master(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
        ]))
        .unwrap();
        assert_eq!(c.launcher, Launcher::OpenMpi);
        assert_eq!((c.rank, c.world_size), (3, 16));
        assert_eq!((c.local_rank, c.local_world_size), (Some(3), Some(8)));
    }

    #[test]
    fn slurm_variables() {
        let c = run(&with_master(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "12"),
            ("SLURM_LOCALID", "1"),
        ]))
        .unwrap();
        assert_eq!(c.launcher, Launcher::Slurm);
        assert_eq!((c.rank, c.world_size), (7, 12));
        assert_eq!((c.local_rank, c.local_world_size), (Some(1), None));
        // SLURM_NPROCS stands in for SLURM_NTASKS.
        let c = run(&with_master(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NPROCS", "2"),
        ]))
        .unwrap();
        assert_eq!((c.rank, c.world_size), (0, 2));
    }

    #[test]
    fn pmi_variables() {
        let c = run(&with_master(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ]))
        .unwrap();
        assert_eq!(c.launcher, Launcher::Pmi);
        assert_eq!((c.rank, c.world_size), (1, 2));
        assert_eq!((c.local_rank, c.local_world_size), (Some(1), Some(2)));
    }

    #[test]
    fn precedence_ringwire_then_torchrun_then_mpi_then_slurm_then_pmi() {
        let all = [
            ("RINGWIRE_RANK", "0"),
            ("RINGWIRE_WORLD_SIZE", "1"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("PMI_RANK", "4"),
            ("PMI_SIZE", "5"),
        ];
        let expected = [
            Launcher::Ringwire,
            Launcher::Torchrun,
            Launcher::OpenMpi,
            Launcher::Slurm,
            Launcher::Pmi,
        ];
        for (skip, launcher) in expected.into_iter().enumerate() {
            let c = run(&with_master(&all[2 * skip..])).unwrap();
            assert_eq!(c.launcher, launcher);
            assert_eq!((c.rank, c.world_size), (skip, skip + 1));
        }
    }

    #[test]
    fn local_variables_come_from_the_chosen_launcher_only() {
        let c = run(&with_master(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("SLURM_LOCALID", "5"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "6"),
        ]))
        .unwrap();
        assert_eq!(c.local_rank, None);
    }

    #[test]
    fn ringwire_master_overrides_master() {
        let c = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RINGWIRE_MASTER_ADDR", "[fd00::1]"),
            ("RINGWIRE_MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!(c.master_addr, "[fd00::1]");
        assert_eq!(c.master_port, 1234);
        // Each overrides independently.
        let c = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RINGWIRE_MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!((c.master_addr.as_str(), c.master_port), ("10.0.0.1", 1234));
    }

    #[test]
    fn empty_and_padded_values() {
        // Empty counts as unset; surrounding whitespace is ignored.
        let c = run(&with_master(&[
            ("RINGWIRE_RANK", ""),
            ("RANK", " 1 "),
            ("WORLD_SIZE", "2\n"),
            ("RINGWIRE_SOCKET_IFNAME", ""),
        ]))
        .unwrap();
        assert_eq!(
            (c.launcher, c.rank, c.world_size),
            (Launcher::Torchrun, 1, 2)
        );
        assert_eq!(c.socket_ifname, None);
    }

    #[test]
    fn no_launcher() {
        let e = run(&MASTER).unwrap_err();
        assert_eq!(e, EnvError::NoLauncher);
        let msg = e.to_string();
        for var in [
            "RINGWIRE_RANK",
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "SLURM_PROCID",
            "PMI_RANK",
        ] {
            assert!(msg.contains(var), "{msg}");
        }
    }

    #[test]
    fn half_set() {
        let e = run(&with_master(&[("RANK", "3")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RANK=3 is set but WORLD_SIZE is not; set WORLD_SIZE to the number of ranks"
        );
        let e = run(&with_master(&[("OMPI_COMM_WORLD_SIZE", "4")])).unwrap_err();
        assert!(matches!(
            e,
            EnvError::HalfSet {
                set_var: "OMPI_COMM_WORLD_SIZE",
                missing_var: "OMPI_COMM_WORLD_RANK",
                ..
            }
        ));
        // A half-set higher launcher is an error even if a lower one is whole.
        let e = run(&with_master(&[
            ("RINGWIRE_WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            EnvError::HalfSet {
                missing_var: "RINGWIRE_RANK",
                ..
            }
        ));
    }

    #[test]
    fn not_a_number() {
        let e = run(&with_master(&[("RANK", "two"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert_eq!(
            e,
            EnvError::NotANumber {
                var: "RANK",
                value: "two".into(),
                expected: INDEX_EXPECTED
            }
        );
        assert!(
            e.to_string().starts_with("RANK=\"two\" is not a rank"),
            "{e}"
        );
        let e = run(&with_master(&[("RANK", "-1"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(matches!(e, EnvError::NotANumber { var: "RANK", .. }));
        let e = run(&with_master(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "x"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            EnvError::NotANumber {
                var: "LOCAL_RANK",
                ..
            }
        ));
        for port in ["http", "0", "65536", "-5"] {
            let e = run(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", port),
            ])
            .unwrap_err();
            assert!(
                matches!(
                    e,
                    EnvError::NotANumber {
                        var: "MASTER_PORT",
                        expected: PORT_EXPECTED,
                        ..
                    }
                ),
                "{port}: {e}"
            );
        }
    }

    #[test]
    fn rank_out_of_range() {
        let e = run(&with_master(&[("PMI_RANK", "4"), ("PMI_SIZE", "4")])).unwrap_err();
        assert_eq!(
            e,
            EnvError::RankOutOfRange {
                rank_var: "PMI_RANK",
                rank: 4,
                size_var: "PMI_SIZE",
                size: 4
            }
        );
        assert_eq!(
            e.to_string(),
            "PMI_RANK=4 is out of range for PMI_SIZE=4; ranks run from 0 to PMI_SIZE - 1"
        );
        let e = run(&with_master(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            EnvError::RankOutOfRange {
                rank_var: "LOCAL_RANK",
                size_var: "LOCAL_WORLD_SIZE",
                ..
            }
        ));
    }

    #[test]
    fn zero_world_size() {
        let e = run(&with_master(&[("RANK", "0"), ("WORLD_SIZE", "0")])).unwrap_err();
        assert_eq!(e, EnvError::ZeroWorldSize { var: "WORLD_SIZE" });
        let e = run(&with_master(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_WORLD_SIZE", "0"),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            EnvError::ZeroWorldSize {
                var: "LOCAL_WORLD_SIZE"
            }
        );
    }

    #[test]
    fn missing_master_names_the_variable_and_launcher_advice() {
        let e = run(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "1")]).unwrap_err();
        let EnvError::Missing { var, hint } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*var, "MASTER_ADDR");
        assert!(hint.contains("rank 0"), "{hint}");
        let e = run(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
        ])
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("MASTER_PORT is not set; set MASTER_PORT"),
            "{msg}"
        );
        assert!(msg.contains("mpirun does not set it"), "{msg}");
        let e = run(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]).unwrap_err();
        assert!(e.to_string().contains("srun sets neither it"), "{e}");
        let e = run(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap_err();
        assert!(e.to_string().contains("PMI launchers do not set it"), "{e}");
    }

    /// What Open MPI 4.1's mpirun really sets (`mpirun -np 3 env`, one
    /// host), less the variables ringwire does not read.
    fn open_mpi_one_host(rank: &str) -> Vec<(&str, &str)> {
        vec![
            ("OMPI_COMM_WORLD_RANK", rank),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", rank),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("OMPI_COMM_WORLD_NODE_RANK", rank),
            ("OMPI_MCA_ess_base_jobid", "1987706881"),
            ("OMPI_MCA_orte_num_nodes", "1"),
            ("PMIX_NAMESPACE", "1987706881"),
            ("PMIX_RANK", rank),
        ]
    }

    #[test]
    fn open_mpi_on_one_host_needs_no_master_variables() {
        let port = derived_port("1987706881");
        for rank in ["0", "1", "2"] {
            let c = run(&open_mpi_one_host(rank)).unwrap();
            assert_eq!((c.master_addr.as_str(), c.master_port), ("127.0.0.1", port));
            assert_eq!(c.launcher_job_id.as_deref(), Some("1987706881"));
            let from = c.master_from.unwrap();
            for part in [
                "MASTER_ADDR defaulted to 127.0.0.1",
                "OMPI_COMM_WORLD_LOCAL_SIZE=3",
                &format!("MASTER_PORT {port} was derived from Open MPI's job id"),
                "OMPI_MCA_ess_base_jobid=1987706881",
                "set MASTER_PORT",
                "mpirun -x MASTER_PORT=",
            ] {
                assert!(from.contains(part), "{part:?} not in {from:?}");
            }
        }
        // Open MPI 5 (PRRTE) sets no OMPI_MCA_ess_base_jobid, only the
        // PMIx namespace.
        let c = run(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PMIX_NAMESPACE", "prterun-vm-6788@1"),
        ])
        .unwrap();
        assert_eq!(c.master_port, derived_port("prterun-vm-6788@1"));
        assert!(
            c.master_from
                .unwrap()
                .contains("PMIX_NAMESPACE=prterun-vm-6788@1"),
            "names the variable"
        );
        // One rank is on one host whatever the local size says.
        let c = run(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("OMPI_MCA_ess_base_jobid", "7"),
        ])
        .unwrap();
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", derived_port("7"))
        );
    }

    #[test]
    fn open_mpi_across_hosts_names_what_to_set() {
        let across = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "1987706881"),
        ];
        let e = run(&across).unwrap_err();
        assert!(
            matches!(
                e,
                EnvError::Missing {
                    var: "MASTER_ADDR",
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        for part in [
            "MASTER_ADDR is not set",
            "rank 0",
            "OMPI_COMM_WORLD_LOCAL_SIZE=2 on this one, OMPI_COMM_WORLD_SIZE=4",
            "mpirun -x MASTER_ADDR=<rank 0's host>",
            "MASTER_PORT is derived from Open MPI's job id",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg:?}");
        }
        // With the port given, only the address is asked for.
        let mut vars = across.to_vec();
        vars.push(("MASTER_PORT", "29500"));
        let msg = run(&vars).unwrap_err().to_string();
        assert!(!msg.contains("MASTER_PORT"), "{msg}");
        // With no job id to derive it from, both are.
        let msg = run(&across[..4]).unwrap_err().to_string();
        assert!(
            msg.contains("mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<free port>"),
            "{msg}"
        );
        // No local size: ringwire cannot tell, so it asks too.
        let msg = run(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "5"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("OMPI_COMM_WORLD_LOCAL_SIZE is not set"),
            "{msg}"
        );
        // MASTER_ADDR alone is enough: the port is derived.
        vars = across.to_vec();
        vars.push(("MASTER_ADDR", "node01"));
        let c = run(&vars).unwrap();
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("node01", derived_port("1987706881"))
        );
        let from = c.master_from.unwrap();
        assert!(from.starts_with("MASTER_PORT "), "{from}");
    }

    /// What srun sets in each task (Slurm's srun(1), "OUTPUT ENVIRONMENT
    /// VARIABLES"), for job 4242's step 0 of `tasks` tasks on `nodes`.
    fn slurm_step<'a>(
        rank: &'a str,
        tasks: &'a str,
        (num_nodes, nodelist): (&'a str, &'a str),
    ) -> Vec<(&'a str, &'a str)> {
        vec![
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOBID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEPID", "0"),
            ("SLURM_PROCID", rank),
            ("SLURM_NTASKS", tasks),
            ("SLURM_NPROCS", tasks),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NNODES", num_nodes),
            ("SLURM_JOB_NUM_NODES", num_nodes),
            ("SLURM_STEP_NUM_NODES", num_nodes),
            ("SLURM_NODELIST", nodelist),
            ("SLURM_JOB_NODELIST", nodelist),
            ("SLURM_STEP_NODELIST", nodelist),
        ]
    }

    #[test]
    fn slurm_on_one_node_needs_no_master_variables() {
        let c = run(&slurm_step("3", "4", ("1", "gpu07"))).unwrap();
        assert_eq!(c.launcher, Launcher::Slurm);
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", derived_port("4242.0"))
        );
        assert_eq!(c.launcher_job_id.as_deref(), Some("4242.0"));
        let from = c.master_from.unwrap();
        for part in [
            "SLURM_STEP_NUM_NODES=1",
            "SLURM_JOB_ID=4242, SLURM_STEP_ID=0",
            "export MASTER_PORT=<port> before srun",
        ] {
            assert!(from.contains(part), "{part:?} not in {from:?}");
        }
        // Another step of the job, running beside it, gets its own port.
        let mut next = slurm_step("0", "4", ("1", "gpu07"));
        next.retain(|(k, _)| !k.starts_with("SLURM_STEP"));
        next.push(("SLURM_STEP_ID", "1"));
        let other = run(&next).unwrap();
        assert_eq!(other.master_port, derived_port("4242.1"));
        assert_ne!(other.master_port, c.master_port);
        // A batch script's own environment has no step: the job id alone.
        let c = run(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!(c.master_port, derived_port("4242"));
    }

    #[test]
    fn slurm_across_nodes_meets_at_the_first_node() {
        for rank in ["0", "5"] {
            let c = run(&slurm_step(rank, "8", ("5", "node[01-04,07]"))).unwrap();
            assert_eq!(
                (c.master_addr.as_str(), c.master_port),
                ("node01", derived_port("4242.0"))
            );
            let from = c.master_from.unwrap();
            assert!(
                from.contains("MASTER_ADDR defaulted to node01, the first host of SLURM_STEP_NODELIST=node[01-04,07]"),
                "{from}"
            );
        }
        // A step on part of the allocation: its own first node, not the job's.
        let mut vars = slurm_step("0", "4", ("5", "node[01-04,07]"));
        vars.retain(|(k, _)| !k.starts_with("SLURM_STEP_N") && *k != "SLURM_NODELIST");
        vars.extend([
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_NODELIST", "node[04,07]"),
        ]);
        assert_eq!(run(&vars).unwrap().master_addr, "node04");
        // ... and a step on one node of it meets on loopback.
        vars.retain(|(k, _)| !k.starts_with("SLURM_STEP_N"));
        vars.extend([
            ("SLURM_STEP_NUM_NODES", "1"),
            ("SLURM_STEP_NODELIST", "node03"),
        ]);
        assert_eq!(run(&vars).unwrap().master_addr, "127.0.0.1");
        // Only the job's list (an older Slurm): its first host.
        let c = run(&[
            ("SLURM_JOB_ID", "9"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "a1,b[2-3]"),
        ])
        .unwrap();
        assert_eq!(c.master_addr, "a1");
        // A list ringwire cannot read is an error naming the variable.
        let mut bad = slurm_step("0", "8", ("2", "x"));
        bad.retain(|(k, _)| *k != "SLURM_STEP_NODELIST");
        bad.push(("SLURM_STEP_NODELIST", "node[01-"));
        let e = run(&bad).unwrap_err();
        assert!(
            matches!(&e, EnvError::BadHostList { var: "SLURM_STEP_NODELIST", value, .. } if value == "node[01-"),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("never closed") && msg.contains("set MASTER_ADDR"),
            "{msg}"
        );
        // No list at all across nodes: MASTER_ADDR is asked for.
        let e = run(&[
            ("SLURM_JOB_ID", "9"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NNODES", "2"),
        ])
        .unwrap_err();
        assert!(
            matches!(
                e,
                EnvError::Missing {
                    var: "MASTER_ADDR",
                    ..
                }
            ),
            "{e:?}"
        );
        // A bad node count is not taken as "several nodes".
        let mut bad = slurm_step("0", "8", ("2", "node[1-2]"));
        bad.retain(|(k, _)| *k != "SLURM_STEP_NUM_NODES");
        bad.push(("SLURM_STEP_NUM_NODES", "two"));
        assert!(matches!(
            run(&bad),
            Err(EnvError::NotANumber {
                var: "SLURM_STEP_NUM_NODES",
                ..
            })
        ));
    }

    #[test]
    fn slurm_host_lists() {
        let expand = |list: &str| expand_hostlist(list).map_err(|e| format!("{list}: {e}"));
        for (list, hosts) in [
            ("node07", &["node07"][..]),
            (
                "node[01-04,07]",
                &["node01", "node02", "node03", "node04", "node07"],
            ),
            ("n[8-11]", &["n8", "n9", "n10", "n11"]),
            ("n[008-010]", &["n008", "n009", "n010"]),
            ("a1,b[2-3]", &["a1", "b2", "b3"]),
            ("b[2-3],a1", &["b2", "b3", "a1"]),
            ("rack[1-2]-n3", &["rack1-n3", "rack2-n3"]),
            ("r[1-2]n[01-02]", &["r1n01", "r1n02", "r2n01", "r2n02"]),
            (
                "gpu-a100.cluster[3,5]",
                &["gpu-a100.cluster3", "gpu-a100.cluster5"],
            ),
            ("[1-2]", &["1", "2"]),
            ("x[5]", &["x5"]),
        ] {
            assert_eq!(expand(list).unwrap(), hosts, "{list}");
            assert_eq!(first_host(list).unwrap(), hosts[0], "{list}");
        }
        // The first host needs no expansion of the rest.
        assert_eq!(first_host("n[0-99999999999]").unwrap(), "n0");
        for (list, why) in [
            ("", "empty host name"),
            ("a,,b", "empty host name at byte 2"),
            ("a,", "empty host name"),
            (",a", "empty host name at byte 0"),
            ("node[01-", "'[' at byte 4 is never closed"),
            ("node[1[2]]", "'[' at byte 6 inside brackets"),
            ("node]1", "']' at byte 4 closes no '['"),
            ("node[]", "empty brackets"),
            ("node[1-]", "neither a number nor a range"),
            ("node[-3]", "neither a number nor a range"),
            ("node[1,,2]", "neither a number nor a range"),
            ("node[a-c]", "neither a number nor a range"),
            ("node[1-2-3]", "neither a number nor a range"),
            ("node[+1]", "neither a number nor a range"),
            ("node[99999999999999999999]", "neither a number nor a range"),
            ("node[4-1]", "runs backwards"),
            ("node1 node2", "space or control character at byte 5"),
        ] {
            let e = first_host(list).unwrap_err();
            assert!(e.contains(why), "{list:?}: {e:?} lacks {why:?}");
        }
    }

    /// Every host of a list, for the tests (ringwire needs only the first).
    fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
        let mut hosts = Vec::new();
        for item in parse_hostlist(list)? {
            let mut names = vec![String::new()];
            for piece in &item {
                names = match piece {
                    HostPiece::Text(text) => names.into_iter().map(|n| n + text).collect(),
                    HostPiece::Ranges(ranges) => names
                        .iter()
                        .flat_map(|n| {
                            ranges.iter().flat_map(move |&(first, last, width)| {
                                (first..=last).map(move |v| format!("{n}{v:0width$}"))
                            })
                        })
                        .collect(),
                };
            }
            hosts.extend(names);
        }
        Ok(hosts)
    }

    #[test]
    fn explicit_master_variables_win_over_the_defaults() {
        let mut vars = open_mpi_one_host("0");
        vars.extend(MASTER);
        let c = run(&vars).unwrap();
        assert_eq!((c.master_addr.as_str(), c.master_port), ("10.0.0.1", 29500));
        assert_eq!(c.master_from, None);
        assert_eq!(c.launcher_job_id.as_deref(), Some("1987706881"));
        vars.extend([
            ("RINGWIRE_MASTER_ADDR", "10.0.0.2"),
            ("RINGWIRE_MASTER_PORT", "1234"),
        ]);
        let c = run(&vars).unwrap();
        assert_eq!((c.master_addr.as_str(), c.master_port), ("10.0.0.2", 1234));

        // Each is filled in on its own: an address with a derived port ...
        let mut vars = slurm_step("0", "4", ("2", "node[1-2]"));
        vars.push(("MASTER_ADDR", "login1"));
        let c = run(&vars).unwrap();
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("login1", derived_port("4242.0"))
        );
        assert!(c.master_from.unwrap().starts_with("MASTER_PORT "));
        // ... a port with the default address ...
        let mut vars = open_mpi_one_host("1");
        vars.push(("RINGWIRE_MASTER_PORT", "29501"));
        let c = run(&vars).unwrap();
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", 29501)
        );
        let from = c.master_from.unwrap();
        assert!(
            from.starts_with("MASTER_ADDR defaulted") && !from.contains("derived"),
            "{from}"
        );
        // ... and a bad port is an error, not a reason to derive one.
        let mut vars = open_mpi_one_host("1");
        vars.push(("MASTER_PORT", "http"));
        assert!(matches!(
            run(&vars),
            Err(EnvError::NotANumber {
                var: "MASTER_PORT",
                ..
            })
        ));
        // torchrun and PMI get no defaults.
        let e = run(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALNRANKS", "2"),
        ]);
        assert!(matches!(
            e,
            Err(EnvError::Missing {
                var: "MASTER_ADDR",
                ..
            })
        ));
    }

    const PINNED_PORTS: [u16; 4] = [32051, 31884, 24575, 29057];

    #[test]
    fn derived_ports_are_stable_and_in_range() {
        // Pinned (and checked against an FNV-1a written apart, in Python):
        // ranks of one job must agree, whatever version each runs.
        assert_eq!(
            derived_port("1987706881"),
            derived_port(&String::from("1987706881"))
        );
        let pinned: Vec<u16> = ["1987706881", "4242.0", "4242.1", ""]
            .map(derived_port)
            .to_vec();
        assert_eq!(
            pinned, PINNED_PORTS,
            "the derivation changed: ranks of mixed versions would not meet"
        );
        let ids: Vec<String> = (0..2000)
            .map(|i| format!("{}.0", 1_000_000 + i))
            .chain((0..2000).map(|i| (1_987_706_881u64 + (i << 16)).to_string()))
            .collect();
        let ports: Vec<u16> = ids.iter().map(|id| derived_port(id)).collect();
        assert!(ports.iter().all(|p| DERIVED_PORTS.contains(p)));
        // Neighbouring job ids (consecutive Slurm jobs, Open MPI job
        // families) land on different ports ...
        for pair in ports.windows(2) {
            assert_ne!(pair[0], pair[1]);
        }
        // ... and 2000 ids spread about as a random choice of 12768 ports
        // would (expected distinct: about 1851 of 2000).
        for half in ports.chunks(2000) {
            let distinct = half.iter().collect::<std::collections::HashSet<_>>().len();
            assert!(distinct > 1800, "{distinct} distinct ports of 2000");
        }
        // Both ends of the range are reachable in principle; the spread
        // covers it.
        let (lo, hi) = (ports.iter().min().unwrap(), ports.iter().max().unwrap());
        assert!(*lo < 20100 && *hi > 32650, "{lo}..{hi}");
    }
}
