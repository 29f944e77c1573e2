#!/usr/bin/env bash
# ringwire vs Open MPI vs torch.distributed gloo: one collective (all_reduce
# by default; f32, sum where it reduces, root 0) on local ranks, one table.
# Over TCP on loopback (like for like: ringwire forced onto TCP, Open MPI's
# tcp BTL, gloo), and on one host's fastest path (ringwire's Unix-socket and
# shared-memory links, Open MPI with its own defaults: its shared-memory
# BTL). One core's memcpy bandwidth and the core-to-core round trip are
# measured beside each world size. Installs what it needs (skipped when
# already there), then for each world size runs the libraries back to back.
#
#   bash benches/compare/run.sh                      # ranks 2 4, 8 B .. 256 MiB, factor 4
#   bash benches/compare/run.sh --ranks "2" -b 1K -e 16M -f 2
#   bash benches/compare/run.sh --rounds 3          # medians of 3 round-robin sweeps
#   bash benches/compare/run.sh --op gather --ranks 4 -b 64K -e 64M
#   PEERS="ringwire mpi" bash benches/compare/run.sh  # leave a peer out
#
# Options (or the environment variable in brackets):
#   --op all_reduce the collective: all_reduce broadcast reduce all_gather
#                   reduce_scatter all_to_all gather scatter [OP]
#   --ranks "2 4"   world sizes [RANKS]          -b 8      smallest size [MINB]
#   -e 256M         largest size [MAXB]          -f 4      size factor [FACTOR]
#   -w 3            warm-up ops per size [WARMUP] -n 200   timed ops per size, at most [ITERS]
#   -m 1            cap timed ops near this many seconds per size [MAX_SECONDS]
#   --out DIR       where logs and JSON go [OUT] (default target/compare/run-DATE)
#   --peers "ringwire mpi gloo"  [PEERS]
#   --no-install    never install; a missing peer is skipped [NO_INSTALL=1]
#   --wait-idle 60  before each world size, wait up to this many seconds for
#                   the CPUs to be >= 85% idle over 2 s (0: don't) [WAIT_IDLE]
#   --retry-busy 2  run a library's sweep again (at most this many times) when
#                   other processes used > 0.25 cores during it [RETRY_BUSY]
#   --far-ns auto   measure the core-to-core round trip (ringwire-bench
#                   core-round-trip) before and after each library's sweep, and
#                   run the sweep again (at most --retry-busy times) when either
#                   is above this many ns: on this VM the host sometimes places
#                   the two vCPUs far apart (AMD host: 55 ns near, 300-425 far),
#                   and every TCP library then runs 2-2.5x slower (docs/perf.md,
#                   tenth session). auto: twice the median of 5 probes taken
#                   at the start (hosts differ: the Intel host's near is
#                   100-150 ns); a number fixes it; 0: don't check [FAR_NS]
#   --rounds 1      run every library's sweep this many times, round-robin
#                   (on a noisy VM one sweep's ratios swing 2x); the table shows
#                   per-size medians over the rounds, and the median and range
#                   of the per-round ratios [ROUNDS]
# Prebuilt binaries (a host with no Rust or no compiler, such as a lent
# many-core machine; see benches/compare/device.sh): RWBENCH (a
# ringwire-bench to run instead of building one), MPIBIN (an mpi_coll built
# against the mpirun on PATH). RW_VARIANTS picks ringwire's variants
# (default "unix shm tcp portable"), MPI_MODES Open MPI's ("tcp sm").
# Also: VENV (torch venv, default the one .ci/setup-launchers makes:
# $RINGWIRE_PY_VENV or ~/.cache/ringwire/torch-venv), TORCH_SPEC (pip
# requirement, default torch), PYTHON (for the venv, default python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OP=${OP:-all_reduce}
RANKS=${RANKS:-"2 4"}
MINB=${MINB:-8}
MAXB=${MAXB:-256M}
FACTOR=${FACTOR:-4}
WARMUP=${WARMUP:-3}
ITERS=${ITERS:-200}
MAX_SECONDS=${MAX_SECONDS:-1}
PEERS=${PEERS:-"ringwire mpi gloo"}
RW_VARIANTS=${RW_VARIANTS:-"unix shm tcp portable"}
MPI_MODES=${MPI_MODES:-"tcp sm"}
NO_INSTALL=${NO_INSTALL:-0}
VENV=${VENV:-${RINGWIRE_PY_VENV:-$HOME/.cache/ringwire/torch-venv}}
TORCH_SPEC=${TORCH_SPEC:-torch}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-}
WAIT_IDLE=${WAIT_IDLE:-60}
RETRY_BUSY=${RETRY_BUSY:-2}
ROUNDS=${ROUNDS:-1}
FAR_NS=${FAR_NS:-auto}

