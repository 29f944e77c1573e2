//! The harness under a real torchrun, as docs/perf.md tells users to run it:
//! torchrun's agent hosts a TCPStore on MASTER_PORT and every rank joins it.

#[allow(dead_code)]
#[path = "../../tests/common/launchers.rs"]
mod launchers;

use std::net::TcpListener;

#[test]
fn the_bench_under_torchruns_default_launch() {
    let Some(torchrun) = launchers::torchrun() else {
        return;
    };
    // The port moved off torchrun's 29500 so test runs cannot collide.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut cmd = launchers::torchrun_command(&torchrun);
    let out = cmd
        .args([
            "--nproc-per-node",
            "4",
            "--master-port",
            &port,
            "--no-python",
        ])
        .arg(env!("CARGO_BIN_EXE_ringwire-bench"))
        .args(["all_reduce", "-b", "8", "-e", "64K", "-n", "5", "-w", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    // Rank 0 prints the table: 4 ranks, every size checked.
    assert!(
        stdout.contains("# ranks: 4") || stdout.contains("4 ranks"),
        "{stdout}"
    );
    assert!(stdout.contains("# wrong elements: 0 (OK)"), "{stdout}");
    let rows = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("uring") || l.trim_start().starts_with("portable"))
        .count();
    assert!(rows >= 14, "a row per size and transport: {stdout}");
}
