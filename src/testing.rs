//! Helpers shared by the unit tests, the integration tests and the benchmark
//! harness: a seeded PRNG, random inputs per dtype and operator, a
//! reference reduction computed in f64, a lookup over fixed variables, and
//! re-running a test in a child process.
//!
//! Not part of the stable API.

use crate::{DType, Element, ReduceOp};

/// SplitMix64: tiny, seedable, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed from the clock, for tests that want new data each run (print it!).
    pub fn fresh_seed() -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        nanos ^ (u64::from(std::process::id()) << 32)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Random elements in a range that keeps the reference exact enough for `op`:
/// small integers for integer types (no overflow except u8 products, which the
/// check wraps), [-1, 1) for float sums, [0.5, 1.5) for float products.
pub fn random_data<T: Element>(rng: &mut Rng, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len)
        .map(|_| {
            let v = match (T::DTYPE, op) {
                (DType::U8, _) => rng.below(4) as f64,
                (DType::I32 | DType::I64, ReduceOp::Prod) => rng.below(7) as f64 - 3.0,
                (DType::I32 | DType::I64, _) => rng.below(2001) as f64 - 1000.0,
                (_, ReduceOp::Prod) => 0.5 + rng.unit(),
                _ => rng.unit() * 2.0 - 1.0,
            };
            T::from_f64(v)
        })
        .collect()
}

/// The elementwise reduction of `inputs` (one vector per rank) in f64.
pub fn reference_reduce<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<f64> {
    let len = inputs.first().map_or(0, Vec::len);
    let ranks = inputs.len() as f64;
    (0..len)
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i].to_f64());
            match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Avg => {
                    let s: f64 = vals.sum();
                    if is_float(T::DTYPE) {
                        s / ranks
                    } else {
                        (s / ranks).trunc()
                    }
                }
                ReduceOp::Prod => vals.product(),
                ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect()
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Checks `got` against an f64 reference over `ranks` inputs: exact for
/// integers (u8 wrapping), within a tolerance that grows with the number of
/// roundings for floats. Returns the first mismatch as a message.
pub fn check_close<T: Element>(got: &[T], reference: &[f64], ranks: usize) -> Result<(), String> {
    if got.len() != reference.len() {
        return Err(format!(
            "length {} but expected {}",
            got.len(),
            reference.len()
        ));
    }
    let eps = match T::DTYPE {
        DType::F32 => f32::EPSILON as f64,
        DType::F64 => f64::EPSILON,
        DType::F16 => 0.000_977,
        DType::BF16 => 0.007_813,
        _ => 0.0,
    };
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        let g = g.to_f64();
        let ok = match T::DTYPE {
            DType::U8 => g == (*r as i64).rem_euclid(256) as f64,
            DType::I32 | DType::I64 => g == *r,
            _ => (g - r).abs() <= 2.0 * eps * (ranks as f64 + 1.0) * r.abs().max(1.0),
        };
        if !ok {
            return Err(format!(
                "element {i}: got {g}, expected {r} ({} over {ranks} ranks)",
                T::DTYPE
            ));
        }
    }
    Ok(())
}

/// Counts elements that fail [`check_close`]'s rule (for the harness's #wrong column).
pub fn count_wrong<T: Element>(got: &[T], reference: &[f64], ranks: usize) -> usize {
    got.iter()
        .zip(reference)
        .filter(|(g, r)| {
            check_close(std::slice::from_ref(*g), std::slice::from_ref(*r), ranks).is_err()
        })
        .count()
}

/// A variable lookup over fixed pairs, for testing env-driven settings
/// without touching the process environment.
pub fn env_lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

/// Runs the test `name` (its full path, as `--exact` wants it) again in a
/// child of the current test binary with `marker` set, and asserts that it
/// passed there. For tests that change process-wide state (limits, user,
/// open files): the test checks `marker` and does that work only in the
/// child.
pub fn in_a_child(name: &str, marker: &str) {
    in_a_child_with(name, marker, &[]);
}

/// [`in_a_child`] with the variables `env` set in the child too.
pub fn in_a_child_with(name: &str, marker: &str, env: &[(&str, &str)]) {
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .env(marker, "1")
        .envs(env.iter().copied())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .output()
        .expect("start the test binary again");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// `train::broadcast_state` with pieces of at most `piece_bytes` (a small
/// state cut into many pieces).
pub fn broadcast_state_in_pieces<T: Element>(
    comm: &crate::Communicator,
    root: usize,
    parts: &mut [&mut [T]],
    piece_bytes: usize,
) -> Result<(), crate::train::TrainError> {
    crate::train::broadcast_state_in_pieces(comm, root, parts, piece_bytes)
}

/// `world` communicators of this process on loopback, one per rank, each
/// built on its own thread against the store this returns (keep it alive
/// while they run): for tests of code above the communicator (the trainer
/// layer, the adapters, the GPU path). Every builder starts with a 30 s op
/// timeout and a 20 s connect timeout; `configure` sees it with its rank.
pub fn local_group(
    world: usize,
    configure: impl Fn(usize, crate::Builder) -> crate::Builder + Sync,
) -> (crate::store::StoreServer, Vec<crate::Communicator>) {
    use std::time::Duration;
    let store = crate::store::StoreServer::bind("127.0.0.1:0".parse().expect("a literal address"))
        .expect("bind store");
    let addr = store.local_addr();
    let comms = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let b = configure(
                    rank,
                    crate::Communicator::builder()
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

/// Runs `f` on every item (a rank's communicator, usually) at once, one
/// thread each, and returns the results in order.
pub fn on_all<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|c| s.spawn(|| f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}
