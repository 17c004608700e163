#!/usr/bin/env bash
# normlab set-up for Debian 12: installs the packages that are missing (only those), configures and
# builds Release in ./build, then runs the main job or the tests. The README's two commands:
#   ./setup.sh run     # set up, build the program, then train the toy transformer on configs/toy_transformer.json
#   ./setup.sh test    # set up, build everything, then run every test (ctest in ./build)
# Also:  ./setup.sh            set up only
#        ./setup.sh run ARGS   set up, then run `build/normlab ARGS`
#        ./setup.sh python     the Python package installed into the virtual environment .venv
# Environment: NORMLAB_CMAKE_ARGS adds configure flags (e.g. "-DNORMLAB_CUDA=OFF");
#              NORMLAB_WITH_TORCH=1 adds PyTorch to .venv, for the Python tests that compare with it.
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
# The Python package (python/, docs/python.md) builds in a virtual environment: venv and the headers.
REQUIRED_PACKAGES+=(python3-dev python3-venv)
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

# The virtual environment .venv with the Python package's build and test tools from PyPI (nanobind,
# scikit-build-core, NumPy, pytest; jsonschema, which checks the config schemas as an editor does;
# tokenizers, for `python -m normlab.data.tokenize`; PyTorch too when NORMLAB_WITH_TORCH=1, for the tests that compare with it). Made once; `pip install`
# only what is missing.
PYTHON_PACKAGES=(nanobind scikit-build-core numpy pytest jsonschema tokenizers)
python_env() {
    if [[ ! -x .venv/bin/python ]]; then
        log "making the virtual environment .venv"
        python3 -m venv .venv
    fi
    local wanted=("${PYTHON_PACKAGES[@]}")
    [[ "${NORMLAB_WITH_TORCH:-0}" == 1 ]] && wanted+=(torch)
    local missing=() p
    for p in "${wanted[@]}"; do
        .venv/bin/python -c "import ${p//-/_}" 2>/dev/null || missing+=("$p")
    done
    if ((${#missing[@]} > 0)); then
        log "installing into .venv: ${missing[*]}"
        .venv/bin/python -m pip install -q --disable-pip-version-check "${missing[@]}"
    fi
}

# Configures ./build and builds the targets given (none: everything, the tests included).
build() {
    local extra=() targets=()
    if [[ -n "${NORMLAB_CMAKE_ARGS:-}" ]]; then
        read -r -a extra <<<"$NORMLAB_CMAKE_ARGS"
    fi
    if (($# > 0)); then
        targets=(--target "$@")
    fi
    if [[ -x .venv/bin/python ]]; then
        extra=("-DPython_EXECUTABLE=$PWD/.venv/bin/python" "${extra[@]}")
    fi
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${extra[@]}"
    cmake --build build -j"$(nproc)" "${targets[@]}"
}

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
}

main() {
    local command="${1:-}"
    case "$command" in
        "" | run | test | python) ;;
        -h | --help | help) usage; return 0 ;;
        *) log "unknown command '$command'"; usage >&2; return 2 ;;
    esac
    install_missing
    case "$command" in
        "") build ;;
        run)
            build normlab  # only the program: the job needs nothing else
            shift
            if (($# == 0)); then
                set -- train configs/toy_transformer.json  # the main job on its default config
            fi
            ./build/normlab "$@"
            ;;
        test)
            python_env
            build
            cd build
            # ctest runs tests side by side: idle OpenMP workers must sleep, not spin, or the
            # parallel tests starve each other on a small machine.
            export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
            ctest --output-on-failure -j"$(nproc)"
            ;;
        python)
            # `import normlab` in .venv: the package built and installed by pip (pyproject.toml).
            python_env
            .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation .
            .venv/bin/python -c "import normlab; print('setup.sh: normlab', normlab.__version__, 'in .venv:', normlab.__file__)"
            ;;
    esac
}

main "$@"
