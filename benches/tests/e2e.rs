//! End-to-end runs of the harness with local ranks: results checked, wrong
//! results detected, every op runs, output files written. No timing
//! assertions.

use std::process::Command;

fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringwire-bench"))
        .args(args)
        .output()
        .expect("run ringwire-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the bench with `args` and `--json`; asserts it succeeded and
/// returns its stdout and the JSON document.
fn bench_json(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("ringwire-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let (ok, out, err) = bench(&all);
    assert!(ok, "{out}\n{err}");
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    (out, doc)
}

/// The #wrong column of every data row (the short rows after the table
/// compare transports, size by size).
fn wrong_column(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.len() > 9)
        .map(|cols| cols[9].parse().expect("a number in the #wrong column"))
        .collect()
}

/// How many transports a default (`--transport all`) run measures here.
fn transports() -> usize {
    if ringwire_uring::probe().is_ok() {
        2
    } else {
        1
    }
}

#[test]
fn two_ranks_all_reduce_is_checked_and_correct() {
    let (ok, out, err) = bench(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "256K",
        "-f",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        "-c",
        "1",
    ]);
    assert!(ok, "{out}\n{err}");
    let wrong = wrong_column(&out);
    assert_eq!(
        wrong.len(),
        6 * transports(),
        "one row per size and transport:\n{out}"
    );
    assert!(wrong.iter().all(|w| *w == 0), "{out}");
    assert!(out.contains("# wrong elements: 0 (OK)"), "{out}");
    assert!(out.contains("# avg bus bandwidth:"), "{out}");
}

/// Also in a run of several ops: the run fails as a whole.
#[test]
fn a_wrong_result_is_counted_and_fails_the_run() {
    let (ok, out, err) = bench(&[
        "broadcast,all_reduce",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "2",
        "-w",
        "0",
        "--inject-wrong",
    ]);
    assert!(!ok, "a wrong result must fail the run:\n{out}\n{err}");
    assert!(wrong_column(&out).iter().any(|w| *w > 0), "{out}");
    assert!(out.contains("(FAILED)"), "{out}");
}

/// Every op, in one run of `all` (one table each, in the order of the usage).
#[test]
fn every_op_runs_with_three_ranks() {
    let (ok, out, err) = bench(&[
        "all", "--ranks", "3", "-b", "64", "-e", "96K", "-f", "32", "-n", "2", "-w", "1", "-d",
        "bf16", "-o", "max", "-r", "2",
    ]);
    assert!(ok, "{out}\n{err}");
    let ops = [
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "gather",
        "scatter",
        "barrier",
        "sendrecv",
        "pingpong",
    ];
    // Each op's section: its name, then its table and summary.
    let sections: Vec<&str> = out.split("\n#\n# ").skip(1).collect();
    assert_eq!(sections.len(), ops.len(), "{out}");
    for (op, section) in ops.iter().zip(&sections) {
        assert!(section.starts_with(&format!("{op}\n")), "{op}:\n{section}");
        let wrong = wrong_column(section);
        // Barrier has one size; the others 64 B, 2 KiB and 64 KiB, 96 KiB.
        let sizes = if *op == "barrier" { 1 } else { 4 };
        assert_eq!(wrong.len(), sizes * transports(), "{op}:\n{section}");
        assert!(wrong.iter().all(|w| *w == 0), "{op}:\n{section}");
        assert!(
            section.contains("# wrong elements: 0 (OK)"),
            "{op}:\n{section}"
        );
    }
}

