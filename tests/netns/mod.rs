//! Collectives across a real (virtual) network: two network namespaces this
//! test creates, joined by a veth pair with `tc netem` adding 5 ms of delay
//! and 1% loss each way. Collectives must stay correct; cutting the link
//! must fail them cleanly on both sides. Needs root and `ip`/`tc`
//! (iproute2); skips with a printed reason without root, or where the
//! kernel refuses unless `CI=true`, where that fails.
//! Everything it creates it removes, also on failure. Part of the
//! multi-process test binary, whose `child_rank` plays the ranks.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The two namespaces and their veth pair; removed on drop.
struct TestNet {
    ns: [String; 2],
    ip: [String; 2],
    /// The veth end inside each namespace.
    veth: [String; 2],
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl TestNet {
    fn create(tag: &str) -> Result<TestNet, String> {
        let id = std::process::id() % 10_000;
        let subnet = 100 + id % 150;
        let net = TestNet {
            ns: [format!("rw{tag}a{id}"), format!("rw{tag}b{id}")],
            ip: [format!("10.213.{subnet}.1"), format!("10.213.{subnet}.2")],
            veth: [format!("v{tag}a{id}"), format!("v{tag}b{id}")],
        };
        // From here on, Drop removes whatever was made.
        run(&["ip", "netns", "add", &net.ns[0]])?;
        run(&["ip", "netns", "add", &net.ns[1]])?;
        let [va, vb] = &net.veth;
        run(&["ip", "link", "add", va, "type", "veth", "peer", "name", vb])?;
        for ((ns, ip), veth) in net.ns.iter().zip(&net.ip).zip(&net.veth) {
            run(&["ip", "link", "set", veth, "netns", ns])?;
            let cidr = format!("{ip}/24");
            run(&["ip", "-n", ns, "addr", "add", &cidr, "dev", veth])?;
            run(&["ip", "-n", ns, "link", "set", veth, "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

fn spawn_in(net: &TestNet, rank: usize, mode: &str, extra: &[(&str, &str)]) -> Child {
    spawn_of(net, (rank, 2, 1), mode, extra)
}

/// Rank `rank` of `world`, in the namespace of ranks `per_ns` at a time
/// (ranks 0 .. per_ns in the first).
fn spawn_of(
    net: &TestNet,
    (rank, world, per_ns): (usize, usize, usize),
    mode: &str,
    extra: &[(&str, &str)],
) -> Child {
    // This test binary plays the ranks (its `child_rank`).
    let child_exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.ns[rank / per_ns]])
        .arg(child_exe)
        .args([
            "--exact",
            "child_rank",
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("RINGWIRE_TEST_CHILD", "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("RINGWIRE_TEST_PER_NS", per_ns.to_string())
        .env("MASTER_ADDR", &net.ip[0])
        .env("MASTER_PORT", "29517")
        .env("RINGWIRE_TEST_SEED", "7")
        .env("RINGWIRE_TEST_MODE", mode)
        .env("RINGWIRE_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank in its namespace")
}

/// Waits for every child rank and asserts each ran its sweep.
fn all_ran_the_sweep(children: Vec<Child>) {
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success() && text(&out).contains("CHILD-OK"),
            "rank {rank}:\n{}",
            text(&out)
        );
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The test's network, or `None` (having said why) where none can be made:
/// without root (no install brings it), or, unless CI asked for every test
/// to run, without `ip` (iproute2, which `.ci/setup-launchers` installs).
fn try_net(tag: &str) -> Option<TestNet> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP: network namespaces need root");
        return None;
    }
    match TestNet::create(tag) {
        Ok(n) => Some(n),
        Err(e) if crate::common::launchers::in_ci() => {
            panic!("network namespaces are needed, and CI=true: {e}")
        }
        Err(e) => {
            eprintln!("SKIP: network namespaces unavailable here: {e}");
            None
        }
    }
}

#[test]
fn collectives_stay_correct_over_delay_and_loss() {
    let Some(net) = try_net("n") else { return };
    for i in 0..2 {
        let dev = net.veth[i].clone();
        let netem = [
            "tc", "-n", &net.ns[i], "qdisc", "add", "dev", &dev, "root", "netem", "delay", "5ms",
            "loss", "1%",
        ];
        if let Err(e) = run(&netem) {
            // Kernels without sch_netem still give a real veth hop between
            // namespaces; say that the delay and loss are missing.
            eprintln!("NOTE: tc netem unavailable ({e}); running over plain veth");
            break;
        }
    }
    let children: Vec<_> = (0..2).map(|r| spawn_in(&net, r, "netem", &[])).collect();
    all_ran_the_sweep(children);
}

/// A job of two hosts (namespaces) of two ranks each, shared memory asked
/// for: ranks inside a namespace share memory, ranks across it talk TCP,
/// and the sweep's collectives are right on the mixed links (issue 31,
/// part 6).
#[test]
fn two_namespaces_of_two_ranks_share_memory_inside_and_tcp_across() {
    let Some(net) = try_net("m") else { return };
    let extra = [("RINGWIRE_LOCAL_LINKS", "shm")];
    all_ran_the_sweep(two_hosts_of_two(&net, "netem", &extra));
}

/// Two namespaces of one rank, four TCP lanes each way (decision 0034):
/// the sweep is right over a real veth hop with its large payloads in
/// pieces, and every lane carried some.
#[test]
fn four_lanes_across_namespaces_carry_the_sweep() {
    let Some(net) = try_net("w") else { return };
    let extra = [
        ("RINGWIRE_TCP_LANES", "4"),
        ("RINGWIRE_TEST_EXPECT_LANES", "4"),
    ];
    let children: Vec<_> = (0..2).map(|r| spawn_in(&net, r, "netem", &extra)).collect();
    all_ran_the_sweep(children);
}

/// Ranks 0 and 1 in the first namespace, 2 and 3 in the second.
fn two_hosts_of_two(net: &TestNet, mode: &str, extra: &[(&str, &str)]) -> Vec<Child> {
    (0..4)
        .map(|r| spawn_of(net, (r, 4, 2), mode, extra))
        .collect()
}

/// The same two hosts of two ranks, told to run collectives in two levels
/// (decision 0033): all-reduces reduce-scatter over shared memory within
/// each namespace, all-reduce shards over TCP across, and all-gather
/// within; the sweep's results are right, and the stats count the ops as
/// two-level.
#[test]
fn two_namespaces_of_two_ranks_run_all_reduce_in_two_levels() {
    let Some(net) = try_net("l") else { return };
    let extra = [
        ("RINGWIRE_LOCAL_LINKS", "shm"),
        ("RINGWIRE_TWO_LEVEL", "always"),
        ("RINGWIRE_TEST_EXPECT_TWO_LEVEL", "1"),
    ];
    all_ran_the_sweep(two_hosts_of_two(&net, "netem", &extra));
}

/// Two hosts of two ranks in a loop of two-level all-reduces (8 MiB: two
/// pipelined pieces); rank 3 is killed. Every other rank's op fails within
/// seconds, rank 0 too, though none of its groups holds rank 3 (the host
/// of ranks 0 and 1, the cross group of 0 and 2): the failing ranks'
/// abort of the parent reaches it, nested into its groups.
#[test]
fn a_rank_killed_in_a_two_level_all_reduce_fails_every_other_rank() {
    let Some(net) = try_net("k") else { return };
    let extra = [
        ("RINGWIRE_LOCAL_LINKS", "shm"),
        ("RINGWIRE_TWO_LEVEL", "always"),
        ("RINGWIRE_TEST_LEN", "2097152"),
    ];
    let mut children = two_hosts_of_two(&net, "loop", &extra);
    std::thread::sleep(Duration::from_millis(2000));
    children[3].kill().unwrap();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for (rank, c) in children.into_iter().enumerate().take(3) {
        let out = c.wait_with_output().unwrap();
        let t = text(&out);
        let line = t
            .lines()
            .find(|l| l.contains("CHILD-LOOP-ERR"))
            .unwrap_or_else(|| panic!("rank {rank} reported no error:\n{t}"));
        eprintln!("rank {rank}: {line}");
        let at: u128 = line
            .split_whitespace()
            .skip_while(|w| *w != "CHILD-LOOP-ERR")
            .nth(1)
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("rank {rank}: no time in {line}"));
        assert!(
            at.saturating_sub(killed_at) < 5000,
            "rank {rank} failed {} ms after the kill: {line}",
            at.saturating_sub(killed_at)
        );
    }
}

#[test]
fn cutting_the_link_fails_both_sides_cleanly() {
    let Some(net) = try_net("c") else { return };
    let extra = [("RINGWIRE_HEARTBEAT_TIMEOUT", "2")];
    let children: Vec<_> = (0..2).map(|r| spawn_in(&net, r, "loop", &extra)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    run(&["ip", "-n", &net.ns[0], "link", "set", &net.veth[0], "down"]).unwrap();
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let t = text(&out);
        let line = t
            .lines()
            .find(|l| l.contains("CHILD-LOOP-ERR"))
            .unwrap_or_else(|| panic!("rank {rank} reported no error:\n{t}"));
        eprintln!("rank {rank}: {line}");
        assert!(
            line.contains(&format!("rank {}", 1 - rank)),
            "rank {rank} must name its peer: {line}"
        );
    }
}
