#!/usr/bin/env bash
# Issue 33's many-core run, on a machine that builds nothing (the lent
# 16-core GPU host: no Rust, no Open MPI, no network). Stage here, carry
# .dev, run there:
#
#   bash benches/compare/device.sh prepare        # here: .dev/ringwire-bench,
#                                                 # .dev/ompi, .dev/mpi_coll
#   OUT=/somewhere bash benches/netns/device.sh   # there, as root
#
# Two "hosts" (network namespaces, each with its own host name: Open MPI
# groups ranks by host name) joined by one veth pair (MTU 9000; RATE adds
# tbf), RANKS_LIST ranks in all ("8 16": 4 and 8 per host), host A's ranks
# pinned to the first cores, host B's to the next. Each round (ROUNDS, the
# order rotated) runs all_reduce (OP) from -b MINB (256K) to -e MAXB (256M):
#   - ringwire flat (RINGWIRE_TWO_LEVEL=never) with each count of TCP lanes
#     each way in LANES_LIST ("0 1 4 8"; decisions 0018, 0034), and two
#     levels (=always) with 0 and 1 lane, --link-limit: every size
#     is set beside every rank streaming to its ring successor at once over
#     plain TCP on the same veth (link %, busbw over that limit);
#   - Open MPI over TCP (btl tcp,self), mpirun in host A launching host
#     B's daemon through an ssh stand-in that enters B's namespace.
#   - with each lane count above 0, engine threads (decision 0036) in
#     THREADS_LIST ("1 2 4"; RINGWIRE_ENGINE_THREADS): those ranks get
#     their host's cores, not one each, and pin their threads to cores
#     after the ranks' own where the host has enough (else the threads
#     run unpinned within the host's cores).
# Each run takes a minute or two: narrow the lists to fit the time lent,
# e.g. RANKS_LIST=8 LANES_LIST="1 4" THREADS_LIST=2 ROUNDS=1.
# One JSON per run in $OUT, and a table of median busbw (and link %).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEV=${DEV:-$ROOT/.dev}
: "${OUT:?device.sh wants OUT, the folder results go to}"
mkdir -p "$OUT"
op=${OP:-all_reduce}
minb=${MINB:-256K}
maxb=${MAXB:-256M}
rounds=${ROUNDS:-2}
ranks_list=${RANKS_LIST:-8 16}
lanes_list=${LANES_LIST:-0 1 4 8}
threads_list=${THREADS_LIST:-1 2 4}
mtu=${MTU:-9000}
bench=$DEV/ringwire-bench
for f in "$bench" "$DEV/mpi_coll" "$DEV/ompi/bin/mpirun"; do
  [ -e "$f" ] || { echo "missing $f: run benches/compare/device.sh prepare where Rust is" >&2; exit 1; }
done
chmod +x "$bench" "$DEV/mpi_coll"
rm -rf /tmp/ompi && cp -r "$DEV/ompi" /tmp/ompi # mpi_coll's rpath

work=$(mktemp -d)
on_exit() { rm -rf "$work"; }
source "$HERE/hosts.sh"
two_hosts dev 216 "$mtu"
for i in 0 1; do
  if [ -n "${RATE:-}" ]; then
    tc -n "${ns[$i]}" qdisc add dev "${veth[$i]}" root tbf rate "$RATE" burst 1mb latency 100ms
  fi
done
cores=$(nproc)
echo "# $(uname -r), $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# veth MTU $mtu${RATE:+, tbf $RATE each way}; $op $minb..$maxb; rounds $rounds"

# The ssh stand-in: "host" is a namespace's address; it enters that
# namespace with its own host name, pinned to that host's cores.
cat >"$work/agent.sh" <<EOF
#!/bin/bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1; shift
case \$host in
  ${ip_of[0]}) ns=${ns[0]}; cpus=\$HOST_A_CPUS ;;
  ${ip_of[1]}) ns=${ns[1]}; cpus=\$HOST_B_CPUS ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts taskset -c \$cpus /bin/sh -c "hostname host-\$ns; \$*"
EOF
chmod +x "$work/agent.sh"

# Host A's cores, host B's, for `world` ranks: a core each where there
# are enough, else every core.
cpus_of() { # world host
  local per=$(($1 / 2))
  if ((2 * per <= cores)); then echo "$(($2 * per))-$(($2 * per + per - 1))"; else echo "0-$((cores - 1))"; fi
}

