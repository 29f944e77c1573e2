//! The training examples as CI runs them, each checked by the example
//! itself against one process; the exit status is the verdict, and the
//! printout must say which check held. `examples/ddp.rs`: data-parallel
//! training on the digits (bit-identical at 2 ranks, within its stated
//! tolerance at 4). `examples/elastic.rs`: the same with a rank killed at
//! a random step, the others going on and a replacement rejoining
//! (bit-identical to one process replaying the membership).

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
    run_example("ddp", args)
}

fn run_example(name: &str, args: &[&str]) -> String {
    let out = Command::new(example(name))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .env_remove("RINGWIRE_REJOIN")
        .output()
        .expect("run the example");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} {args:?} failed:\n{text}");
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

/// A random rank killed at a random step (the seed is printed), at 4
/// ranks; then at 3, rank 0 (the seed picks it), whose place every other
/// rank dials.
#[test]
fn a_killed_rank_is_replaced_and_training_matches_one_process() {
    for args in [&["--ranks", "4"][..], &["--ranks", "3", "--seed", "1"]] {
        let text = run_example("elastic", args);
        for said in [
            "going on with",
            "a replacement) joined at step",
            "extra state intact: yes",
            "holds the same parameters: yes",
            "bit-identical",
        ] {
            assert!(text.contains(said), "{args:?}: no {said:?} in\n{text}");
        }
    }
}
