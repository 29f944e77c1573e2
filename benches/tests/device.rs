//! `--device`: the sweep on device buffers through ringwire-gpu. Without a
//! GPU, on the stand-in NCCL's host device (`--device standin`, the .so
//! built on demand as gpu/tests/common does); `--device cuda` here must
//! fail with a reason, not a panic. No timing assertions.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The stand-in's `.so`: `RINGWIRE_STANDIN_NCCL` if set, else built with
/// cargo (the workspace's debug profile) on first use.
fn standin_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("RINGWIRE_STANDIN_NCCL") {
            return PathBuf::from(p);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(cargo)
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

/// Runs the bench with `args`; `standin`: with RINGWIRE_NCCL_LIB at the
/// stand-in. (success, stdout, stderr)
fn bench(args: &[&str], standin: bool) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringwire-bench"));
    cmd.args(args).env_remove("RINGWIRE_NCCL_LIB");
    if standin {
        cmd.env("RINGWIRE_NCCL_LIB", standin_path());
    }
    let out = cmd.output().expect("run ringwire-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// (label, size, #wrong) of every data row.
fn rows(stdout: &str) -> Vec<(String, usize, u64)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.len() > 9)
        .map(|cols| {
            (
                cols[0].to_string(),
                cols[1].parse().expect("a number in the size column"),
                cols[9].parse().expect("a number in the #wrong column"),
            )
        })
        .collect()
}

fn assert_no_panic(stderr: &str) {
    for sign in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(sign), "{sign}:\n{stderr}");
    }
}

#[test]
fn standin_device_sweeps_all_reduce_and_all_gather_correctly() {
    let dir = std::env::temp_dir().join(format!("ringwire-bench-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let (ok, out, err) = bench(
        &[
            "all_reduce,all_gather",
            "--device",
            "standin",
            "--ranks",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        true,
    );
    assert!(ok, "{out}\n{err}");
    assert_no_panic(&err);
    assert!(out.contains("# device: stand-in NCCL host device"), "{out}");
    let sections: Vec<&str> = out.split("\n#\n# ").skip(1).collect();
    assert_eq!(sections.len(), 2, "{out}");
    // 8 B to 64 KiB by 8: all-gather's sizes round down to whole blocks
    // of two ranks' elements (8 B is one f32 per rank).
    let sizes = [8, 64, 512, 4096, 32768, 65536];
    for (op, section) in ["all_reduce", "all_gather"].iter().zip(&sections) {
        assert!(section.starts_with(&format!("{op}\n")), "{op}:\n{section}");
        let rows = rows(section);
        assert_eq!(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            sizes,
            "one row per size:\n{section}"
        );
        for (label, _, wrong) in &rows {
            assert_eq!(label, "nccl", "{section}");
            assert_eq!(*wrong, 0, "{op}:\n{section}");
        }
        assert!(section.contains("# wrong elements: 0 (OK)"), "{section}");
    }
    for op in ["all_reduce", "all_gather"] {
        let path = dir.join(format!("r.{op}.json"));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["device"], "stand-in NCCL host device", "{doc}");
        assert!(doc["nccl"].as_str().unwrap().contains("standin"), "{doc}");
        assert_eq!(doc["rows"].as_array().unwrap().len(), sizes.len(), "{doc}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The check reads results back from the device: a corrupted one counts.
#[test]
fn standin_device_counts_a_wrong_result_and_fails() {
    let (ok, out, err) = bench(
        &[
            "reduce_scatter",
            "--device",
            "standin",
            "--ranks",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
            "-w",
            "0",
            "--inject-wrong",
        ],
        true,
    );
    assert!(!ok, "a wrong result must fail the run:\n{out}\n{err}");
    assert_no_panic(&err);
    assert!(rows(&out).iter().any(|r| r.2 > 0), "{out}");
    assert!(out.contains("(FAILED)"), "{out}");
}

#[test]
fn standin_device_without_its_library_says_what_to_set() {
    let (ok, out, err) = bench(
        &[
            "all_reduce",
            "--device",
            "standin",
            "--ranks",
            "1",
            "-e",
            "8",
        ],
        false,
    );
    assert!(!ok, "{out}\n{err}");
    assert_no_panic(&err);
    assert!(err.contains("RINGWIRE_NCCL_LIB"), "{err}");
}

/// This machine has no GPU (or, built with `cuda`, the test checks that
/// one really runs). Without the feature the run is refused before any
/// rank starts; with it each rank says why CUDA cannot be used.
#[test]
fn cuda_device_without_a_gpu_fails_with_a_reason() {
    let (ok, out, err) = bench(
        &[
            "all_reduce",
            "--device",
            "cuda",
            "--ranks",
            "1",
            "-b",
            "8",
            "-e",
            "1K",
            "-n",
            "2",
            "-w",
            "1",
        ],
        false,
    );
    assert_no_panic(&err);
    if cfg!(feature = "cuda") && ringwire_gpu::available(0).is_ok() {
        assert!(ok, "{out}\n{err}");
        assert!(rows(&out).iter().all(|r| r.2 == 0), "{out}");
        return;
    }
    assert!(!ok, "{out}\n{err}");
    if cfg!(feature = "cuda") {
        // Device::cuda's or NCCL's reason, from the rank.
        assert!(
            err.contains("--device cuda: no CUDA") || err.contains("--device cuda: no NCCL"),
            "{err}"
        );
    } else {
        assert!(err.contains("--features cuda"), "{err}");
        assert_eq!(out, "", "refused before any rank starts");
    }
}
