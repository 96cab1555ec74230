#!/bin/bash
# test_student_run.sh SRC BUILD - configs/student.ini end to end on a tiny
# MovieLens-shaped file (tests/support/make_ml_tiny.py): `pipeline run
# student.ini` runs pretrain and teacher first through `requires`, the
# teacher exports with source_row and lognorm, the student's loader joins
# the outputs named by @teacher.ini:outputs/teacher_outputs.h5 (resolved in
# its config.ini), the student trains with the KD term; a second run reuses
# the teacher's run; a data file whose row differs from the teacher's copy
# is refused naming both files and the row. Exit 77 (skip) without
# python3 + numpy + h5py.
set -euo pipefail
src=$1
build=$2
bin="$build/core/pipeline"
python3 -c "import numpy, h5py" 2>/dev/null || { echo "SKIP: python3 lacks numpy/h5py"; exit 77; }
tmp=$(mktemp -d /tmp/pl_test_student.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 "$src/tests/support/make_ml_tiny.py" "$tmp/ml_tiny.h5"
mkdir -p "$tmp/configs"
for c in pretrain teacher student; do
    sed -e "s#^path = data/movielens.h5#path = $tmp/ml_tiny.h5#" -e '/^history = history/d' \
        -e 's#^max_len = 50#max_len = 8#' -e 's#^max_epochs = .*#max_epochs = 2#' \
        -e 's#^export_top_k = 100#export_top_k = 6#' -e 's#^teacher_top_k = 100#teacher_top_k = 5#' \
        -e "s#^\[pipeline\]#[pipeline]\nrun_dir = $tmp/runs#" \
        "$src/configs/$c.ini" > "$tmp/configs/$c.ini"
done
cd "$tmp"
"$bin" run configs/student.ini > student1.log 2>&1 || { tail -30 student1.log; fail "first student run"; }
grep -q "needs .*teacher.ini" student1.log || fail "the teacher did not run first"
grep -q "needs .*pretrain.ini" student1.log || fail "pretrain did not run first"
t=$(readlink -f runs/teacher/latest)
python3 - "$t/outputs/teacher_outputs.h5" <<'PY' || fail "teacher export lacks source_row/lognorm"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
src = f["train/source_row"][:]
assert (src >= 0).all() and len(set(src.tolist())) == len(src), src
assert f["train/lognorm"].shape == f["train/label"].shape
q = np.exp(f["train/topk_logits"][:] - f["train/lognorm"][:][:, None]).sum(1)
assert ((q > 0) & (q <= 1 + 1e-5)).all(), q
PY
grep -q "^teacher_outputs *= *$t/outputs/teacher_outputs.h5" runs/student/latest/config.ini ||
    fail "config.ini of the student does not record the resolved teacher outputs"
python3 - runs/student/latest/summary.json <<'PY' || fail "student summary"
import json, sys, math
s = json.load(open(sys.argv[1]))
assert s["status"] == "ok" and math.isfinite(s["test_metrics"]["hit_ratio@10"]), s["status"]
PY
"$bin" run configs/student.ini pipeline.name=student2 > student2.log 2>&1 ||
    { tail -30 student2.log; fail "second student run"; }
grep -q "requirement .*teacher.ini satisfied by" student2.log || fail "the teacher run was not reused"
# the data changed under the teacher's outputs: refused naming both files and the row
python3 - "$tmp/ml_tiny.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    x = f["train/input_ids"]
    r = x[3]; r[-1] = r[-1] % 40 + 1; x[3] = r
PY
if "$bin" run configs/student.ini pipeline.name=student3 > student3.log 2>&1; then
    fail "a teacher file that no longer matches the data was accepted"
fi
grep -q "does not match $tmp/ml_tiny.h5 train row 3" student3.log || { cat student3.log; fail "mismatch message"; }
grep -q "teacher outputs $t/outputs/teacher_outputs.h5" student3.log || { cat student3.log; fail "mismatch names the teacher file"; }
# a module modules_to_save cannot train: refused naming the key (exit 2)
rc=0
"$bin" run configs/teacher.ini pipeline.name=bad_mts pipeline.requires= '~trainer.init_from' \
    model.modules_to_save=lm_head > bad_mts.log 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "modules_to_save: 'lm_head' is not a module" bad_mts.log ||
    { cat bad_mts.log; fail "modules_to_save = lm_head: exit $rc"; }
echo "ok: student end to end"
