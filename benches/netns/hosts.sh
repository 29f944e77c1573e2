# Sourced by the scripts beside it: two "hosts" (network namespaces) joined
# by one veth pair, removed again at exit (also on failure).
#
#   two_hosts TAG OCTET MTU
#
# sets ns (the namespaces), veth (their ends of the pair), net (10.OCTET.x,
# their /24) and ip_of (net.1 and net.2), with loopback up in each. A
# script with more to clean up at exit puts it in a function `on_exit`.

two_hosts() {
  local tag=$1 octet=$2 mtu=$3 id=$$ i n
  ns=("rw${tag}a$id" "rw${tag}b$id")
  veth=("v${tag}a$id" "v${tag}b$id")
  net=10.$octet.$((id % 200))
  ip_of=("$net.1" "$net.2")
  trap remove_hosts EXIT
  for n in "${ns[@]}"; do ip netns add "$n"; done
  ip link add "${veth[0]}" type veth peer name "${veth[1]}"
  for i in 0 1; do
    ip link set "${veth[$i]}" netns "${ns[$i]}"
    ip -n "${ns[$i]}" addr add "${ip_of[$i]}/24" dev "${veth[$i]}"
    ip -n "${ns[$i]}" link set "${veth[$i]}" mtu "$mtu" up
    ip -n "${ns[$i]}" link set lo up
  done
}

remove_hosts() {
  if declare -F on_exit >/dev/null; then on_exit; fi
  local n
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
}
