#!/usr/bin/env bash
# Step time of data-parallel burn training over ringwire-burn, against torch
# DDP over gloo on the same MLPs (the peer a burn user would otherwise
# reach for), at 1, 2 and 4 local ranks, ROUNDS rounds with the order of
# the runs rotated each round (the VM drifts). Prints every run's line,
# then the medians per cell.
#
#   bash adapters/burn/benches/step_time.sh [ROUNDS]
#   RINGWIRE_PY_VENV=...   the venv with torch (.ci/setup-launchers makes it)
set -euo pipefail
rounds=${1:-3}
here=$(cd "$(dirname "$0")" && pwd)
crate=$(cd "$here/.." && pwd)
venv=${RINGWIRE_PY_VENV:-$HOME/.cache/ringwire/torch-venv}
(cd "$crate" && cargo build --release -q --example step_time)
exe=$crate/target/release/examples/step_time
runs=()
for model in digits wide; do
    for ranks in 1 2 4; do
        steps=200; [ $model = wide ] && steps=8
        runs+=("burn $model $ranks $steps" "torch $model $ranks $steps")
    done
done
out=$(mktemp)
trap 'rm -f "$out" "$out.err"' EXIT
n=${#runs[@]}
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < n; i++)); do
        read -r who model ranks steps <<<"${runs[$(( (i + r * 5) % n ))]}"
        # A failed run is reported and left out of the medians.
        if [ "$who" = burn ]; then
            "$exe" --ranks "$ranks" --model "$model" --steps "$steps" >>"$out" \
                || echo "FAILED (exit $?): burn $model $ranks ranks" >&2
        else
            "$venv/bin/torchrun" --nproc-per-node "$ranks" "$here/torch_ddp_step.py" \
                --model "$model" --steps "$steps" >>"$out" 2>"$out.err" \
                || { echo "FAILED (exit $?): torch $model $ranks ranks" >&2; tail -5 "$out.err" >&2; }
        fi
        tail -1 "$out"
    done
done
python3 - "$out" <<'PY'
import re, statistics, sys
cells = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) step_time: model (\w+) .*?, (\d+) ranks, .*step p50 ([\d.]+) ms(?:, sync p50 ([\d.]+) ms)?", line)
    if m:
        who, model, ranks, step, sync = m.groups()
        c = cells.setdefault((model, int(ranks), who), ([], []))
        c[0].append(float(step))
        if sync:
            c[1].append(float(sync))
print("| model | ranks | ringwire-burn step (sync) ms | torch DDP gloo step ms | torch / burn |")
print("|---|---|---|---|---|")
for model in ("digits", "wide"):
    for ranks in (1, 2, 4):
        b = cells.get((model, ranks, "burn"))
        t = cells.get((model, ranks, "torch"))
        if not b or not t:
            continue
        bs, bsync, ts = statistics.median(b[0]), statistics.median(b[1]), statistics.median(t[0])
        print(f"| {model} | {ranks} | {bs:.3f} ({bsync:.3f}) | {ts:.3f} | {ts / bs:.2f}x |")
PY
