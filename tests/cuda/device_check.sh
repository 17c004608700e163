#!/usr/bin/env bash
# GPU machine check for the CUDA backend: builds normlab from scratch with the CUDA backend
# required, runs every CUDA kernel's test against the CPU (none may be skipped there), the norm benchmark
# with the 8192x4096 target shape in f32 and bf16, the default `normlab train` (f32 and bf16 autocast),
# `normlab bench torch` (normlab vs PyTorch eager on the same GPU), the whole test suite and
# `normlab stability`, all on the GPU, most telling first, so that a run cut short still reports them.
# Where a Python test dies on a signal, the smallest Python program that did is run again under a
# debugger and with single settings changed.
#
# A GPU machine may have a CUDA toolkit but no package registry: give it the Debian packages normlab
# builds against as an archive made by tests/cuda/stage_deps.sh (--deps). The build and the runs live in
# a work folder, and OUT_DIR gets only two files, rewritten after every step (so a caller that fetches a
# few files gets everything): summary.txt (each step's command, exit status, time and last lines) and
# results.tar.gz (every step's full log and the runs' CSV/JSON outputs, without checkpoints).
#
#   usage: tests/cuda/device_check.sh [--deps ARCHIVE] [--device cuda|cpu] [--work DIR] OUT_DIR [cmake args...]
#   --deps ARCHIVE  unpack ARCHIVE (from stage_deps.sh) and build and run against it
#   --device cpu    run every step on the CPU instead, without the CUDA backend: checks this script's
#                   plumbing on a machine without a GPU (the benchmark figures then mean nothing)
#   --work DIR      build and run folder (default /tmp/normlab-device-check; emptied first)
# On the GPU machine, from the repository root, with the archive copied there:
#   tests/cuda/device_check.sh --deps .devdeps/normlab-deps.tar.gz OUT_DIR
# Exit status: non-zero when any step failed.
set -uo pipefail

