//! The launch commands of the guide (docs/guide/01-launching.md, "Every
//! launcher"), run as written on this host. The only changes are the ones
//! a user on one test machine must make: the path of the built bench, a
//! free port or endpoint instead of 29400/29500 (so runs cannot collide),
//! `127.0.0.1` for `node01`, and mpirun's `--allow-run-as-root
//! --oversubscribe` (root in containers, more ranks than cores). A command
//! added to that block must be run here or listed with the reason it
//! cannot be (several hosts, Slurm), or the first test fails.

#[allow(dead_code)]
#[path = "../../tests/common/launchers.rs"]
mod launchers;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Output, Stdio};

const GUIDE: &str = "docs/guide/01-launching.md";
const BENCH_IN_GUIDE: &str = "./target/release/ringwire-bench";

/// The commands of the guide's "Every launcher" block, one per line
/// (continuations joined, comments dropped).
fn guide_commands() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(GUIDE);
    let text = std::fs::read_to_string(&path).expect("the guide's launching chapter");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Every launcher"))
        .expect("a section \"Every launcher\"");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a ```sh block in it");
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                commands.push(current.split_whitespace().collect::<Vec<_>>().join(" "));
                current.clear();
            }
        }
    }
    commands
}

/// What the tests do with a command of the guide: run it here (which
/// test), or why they cannot.
fn plan(command: &str) -> Result<&'static str, &'static str> {
    if command.starts_with("srun ") {
        return Err(
            "no Slurm on the test machines; srun's variables are tested in src/env/tests.rs",
        );
    }
    if command.starts_with("mpirun ") && command.contains("--host node01") {
        return Err("several hosts: the test machines are single hosts");
    }
    if command.contains("./my-trainer") {
        return Err(
            "a user's own trainer: tests/torchrun.rs runs an elastic restart with --max-restarts",
        );
    }
    Ok(match command {
        c if c.starts_with("torchrun --nproc-per-node 4 --no-python") => {
            "the_guides_torchrun_on_one_host"
        }
        c if c.starts_with("torchrun --nnodes 2") => "the_guides_two_torchrun_agents",
        c if c.starts_with("mpirun -np 4 -x MASTER_PORT=") => {
            "the_guides_mpirun_with_a_chosen_port"
        }
        c if c.starts_with("mpirun -np 4 ") => "the_guides_mpirun_on_one_host",
        _ => return Err(""),
    })
}

/// The launch commands of the README's "Launching" section.
fn readme_commands() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&path).expect("the README");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Launching"))
        .expect("a section \"Launching\" in the README");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a ```sh block in it");
    block
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn the_readmes_launches_are_the_guides() {
    let guide = guide_commands();
    let readme = readme_commands();
    assert!(!readme.is_empty(), "the README's Launching block is empty");
    for command in readme {
        assert!(
            guide.contains(&command),
            "the README shows `{command}`, which {GUIDE}'s \"Every launcher\" block (run by these \
             tests) does not"
        );
    }
}

#[test]
fn every_launch_in_the_guide_is_run_or_said_why_not() {
    let commands = guide_commands();
    assert!(
        commands.len() >= 8,
        "the block lost its commands: {commands:?}"
    );
    let mut run = Vec::new();
    for command in &commands {
        match plan(command) {
            Ok(test) => run.push(test),
            Err("") => panic!(
                "{GUIDE} shows `{command}`, which no test runs: run it in benches/tests/guide_launches.rs, \
                 or say in `plan` why it cannot run here"
            ),
            Err(why) => eprintln!("not run here: `{command}`: {why}"),
        }
    }
    for test in [
        "the_guides_torchrun_on_one_host",
        "the_guides_two_torchrun_agents",
        "the_guides_mpirun_on_one_host",
        "the_guides_mpirun_with_a_chosen_port",
    ] {
        assert!(
            run.contains(&test),
            "{test} runs a command the guide no longer shows"
        );
    }
}