while [ $# -gt 0 ]; do
    case "$1" in
        --op) OP=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        -b) MINB=$2; shift 2 ;;
        -e) MAXB=$2; shift 2 ;;
        -f) FACTOR=$2; shift 2 ;;
        -w) WARMUP=$2; shift 2 ;;
        -n) ITERS=$2; shift 2 ;;
        -m) MAX_SECONDS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --peers) PEERS=$2; shift 2 ;;
        --no-install) NO_INSTALL=1; shift ;;
        --wait-idle) WAIT_IDLE=$2; shift 2 ;;
        --retry-busy) RETRY_BUSY=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --far-ns) FAR_NS=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

case " all_reduce broadcast reduce all_gather reduce_scatter all_to_all gather scatter " in
    *" $OP "*) ;;
    *) echo "run.sh: --op wants all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather or scatter, got '$OP'" >&2; exit 2 ;;
esac
case "$ROUNDS" in ''|*[!0-9]*|0) echo "run.sh: --rounds wants a whole number from 1, got '$ROUNDS'" >&2; exit 2 ;; esac
case "$FAR_NS" in auto) ;; ''|*[!0-9]*) echo "run.sh: --far-ns wants auto or a whole number of ns (0: off), got '$FAR_NS'" >&2; exit 2 ;; esac

