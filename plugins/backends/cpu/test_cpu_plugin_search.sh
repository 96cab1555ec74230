#!/usr/bin/env bash
# test_cpu_plugin_search.sh SOURCE_DIR BUILD_DIR - the CPU backend is a plugin
# (cpu.so) that the core finds on the plugin search path; a copy of `pipeline`
# and libpipeline_core outside the build tree (as installed, so the build
# tree's plugin dir is not searched):
#   1. with every plugin but cpu.so on PIPELINE_PLUGIN_PATH, `pipeline run`
#      stops at the device setup (exit 2) naming cpu.so and the dir searched;
#   2. with cpu.so in <the library's dir>/pipeline/plugins (where `cmake
#      --install` puts it), `pipeline plugins` lists it from there;
#   3. with cpu.so given by --plugin-path only, a tiny run (teacher_llm on
#      tests/support/make_ml_tiny.py's data) trains and tests (exit 0) and
#      its summary.json names the CPU's bf16 GEMM and features (through the
#      backend table's get_option).
set -u
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/pl_test_cpu_plugin_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset PIPELINE_PLUGIN_PATH

mkdir -p "$tmp/lib" "$tmp/others" "$tmp/cpu_only"
cp "$build/core/pipeline" "$tmp/lib/pipeline"
cp -L "$build/core/libpipeline_core.so.2" "$tmp/lib/"
for p in "$build"/plugins/*.so; do
    [ "$(basename "$p")" = cpu.so ] || ln -s "$p" "$tmp/others/"
done
[ -e "$tmp/others/adamw.so" ] || fail "no plugins in $build/plugins"
export LD_LIBRARY_PATH=$tmp/lib # the copy of the core, not the build tree's (RUNPATH comes after)
ldd "$tmp/lib/pipeline" | grep -q "$tmp/lib/libpipeline_core.so.2" || fail "the copy does not load its own core"

cd "$tmp" || exit 1
python3 "$src/tests/support/make_ml_tiny.py" "$tmp/ml_tiny.h5" >/dev/null || fail "make_ml_tiny.py"
tiny=(data.path="$tmp/ml_tiny.h5" data.history= data.batch_size=4 data.eval_batch_size=8
      model.backbone="$src/tests/data/hf_llama/gqa_tied" model.item_dim=8 model.max_len=8
      model.export_top_k=5 pipeline.requires= trainer.init_from= trainer.max_epochs=1
      trainer.early_stopping=false trainer.export=false trainer.limit_train_batches=1.0
      trainer.limit_val_batches=1.0 trainer.limit_test_batches=1.0 pipeline.run_dir="$tmp/runs")

# 1. absent: named, with the dir searched
PIPELINE_PLUGIN_PATH=$tmp/others "$tmp/lib/pipeline" run "$src/configs/teacher_llm.ini" "${tiny[@]}" \
    >"$tmp/absent.out" 2>&1
rc=$?
cat "$tmp/absent.out"
[ $rc -eq 2 ] || fail "without cpu.so: exit $rc, expected 2"
grep -q "cpu.so" "$tmp/absent.out" && grep -q "$tmp/others" "$tmp/absent.out" ||
    fail "without cpu.so: the message does not name cpu.so and $tmp/others"
echo "ok - absent cpu.so is named with the dir searched"

# 2. beside the library: <libdir>/pipeline/plugins
mkdir -p "$tmp/libdir/pipeline/plugins"
mv "$tmp/lib/libpipeline_core.so.2" "$tmp/libdir/"
ln -s "$build/plugins/cpu.so" "$tmp/libdir/pipeline/plugins/cpu.so"
LD_LIBRARY_PATH=$tmp/libdir "$tmp/lib/pipeline" plugins >"$tmp/plugins.out" 2>&1 ||
    { cat "$tmp/plugins.out"; fail "pipeline plugins"; }
grep -E "^cpu +backend .*$tmp/libdir/pipeline/plugins/cpu.so" "$tmp/plugins.out" ||
    { cat "$tmp/plugins.out"; fail "cpu.so not listed from <libdir>/pipeline/plugins"; }
echo "ok - cpu.so found beside the installed library"
rm -rf "$tmp/libdir/pipeline"

# 3. --plugin-path only: a run trains on it
ln -s "$build/plugins/cpu.so" "$tmp/cpu_only/cpu.so"
LD_LIBRARY_PATH=$tmp/libdir PIPELINE_PLUGIN_PATH=$tmp/others "$tmp/lib/pipeline" run \
    "$src/configs/teacher_llm.ini" "${tiny[@]}" --plugin-path "$tmp/cpu_only" >"$tmp/run.out" 2>&1 ||
    { cat "$tmp/run.out"; fail "the run with --plugin-path $tmp/cpu_only"; }
python3 - "$tmp/runs" <<'PY' || fail "summary.json"
import glob, json, sys
s = json.load(open(sorted(glob.glob(sys.argv[1] + "/*/latest/summary.json"))[0]))
h = s.get("host", s)
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
    return None
g, f, t = find(s, "cpu_gemm_bf16"), find(s, "cpu_features"), find(s, "openblas_threads")
print("summary.json: cpu_gemm_bf16", g, "cpu_features", f, "openblas_threads", t)
assert g in ("avx512bf16", "avx2", "scalar"), g
assert f and f != "unknown", f
assert isinstance(t, (int, float)) and t >= 1, t
PY
echo "ok - a run with cpu.so from --plugin-path only"
