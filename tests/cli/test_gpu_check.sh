#!/usr/bin/env bash
# test_gpu_check.sh BUILD_DIR - tools/gpu_check.sh, the one command a lent GPU
# machine runs, on a machine without a GPU: it parses, ends 0 when no step
# failed, starts no step that GPU_CHECK_DEADLINE leaves no time for (reported
# "skip" with the seconds it needs), and copies its report into $OUT after the
# steps (what a lent machine's runner sends back even when its time limit cuts
# the call). A GPU session lost to a broken script is not had again.
set -u
build=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
bash -n "$repo/tools/gpu_check.sh" || fail "tools/gpu_check.sh does not parse"
mkdir -p "$tmp/out"
# no torch import (PYTHON=false): its line says "not importable"; no GPU here
OUT="$tmp/out" PYTHON=false GPU_CHECK_BUILD="$build" GPU_CHECK_DEADLINE=40 \
    GPU_CHECK_ONLY="test_cuda curves" bash "$repo/tools/gpu_check.sh" "$tmp/check" >"$tmp/log" 2>&1
rc=$?
cat "$tmp/log"
[ "$rc" = 0 ] || fail "exit $rc with no step failed"
r=$tmp/out/gpu_report.md
[ -s "$r" ] || fail "no gpu_report.md in \$OUT"
grep -q '^| test_cuda | skip |' "$r" || fail "test_cuda's row missing from the report in \$OUT"
grep -q '^| curves | skip | 0 | GPU_CHECK_DEADLINE: needs about 90 s, [0-9]* s left |' "$r" ||
    fail "curves (about 90 s) was not left out by a 40 s deadline: $(grep curves "$r")"
cmp -s "$r" "$tmp/check/gpu_report.md" || fail "the report in \$OUT is not the final one"
GPU_CHECK_DEADLINE=5m bash "$repo/tools/gpu_check.sh" "$tmp/bad" >"$tmp/bad.log" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "GPU_CHECK_DEADLINE = '5m'" "$tmp/bad.log" ||
    fail "a deadline that is not whole seconds: exit $rc, $(cat "$tmp/bad.log")"
echo "OK"
