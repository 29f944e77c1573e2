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
//! `MASTER_ADDR` / `MASTER_PORT`, for every launcher: torchrun sets them, but
//! under MPI, Slurm or PMI the job script must. `RINGWIRE_SOCKET_IFNAME`
//! optionally names the network interface to use.

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
    /// No launcher's variables are set at all.
    #[error(
        "no launch environment found: set RINGWIRE_RANK and RINGWIRE_WORLD_SIZE (plus \
         MASTER_ADDR and MASTER_PORT), or start the job with torchrun (sets RANK, WORLD_SIZE, \
         MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (sets OMPI_COMM_WORLD_RANK and \
         OMPI_COMM_WORLD_SIZE), Slurm's srun (sets SLURM_PROCID and SLURM_NTASKS) or a PMI \
         launcher such as MPICH's mpiexec (sets PMI_RANK and PMI_SIZE); with MPI, Slurm or PMI \
         also export MASTER_ADDR and MASTER_PORT to every rank"
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

    let Some((_, master_addr)) = first(&["RINGWIRE_MASTER_ADDR", "MASTER_ADDR"]) else {
        return Err(EnvError::Missing {
            var: "MASTER_ADDR",
            hint: master_hint(
                launcher,
                "MASTER_ADDR",
                "the host name or IP address of the machine running rank 0",
            ),
        });
    };
    let Some((port_var, port)) = first(&["RINGWIRE_MASTER_PORT", "MASTER_PORT"]) else {
        return Err(EnvError::Missing {
            var: "MASTER_PORT",
            hint: master_hint(
                launcher,
                "MASTER_PORT",
                "a free TCP port on the machine running rank 0 (e.g. 29500)",
            ),
        });
    };
    let master_port = match port.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => {
            return Err(EnvError::NotANumber {
                var: port_var,
                value: port,
                expected: PORT_EXPECTED,
            });
        }
    };
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
        master_addr,
        master_port,
        socket_ifname,
        launcher,
        store,
        elastic,
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

fn master_hint(launcher: Launcher, var: &str, what: &str) -> String {
    let mut hint = format!("set {var} (or RINGWIRE_{var}) to {what}");
    match launcher {
        Launcher::Ringwire | Launcher::Torchrun => {}
        Launcher::OpenMpi => hint.push_str(
            "; mpirun does not set it, so export it in the job script and pass it to every \
             rank (mpirun -x MASTER_ADDR -x MASTER_PORT)",
        ),
        Launcher::Slurm => hint.push_str(
            "; Slurm does not set it, so export it in the batch script before srun \
             (e.g. the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`)",
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
        let e = run(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap_err();
        assert!(e.to_string().contains("Slurm does not set it"), "{e}");
        let e = run(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap_err();
        assert!(e.to_string().contains("PMI launchers do not set it"), "{e}");
    }
}