BUILD=$ROOT/target/compare
OUT=${OUT:-$BUILD/run-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$BUILD" "$OUT"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

log() { echo "[compare] $*" >&2; }
has() { case " $PEERS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
drop() { PEERS=$(echo " $PEERS " | sed "s/ $1 / /; s/^ *//; s/ *$//"); log "skipping $1: $2"; }

# ---------------------------------------------------------------- installs
if [ -n "${RWBENCH:-}" ]; then
    [ -x "$RWBENCH" ] || drop ringwire "RWBENCH=$RWBENCH is not an executable"
else
    if has ringwire; then
        log "building ringwire-bench (cargo, incremental)"
        (cd "$ROOT" && cargo build --release -q -p ringwire-bench) || drop ringwire "cargo build failed"
    fi
    RWBENCH=$ROOT/target/release/ringwire-bench
fi

PREBUILT_MPI=${MPIBIN:+1}
MPIBIN=${MPIBIN:-$BUILD/mpi_coll}
if has mpi && [ -n "$PREBUILT_MPI" ]; then
    { [ -x "$MPIBIN" ] && command -v mpirun >/dev/null; } || drop mpi "MPIBIN=$MPIBIN or mpirun missing"
elif has mpi; then
    if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
        if [ "$NO_INSTALL" = 1 ]; then
            drop mpi "mpicc/mpirun not found and --no-install"
        else
            log "installing Open MPI from Debian (openmpi-bin libopenmpi-dev, ~25 MB download)"
            t0=$SECONDS
            if $SUDO apt-get update -qq >"$OUT/apt.log" 2>&1 &&
                DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >>"$OUT/apt.log" 2>&1; then
                log "Open MPI installed in $((SECONDS - t0)) s"
            else
                drop mpi "apt-get install openmpi-bin libopenmpi-dev failed (see $OUT/apt.log)"
            fi
        fi
    fi
    if has mpi && { [ ! -x "$MPIBIN" ] || [ "$HERE/mpi_coll.c" -nt "$MPIBIN" ]; }; then
        log "building $MPIBIN"
        mpicc -O2 -o "$MPIBIN" "$HERE/mpi_coll.c" || drop mpi "mpicc failed"
    fi
fi

TORCHPY=$VENV/bin/python
torch_ok() { [ -x "$TORCHPY" ] && "$TORCHPY" -c 'import torch.distributed as d; assert d.is_gloo_available()' >/dev/null 2>&1; }
if has gloo && ! torch_ok; then
    free_gb=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print int($4 / 1048576)}')
    if [ "$NO_INSTALL" = 1 ]; then
        drop gloo "no torch in $VENV and --no-install"
    elif [ "$free_gb" -lt 8 ]; then
        drop gloo "torch from PyPI needs ~3 GB download / ~5.5 GB installed (it pulls the CUDA wheels; PyPI has no CPU-only Linux build), only ${free_gb} GB free"
    else
        log "installing $TORCH_SPEC into $VENV (PyPI's Linux wheel pulls CUDA libraries: ~3 GB download, ~5.5 GB on disk)"
        t0=$SECONDS
        if { [ -x "$VENV/bin/pip" ] || "$PYTHON" -m venv "$VENV"; } &&
            "$VENV/bin/pip" install -q "$TORCH_SPEC" >"$OUT/pip.log" 2>&1 && torch_ok; then
            log "torch installed in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1) on disk"
        else
            drop gloo "torch install failed after $((SECONDS - t0)) s (see $OUT/pip.log)"
        fi
    fi
fi
[ -n "$PEERS" ] || { log "nothing left to run"; exit 1; }

# ---------------------------------------------------------------- runs
if [ "$FAR_NS" = auto ]; then
    probes=$(for _ in 1 2 3 4 5; do "$RWBENCH" core-round-trip 2>/dev/null | sed -n 's/.*: \([0-9]*\) ns$/\1/p'; done | sort -n)
    near=$(sed -n 3p <<<"$probes")
    if [ -n "$near" ]; then
        FAR_NS=$((2 * near))
        log "far phase: a round trip above $FAR_NS ns (twice the median of 5 probes now: $(paste -sd' ' <<<"$probes") ns)"
    else
        FAR_NS=0
        log "far phase: not checked (the core-to-core probe did not run)"
    fi
fi
machine=$("$RWBENCH" all_reduce --ranks 2 -b 8 -e 8 -w 0 -n 1 --transport portable 2>/dev/null | sed -n 's/^# machine: //p') || true
[ -n "$machine" ] || machine="$(hostname), $(nproc) cores, $(uname -sr)"
versions="ringwire $(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo '?')"
has mpi && versions+="; $(mpirun --version 2>/dev/null | head -1)"
has gloo && versions+="; torch $("$TORCHPY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
{
    echo "command: bash benches/compare/run.sh --op $OP --ranks \"$RANKS\" -b $MINB -e $MAXB -f $FACTOR -w $WARMUP -n $ITERS -m $MAX_SECONDS --rounds $ROUNDS --far-ns $FAR_NS --peers \"$PEERS\""
    echo "machine: $machine, $(awk '/MemTotal/ {printf "%d GiB", $2 / 1048576 + 0.5}' /proc/meminfo)"
    echo "versions: $versions"
    echo "op: $OP"
    echo "settings: f32, sum where it reduces, root 0, $WARMUP warm-up, up to $ITERS timed ops per size capped near ${MAX_SECONDS} s, time = mean of the slowest rank per op"
    echo "ranks: $RANKS"
    echo "rounds: $ROUNDS"
} >"$OUT/meta.txt"

COMMON=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -w "$WARMUP" -n "$ITERS")
run_ringwire() {
    # Four variants, one process group each, one after another like the
    # peers: the engine with Unix-socket links between local ranks, with
    # shared-memory links (ringwire's default), the engine over TCP (like the
    # TCP peers), and the portable transport over TCP. (Interleaved in one
    # group, the variants' idle threads made the scheduler stack ranks: 4
    # ranks at 8 B took 95-112 us against 61-63 in a group of their own.)
    local ranks=$1 variant transport links
    for variant in $RW_VARIANTS; do
        case $variant in
            portable) transport=portable links=tcp ;;
            *) transport=uring links=$variant ;;
        esac
        # --blocking: the slice forms, called and waited for in place, as
        # MPI's blocking calls (and gloo's wait) are.
        "$RWBENCH" "$OP" --ranks "$ranks" "${COMMON[@]}" --max-seconds "$MAX_SECONDS" \
            --transport "$transport" --local-links "$links" --blocking \
            --json "$OUT/ringwire-$transport-$links-p$ranks$TAG.json" || return
    done
}
run_mpi() {
    case " $MPI_MODES " in *" tcp "*) run_mpi_tcp "$1" || return ;; esac
    case " $MPI_MODES " in *" sm "*) run_mpi_sm "$1" ;; esac
}
run_mpi_tcp() {
    # btl tcp,self: TCP even between local ranks (no shared memory); pml ob1:
    # the BTL path, not UCX; --bind-to none: scheduled like the other two.
    mpirun --allow-run-as-root --oversubscribe -np "$1" --bind-to none \
        --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include lo \
        "$MPIBIN" -c "$OP" "${COMMON[@]}" -m "$MAX_SECONDS" -o "$OUT/mpi-p$1$TAG.json"
}
run_mpi_sm() {
    # With its own defaults on one host (shared memory between the
    # ranks, its binding), what a user of mpirun gets.
    mpirun --allow-run-as-root --oversubscribe -np "$1" \
        "$MPIBIN" -c "$OP" "${COMMON[@]}" -m "$MAX_SECONDS" -o "$OUT/mpi-sm-p$1$TAG.json"
}
run_gloo() {
    GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 TORCH_CPP_LOG_LEVEL=ERROR \
        "$VENV/bin/torchrun" --standalone --nproc-per-node "$1" \
        "$HERE/torch_gloo_coll.py" -c "$OP" "${COMMON[@]}" -m "$MAX_SECONDS" -o "$OUT/gloo-p$1$TAG.json"
}

