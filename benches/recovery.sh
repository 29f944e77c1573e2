#!/usr/bin/env bash
# Kill -9 (or SIGSTOP) to the first completed all-reduce on the shrunk
# communicator (issue 45): for each world size in WORLDS and each kind of
# local link in LINKS, ranks in their own processes all-reduce 1 MiB in a
# loop, rank world-2 gets the signal, and each survivor shrinks and runs one
# all-reduce there; RUNS runs per cell, the median of "signal to the last
# survivor's first op". tests/chaos.rs `kill_to_first_op` is the program.
#
# Usage: benches/recovery.sh
# Env: WORLDS ("4 8"), LINKS ("shm tcp"), SIGNALS ("kill"; "stop" is
#      bounded by the heartbeat, HEARTBEAT_S, default 2 for stop and 10,
#      ringwire's default, for kill), RUNS (5),
#      LEN (f32 elements per all-reduce, 262144).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --test chaos --no-run >/dev/null 2>&1 || cargo test --release --test chaos --no-run
for signal in ${SIGNALS:-kill}; do
    if [[ $signal == stop ]]; then hb=${HEARTBEAT_S:-2}; else hb=${HEARTBEAT_S:-10}; fi
    for world in ${WORLDS:-4 8}; do
        for links in ${LINKS:-shm tcp}; do
            RECOVERY_WORLD=$world RECOVERY_LINKS=$links RECOVERY_SIGNAL=$signal \
            RECOVERY_RUNS=${RUNS:-5} RECOVERY_LEN=${LEN:-262144} \
            RECOVERY_HEARTBEAT_S=$hb \
                cargo test -q --release --test chaos kill_to_first_op -- --ignored --exact --nocapture 2>&1 |
                grep -E '^(run|RECOVERY) '
        done
    done
done
