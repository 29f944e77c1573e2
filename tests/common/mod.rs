//! Shared helpers for the integration tests: start N ranks in this process
//! (one thread each, real TCP on loopback) and run the same closure on all.

#![allow(dead_code)]

pub(crate) mod sweep;

use ringwire::store::StoreServer;
use ringwire::{Builder, Communicator};
use std::time::Duration;

/// Builds `world` communicators over loopback with a standalone store, with
/// `configure` applied to every builder.
pub(crate) fn local_group(
    world: usize,
    configure: impl Fn(Builder) -> Builder + Sync,
) -> (StoreServer, Vec<Communicator>) {
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap()).expect("bind store");
    let addr = store.local_addr();
    let comms = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let b = configure(
                    Communicator::builder()
                        .rank(rank)
                        .world_size(world)
                        .store_addr(addr)
                        .host_store(false)
                        .timeout(Duration::from_secs(30))
                        .connect_timeout(Duration::from_secs(20)),
                );
                s.spawn(move || b.build().wait())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread").expect("build communicator"))
            .collect()
    });
    (store, comms)
}

/// Runs `f` on every communicator concurrently and returns the results in
/// rank order.
pub(crate) fn on_all<R: Send>(
    comms: &[Communicator],
    f: impl Fn(&Communicator) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
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