idle_pct() { # percentage of CPU time idle over 2 s
    local a b
    read -ra a </proc/stat; sleep 2; read -ra b </proc/stat
    local tot=0 i
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    echo $(( tot > 0 ? 100 * (b[4] + b[5] - a[4] - a[5]) / tot : 100 ))
}
wait_idle() { # sets IDLE
    local t0=$SECONDS
    while IDLE=$(idle_pct); [ "$IDLE" -lt 85 ] && [ "$WAIT_IDLE" -gt 0 ]; do
        if [ $((SECONDS - t0)) -ge "$WAIT_IDLE" ]; then
            log "machine still busy (${IDLE}% idle) after ${WAIT_IDLE} s; running anyway"
            return 0
        fi
        log "machine busy (${IDLE}% idle); waiting"
        sleep 3
    done
}

cpu_snap() { # sets SNAP: "<CPU s all processes used> <CPU s this shell's children used> <wall s>"
    local a busy child
    read -ra a </proc/stat  # cpu user nice system idle iowait irq softirq steal (jiffies)
    busy=$((a[1] + a[2] + a[3] + a[6] + a[7] + a[8]))
    # `times` in this shell (not a $(...) subshell, whose counts start at 0):
    # user and sys of the waited-for children, their children included.
    times >"$OUT/.times"
    child=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); s += a[1] * 60 + a[2] } printf "%.3f", s }' "$OUT/.times")
    SNAP="$(awk -v j="$busy" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", j / hz }') $child $(date +%s.%N)"
}

