//! Helpers for ringwire-gpu's tests: the stand-in NCCL (built on demand),
//! CPU communicators on loopback with one thread per rank, and GPU
//! communicators over them on the stand-in's host device.

#![allow(dead_code)]

use ringwire::store::StoreServer;
use ringwire::{Builder, Communicator};
use ringwire_gpu::{Device, GpuCommunicator, NcclLibrary};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The stand-in's `.so`: `RINGWIRE_STANDIN_NCCL` if set, else built with
/// cargo (the workspace's debug profile) on first use.
pub(crate) fn standin_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("RINGWIRE_STANDIN_NCCL") {
            return PathBuf::from(p);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(cargo)
            .current_dir(&root)
            .args([
                "build",
                "-q",
                "-p",
                "ringwire-nccl-standin",
                "--message-format=json",
            ])
            .output()
            .expect("run cargo build for the stand-in NCCL");
        assert!(
            out.status.success(),
            "building the stand-in NCCL failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let name = "libringwire_nccl_standin.so";
        let end = text
            .find(&format!("{name}\""))
            .expect("cargo names the stand-in's .so")
            + name.len();
        let start = text[..end].rfind('"').expect("a quoted path") + 1;
        PathBuf::from(&text[start..end])
    })
    .clone()
}

/// The stand-in, opened through the production loader.
pub(crate) fn standin() -> Arc<NcclLibrary> {
    NcclLibrary::open(standin_path()).expect("open the stand-in NCCL")
}

/// `world` CPU communicators on loopback, one per rank.
pub(crate) fn cpu_group(world: usize, timeout: Duration) -> (StoreServer, Vec<Communicator>) {
    cpu_group_with(world, timeout, |b| b)
}

/// As [`cpu_group`], with `configure` applied to every builder.
pub(crate) fn cpu_group_with(
    world: usize,
    timeout: Duration,
    configure: impl Fn(Builder) -> Builder + Sync,
) -> (StoreServer, Vec<Communicator>) {
    ringwire::testing::local_group(world, |_, b| configure(b.timeout(timeout)))
}

/// GPU communicators over `cpu` on the stand-in's host device.
pub(crate) fn gpu_group(cpu: &[Communicator], timeout: Duration) -> Vec<GpuCommunicator> {
    let lib = standin();
    let device = Device::standin_host(&lib).expect("the stand-in's host device");
    on_all(cpu, |c| {
        GpuCommunicator::builder(c, &device)
            .library(lib.clone())
            .timeout(timeout)
            .build()
            .expect("make the GPU communicator")
    })
}

/// Runs `f` on every item concurrently (one thread each), results in order.
pub(crate) fn on_all<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    ringwire::testing::on_all(items, f)
}

/// The seed: RINGWIRE_TEST_SEED, else fresh (printed, to rerun a failure).
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("RINGWIRE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(ringwire::testing::Rng::fresh_seed);
    eprintln!("RINGWIRE_TEST_SEED={seed}");
    seed
}