# Waits for every pid; at the first that fails, says which and with what
# status, and stops the rest. (Polled, each pid waited for by itself once
# it has ended: a `wait -n` loop once reported a failure here that no
# rank's log showed.)
wait_all() {
  local left=("$@") p rc
  while ((${#left[@]} > 0)); do
    local still=()
    for p in "${left[@]}"; do
      if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
      rc=0
      wait "$p" || rc=$?
      if ((rc != 0)); then
        echo "pid $p ended with status $rc" >&2
        kill "${left[@]}" 2>/dev/null || true
        wait "${left[@]}" 2>/dev/null || true
        return 1
      fi
    done
    left=("${still[@]}")
    ((${#left[@]} == 0)) || sleep 0.05
  done
}

# A host's half of the cores.
host_cpus() { # host
  local half=$((cores / 2))
  echo "$(($1 * half))-$(($1 * half + half - 1))"
}

run_ringwire() { # world two_level lanes threads label round
  local world=$1 mode=$2 lanes=$3 threads=$4 label=$5 round=$6 per=$(($1 / 2)) pids=()
  local port=$((20000 + RANDOM % 20000))
  for ((r = 0; r < world; r++)); do
    local host=$((r / per)) core=$r
    ((world <= cores)) || core=0-$((cores - 1))
    # Ranks with engine threads get their host's cores: the engine homes
    # each rank on one and puts its threads on others.
    ((threads == 0)) || core=$(host_cpus $host)
    ip netns exec "${ns[$host]}" taskset -c "$core" env \
      RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per \
      MASTER_ADDR="${ip_of[0]}" MASTER_PORT=$port \
      RINGWIRE_TWO_LEVEL="$mode" RINGWIRE_TCP_LANES="$lanes" RINGWIRE_ENGINE_THREADS="$threads" \
      "$bench" "$op" -b "$minb" -e "$maxb" -f 4 --transport uring --local-links shm --link-limit \
      $([ $r = 0 ] && echo --json "$OUT/$label-$world-$round.json") \
      >"$OUT/$label-$world-$round-rank$r.log" 2>&1 &
    pids+=($!)
  done
  wait_all "${pids[@]}" || { echo "ringwire $label at $world ranks failed (round $round); logs in $OUT" >&2; return 1; }
}

run_ompi() { # world round
  local world=$1 round=$2 per=$(($1 / 2))
  HOST_A_CPUS=$(cpus_of "$world" 0) HOST_B_CPUS=$(cpus_of "$world" 1) \
    ip netns exec "${ns[0]}" unshare --uts taskset -c "$(cpus_of "$world" 0)" /bin/sh -c "hostname host-${ns[0]}; \
    PATH=/tmp/ompi/bin:\$PATH mpirun --allow-run-as-root --oversubscribe \
      --host ${ip_of[0]}:$per,${ip_of[1]}:$per -np $world \
      --mca plm_rsh_agent $work/agent.sh --prtemca plm_rsh_agent $work/agent.sh \
      --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include $net.0/24 \
      --mca oob_tcp_if_include $net.0/24 --prtemca oob_tcp_if_include $net.0/24 \
      $DEV/mpi_coll -c $op -b $minb -e $maxb -f 4 -o $OUT/ompi-tcp-$world-$round.json" \
    >"$OUT/ompi-tcp-$world-$round.log" 2>&1 ||
    { echo "Open MPI at $world ranks failed (round $round)" >&2; tail -20 "$OUT/ompi-tcp-$world-$round.log" >&2; return 1; }
}

for ((round = 0; round < rounds; round++)); do
  for world in $ranks_list; do
    runs=("run_ringwire $world always 1 0 two-level-l1 $round" "run_ringwire $world always 0 0 two-level-l0 $round"
      "run_ompi $world $round")
    for lanes in $lanes_list; do
      runs+=("run_ringwire $world never $lanes 0 flat-l$lanes $round")
      if ((lanes > 0)); then
        for threads in $threads_list; do
          runs+=("run_ringwire $world never $lanes $threads flat-l$lanes-t$threads $round")
        done
      fi
    done
    n=${#runs[@]}
    for ((i = 0; i < n; i++)); do
      ${runs[$(((i + round) % n))]} || true
    done
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys, glob, os, re
out = sys.argv[1]
cells = {}
for path in glob.glob(os.path.join(out, "*.json")):
    m = re.match(r"(.+)-(\d+)-(\d+)\.json$", os.path.basename(path))
    if not m:
        continue
    label, world = m.group(1), int(m.group(2))
    for r in json.load(open(path))["rows"]:
        if r.get("wrong"):
            print(f"WRONG: {path} {r['size_bytes']}")
        key = (world, r["size_bytes"], label)
        cells.setdefault(key, []).append((r["busbw_gbps"], r.get("link_pct")))
labels = sorted({k[2] for k in cells}, key=lambda l: (l.startswith("ompi"), l))
for world in sorted({k[0] for k in cells}):
    print(f"\n{world} ranks: busbw GB/s, median over rounds (link % for ringwire)")
    print(f"{'bytes':>11} " + " ".join(f"{l:>20}" for l in labels))
    for size in sorted({k[1] for k in cells if k[0] == world}):
        row = []
        for l in labels:
            v = cells.get((world, size, l))
            if not v:
                row.append(f"{'-':>20}")
                continue
            bw = statistics.median(x for x, _ in v)
            pct = [p for _, p in v if p is not None]
            row.append(f"{bw:>9.2f}" + (f" ({statistics.median(pct):5.1f}%)" if pct else " " * 9) + "  ")
        print(f"{size:>11} " + " ".join(row))
EOF
echo "# runs: $OUT"