round_trip() { # the core-to-core round trip in ns now, or "?"
    local ns=""
    [ "$FAR_NS" = 0 ] || [ ! -x "$RWBENCH" ] ||
        ns=$("$RWBENCH" core-round-trip 2>/dev/null | sed -n 's/.*: \([0-9]*\) ns$/\1/p')
    echo "${ns:-?}"
}

# One library's sweep; sets OTHERS: cores' worth of CPU that other processes
# used meanwhile (what the rest of the machine took away from this run), and
# TRIPS / FAR: the core-to-core round trips before and after it, and whether
# either was in the far phase.
run_peer() {
    local peer=$1 p=$2 s0 rc=0 before after
    before=$(round_trip)
    cpu_snap; s0=$SNAP
    "run_$peer" "$p" >"$OUT/$peer-p$p$TAG.log" 2>&1 || rc=$?
    cpu_snap
    after=$(round_trip)
    TRIPS="$before/$after ns"
    FAR=0
    for t in $before $after; do
        [ "$t" = "?" ] || [ "$FAR_NS" = 0 ] || [ "$t" -le "$FAR_NS" ] || FAR=1
    done
    read -r OTHERS WALL < <(echo "$s0 $SNAP" | awk '{ w = $6 - $3; o = (($4 - $1) - ($5 - $2)) / w; if (o < 0) o = 0; printf "%.2f %.0f\n", o, w }')
    log "p=$p${TAG:+ round ${TAG#-r}} $peer: $WALL s, exit $rc, other processes used $OTHERS cores meanwhile, core round trip $TRIPS before/after (log: $OUT/$peer-p$p$TAG.log)"
    [ "$rc" = 0 ] || { log "p=$p $peer FAILED; its column shows n/a. Tail of its log:"; tail -5 "$OUT/$peer-p$p$TAG.log" >&2; }
    return $rc
}

# Files of round k end in -rk when there are several rounds.
TAG=""
for p in $RANKS; do
    wait_idle
    echo "load p$p: $(cut -d' ' -f1-3 /proc/loadavg) (load average), ${IDLE}% idle over 2 s" >>"$OUT/meta.txt"
    [ ! -x "$RWBENCH" ] || echo "memcpy p$p: $("$RWBENCH" memcpy-bandwidth 2>/dev/null | sed 's/^# memcpy bandwidth (one core): //'); core round trip $(round_trip) ns" >>"$OUT/meta.txt"
    for round in $(seq 1 "$ROUNDS"); do
        [ "$ROUNDS" = 1 ] || TAG="-r$round"
        for peer in $PEERS; do
            tries=0
            while run_peer "$peer" "$p"; [ "$tries" -lt "$RETRY_BUSY" ] &&
                { [ "$FAR" = 1 ] || awk -v o="$OTHERS" 'BEGIN { exit !(o > 0.25) }'; }; do
                tries=$((tries + 1))
                if [ "$FAR" = 1 ]; then
                    log "p=$p $peer: the VM's cores were far apart (round trip $TRIPS, above $FAR_NS); running it again ($tries of $RETRY_BUSY)"
                else
                    log "p=$p $peer: other processes took $OTHERS cores during the run; running it again ($tries of $RETRY_BUSY)"
                fi
                wait_idle
            done
            echo "others p$p$TAG $peer: $OTHERS" >>"$OUT/meta.txt"
            echo "phase p$p$TAG $peer: $TRIPS$([ "$FAR" = 1 ] && echo ' (far)')" >>"$OUT/meta.txt"
        done
    done
done
rm -f "$OUT/.times"

echo
python3 "$HERE/table.py" "$OUT" | tee "$OUT/table.md"
