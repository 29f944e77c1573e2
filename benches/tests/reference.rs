//! `docs/reference/bench.md` holds `ringwire-bench --help` as the binary
//! prints it: this test fails when they differ (`RINGWIRE_BLESS=1 cargo
//! test -p ringwire-bench --test reference` rewrites the page). The bench's
//! own unit tests check that `--help` lists every flag the parser takes.

use std::path::PathBuf;
use std::process::Command;

const PAGE: &str = "docs/reference/bench.md";

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ringwire-bench"))
        .arg("--help")
        .output()
        .expect("run ringwire-bench --help");
    assert!(out.status.success(), "--help exits 0");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

fn render(help: &str) -> String {
    format!(
        "# ringwire-bench reference\n\
         \n\
         Every flag of `ringwire-bench`, exactly as `ringwire-bench --help` prints it (a test\n\
         compares the two: `RINGWIRE_BLESS=1 cargo test -p ringwire-bench --test reference`\n\
         rewrites this page). The [benchmarking chapter](../guide/10-benchmarking.md) of the\n\
         guide explains the table and how to compare ringwire with Open MPI and gloo;\n\
         [docs/perf.md](../perf.md) holds the numbers. The bench also reads every variable of\n\
         the [configuration reference](configuration.md); its flags set the transport, the\n\
         links between local ranks, the job id and, with `--timeout`, the op timeout, and a\n\
         variable they override is named in a warning at start.\n\
         \n\
         ```text\n\
         {help}```\n"
    )
}

#[test]
fn the_bench_reference_is_its_help() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(PAGE);
    let rendered = render(&help());
    if std::env::var_os("RINGWIRE_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("the page written");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "{PAGE} differs from `ringwire-bench --help`: rewrite it with `RINGWIRE_BLESS=1 cargo \
         test -p ringwire-bench --test reference` and review the diff"
    );
}
