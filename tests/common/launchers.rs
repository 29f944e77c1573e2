//! The real launchers and peers some tests need: a Python with torch and
//! prometheus_client (torchrun, `torch.distributed.TCPStore`, the Prometheus
//! text parser), and Open MPI's `mpirun`.
//!
//! `.ci/run` installs them (a virtual environment outside the repo, Open MPI
//! from Debian). Where one is missing a test says so and skips, except when
//! `CI=true`: there a missing launcher fails the test, so CI never passes
//! without running it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtual environment `.ci/run` fills: RINGWIRE_PY_VENV, else
/// `$HOME/.cache/ringwire/torch-venv`.
pub(crate) fn venv() -> PathBuf {
    match std::env::var_os("RINGWIRE_PY_VENV") {
        Some(v) => PathBuf::from(v),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/ringwire/torch-venv"),
    }
}

/// Whether CI asked for every test to run (`CI=true`): a missing component
/// then fails a test instead of skipping it.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Reports a missing component: fails under CI, else prints why this test
/// skips and returns `None`.
fn missing<T>(what: &str, how: &str) -> Option<T> {
    assert!(
        !in_ci(),
        "{what} is missing, and CI=true needs it: {how} (.ci/run installs it)"
    );
    eprintln!("SKIP: {what} is missing: {how}");
    None
}

/// The venv's Python, if it imports every module of `modules`.
pub(crate) fn python_with(modules: &[&str]) -> Option<PathBuf> {
    let python = venv().join("bin/python");
    let script = modules
        .iter()
        .map(|m| format!("import {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let ok = Command::new(&python)
        .args(["-c", &script])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(python)
    } else {
        missing(
            &format!(
                "a Python with {} at {}",
                modules.join(", "),
                python.display()
            ),
            "run `bash .ci/setup-launchers` or set RINGWIRE_PY_VENV to a venv that has them",
        )
    }
}

/// torchrun from the venv (torch installed).
pub(crate) fn torchrun() -> Option<PathBuf> {
    python_with(&["torch.distributed.run"])?;
    Some(venv().join("bin/torchrun"))
}

/// Open MPI's `mpirun`, if it runs.
pub(crate) fn mpirun() -> Option<PathBuf> {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("Open MPI")
        });
    if ok {
        Some(PathBuf::from("mpirun"))
    } else {
        missing(
            "Open MPI's mpirun",
            "apt-get install openmpi-bin (or run `bash .ci/setup-launchers`)",
        )
    }
}

/// A command running `torchrun` with the launch variables this test
/// process may have removed (torchrun sets its own), and one OpenMP thread.
pub(crate) fn torchrun_command(torchrun: &Path) -> Command {
    let mut cmd = Command::new(torchrun);
    for var in [
        "MASTER_ADDR",
        "MASTER_PORT",
        "RINGWIRE_MASTER_ADDR",
        "RINGWIRE_MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "RINGWIRE_RANK",
        "RINGWIRE_WORLD_SIZE",
        "RINGWIRE_STORE",
        "RINGWIRE_JOB_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("OMP_NUM_THREADS", "1");
    cmd
}
