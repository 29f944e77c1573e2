//! Shared helpers for the integration tests: start N ranks in this process
//! (one thread each, real TCP on loopback) and run the same closure on all.

#![allow(dead_code)]

pub(crate) mod launchers;
pub(crate) mod sweep;

use ringwire::store::StoreServer;
use ringwire::{Builder, Communicator};

/// Builds `world` communicators over loopback with a standalone store, with
/// `configure` applied to every builder.
pub(crate) fn local_group(
    world: usize,
    configure: impl Fn(Builder) -> Builder + Sync,
) -> (StoreServer, Vec<Communicator>) {
    local_group_per_rank(world, |_, b| configure(b))
}

/// As `local_group`, configuring each rank's builder knowing its rank.
#[allow(dead_code)] // not every test file configures ranks apart
pub(crate) fn local_group_per_rank(
    world: usize,
    configure: impl Fn(usize, Builder) -> Builder + Sync,
) -> (StoreServer, Vec<Communicator>) {
    ringwire::testing::local_group(world, configure)
}

/// Runs `f` on every communicator concurrently and returns the results in
/// rank order.
pub(crate) fn on_all<R: Send>(
    comms: &[Communicator],
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    ringwire::testing::on_all(comms, f)
}

/// The seed for this run: RINGWIRE_TEST_SEED if set, else fresh (printed).
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("RINGWIRE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(ringwire::testing::Rng::fresh_seed);
    eprintln!("seed {seed} (rerun with RINGWIRE_TEST_SEED={seed})");
    seed
}

/// The transport communicators of this run must use: what
/// RINGWIRE_TRANSPORT asks for, else the engine where io_uring works.
pub(crate) fn expected_transport() -> &'static str {
    match std::env::var("RINGWIRE_TRANSPORT").as_deref() {
        Ok("portable") => "portable",
        Ok("uring") => "uring",
        _ if ringwire_uring::probe().is_ok() => "uring",
        _ => "portable",
    }
}

/// Parametrises a test file over the transports: the default run uses the
/// engine (where io_uring works), and this runs every other test of the
/// same binary again on the portable transport, failing with its output if
/// any fails there. Call it from one test named `this_test`.
pub(crate) fn rerun_on_portable(this_test: &str) {
    if std::env::var_os("RINGWIRE_TRANSPORT").is_some() {
        return; // this *is* a parametrised run, or the user chose one transport
    }
    if expected_transport() == "portable" {
        eprintln!("note: io_uring does not work here; the default run was the portable one");
        return;
    }
    rerun_with(
        ("RINGWIRE_TRANSPORT", "portable"),
        &[this_test],
        "on the portable transport",
    );
}

/// Runs every other test of this binary again with links between local
/// ranks forced to TCP (`RINGWIRE_LOCAL_LINKS=tcp`; they are shared memory
/// by default), on the default transport. Call it from one test named
/// `this_test`.
pub(crate) fn rerun_over_tcp_local_links(this_test: &str) {
    rerun_over_local_links(this_test, "tcp", "over TCP local links");
}

/// Runs every other test of this binary again with links between local
/// ranks on Unix sockets (`RINGWIRE_LOCAL_LINKS=unix`; shared memory is the
/// default), on the default transport. Call it from one test named
/// `this_test`.
pub(crate) fn rerun_over_unix_links(this_test: &str) {
    rerun_over_local_links(this_test, "unix", "over Unix-socket links");
}

/// The reruns with `RINGWIRE_LOCAL_LINKS=links`, skipping the other
/// parametrised reruns (only the default run starts them).
fn rerun_over_local_links(this_test: &str, links: &str, there: &str) {
    if std::env::var_os("RINGWIRE_LOCAL_LINKS").is_some()
        || std::env::var_os("RINGWIRE_TRANSPORT").is_some()
    {
        return; // a parametrised run already
    }
    let skip = [
        this_test,
        "on_the_portable_transport_too",
        "over_tcp_local_links_too",
        "over_unix_links_too",
    ];
    rerun_with(("RINGWIRE_LOCAL_LINKS", links), &skip, there);
}

/// Runs this test binary again with `var` set, skipping `skip`; fails with
/// the output if any test fails there.
fn rerun_with((name, value): (&str, &str), skip: &[&str], there: &str) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = std::process::Command::new(exe);
    cmd.env(name, value).args(["--test-threads", "2"]);
    for s in skip {
        cmd.args(["--skip", s]);
    }
    let out = cmd.output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "these tests fail {there}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("test result: ok"), "{stdout}");
}

/// What links local ranks in this run: `shm` unless RINGWIRE_LOCAL_LINKS
/// says `tcp` or `unix`.
pub(crate) fn expected_local_link() -> &'static str {
    match std::env::var("RINGWIRE_LOCAL_LINKS").as_deref() {
        Ok("tcp") => "tcp",
        Ok("unix") => "unix",
        _ => "shm",
    }
}

/// Logs to stderr when RINGWIRE_TEST_LOG is set (an env-filter, e.g.
/// `ringwire=debug`), for chasing a failure.
pub(crate) fn init_logging() {
    if let Ok(filter) = std::env::var("RINGWIRE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// Issue 45's scenario under a real launcher: rank 2 kills itself
/// (SIGKILL) after five all-reduces; every other rank sees an op fail,
/// shrinks with the others, and checks an all-reduce on the shrunk
/// communicator (which only runs if the launcher left it alive). Returns
/// its rank there and the size.
pub(crate) fn lose_rank_2_and_go_on(comm: &Communicator) -> (usize, usize) {
    let rank = comm.rank();
    let shrunk = lose_rank_2(comm);
    let sum = shrunk
        .all_reduce(vec![1.0f32; 1000], ringwire::ReduceOp::Sum)
        .wait()
        .unwrap_or_else(|e| panic!("rank {rank}: all_reduce on the shrunk communicator: {e}"));
    let size = shrunk.world_size();
    assert!(
        sum.iter().all(|&x| x == size as f32),
        "rank {rank}: {}",
        sum[0]
    );
    (shrunk.rank(), size)
}

/// Rank 2 kills itself (SIGKILL) at its sixth all-reduce; the others
/// find out and shrink: their communicator without it.
#[allow(dead_code)] // not every test file loses a rank
pub(crate) fn lose_rank_2(comm: &Communicator) -> Communicator {
    let rank = comm.rank();
    for op in 0.. {
        if rank == 2 && op == 5 {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
        if let Err(e) = comm
            .all_reduce(vec![1.0f32; 1000], ringwire::ReduceOp::Sum)
            .wait()
        {
            println!("rank {rank}: op {op} failed: {e}");
            break;
        }
        assert!(op < 100_000, "rank {rank}: no op failed");
    }
    comm.shrink()
        .wait()
        .unwrap_or_else(|e| panic!("rank {rank}: shrink: {e}"))
}