/// The guide's command starting with `prefix`, as words, with this test
/// machine's substitutions.
fn guide_command(prefix: &str, substitutions: &[(&str, &str)]) -> Vec<String> {
    let command = guide_commands()
        .into_iter()
        .find(|c| c.starts_with(prefix))
        .unwrap_or_else(|| panic!("{GUIDE} has no command starting `{prefix}`"));
    let mut line = command.replace(BENCH_IN_GUIDE, env!("CARGO_BIN_EXE_ringwire-bench"));
    for (from, to) in substitutions {
        assert!(line.contains(from), "`{command}` has no `{from}`");
        line = line.replace(from, to);
    }
    line.split_whitespace().map(str::to_string).collect()
}

fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// Runs `words` (the launcher first) with the launch variables this test
/// process may carry removed (`torchrun_command` removes them for any
/// launcher).
fn spawn(words: &[String]) -> std::process::Child {
    let launcher = &words[0];
    let mut cmd = match launcher.as_str() {
        "torchrun" => launchers::torchrun_command(&launchers::venv().join("bin/torchrun")),
        _ => launchers::torchrun_command(std::path::Path::new(launcher)),
    };
    cmd.args(&words[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {words:?}: {e}"))
}

/// Checks that the sweep ran on `ranks` ranks and every result was right.
fn assert_checked(outs: &[Output], ranks: usize) {
    let all: String = outs
        .iter()
        .map(|o| {
            format!(
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    for out in outs {
        assert!(out.status.success(), "{all}");
    }
    assert!(all.contains(&format!(": {ranks} ranks, dtype")), "{all}");
    assert_eq!(all.matches("# wrong elements: 0 (OK)").count(), 1, "{all}");
    let rows = all
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("uring") || l.starts_with("portable")
        })
        .count();
    assert!(
        rows >= 18,
        "a row per size (8 B .. 1 MiB) and transport: {all}"
    );
}

/// mpirun's words with the flags a root container with few cores needs.
fn under_mpirun(mut words: Vec<String>) -> Vec<String> {
    let extra = ["--allow-run-as-root", "--oversubscribe", "--timeout", "120"];
    words.splice(1..1, extra.iter().map(|s| s.to_string()));
    words
}

#[test]
fn the_guides_torchrun_on_one_host() {
    if launchers::torchrun().is_none() {
        return;
    }
    let port = format!("--master-port {} --no-python", free_port());
    let words = guide_command(
        "torchrun --nproc-per-node 4 --no-python",
        &[("--no-python", &port)],
    );
    let out = spawn(&words).wait_with_output().unwrap();
    assert_checked(&[out], 4);
}

#[test]
fn the_guides_two_torchrun_agents() {
    if launchers::torchrun().is_none() {
        return;
    }
    let endpoint = format!("127.0.0.1:{}", free_port());
    let id = format!("guide-{}", std::process::id());
    let words = guide_command(
        "torchrun --nnodes 2",
        &[("node01:29400", &endpoint), ("job42", &id)],
    );
    let agents: Vec<_> = (0..2).map(|_| spawn(&words)).collect();
    let outs: Vec<Output> = agents
        .into_iter()
        .map(|a| a.wait_with_output().unwrap())
        .collect();
    assert_checked(&outs, 8);
}

#[test]
fn the_guides_mpirun_on_one_host() {
    if launchers::mpirun().is_none() {
        return;
    }
    let words = under_mpirun(guide_command("mpirun -np 4 ./", &[]));
    let out = spawn(&words).wait_with_output().unwrap();
    assert_checked(&[out], 4);
}

#[test]
fn the_guides_mpirun_with_a_chosen_port() {
    if launchers::mpirun().is_none() {
        return;
    }
    let port = format!("MASTER_PORT={}", free_port());
    let words = under_mpirun(guide_command(
        "mpirun -np 4 -x MASTER_PORT=",
        &[("MASTER_PORT=29500", &port)],
    ));
    let out = spawn(&words).wait_with_output().unwrap();
    assert_checked(&[out], 4);
}
