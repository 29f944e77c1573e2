#!/usr/bin/env bash
# ringwire-gpu on a real GPU. Two halves, because the GPU machine may have
# no Rust toolchain:
#   bash gpu/scripts/gpu-test.sh build   (where Rust is) builds the test
#       binaries with the `cuda` feature, and the stand-in NCCL, into .gpu-bin/
#   bash gpu/scripts/gpu-test.sh run     (on the GPU machine, with .gpu-bin/
#       carried over) runs every test there, the ignored real-GPU ones too
#   bash gpu/scripts/gpu-test.sh         does both on one machine.
# NCCL is found as in production (RINGWIRE_NCCL_LIB, libnccl.so.2, the
# nvidia-nccl wheel of a Python on PATH); the script adds the usual venvs
# to PATH. NCCL_MULTI_RANK_GPU_ENABLE=1 lets NCCL 2.30+ put two ranks on one
# GPU; older NCCLs refuse, and the test asserts the refusal instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.gpu-bin

build() {
    rm -rf "$BIN" && mkdir -p "$BIN"
    # No debug info: the binaries travel (64 MiB in all).
    export CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_DEV_DEBUG=0
    cargo build -q -p ringwire-nccl-standin
    cp target/debug/libringwire_nccl_standin.so "$BIN/"
    cargo test -q -p ringwire-gpu --features cuda --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    kinds = m.get("target", {}).get("kind", [])
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test") and "example" not in kinds:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
        print("built", m["target"]["name"])
' "$BIN"
    strip "$BIN"/* 2>/dev/null || true
    du -sh "$BIN"
}

run() {
    for venv in /opt/torch/.venv "$HOME/.cache/ringwire/torch-venv"; do
        [ -d "$venv/bin" ] && PATH="$PATH:$venv/bin"
    done
    export PATH
    nvidia-smi -L || echo "(no nvidia-smi)"
    export NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE:-1}
    export RINGWIRE_STANDIN_NCCL="$PWD/$BIN/libringwire_nccl_standin.so"
    status=0
    for test in "$BIN"/*; do
        case "$test" in *.so) continue ;; esac
        echo "=== $(basename "$test")"
        "$test" --include-ignored --test-threads=1 || status=1
    done
    exit $status
}

case "${1:-all}" in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: $0 [build|run|all]" >&2; exit 2 ;;
esac
