#!/usr/bin/env bash
# Chaos trials by the hundred (issue 45): each trial is 4 to 8 ranks in
# their own processes running collectives on two communicators while one or
# two are killed (SIGKILL from outside, or in their own `agree`/`shrink`)
# or stopped (SIGSTOP); the survivors revoke, agree and shrink and go on.
# tests/chaos.rs says what each trial checks. Prints each trial and a
# summary: hangs, disagreements, wrong results, leaks (all must be 0) and
# how many shrinks the survivors ran; exits non-zero if any is not 0.
#
# Usage: benches/chaos.sh [TRIALS]   (default 500)
# Env: SEED (the first trial's seed; default fresh, printed), OUT (a file
#      for the whole log; default chaos-<seed>.log in the working folder).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-500}
seed=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
out=${OUT:-chaos-$seed.log}
echo "chaos: $trials trials from seed $seed; log in $out"
status=0
CHAOS_TRIALS=$trials CHAOS_SEED=$seed cargo test --release --test chaos chaos_trials \
    -- --nocapture >"$out" 2>&1 || status=$?
grep -E '^trial .*FAILED|^  (hang|disagreement|wrong|leak|other):' "$out" || true
summary=$(grep '^CHAOS-SUMMARY' "$out" || true)
if [[ -z $summary ]]; then
    tail -20 "$out"
    echo "chaos: no summary (the test did not finish); see $out" >&2
    exit 1
fi
echo "$summary"
exit "$status"
