#!/usr/bin/env bash
# GPU machine check for the CUDA backend (issue 6): builds normlab from scratch with the CUDA backend
# required, runs every test (the [cuda] tests compare each CUDA kernel with the CPU's; none may be
# skipped here), prints `normlab info`, runs `normlab bench norms` and the default
# `normlab train configs/toy_transformer.json` on the GPU, and writes all output into the folder given
# as the argument (one log per step plus summary.txt). Exit status: non-zero when any step failed.
#   usage: tests/cuda/device_check.sh OUT_DIR [extra cmake args...]
set -uo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [extra cmake args...]" >&2
    exit 2
fi
out="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$out/build"
jobs="$(nproc 2>/dev/null || echo 4)"
summary="$out/summary.txt"
: >"$summary"
status=0

# step NAME COMMAND...: runs COMMAND with stdout+stderr to NAME.log, records pass/fail in the summary.
step() {
    local name="$1"
    shift
    echo "== $name: $*" | tee -a "$summary"
    local start=$SECONDS
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc after $((SECONDS - start)) s (log: $name.log)" | tee -a "$summary"
    if [[ $rc -ne 0 ]]; then
        status=1
        tail -n 30 "$out/$name.log" | sed 's/^/   | /' | tee -a "$summary"
    fi
    return $rc
}

{
    echo "normlab CUDA device check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "source: $root ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi unavailable"
} | tee -a "$summary"
nvidia-smi >"$out/nvidia-smi.log" 2>&1

rm -rf "$build"
step configure cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DNORMLAB_CUDA=ON "$@" || { echo "FAILED" | tee -a "$summary"; exit 1; }
step build cmake --build "$build" -j"$jobs" || { echo "FAILED" | tee -a "$summary"; exit 1; }
step info "$build/normlab" info

# Every CUDA kernel against the CPU first (quick to read), then the whole suite.
step test_cuda "$build/normlab_tests" "[cuda]" --durations yes
if grep -q "SKIPPED: no CUDA device" "$out/test_cuda.log"; then
    echo "   ERROR: CUDA tests were skipped on the device machine" | tee -a "$summary"
    status=1
fi
(cd "$build" && step ctest ctest --output-on-failure -j"$jobs" --timeout 900)

# The GPU runs. `--set device=cuda` selects the GPU where the command's config has a "device" key;
# when a command does not accept it yet, the failure is recorded and it runs again on the CPU so the
# log still shows the command works (that run is NOT a GPU result).
gpu_or_cpu() {
    local name="$1"
    shift
    if ! step "$name" "$@" --set device=cuda; then
        echo "   NOTE: '$name' did not run with --set device=cuda; CPU run follows (not a GPU result)" | tee -a "$summary"
        step "${name}_cpu" "$@"
    fi
}
gpu_or_cpu bench_norms "$build/normlab" bench norms --out "$out/bench_norms" --force
gpu_or_cpu train "$build/normlab" train "$root/configs/toy_transformer.json" --out "$out/train_run" --force

echo "== done: overall status $status" | tee -a "$summary"
exit $status
