#!/usr/bin/env bash
# Two "hosts" (network namespaces) of one rank each, joined by a veth pair
# whose ends cap every TCP connection of the ranks' link on its own (an htb
# class per connection, CAP, under a LINK class for the whole), run
# ringwire-bench's OP (default all_reduce) with RINGWIRE_TCP_LANES set to
# each of LANES, rotated ROUNDS times, and print busbw as a fraction of
# what the link can carry, min(lanes x CAP, LINK) (decision 0034).
# With SLOW set (a tc rate), one lane the first rank writes is capped at
# SLOW instead, and the fraction is of the summed rates.
# Issue 33's goals: at least 0.9 of min(L x cap, link); with one slow lane,
# at least 0.9 of the summed rates (fixed striping would fall to L x SLOW).
#
# Connections are classed as they appear (`ss` in the first namespace, by
# port), during the warm-up iterations (WARMUP, default 3): every one of the
# link's, its main connection too, which carries headers only. The slow
# lane is the first connection seen carrying a megabyte from the first
# rank.
#
# Needs root, ip, tc and ss (and nstat for DIAG). Everything it makes it removes, also on failure.
# Usage: benches/netns/lanes.sh [BENCH]   (default: the release build)
# Env: OP, LANES ("1 2 4 8"), CAP (100mbit), LINK (400mbit), SLOW (unset),
#      ROUNDS (2), SIZES (-b/-e, default "4M 32M"), ITERS (3), WARMUP (3),
#      EXTRA_ENV (VAR=VALUE words for every rank), QUEUE (packets each
#      connection's class queues, default 100), OUT (a folder for the JSON
#      of every run), DIAG (1: after each run, each namespace's TCP counters
#      (`nstat`) and its classes' drops (`tc -s`) beside the run's JSON),
#      ASSURED (auto: each connection's class is assured its cap where
#      the caps together fit in LINK, else it borrows up to its cap from a
#      small assured rate so that LINK bounds the sum; 1 or 0 force one).
#
# Why assured: through classes that borrow up to their caps, even plain
# TCP streams reached only 0.86-0.92 of the summed caps; through assured
# ones 0.93-0.96 (decision 0037, thirty-first section). ASSURED=1 with
# caps that add up to more than LINK lets the sum pass LINK (htb grants
# every class its assured rate): fractions above 1 then, not a short
# warm-up.
set -euo pipefail
bench=${1:-target/release/ringwire-bench}
op=${OP:-all_reduce}
lanes_list=${LANES:-1 2 4 8}
cap=${CAP:-100mbit}
link=${LINK:-400mbit}
slow=${SLOW:-}
rounds=${ROUNDS:-2}
read -r min_size max_size <<<"${SIZES:-4M 32M}"
iters=${ITERS:-3}
warmup=${WARMUP:-3}
out=${OUT:-$(mktemp -d)}
extra_env=${EXTRA_ENV:-}
queue=${QUEUE:-100}
diag=${DIAG:-}
assured=${ASSURED:-auto}
mkdir -p "$out"
[ -x "$bench" ] || { echo "no bench at $bench: cargo build --release -p ringwire-bench" >&2; exit 1; }

source "$(dirname "${BASH_SOURCE[0]}")/hosts.sh"
two_hosts ln 215 1500
# Whether each connection's class is assured its cap (1) or borrows (0),
# per lane count: auto assures them where every lane at its cap fits in
# the link (the slow lane is slow on rank 0's end only, so it does not
# count here).
declare -A assured_of
for lanes in $lanes_list; do
  case $assured in
  0 | 1) assured_of[$lanes]=$assured ;;
  auto)
    assured_of[$lanes]=$(python3 - "$lanes" "$cap" "$link" <<'EOF'
import re, sys
def bits(rate):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
    if not m:
        sys.exit(f"lanes.sh: cannot read the rate {rate!r} (want e.g. 100mbit)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
lanes, cap, link = int(sys.argv[1]), bits(sys.argv[2]), bits(sys.argv[3])
print(1 if lanes * cap <= link else 0)
EOF
    ) ;;
  *) echo "lanes.sh: ASSURED is auto, 0 or 1, not '$assured'" >&2; exit 1 ;;
  esac