/// The blocking slice forms, on shared-memory links (the arena runs the
/// small sizes): every op's results checked, and the header says which
/// forms ran.
#[test]
fn every_op_runs_blocking_on_shared_memory() {
    let (ok, out, err) = bench(&[
        "all",
        "--ranks",
        "3",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "64",
        "-n",
        "3",
        "-w",
        "1",
        "--local-links",
        "shm",
        "--blocking",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("blocking slice forms"), "{out}");
    let wrong = wrong_column(&out);
    assert!(!wrong.is_empty() && wrong.iter().all(|w| *w == 0), "{out}");
}

#[test]
fn several_ops_write_a_file_each() {
    let dir = std::env::temp_dir().join(format!("ringwire-bench-ops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let (ok, out, err) = bench(&[
        "all_gather,all_reduce",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    for op in ["all_gather", "all_reduce"] {
        let path = dir.join(format!("r.{op}.json"));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["op"], op);
        assert_eq!(doc["rows"].as_array().unwrap().len(), 2 * transports());
    }
    assert!(
        !json.exists(),
        "with several ops no file takes the plain name"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn json_csv_and_plot_are_written_and_link_limit_shown() {
    let dir = std::env::temp_dir().join(format!("ringwire-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Removed however the test ends (a failed assertion too).
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveOnDrop(dir.clone());
    let (json, csv, svg) = (dir.join("r.json"), dir.join("r.csv"), dir.join("r.svg"));
    let (ok, out, err) = bench(&[
        "all_gather",
        "--ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "--link-limit",
        // Not a divisor of the 256 MiB streamed: the buffers wrap mid-way.
        "--link-buffer",
        "3M",
        "--local-links",
        "all",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    // Both kinds of local link, each against its own limit.
    assert!(out.contains("# ring link limit (unix):"), "{out}");
    assert!(out.contains("from and into 3 MiB buffers"), "{out}");
    assert!(out.contains("# ring link limit (tcp):"), "{out}");
    assert!(
        out.contains("uring-tcp") || out.contains("portable-tcp"),
        "{out}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(doc["link_limit_gbps"].as_f64().is_some(), "{doc}");
    assert!(doc["link_limit_unix_gbps"].as_f64().is_some(), "{doc}");
    assert_eq!(doc["link_buffer_bytes"].as_u64(), Some(3 << 20), "{doc}");
    let rows = doc["rows"].as_array().unwrap();
    // Three sizes, three kinds of local link (unix, tcp, shm).
    assert_eq!(rows.len(), 3 * 3 * transports());
    assert!(
        rows.iter().all(|r| r["link_pct"].as_f64().is_some()),
        "{doc}"
    );
    assert!(
        rows.iter()
            .any(|r| r["transport"].as_str().unwrap().ends_with("-tcp"))
    );
    assert!(
        rows.iter()
            .any(|r| r["transport"].as_str().unwrap().ends_with("-shm"))
    );
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap().lines().count(),
        1 + 3 * 3 * transports()
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg_text.contains("<svg") && svg_text.contains("portable"),
        "svg lacks the series label"
    );
}

#[test]
fn sizes_from_1_mib_are_compared_with_the_link_limit_around_them() {
    let (out, doc) = bench_json(
        "bracket",
        &[
            "all_reduce",
            "--ranks",
            "2",
            "-b",
            "256K",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--link-limit",
            "--local-links",
            "tcp",
        ],
    );
    assert!(
        out.contains("# ring link limit (tcp) around the sizes from 1 MiB:")
            && out.contains("CPU s per GB streamed"),
        "{out}"
    );
    let headline = doc["link_limit_gbps"].as_f64().unwrap();
    let rows = doc["rows"].as_array().unwrap();
    let tcp_rows: Vec<_> = rows.iter().filter(|r| r["link_kind"] == "tcp").collect();
    assert_eq!(tcp_rows.len(), 2 * transports(), "{doc}");
    for r in tcp_rows {
        let limit = r["link_limit_gbps"].as_f64().unwrap();
        // The stream's own CPU cost comes with it (all ranks' CPU time).
        let link_cpu = r["link_cpu_s_per_gb"].as_f64().unwrap();
        assert!(link_cpu > 0.0 && link_cpu.is_finite(), "{r}");
        let pct = r["link_pct"].as_f64().unwrap();
        let busbw = r["busbw_gbps"].as_f64().unwrap();
        assert!(
            (pct - busbw / limit * 100.0).abs() < 1e-6 * pct.max(1.0),
            "{r}"
        );
        // Below 1 MiB the limit measured before the sweep; from 1 MiB the
        // mean of two measured around the size (equal to the first only by
        // a coincidence of every bit).
        if r["size_bytes"].as_u64().unwrap() < 1 << 20 {
            assert_eq!(limit, headline, "{r}");
        } else {
            assert_ne!(limit, headline, "{r}");
        }
    }
}

#[test]
fn link_buffer_op_streams_each_sizes_limits_from_buffers_of_its_size() {
    let (out, doc) = bench_json(
        "opbuf",
        &[
            "all_reduce",
            "--ranks",
            "2",
            "-b",
            "512K",
            "-e",
            "2M",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "--transport",
            "uring",
            "--link-limit",
            "--link-buffer",
            "op",
        ],
    );
    assert!(out.contains("buffers as large as the size"), "{out}");
    let rows = doc["rows"].as_array().unwrap();
    let buffer_of = |size: u64| {
        let row = rows.iter().find(|r| r["size_bytes"] == size).unwrap();
        assert!(row["link_cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{row}");
        row["link_buffer_bytes"].as_u64()
    };
    // Below 1 MiB, the limit measured before the sweep (4 MiB buffers);
    // from 1 MiB, limits streamed from buffers the size of the op.
    assert_eq!(buffer_of(512 << 10), Some(4 << 20), "{doc}");
    assert_eq!(buffer_of(2 << 20), Some(2 << 20), "{doc}");
}

#[test]
fn link_socket_buffer_sizes_the_limits_sockets_and_says_so() {
    let (out, doc) = bench_json(
        "sockbuf",
        &[
            "all_reduce",
            "--ranks",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
            "-w",
            "1",
            "--link-limit",
            "--local-links",
            "all",
            "--link-socket-buffer",
            "256K",
        ],
    );
    for kind in ["unix", "tcp"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("# ring link limit ({kind}):")))
            .unwrap_or_else(|| panic!("no {kind} limit in {out}"));
        assert!(line.contains("socket buffers set to 256 KiB"), "{line}");
    }
    assert_eq!(doc["link_socket_buffer_bytes"], 256 << 10, "{doc}");
}

#[test]
fn a_failing_rank_fails_the_run_with_its_rank_named() {
    // sendrecv needs two ranks; with one, the rank errors out.
    let (ok, _out, err) = bench(&["sendrecv", "--ranks", "1"]);
    assert!(!ok);
    assert!(
        err.contains("rank 0") && err.contains("at least 2 ranks"),
        "{err}"
    );
    let (ok, _, err) = bench(&["all_reduce", "--transport", "quic", "--ranks", "1"]);
    assert!(!ok);
    assert!(err.contains("--transport") && err.contains("quic"), "{err}");
}

#[test]
fn the_launcher_reports_the_core_to_core_round_trip_around_the_run() {
    let (ok, out, err) = bench(&[
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "2",
    ]);
    assert!(ok, "{out}\n{err}");
    let trips: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("# core-to-core round trip"))
        .collect();
    if ringwire_uring::usable_core_ids().len() < 2 {
        assert!(trips.is_empty(), "{out}");
        return;
    }
    assert_eq!(trips.len(), 2, "{out}");
    let first = out.lines().next().unwrap();
    let last = out.lines().last().unwrap();
    assert!(first.contains("before the ranks start: "), "{out}");
    assert!(last.contains("after they end: "), "{out}");
    for line in [first, last] {
        let ns: u64 = line
            .rsplit(": ")
            .next()
            .and_then(|t| t.strip_suffix(" ns"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no round trip in {line}"));
        assert!(ns > 0, "{line}");
    }
}

#[test]
fn core_round_trip_prints_the_probe_alone() {
    let (ok, out, err) = bench(&["core-round-trip"]);
    if ringwire_uring::usable_core_ids().len() < 2 {
        assert!(
            !ok && err.contains("fewer than two usable cores"),
            "{out}\n{err}"
        );
        return;
    }
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let ns: u64 = out
        .trim_end()
        .strip_prefix("# core-to-core round trip (cores ")
        .and_then(|l| l.split(") now: ").nth(1))
        .and_then(|t| t.strip_suffix(" ns"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no round trip in {out:?}"));
    assert!(ns > 0, "{out}");
}

/// The bench with `args` and the variable `var` set to `value`.
fn bench_with(var: &str, value: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringwire-bench"))
        .args(args)
        .env(var, value)
        .output()
        .expect("run ringwire-bench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ringwire_timeout_is_read_and_an_overriding_flag_says_so() {
    let run = [
        "all_reduce",
        "--ranks",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "-w",
        "0",
    ];
    // Without --timeout the bench leaves RINGWIRE_TIMEOUT to the library,
    // which refuses a value it cannot read, naming it.
    let (ok, out, err) = bench_with("RINGWIRE_TIMEOUT", "soon", &run);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains("RINGWIRE_TIMEOUT=soon"), "{err}");
    let (ok, out, err) = bench_with("RINGWIRE_TIMEOUT", "30", &run);
    assert!(ok, "{out}\n{err}");
    assert!(
        !err.contains("RINGWIRE_TIMEOUT"),
        "nothing overrides it: {err}"
    );
    // --timeout wins over the variable, and every rank says so at start.
    let mut flagged = run.to_vec();
    flagged.extend(["--timeout", "7"]);
    let (ok, out, err) = bench_with("RINGWIRE_TIMEOUT", "30", &flagged);
    assert!(ok, "{out}\n{err}");
    let said = err
        .lines()
        .filter(|l| l.contains("RINGWIRE_TIMEOUT=30 is set, but Builder::timeout gave 7 s"))
        .count();
    assert!(said >= 2, "each rank names the overridden variable: {err}");
}
