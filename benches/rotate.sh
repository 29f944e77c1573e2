#!/usr/bin/env bash
# Compares settings of one ringwire-bench command on a host whose speed
# drifts: runs the command once per setting per round, rotating the order
# each round, and prints per row and size the median time and CPU of each
# setting and its speed-up over the first.
#
#   bash benches/rotate.sh ROUNDS LABEL=VAR=VALUE[,VAR=VALUE]... -- BENCH-ARGS...
#
# LABEL=- runs with no extra variables. LABEL=@REV runs the bench built
# from git revision REV (in a worktree, its own target directory under
# target/), so two builds alternate on the same drifting host:
#   bash benches/rotate.sh 4 old=@HEAD~1 new=- -- reduce --ranks 4 -b 1M -e 64M -f 4
# Example (decision 0015):
#   bash benches/rotate.sh 6 old=RINGWIRE_SOCKET_BUFFER_BYTES=106496 new=- -- \
#     all_reduce --ranks 4 -b 1M -e 64M -f 4 -n 30 -w 3 -c 0 --max-seconds 0 --transport uring
# (106496 doubles to 208 KiB, the kernel's default before 0015.)
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,15p "$0"; exit 2; }
rounds=$1; shift
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do settings+=("$1"); shift; done
[ "${1:-}" = "--" ] || { echo "rotate.sh: missing -- before the bench arguments" >&2; exit 2; }
shift
root=$(cd "$(dirname "$0")/.." && pwd)
(cd "$root" && cargo build --release -q -p ringwire-bench)
rows=$(mktemp)
worktrees=()
cleanup() {
    rm -f "$rows"
    for w in "${worktrees[@]}"; do git -C "$root" worktree remove --force "$w"; done
}
trap cleanup EXIT
n=${#settings[@]}
declare -A bench
for s in "${settings[@]}"; do
    label=${s%%=*}; vars=${s#*=}
    bench[$label]=$root/target/release/ringwire-bench
    if [ "${vars:0:1}" = "@" ]; then
        wt=$(mktemp -d); worktrees+=("$wt")
        git -C "$root" worktree add -q --detach "$wt" "${vars:1}"
        (cd "$wt" && CARGO_TARGET_DIR=$root/target/rotate-$label cargo build --release -q -p ringwire-bench)
        bench[$label]=$root/target/rotate-$label/release/ringwire-bench
    fi
done
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < n; i++)); do
        s=${settings[$(((i + r) % n))]}
        label=${s%%=*}; vars=${s#*=}
        env_args=()
        [ "$vars" = "-" ] || [ "${vars:0:1}" = "@" ] || IFS=, read -ra env_args <<< "$vars"
        out=$(env "${env_args[@]}" "${bench[$label]}" "$@" 2>/dev/null)
        awk -v l="$label" '$1 ~ /^(uring|portable)/ {print l, $1, $2, $7, $14}' <<< "$out" >> "$rows"
        # The VM's core-to-core round trip before and after (about 55 ns near,
        # 300+ far: a far phase slows every run, so rounds may be judged by it).
        trips=$(sed -n 's/^# core-to-core round trip.*: \([0-9]*\) ns$/\1/p' <<< "$out" | paste -sd' ')
        echo "round $((r + 1))/$rounds: $label (core round trip ns: ${trips:-none})" >&2
    done
done
python3 - "$rows" "${settings[@]%%=*}" <<'EOF'
import collections, statistics, sys
rows, labels = sys.argv[1], sys.argv[2:]
d = collections.defaultdict(list)
for line in open(rows):
    label, variant, size, time_us, cpu = line.split()
    d[(variant, int(size), label)].append((float(time_us), float(cpu)))
print(f"medians of {len(d[next(iter(d))])} runs each; speed-up over {labels[0]}")
for variant, size in sorted({k[:2] for k in d}):
    base = statistics.median(t for t, _ in d[(variant, size, labels[0])])
    cells = []
    for label in labels:
        runs = d[(variant, size, label)]
        t = statistics.median(t for t, _ in runs)
        c = statistics.median(c for _, c in runs)
        cells.append(f"{label} {t:10.1f} us {base / t:4.2f}x cpu {c:.2f}")
    print(f"{variant:>12} {size:>10} | " + " | ".join(cells))
EOF
