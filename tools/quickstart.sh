#!/usr/bin/env bash
# The main job from a fresh Debian machine: install dependencies, build,
# fetch and convert MovieLens with the project's own tools, then
#   pipeline run configs/teacher.ini
# (which first runs configs/pretrain.ini when its checkpoint is missing).
# Usage: tools/quickstart.sh [extra section.key=value overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh --data
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
bash tools/prepare_data.sh
./build/core/pipeline run configs/teacher.ini "$@"
