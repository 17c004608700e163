#!/usr/bin/env bash
# normlab set-up for Debian 12: installs the packages that are missing (only those), configures and
# builds Release in ./build, then runs the main job or the tests. The README's two commands:
#   ./setup.sh run     # set up, then train the toy transformer on configs/toy_transformer.json
#   ./setup.sh test    # set up, then run every test (ctest in ./build)
# Also:  ./setup.sh            set up only
#        ./setup.sh run ARGS   set up, then run `build/normlab ARGS`
# Environment: NORMLAB_CMAKE_ARGS adds configure flags (e.g. "-DNORMLAB_CUDA=OFF").
# Works without a terminal (CI=true, no stdin): apt runs non-interactively.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

# Needed to build and test. (nvcc is not here: the CUDA backend is built only where a CUDA toolkit
# is already installed; see docs/cuda.md.)
# libopenblas-openmp-dev: OpenBLAS built on OpenMP, so its gemms share normlab's OpenMP threads (see
# CMakeLists.txt); it installs beside Debian's default pthreads build without replacing it.
REQUIRED_PACKAGES=(build-essential cmake pkg-config libopenblas-openmp-dev nlohmann-json3-dev catch2
                   libfmt-dev libcli11-dev)
# MPI (data-parallel train, distributed sweeps: docs/distributed.md); the build works without it.
REQUIRED_PACKAGES+=(libopenmpi-dev openmpi-bin)
# Nice to have: gnuplot draws a run's PNG plots, graphviz renders autograd graphs exported as DOT.
# Installed when missing, but a failure to install them only warns: nothing in the build needs them.
OPTIONAL_PACKAGES=(gnuplot-nox graphviz)

log() { echo "setup.sh: $*" >&2; }

is_installed() {
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == "installed" ]]
}

# Run as root directly, else through sudo (non-interactive: no password prompt without a terminal).
as_root() {
    if [[ "$(id -u)" == 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo -n "$@" || { log "'$*' needs root: run as root or set up password-less sudo"; return 1; }
    else
        log "'$*' needs root and sudo is not installed"
        return 1
    fi
}

install_missing() {
    if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
        log "no dpkg/apt-get here (not Debian?): skipping package installation"
        return 0
    fi
    local required=() optional=() p
    for p in "${REQUIRED_PACKAGES[@]}"; do is_installed "$p" || required+=("$p"); done
    for p in "${OPTIONAL_PACKAGES[@]}"; do is_installed "$p" || optional+=("$p"); done
    if ((${#required[@]} == 0 && ${#optional[@]} == 0)); then
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    local apt_install=(apt-get install -y -q --no-install-recommends)
    log "installing missing packages: ${required[*]}${required[*]:+ }${optional[*]}"
    as_root apt-get update -q
    if ((${#required[@]} > 0)); then
        as_root "${apt_install[@]}" "${required[@]}"
    fi
    if ((${#optional[@]} > 0)); then
        as_root "${apt_install[@]}" "${optional[@]}" ||
            log "warning: could not install optional ${optional[*]} (plots / graph rendering unavailable)"
    fi
}

build() {
    local extra=()
    if [[ -n "${NORMLAB_CMAKE_ARGS:-}" ]]; then
        read -r -a extra <<<"$NORMLAB_CMAKE_ARGS"
    fi
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${extra[@]}"
    cmake --build build -j"$(nproc)"
}

usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
}

main() {
    local command="${1:-}"
    case "$command" in
        "" | run | test) ;;
        -h | --help | help) usage; return 0 ;;
        *) log "unknown command '$command'"; usage >&2; return 2 ;;
    esac
    install_missing
    build
    case "$command" in
        run)
            shift
            if (($# == 0)); then
                set -- train configs/toy_transformer.json  # the main job on its default config
            fi
            ./build/normlab "$@"
            ;;
        test)
            cd build
            # ctest runs tests side by side: idle OpenMP workers must sleep, not spin, or the
            # parallel tests starve each other on a small machine (measured: 29 s vs 2 s).
            export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
            ctest --output-on-failure -j"$(nproc)"
            ;;
    esac
}

main "$@"