done
echo "# link: veth, htb $link each way, each connection $cap${slow:+ (one lane of rank 0: $slow)}, classes assured their caps (by lanes): $(for l in $lanes_list; do printf '%s:%s ' "$l" "${assured_of[$l]}"; done)$(nproc) cores, $(uname -r)"

# A fresh htb tree on both ends: LINK for everything, unclassed traffic
# (the store) in 1:2.
reset_qdiscs() {
  for i in 0 1; do
    tc -n "${ns[$i]}" qdisc del dev "${veth[$i]}" root 2>/dev/null || true
    tc -n "${ns[$i]}" qdisc add dev "${veth[$i]}" root handle 1: htb default 2 r2q 1000
    tc -n "${ns[$i]}" class add dev "${veth[$i]}" parent 1: classid 1:1 htb rate "$link" ceil "$link"
    tc -n "${ns[$i]}" class add dev "${veth[$i]}" parent 1:1 classid 1:2 htb rate "$link" ceil "$link"
  done
}

# Caps each connection of the link to rank 1's port as it appears: its
# class on rank 0's end (by source port) and on rank 1's (by destination).
class_connections() { # port want_connections assured(0/1)
  python3 - "${ns[@]}" "${veth[@]}" "$1" "$2" "$cap" "$slow" "$queue" "$3" <<'EOF'
import subprocess, sys, time
ns0, ns1, v0, v1, port, want, cap, slow, queue, assured = sys.argv[1:11]
want = int(want)
classed, slow_port, k = {}, None, 0
def tc(ns, *args):
    subprocess.run(["tc", "-n", ns, *args], check=True, capture_output=True)
def floor(rate):
    return rate if assured == "1" else "1mbit"
def add(lport, rate):
    global k
    k += 1
    classed[lport] = cls = f"1:{10 + k}"
    for ns, dev, key in ((ns0, v0, "sport"), (ns1, v1, "dport")):
        # Assured its cap, or (where the caps exceed the link) a small
        # assured rate borrowing up to the cap from the link's class: the
        # link's rate then bounds the sum (htb grants every class its
        # assured rate even past its parent's).
        tc(ns, "class", "add", "dev", dev, "parent", "1:1", "classid", cls,
           "htb", "rate", floor(rate), "ceil", rate, "quantum", "1514")
        # A queue of a switch's depth, not htb's default 1000 packets
        # (whose 120 ms at 100 Mbit/s would make every lane's RTT that).
        tc(ns, "qdisc", "add", "dev", dev, "parent", cls, "pfifo", "limit", queue)
        tc(ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
           "prio", "1", "u32", "match", "ip", key, str(lport), "0xffff", "flowid", cls)
deadline = time.time() + 60
while time.time() < deadline:
    ss = subprocess.run(["ip", "netns", "exec", ns0, "ss", "-tinH", "state", "established",
                         "dport", "=", port], capture_output=True, text=True).stdout
    conns, lport = [], None
    for line in ss.splitlines():
        if not line.startswith((" ", "\t")):
            lport = int(line.split()[2].rsplit(":", 1)[1])
            continue
        sent = next((int(f.split(":")[1]) for f in line.split() if f.startswith("bytes_sent:")), 0)
        conns.append((lport, sent))
    for lport, sent in conns:
        if lport not in classed:
            add(lport, cap)
    if slow and slow_port is None:
        busy = [p for p, sent in conns if sent > 1 << 20 and p in classed]
        if busy:
            # A lane rank 0 writes (nothing else carries a megabyte from
            # it): slowed on rank 0's end.
            slow_port = busy[0]
            tc(ns0, "class", "change", "dev", v0, "parent", "1:1", "classid",
               classed[slow_port], "htb", "rate", floor(slow), "ceil", slow, "quantum", "1514")
    if len(classed) >= want and (not slow or slow_port is not None):
        print(f"classed {len(classed)} connections" + (f", slow lane at port {slow_port}" if slow else ""), flush=True)
        sys.exit(0)
    time.sleep(0.02)
sys.exit(f"only {len(classed)} of {want} connections appeared")
EOF
}

