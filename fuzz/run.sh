#!/usr/bin/env bash
# Build the libFuzzer harnesses (clang, ASan + UBSan) and run each in turn.
#
#   bash fuzz/run.sh [SECONDS | --runs N] [HARNESS ...]
#
# SECONDS (default 60) bounds each harness's time, --runs N its executions.
# HARNESS: ini, safetensors, hdf5, hf_config (default: all four).
# Environment: PL_FUZZ_BUILD (build dir, default build-fuzz), PL_FUZZ_WORK
# (corpora, artifacts, logs; default $PL_FUZZ_BUILD/fuzz-work). The corpus of
# each harness is kept between runs in $PL_FUZZ_WORK/corpus/HARNESS (seeded
# by fuzz/seeds.sh); a crashing input is written to
# $PL_FUZZ_WORK/artifacts/HARNESS-crash-<sha1> (reproduce: see README.md).
# Exit status: 0 when every harness ran clean, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time=60)
if [[ ${1:-} == --runs ]]; then
  limit=(-runs="${2:?--runs needs a count}"); shift 2
elif [[ ${1:-} =~ ^[0-9]+$ ]]; then
  limit=(-max_total_time="$1"); shift
fi
harnesses=("$@")
((${#harnesses[@]})) || harnesses=(ini safetensors hdf5 hf_config)
build=${PL_FUZZ_BUILD:-build-fuzz}
work=${PL_FUZZ_WORK:-$build/fuzz-work}

# libFuzzer ships with clang's compiler-rt (Debian: libclang-rt-14-dev); the
# core's OpenMP needs clang's libomp (libomp-dev)
if ! command -v clang >/dev/null ||
   [[ ! -f $(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a ]] ||
   ! echo '#include <omp.h>' | clang -fopenmp -x c -fsyntax-only - 2>/dev/null; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev libomp-dev
fi
mkdir -p "$work"/{artifacts,logs}
targets=(); for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
if ! { cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DPL_FUZZ=ON -DPL_CUDA=OFF \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"; } >"$work/logs/build.log" 2>&1; then
  tail -30 "$work/logs/build.log"
  echo "fuzz: build failed (log: $work/logs/build.log)" >&2
  exit 1
fi

seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
bash fuzz/seeds.sh "$seeds" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fail=0
for h in "${harnesses[@]}"; do
  mkdir -p "$work/corpus/$h"
  log=$work/logs/$h.log
  start=$(date +%s)
  rc=0
  "$build/fuzz/fuzz_$h" "${limit[@]}" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$h-" \
    "$work/corpus/$h" "$seeds/$h" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")
  printf 'fuzz_%s: rc %d, %s executions in %d s (%s exec/s), corpus %d files, peak RSS %s MB, log %s\n' \
    "$h" "$rc" "${runs:-?}" $(($(date +%s) - start)) "${rate:-?}" \
    "$(find "$work/corpus/$h" -type f | wc -l)" "${rss:-?}" "$log"
  if ((rc)); then
    fail=1
    grep -E -m8 'ERROR|SUMMARY|runtime error|Test unit written|fuzz_[a-z_]+:' "$log" || tail -20 "$log"
  fi
done
exit $fail
