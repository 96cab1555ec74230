#!/usr/bin/env bash
# Install the Debian packages pipeline needs to build, test and prepare data.
# Usage: sudo tools/install_deps.sh [--data]   (--data adds R for the MovieLens fetch)
set -euo pipefail
pkgs=(build-essential cmake pkg-config git
      check libsubunit-dev libopenblas-dev libhdf5-dev libcjson-dev hdf5-tools
      # OpenBLAS's OpenMP build beside Debian's default (pthreads; priority 100 > 95, so the
      # system's libopenblas.so.0 is unchanged): CMake links it, GEMMs share OpenMP's pool
      libopenblas-openmp-dev
      python3 python3-numpy python3-h5py
      librsvg2-dev fonts-dejavu-core
      libopenmpi-dev openmpi-bin)  # data-parallel training: the ddp plugin and mpirun
if [[ "${1:-}" == "--data" ]]; then
  pkgs+=(r-base-core)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "dependencies: ok (${#missing[@]} installed now)"

# The data tools run under whichever python3 is first on PATH (Debian's gets
# h5py/numpy from apt above; another interpreter, e.g. pyenv's, from pip).
if ! python3 -c "import h5py, numpy" 2>/dev/null; then
  python3 -m pip install -q h5py numpy 2>/dev/null ||
    python3 -m pip install -q --break-system-packages h5py numpy
fi
