//! Discovery over every launcher's variables, their precedence and errors,
//! from lookups the tests write (no process environment touched).

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
