#!/usr/bin/env bash
# GPU machine check for the CUDA backend (issue 6): builds normlab from scratch with the CUDA backend
# required, runs every test (the [cuda] tests compare each CUDA kernel with the CPU's; none may be
# skipped here), prints `normlab info`, runs `normlab bench norms` (f32 and bf16, with the issue's
# 8192x4096 shape), the default `normlab train configs/toy_transformer.json` (f32 and bf16 autocast),
# `normlab stability` and `normlab bench torch` (normlab vs PyTorch eager, both on the GPU) on the GPU,
# and writes all output into the folder given as the argument (one log per step plus summary.txt).
# Exit status: non-zero when any step failed.
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
# In a subshell for the cd; its exit code carries the step's failure out (the subshell's status=1 would not).
(cd "$build" && step ctest ctest --output-on-failure -j"$jobs" --timeout 900) || status=1

# The GPU runs (the jobs' "device" key). The norm benchmark adds the issue's 8192x4096 shape and runs
# every case in f32 and bf16 (the issue's bandwidth targets: fwd >= 0.85, fwd+bwd >= 0.7 of the copy).
step bench_norms "$build/normlab" bench norms --set device=cuda --set 'large_shapes=["8192x4096","16384x4096"]' \
    --set 'dtypes=["f32","bf16"]' --set reps=30 --out "$out/bench_norms" --force
step train "$build/normlab" train "$root/configs/toy_transformer.json" --set device=cuda --out "$out/train_run" --force
step train_bf16 "$build/normlab" train "$root/configs/toy_transformer.json" --set device=cuda \
    --set train.autocast=bf16 --out "$out/train_bf16" --force
step stability "$build/normlab" stability "$root/configs/stability.json" --set device=cuda --out "$out/stability" --force
# The toy transformer's step time against PyTorch eager on the same GPU (the issue asks for the ratio).
step bench_torch "$build/normlab" bench torch --device cuda --threads 0 --config "$root/configs/toy_transformer.json" \
    --script "$root/examples/torch_bench.py"
if [[ -f "$out/bench_torch.log" ]] && grep -q "PyTorch side skipped" "$out/bench_torch.log"; then
    echo "   ERROR: bench torch ran without PyTorch on the device machine: $(grep "PyTorch side skipped" "$out/bench_torch.log")" |
        tee -a "$summary"
    status=1
fi

echo "== done: overall status $status" | tee -a "$summary"
exit $status
