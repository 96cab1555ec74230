#!/bin/sh
# bench/loader/run.sh BUILD_DIR [FILE.h5] [GiB]
# Builds bench_loader against BUILD_DIR (plugins + test_plugins must be built:
# `cmake --build BUILD_DIR --target plugin_hdf5_rows test_null_model`), makes
# the file if missing, runs once. Heavy: 2 GiB of disk and I/O.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [FILE.h5] [GiB]}" && pwd)
file=${2:-/tmp/pl_bench_loader.h5}
gib=${3:-2}
[ -f "$file" ] || python3 "$here/make_file.py" "$file" "$gib"
sup="$repo/tests/kits" # loader_test_util (issue 33: the test kits under tests/)
cc -O2 -std=gnu11 -o "$build/bench_loader" "$here/bench_loader.c" "$sup/loader_test_util.c" \
   -I"$repo/core/include" -I"$repo/core/src" -I"$sup" \
   -DPL_TEST_PLUGIN_DIR="\"$build/plugins\"" -DPL_LOADER_TEST_PLUGIN_DIR="\"$build/test_plugins\"" \
   $(pkg-config --cflags --libs hdf5) -L"$build/core" -Wl,-rpath,"$build/core" -lpipeline_testing -lpipeline_core
"$build/bench_loader" "$file" 0.25 4096
