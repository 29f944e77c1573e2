//! The binding against the real NCCL, on a machine without a GPU: the
//! `libnccl.so.2` of the nvidia-nccl wheel that `.ci/setup-launchers`
//! installs with torch (in `$RINGWIRE_PY_VENV`, default
//! `~/.cache/ringwire/torch-venv`). It loads without a GPU; the test checks
//! its version and every symbol ringwire binds, gets a unique id, finds the
//! library the way the loader does (through a Python on PATH), compares its
//! error strings with the stand-in's, and sees init fail with NCCL's clear
//! "no driver" error, typed. Skipped when the venv is absent, except under
//! CI=true, where it fails.

mod common;

use common::{cpu_group, standin};
use ringwire_gpu::{Device, GpuCommunicator, GpuError, NcclLibrary, NcclResult, NcclVersion};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn venv() -> PathBuf {
    std::env::var_os("RINGWIRE_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ringwire/torch-venv")
        })
}

/// The wheel's library, or None (a skip) outside CI.
fn real() -> Option<(PathBuf, Arc<NcclLibrary>)> {
    let bin = venv().join("bin");
    let found = NcclLibrary::wheel_libraries(bin.as_os_str());
    let Some(path) = found.first().cloned() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no nvidia-nccl wheel under {}: run `bash .ci/setup-launchers`",
            venv().display()
        );
        eprintln!(
            "SKIP: no nvidia-nccl wheel under {} (bash .ci/setup-launchers installs it)",
            venv().display()
        );
        return None;
    };
    let lib =
        NcclLibrary::open(&path).expect("the real NCCL opens and has every symbol ringwire binds");
    Some((path, lib))
}

#[test]
fn the_real_library_loads_with_every_symbol_and_a_supported_version() {
    let Some((path, lib)) = real() else { return };
    eprintln!("{lib:?}");
    assert!(lib.version() >= NcclVersion::MINIMUM, "{}", lib.version());
    assert!(path.ends_with("nvidia/nccl/lib/libnccl.so.2"));
    // Independently of the loader: every bound name is exported.
    let nm = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output();
    if let Some(nm) = nm.ok().filter(|o| o.status.success()) {
        let exports = String::from_utf8_lossy(&nm.stdout);
        for name in NcclLibrary::REQUIRED_SYMBOLS {
            assert!(
                exports.lines().any(|l| l.ends_with(&format!(" {name}"))),
                "{name} missing from {}",
                path.display()
            );
        }
        // ncclCommShrink came in 2.27.3: found exactly where it should be.
        let exported = exports.lines().any(|l| l.ends_with(" ncclCommShrink"));
        assert_eq!(exported, lib.version() >= NcclVersion::SHRINK, "{lib:?}");
    }
    assert_eq!(
        lib.has_shrink(),
        lib.version() >= NcclVersion::SHRINK,
        "{lib:?}"
    );
}

#[test]
fn a_unique_id_comes_from_the_real_library() {
    let Some((_, lib)) = real() else { return };
    let id = lib
        .unique_id()
        .expect("ncclGetUniqueId works without a GPU");
    assert!(id.internal.iter().any(|&b| b != 0));
    assert_ne!(
        lib.unique_id().unwrap().internal,
        id.internal,
        "two ids are distinct"
    );
}

#[test]
fn the_stand_in_says_what_the_real_library_says() {
    let Some((_, lib)) = real() else { return };
    let fake = standin();
    for code in 0..=10 {
        let code = NcclResult(code);
        assert_eq!(fake.error_string(code), lib.error_string(code), "{code}");
    }
    assert_eq!(
        lib.error_string(NcclResult::IN_PROGRESS),
        "NCCL operation in progress"
    );
}

#[test]
fn init_without_a_gpu_fails_with_nccls_reason_typed() {
    let Some((_, lib)) = real() else { return };
    let (_store, cpu) = cpu_group(1, Duration::from_secs(30));
    // Host streams from the stand-in; the communicator itself is real NCCL's.
    let device = Device::standin_host(&standin()).unwrap();
    let err = GpuCommunicator::builder(&cpu[0], &device)
        .library(lib)
        .build()
        .unwrap_err();
    match &err {
        GpuError::Nccl {
            at,
            code,
            text,
            last_error,
        } => {
            assert_eq!(at.op, ringwire_gpu::GpuOp::Init);
            assert_eq!(*code, NcclResult::UNHANDLED_CUDA_ERROR);
            assert!(text.starts_with("unhandled cuda error"), "{text}");
            assert!(last_error.contains("Cuda failure"), "{last_error}");
        }
        other => panic!("{other}"),
    }
    eprintln!("{err}");
}

#[test]
fn the_loader_finds_the_wheel_through_a_python_on_path() {
    let Some((path, _)) = real() else { return };
    let with_other_dirs = std::env::join_paths([
        PathBuf::from("/nonexistent/bin"),
        venv().join("bin"),
        "/usr/bin".into(),
    ])
    .unwrap();
    assert_eq!(NcclLibrary::wheel_libraries(&with_other_dirs), vec![path]);
}
