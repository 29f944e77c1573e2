#!/usr/bin/env bash
# Two "hosts" (network namespaces) of RANKS_PER_HOST ranks each, joined by
# one veth pair whose both ends are rate-limited (tbf, RATE each way), run
# ringwire-bench's OPS (default all_reduce) with RINGWIRE_TWO_LEVEL=never
# (one flat schedule over all ranks) and =always (decision 0033), rotated
# ROUNDS times, and print each run's algbw as a fraction of the link's
# rate.
# Issue 33's goal: two levels at least 0.85 of the rate at 16-64 MiB, where
# a flat ring manages about 0.67 (it sends 2(p-1)/p of the buffer each way
# over the link; two levels 2(N-1)/N).
#
# Needs root, ip and tc. Everything it makes it removes, also on failure.
# Usage: benches/netns/two_level.sh [BENCH]   (default: the release build)
# Env: OPS ("all_reduce reduce_scatter all_gather", say), RATE (tc rate,
#      default 1gbit), RANKS_PER_HOST (2), ROUNDS (3),
#      SIZES (-b/-e, default "16M 64M"), ITERS (3), OUT (a folder for the
#      JSON of every run).
set -euo pipefail
bench=${1:-target/release/ringwire-bench}
rate=${RATE:-1gbit}
per_host=${RANKS_PER_HOST:-2}
rounds=${ROUNDS:-3}
ops=${OPS:-all_reduce}
read -r min_size max_size <<<"${SIZES:-16M 64M}"
iters=${ITERS:-3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -x "$bench" ] || { echo "no bench at $bench: cargo build --release -p ringwire-bench" >&2; exit 1; }

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
# MTU 1500, as real NICs: packet rates like a NIC's, and tbf's burst well
# above a GSO segment.
two_hosts tl 214 1500
for i in 0 1; do
  tc -n "${ns[$i]}" qdisc add dev "${veth[$i]}" root tbf rate "$rate" burst 512kb latency 100ms
done
rate_bits=$(tc -n "${ns[0]}" -j qdisc show dev "${veth[0]}" | python3 -c '
import json, sys
print(json.load(sys.stdin)[0]["options"]["rate"] * 8)')
echo "# link: veth, tbf $rate each way ($rate_bits bit/s), $per_host ranks per host, $(nproc) cores, $(uname -r)"

world=$((2 * per_host))
run_one() { # op mode round
  local op=$1 mode=$2 round=$3 port=$((20000 + RANDOM % 20000)) pids=()
  for ((r = 0; r < world; r++)); do
    local host=$((r / per_host))
    ip netns exec "${ns[$host]}" env \
      RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % per_host)) LOCAL_WORLD_SIZE=$per_host \
      MASTER_ADDR="${ip_of[0]}" MASTER_PORT=$port \
      RINGWIRE_TWO_LEVEL="$mode" RINGWIRE_INTER_HOST_GBPS=$((rate_bits / 1000000000 + 1)) \
      "$bench" "$op" -b "$min_size" -e "$max_size" -f 2 -n "$iters" -w 1 \
      --transport uring --local-links shm -c 1 \
      $([ $r = 0 ] && echo --json "$out/$op-$mode-$round.json") \
      >"$out/$op-$mode-$round-rank$r.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if [ $failed = 1 ]; then
    echo "a rank failed ($op, $mode, round $round); logs in $out" >&2
    tail -5 "$out/$op-$mode-$round-rank"*.log >&2
    exit 1
  fi
}

for ((round = 0; round < rounds; round++)); do
  # Rotated: the order alternates each round.
  if ((round % 2 == 0)); then order="never always"; else order="always never"; fi
  for op in $ops; do
    for mode in $order; do run_one "$op" "$mode" "$round"; done
  done
done

python3 - "$out" "$rate_bits" "$rounds" $ops <<'EOF'
import json, statistics, sys, glob, os
out, rate_bits, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rate = rate_bits / 8  # bytes per second each way
for op in sys.argv[4:]:
  rows = {}
  for mode in ("never", "always"):
    for path in sorted(glob.glob(os.path.join(out, f"{op}-{mode}-*.json"))):
        doc = json.load(open(path))
        for r in doc["rows"]:
            if r["wrong"]:
                sys.exit(f"{path}: {r['wrong']} wrong elements at {r['size_bytes']} bytes")
            rows.setdefault((r["size_bytes"], mode), []).append(r["algbw_gbps"] * 1e9 / rate)
  print(f"{op}: algbw / link rate, median of {rounds} rounds (each round's in brackets)")
  print(f"{'bytes':>12} {'flat':>30} {'two-level':>30}")
  for size in sorted({b for b, _ in rows}):
    cells = []
    for mode in ("never", "always"):
        v = rows.get((size, mode), [])
        cells.append(f"{statistics.median(v):.3f} {[round(x, 3) for x in v]}" if v else "-")
    print(f"{size:>12} {cells[0]:>30} {cells[1]:>30}")
EOF
echo "# runs: $out"