# A bad argument: what was expected and what was found, then the usage; exit code 2, before any folder
# is made or emptied.
bad_argument() {
    echo "device_check.sh: $*" >&2
    sed -n '/^#   usage:/,/^#   --work/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

deps=""
device="cuda"
work="/tmp/normlab-device-check"
while [[ $# -gt 0 && "$1" == --* ]]; do
    [[ "$1" == --deps || "$1" == --device || "$1" == --work ]] ||
        bad_argument "unknown option \"$1\" (expected --deps, --device or --work)"
    [[ $# -ge 2 ]] || bad_argument "$1: expected a value, found none"
    case "$1" in
        --deps)
            [[ -f "$2" ]] || bad_argument "--deps: expected an archive made by stage_deps.sh, found no file \"$2\""
            deps="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")" ;;
        --device) device="$2" ;;
        --work) work="$2" ;;
    esac
    shift 2
done
[[ $# -ge 1 ]] || bad_argument "expected OUT_DIR, found no arguments after the options"
[[ "$device" == cuda || "$device" == cpu ]] || bad_argument "--device: expected cuda or cpu, found \"$device\""
out="$(realpath -m "$1")"
case "$(realpath -m "$work")" in
    "$out" | "$out"/*) bad_argument "--work: expected a folder outside OUT_DIR, found \"$work\"" ;;
esac
mkdir -p "$out"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work"
mkdir -p "$work/logs" "$work/runs"
build="$work/build"
logs="$work/logs"
runs="$work/runs"
jobs="$(nproc 2>/dev/null || echo 4)"
summary="$out/summary.txt"
: >"$summary"
status=0

say() { echo "$*" | tee -a "$summary"; }

# The results archive, rewritten atomically after every step so that a run killed at its time limit
# still returns what it had.
pack_results() {
    tar -czf "$out/results.tar.gz.tmp" -C "$work" --exclude=checkpoints logs runs && mv "$out/results.tar.gz.tmp" "$out/results.tar.gz"
}

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit with stdout+stderr to logs/NAME.log,
# records exit status, time and the log's last lines in the summary.
step() {
    local name="$1" limit="$2"
    shift 2
    say "== $name: $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    local shown=8
    if [[ $rc -ne 0 ]]; then
        status=1
        shown=30
        [[ $rc -eq 124 || $rc -eq 137 ]] && say "   TIMED OUT after $limit s"
    fi
    say "   exit $rc after $((SECONDS - start)) s (log: logs/$name.log)"
    tail -n "$shown" "$logs/$name.log" | cut -c1-220 | sed 's/^/   | /' | tee -a "$summary"
    pack_results
    return $rc
}

# The device image's CMake comes from pip, beside its python3: put that folder on the PATH if cmake is not.
if ! command -v cmake >/dev/null && command -v python3 >/dev/null; then
    export PATH="$PATH:$(dirname "$(command -v python3)")"
fi

say "normlab device check ($device), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "source: $root ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
say "machine: $(nproc) cores, $(uname -srm); compilers: $(c++ --version 2>/dev/null | head -1); $(nvcc --version 2>/dev/null | tail -1 || echo 'no nvcc on PATH'); $(cmake --version 2>/dev/null | head -1)"
if [[ "$device" == cuda ]]; then
    say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 || echo 'nvidia-smi unavailable')"
fi

cmake_args=(-DCMAKE_BUILD_TYPE=Release)
if [[ "$device" == cuda ]]; then
    cmake_args+=(-DNORMLAB_CUDA=ON)
else
    cmake_args+=(-DNORMLAB_CUDA=OFF)
fi
if [[ -n "$deps" ]]; then
    # Debian's packages unpacked under work/deps: CMake finds their config files and OpenBLAS through the
    # prefix; libopenblas's own dependency (libgfortran) is found at run time through LD_LIBRARY_PATH.
    step unpack_deps 120 tar -xzf "$deps" -C "$(mkdir -p "$work/deps" && echo "$work/deps")" || { say "FAILED"; exit 1; }
    sed 's/^/   deps: /' "$work/deps/MANIFEST.txt" | tee -a "$summary"
    multiarch="$(ls "$work/deps/usr/lib" | grep -m1 -- '-linux-gnu')"
    export LD_LIBRARY_PATH="$work/deps/usr/lib/$multiarch:$work/deps/usr/lib/$multiarch/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    cmake_args+=("-DCMAKE_PREFIX_PATH=$work/deps/usr")
fi

step configure 180 cmake -S "$root" -B "$build" "${cmake_args[@]}" "$@" || { say "FAILED"; exit 1; }
step build 600 cmake --build "$build" -j"$jobs" || { say "FAILED"; exit 1; }
step info 60 "$build/normlab" info

set_device=(--set "device=$device")
if [[ "$device" == cuda ]]; then
    # Every CUDA kernel against the CPU first: the quickest answer to "does it work".
    step test_cuda 300 "$build/normlab_tests" "[cuda]" --durations yes
    # (The two-GPU test may say "SKIPPED: no CUDA device cuda:1" on a one-GPU machine.)
    if grep -q "SKIPPED: no CUDA device: " "$logs/test_cuda.log"; then
        say "   ERROR: CUDA tests were skipped on the device machine"
        status=1
    fi
fi
# The bandwidth targets at 8192x4096 (docs/cuda.md): forward >= 0.85 of a device-to-device copy, fwd+bwd >= 0.7.
step bench_norms 300 "$build/normlab" bench norms "${set_device[@]}" --set 'hidden=[1024,4096]' --set 'batch=[64]' \
    --set 'large_shapes=["8192x4096","16384x4096"]' --set 'dtypes=["f32","bf16"]' --set reps=30 \
    --out "$runs/bench_norms" --force
step train 300 "$build/normlab" train "$root/configs/toy_transformer.json" "${set_device[@]}" --out "$runs/train" --force
step train_bf16 300 "$build/normlab" train "$root/configs/toy_transformer.json" "${set_device[@]}" \
    --set train.autocast=bf16 --out "$runs/train_bf16" --force
# The toy transformer's step time against PyTorch eager on the same device (the torch/ours ratio).
step bench_torch 400 "$build/normlab" bench torch --device "$device" --threads 0 \
    --config "$root/configs/toy_transformer.json" --script "$root/examples/cli/torch_bench.py"
if grep -q "PyTorch side skipped" "$logs/bench_torch.log"; then
    say "   ERROR: bench torch ran without PyTorch: $(grep "PyTorch side skipped" "$logs/bench_torch.log")"
    status=1
fi
# The whole suite (in a subshell for the cd; its exit code carries the failure out).
(cd "$build" && step ctest 600 ctest --output-on-failure -j"$jobs" --timeout 300) || status=1
# A Python test that died on a signal: the smallest program that showed it (examples/python/norm_autograd.py)
# again under cuda-gdb, the GPU machine's one debugger (it debugs programs without GPU code too), for the
# native stack and the libraries loaded; then with one setting changed at a time, to narrow the cause.
if grep -q "python_test_.*(SEGFAULT)" "$logs/ctest.log" && [[ -d "$build/python/normlab" ]]; then
    python="$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"  # the one the package was built for
    probe=("${python:-python3}" "$root/examples/python/norm_autograd.py" --out "$runs/python_probe" --epochs 5)
    if command -v cuda-gdb >/dev/null; then
        step python_crash_stack 180 env PYTHONPATH="$build/python" cuda-gdb -q -batch -ex run -ex bt \
            -ex "info sharedlibrary" --args "${probe[@]}"
    fi
    step python_crash_one_thread 60 env PYTHONPATH="$build/python" OMP_NUM_THREADS=1 "${probe[@]}"
    step python_crash_no_amx 60 env PYTHONPATH="$build/python" NORMLAB_GEMM_BF16=f32 "${probe[@]}"
    step python_crash_no_cuda 60 env PYTHONPATH="$build/python" CUDA_VISIBLE_DEVICES= "${probe[@]}"
    step python_crash_blas_kernel 60 env PYTHONPATH="$build/python" OPENBLAS_CORETYPE=SkylakeX "${probe[@]}"
fi
step stability 300 "$build/normlab" stability "$root/configs/stability.json" "${set_device[@]}" --out "$runs/stability" --force

say "== done: overall status $status"
exit $status
