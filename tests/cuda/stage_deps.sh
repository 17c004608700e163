#!/usr/bin/env bash
# Packs the Debian 12 packages normlab builds against into one archive for the GPU machine, which has a
# CUDA toolkit, a compiler and CMake but reaches no package registry. Run it here (Debian 12, apt
# reachable); `tests/cuda/device_check.sh --deps ARCHIVE OUT_DIR` unpacks it there and builds against it.
# The archive holds the packages' files under usr/ (OpenBLAS's OpenMP build with the libgfortran it
# needs, nlohmann/json, fmt, CLI11, Catch2 v2) and MANIFEST.txt with each package's version.
#   usage: tests/cuda/stage_deps.sh ARCHIVE.tar.gz
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "stage_deps.sh: expected one argument, the archive to write, found $#" >&2
    echo "usage: $0 ARCHIVE.tar.gz" >&2
    exit 2
fi
archive="$(mkdir -p "$(dirname "$1")" && cd "$(dirname "$1")" && pwd)/$(basename "$1")"

# The build's needs (setup.sh's REQUIRED_PACKAGES less the toolchain) and the run-time libraries they
# pull in that a CUDA image may lack. libgomp comes with the compiler, so it is not packed.
packages=(libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
          nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev catch2)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
chmod a+rx "$work" && chmod a+rwx "$work/debs"  # apt-get download fetches as the user _apt
(cd "$work/debs" && apt-get download "${packages[@]}") || {
    echo "stage_deps.sh: apt-get download failed (run 'apt-get update' first?)" >&2
    exit 1
}
for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$work/root"
    dpkg-deb --show --showformat='${Package} ${Version}\n' "$deb" >>"$work/root/MANIFEST.txt"
done
# Not needed to build or run normlab, and they would take most of the device call's 64 MiB: the static
# OpenBLAS (58 MB), its LAPACK/BLAS front libraries, documentation.
rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/lintian"
find "$work/root" -name 'libopenblas*.a' -delete
find "$work/root" \( -name 'liblapack.so*' -o -name 'libblas.so*' \) -delete

tar -czf "$archive.tmp" -C "$work/root" .
mv "$archive.tmp" "$archive"
echo "stage_deps.sh: wrote $archive ($(du -h "$archive" | cut -f1)):"
sed 's/^/  /' "$work/root/MANIFEST.txt"