# The baseline: `lanes` plain TCP streams each way at once (as the
# all-reduce's two directions), each in a class of its own as the ranks'
# connections are (with SLOW, rank 0's first stream at SLOW), for five
# seconds: Mbit/s the slower way.
plain_tcp() { # lanes
  reset_qdiscs
  local lanes=$1 i k rate pids=() senders=()
  for i in 0 1; do
    for ((k = 0; k < lanes; k++)); do
      rate=$cap
      if [ "$i" = 0 ] && [ "$k" = 0 ] && [ -n "$slow" ]; then rate=$slow; fi
      local floor=1mbit
      if [ "${assured_of[$lanes]}" = 1 ]; then floor=$rate; fi
      tc -n "${ns[$i]}" class add dev "${veth[$i]}" parent 1:1 classid "1:$((100 + k))" htb rate "$floor" ceil "$rate" quantum 1514
      tc -n "${ns[$i]}" qdisc add dev "${veth[$i]}" parent "1:$((100 + k))" pfifo limit "$queue"
      tc -n "${ns[$i]}" filter add dev "${veth[$i]}" parent 1: protocol ip prio 1 u32 \
        match ip dport $((6000 + 100 * i + k)) 0xffff flowid "1:$((100 + k))"
    done
  done
  for i in 0 1; do
    ip netns exec "${ns[$i]}" python3 -c '
import socket, sys, threading, time
host, base, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def sink(port):
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((host, port)); l.listen(); c, _ = l.accept()
    while c.recv(1 << 20): pass
for k in range(n):
    threading.Thread(target=sink, args=(base + k,), daemon=True).start()
time.sleep(8)' "${ip_of[$i]}" $((6000 + 100 * (1 - i))) "$lanes" &
    pids+=($!)
  done
  sleep 0.5
  for i in 0 1; do
    ip netns exec "${ns[$i]}" python3 -c '
import socket, sys, threading, time
host, base, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secs, sent = 5.0, [0] * n
def source(k):
    s = socket.create_connection((host, base + k)); buf = b"x" * (1 << 20)
    t = time.time()
    while time.time() - t < secs: sent[k] += s.send(buf)
ts = [threading.Thread(target=source, args=(k,)) for k in range(n)]
t = time.time(); [x.start() for x in ts]; [x.join() for x in ts]
print(sum(sent) * 8 / (time.time() - t) / 1e6)' "${ip_of[$((1 - i))]}" $((6000 + 100 * i)) "$lanes" \
      >"$out/plain-$lanes-$i.txt" &
    senders+=($!)
  done
  for p in "${senders[@]}"; do wait "$p"; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  python3 -c "import sys; print(min(float(open(f).read()) for f in sys.argv[1:]))" \
    "$out/plain-$lanes-0.txt" "$out/plain-$lanes-1.txt" >"$out/plain-$lanes.txt"
}

