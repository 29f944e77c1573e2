//! `examples/ddp.rs` as CI runs it: data-parallel training on the digits,
//! checked by the example itself against one process (bit-identical at 2
//! ranks, within its stated tolerance at 4); its exit status is the
//! verdict, and its printout must say which check held.

use std::path::PathBuf;
use std::process::Command;

/// An example `cargo test` built beside this test binary.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: `cargo test` builds the examples, `cargo test --test ddp_example` alone does not (cargo build --examples)",
        path.display()
    );
    path
}

fn run(args: &[&str]) -> String {
    let out = Command::new(example("ddp"))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .output()
        .expect("run the ddp example");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "ddp {args:?} failed:\n{text}");
    text
}

#[test]
fn two_ranks_train_bit_identical_to_one_process() {
    let text = run(&["--ranks", "2", "--epochs", "2"]);
    assert!(
        text.contains("bit-identical required at 2 ranks: held"),
        "{text}"
    );
    assert!(
        text.contains("every rank holds the same parameters: yes"),
        "{text}"
    );
    assert!(text.contains("the loss falls"), "{text}");
}

#[test]
fn four_ranks_train_within_the_stated_tolerance() {
    let text = run(&["--ranks", "4", "--epochs", "2"]);
    assert!(text.contains("within 1e-4 required: held"), "{text}");
}
