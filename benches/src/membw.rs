//! One core's memory copy bandwidth at a few sizes: the ceiling every
//! shared-memory transport's copies run into (each byte of a hop is copied
//! in and out). Printed beside comparisons (`ringwire-bench
//! memcpy-bandwidth`, run by benches/compare/run.sh) so a busbw can be read
//! against the machine it ran on.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Sizes measured: in cache, past most last-level caches, well past.
const SIZES: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];
/// Copying time per size (after one warm-up copy).
const BUDGET: Duration = Duration::from_millis(200);

/// `# memcpy bandwidth (one core): 1 MiB x GB/s, ...`.
pub(crate) fn line() -> String {
    let cells: Vec<String> = SIZES
        .iter()
        .map(|&n| format!("{} MiB {:.1} GB/s", n >> 20, gbps(n)))
        .collect();
    format!("# memcpy bandwidth (one core): {}", cells.join(", "))
}

/// Bytes copied per second (1e9) between two buffers of `n` bytes.
fn gbps(n: usize) -> f64 {
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // pages touched, caches warm
    let (start, mut copies) = (Instant::now(), 0u64);
    while start.elapsed() < BUDGET {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        copies += 1;
    }
    (n as u64 * copies) as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_line_names_every_size_with_a_positive_rate() {
        let line = super::line();
        for size in ["1 MiB", "16 MiB", "64 MiB"] {
            let rate = line
                .split(&format!("{size} "))
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no rate for {size}: {line}"));
            assert!(rate > 0.0, "{line}");
        }
    }
}