run_one() { # lanes round
  local lanes=$1 round=$2 port=$((20000 + RANDOM % 20000)) pids=()
  reset_qdiscs
  if [ "$diag" = 1 ]; then for r in 0 1; do ip netns exec "${ns[$r]}" env NSTAT_HISTORY="$out/.nstat$r" nstat -n; done; fi
  for r in 0 1; do
    ip netns exec "${ns[$r]}" env \
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="${ip_of[0]}" MASTER_PORT=$port RINGWIRE_TCP_LANES="$lanes" $extra_env \
      "$bench" "$op" -b "$min_size" -e "$max_size" -f 2 -n "$iters" -w "$warmup" \
      --transport uring -c 1 \
      $([ $r = 0 ] && echo --json "$out/$op-l$lanes-$round.json") \
      >"$out/$op-l$lanes-$round-rank$r.log" 2>&1 &
    pids+=($!)
  done
  # Rank 1 listens on the port after the store's (the bench's rule); its
  # link to rank 0 has a main connection and `lanes` lanes each way.
  local listen
  for _ in $(seq 200); do
    listen=$(ip netns exec "${ns[1]}" ss -tlnpH | awk '/ringwire-bench/ {split($4, a, ":"); print a[length(a)]}' | grep -v "^$port$" | head -1 || true)
    [ -n "$listen" ] && break
    sleep 0.05
  done
  class_connections "$listen" $((1 + 2 * lanes)) "${assured_of[$lanes]}" >"$out/$op-l$lanes-$round-classes.log" 2>&1 &
  local classer=$!
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  wait "$classer" || { echo "classing failed ($lanes lanes, round $round):" >&2; cat "$out/$op-l$lanes-$round-classes.log" >&2; exit 1; }
  if [ $failed = 1 ]; then
    echo "a rank failed ($lanes lanes, round $round); logs in $out" >&2
    tail -5 "$out/$op-l$lanes-$round-rank"*.log >&2
    exit 1
  fi
  if [ "$diag" = 1 ]; then
    for r in 0 1; do
      { ip netns exec "${ns[$r]}" env NSTAT_HISTORY="$out/.nstat$r" nstat
        tc -n "${ns[$r]}" -s qdisc show dev "${veth[$r]}"; } >"$out/$op-l$lanes-$round-diag$r.txt"
    done
  fi
}

for lanes in $lanes_list; do plain_tcp "$lanes"; done

for ((round = 0; round < rounds; round++)); do
  order=$lanes_list
  if ((round % 2 == 1)); then order=$(echo "$lanes_list" | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for lanes in $order; do run_one "$lanes" "$round"; done
done

python3 - "$out" "$op" "$rounds" "$cap" "$link" "$slow" $lanes_list <<'EOF'
import json, statistics, sys, glob, os, re
out, op, rounds, cap, link, slow = sys.argv[1:7]
def bits(rate):
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
cap_b, link_b = bits(cap), bits(link)
print(f"{op}: busbw / what the link can carry, median of {rounds} rounds (each round's in brackets);")
print("'plain': busbw / what as many plain TCP streams each way moved through the same classes")
print(f"{'lanes':>5} {'bytes':>10} {'can carry':>10} {'fraction':>28} {'plain':>6} {'cpu s/GB':>9}")
for lanes in map(int, sys.argv[7:]):
    if slow:
        ideal = min((lanes - 1) * cap_b + bits(slow), link_b)
    else:
        ideal = min(lanes * cap_b, link_b)
    plain = float(open(os.path.join(out, f"plain-{lanes}.txt")).read()) * 1e6
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, f"{op}-l{lanes}-*.json"))):
        for r in json.load(open(path))["rows"]:
            if r["wrong"]:
                sys.exit(f"{path}: {r['wrong']} wrong elements at {r['size_bytes']} bytes")
            rows.setdefault(r["size_bytes"], []).append((r["busbw_gbps"] * 8e9, r["cpu_s_per_gb"]))
    for size in sorted(rows):
        v = [b / ideal for b, _ in rows[size]]
        vs_plain = statistics.median(b for b, _ in rows[size]) / plain
        cpu = statistics.median(c for _, c in rows[size])
        print(f"{lanes:>5} {size:>10} {ideal / 1e6:>8.0f}Mb {statistics.median(v):>6.3f} {str([round(x, 3) for x in v]):>21} {vs_plain:>6.3f} {cpu:>9.2f}")
        if max(v) > 1.05:
            print(f"      above the caps: connections were classed after timing began (raise WARMUP)")
    print(f"{lanes:>5} plain TCP, {lanes} streams each way: {plain / 1e6:.0f} Mbit/s the slower way")
EOF
echo "# runs: $out"
