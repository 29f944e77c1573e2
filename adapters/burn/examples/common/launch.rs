//! `--ranks N`: this program started N times as local ranks, with the
//! variables torchrun sets (so torchrun, mpirun and srun start it unchanged).

use std::process::{Command, ExitCode};

/// Runs this executable as ranks 0..n with the same arguments, less
/// `--ranks N`, against a store this process holds; fails if any rank does.
pub(crate) fn local_ranks(n: usize, name: &str) -> ExitCode {
    let store = match ringwire::store::StoreServer::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: cannot start the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("{name}: cannot find this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut passthrough = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--ranks" {
            args.next();
        } else {
            passthrough.push(a);
        }
    }
    let children: Vec<_> = (0..n)
        .map(|rank| {
            Command::new(&exe)
                .args(&passthrough)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", store.local_addr().port().to_string())
                .env("RINGWIRE_HOST_STORE", "0")
                .spawn()
        })
        .collect();
    let mut ok = true;
    for (rank, child) in children.into_iter().enumerate() {
        if !child.and_then(|mut c| c.wait()).is_ok_and(|s| s.success()) {
            eprintln!("{name}: rank {rank} failed");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The value after `flag` in the arguments, parsed; `default` without it.
pub(crate) fn arg<T: std::str::FromStr>(flag: &str, default: T) -> Result<T, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == flag) {
        None => Ok(default),
        Some(at) => args
            .get(at + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{flag} needs a value")),
    }
}
