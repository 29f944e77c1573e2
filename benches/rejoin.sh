#!/usr/bin/env bash
# Rejoin time (issue 45, decision 0040): examples/elastic.rs at RANKS ranks
# kills a rank and starts its replacement; the replacement prints how long
# it waited to be admitted and how long the reducer and the state took
# after that. STATES (MiB of extra state each rank holds and the
# replacement is sent, "0 100") alternate within each of RUNS rounds (5),
# so both see the same machine; the medians are printed, with the time
# from the kill to the survivors' first step without the lost rank.
#
# Usage: benches/rejoin.sh
# Env: RANKS (4), STATES ("0 100"), RUNS (5), LINKS (shm: the default
#      local links; tcp: RINGWIRE_LOCAL_LINKS=tcp).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release --example elastic
exe=target/release/examples/elastic
links=${LINKS:-shm}
[[ $links == tcp ]] && export RINGWIRE_LOCAL_LINKS=tcp
declare -A admitted rest whole lost
for run in $(seq 1 "${RUNS:-5}"); do
    for mib in ${STATES:-0 100}; do
        out=$("$exe" --ranks "${RANKS:-4}" --seed "$run" --extra-state-mib "$mib" 2>&1) || {
            echo "run $run, $mib MiB: the example failed:"; echo "$out"; exit 1; }
        line=$(grep -m1 'a replacement) joined' <<<"$out")
        # "waited 19.4ms to be admitted, 241.1ms more for ... (rejoin 260.5ms)"
        ms() { sed -E 's/([0-9.]+)(ms|µs|s)/\1 \2/' <<<"$1" | awk '{v=$1; if ($2=="µs") v/=1000; if ($2=="s") v*=1000; printf "%.1f", v}'; }
        a=$(ms "$(grep -oE 'waited [0-9.]+(ms|µs|s)' <<<"$line" | cut -d' ' -f2)")
        r=$(ms "$(grep -oE '[0-9.]+(ms|µs|s) more' <<<"$line" | cut -d' ' -f1)")
        w=$(ms "$(grep -oE 'rejoin [0-9.]+(ms|µs|s)' <<<"$line" | cut -d' ' -f2)")
        k=$(grep -m1 -oE 'first step without it \(step [0-9]+\): [0-9.]+ ms' <<<"$out" | grep -oE '[0-9.]+ ms$' | cut -d' ' -f1)
        echo "run $run, $mib MiB: admitted after ${a} ms, reducer and state ${r} ms, rejoin ${w} ms; kill to the first step without it ${k} ms"
        admitted[$mib]+="$a "; rest[$mib]+="$r "; whole[$mib]+="$w "; lost[$mib]+="$k "
    done
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for mib in ${STATES:-0 100}; do
    echo "REJOIN ranks=${RANKS:-4} links=$links state=${mib}MiB: median rejoin $(median "${whole[$mib]}") ms (admitted after $(median "${admitted[$mib]}") ms, reducer and state $(median "${rest[$mib]}") ms); kill to the first step without it $(median "${lost[$mib]}") ms"
done
