#!/usr/bin/env bash
# Runs examples/ddp_overlap as two ranks in two network namespaces joined
# by a veth pair, both ends rate-limited with tbf (this kernel has no
# netem): the link a data-parallel job's gradients cross between two hosts.
# Everything it makes it removes, also on failure. Needs root and iproute2.
#
#   bash benches/ddp_overlap.sh [RATE] [EXAMPLE-ARGS...]
#   bash benches/ddp_overlap.sh 1gbit --rounds 4 --steps 5
set -euo pipefail
rate=${1:-1gbit}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/.." && pwd)
(cd "$root" && cargo build --release -q --example ddp_overlap)
exe=$root/target/release/examples/ddp_overlap
id=$(( $$ % 10000 ))
ns=(rwov${id}a rwov${id}b)
veth=(vov${id}a vov${id}b)
ip=(10.214.$(( id % 200 )).1 10.214.$(( id % 200 )).2)
cleanup() {
    for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT
ip netns add "${ns[0]}"
ip netns add "${ns[1]}"
ip link add "${veth[0]}" type veth peer name "${veth[1]}"
for i in 0 1; do
    ip link set "${veth[$i]}" netns "${ns[$i]}"
    ip -n "${ns[$i]}" addr add "${ip[$i]}/24" dev "${veth[$i]}"
    ip -n "${ns[$i]}" link set "${veth[$i]}" up
    ip -n "${ns[$i]}" link set lo up
    # Each direction limited to RATE, queueing at most 100 ms.
    ip netns exec "${ns[$i]}" tc qdisc add dev "${veth[$i]}" root tbf rate "$rate" burst 256kb latency 100ms
done
port=$(( 20000 + id ))
echo "# two ranks in namespaces ${ns[*]}, veth rate-limited to $rate each way (tbf)"
for i in 1 0; do
    ip netns exec "${ns[$i]}" env RANK=$i WORLD_SIZE=2 MASTER_ADDR="${ip[0]}" MASTER_PORT=$port \
        RINGWIRE_CONNECT_TIMEOUT=60 "$exe" "$@" &
done
status=0
for job in $(jobs -p); do wait "$job" || status=1; done
exit $status
