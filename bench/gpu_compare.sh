#!/bin/bash
# bench/gpu_compare.sh [--device cuda|cpu] [--tiny] [--no-compile] [--budget SECONDS] [OUTDIR]
#
# Issue 35's comparison in one command: the six reference workloads
# (pretraining, teacher, GAT Cora, GAT molecules, LSTM Chicago, stocks) on one
# device, each in one process: pipeline (cuda_graphs=auto on cuda), then
# PyTorch eager, then PyTorch under torch.compile(mode="reduce-overhead"),
# timed the same way (warm-up steps out; the compile mode's warm-up seconds,
# compilation included, reported apart). One markdown table (bench/table.py):
# throughput of each side, pipeline's ratio to eager and to compile, step
# times, peak device memory of each side.
#
# On a lent GPU machine (../shared/gpu/README.md): here `bash ../shared/gpu/pack.sh`
# (after tools/prepare_data.sh --use-shared --molecules), there carry [".device"] and run
#   bash .device/run.sh bash bench/gpu_compare.sh
# with a timeout_s of 540: the whole comparison keeps within --budget (default
# 400 s) plus the last workload's overrun (at most 90 s); the table lands in
# $OUT/bench_compare.md, the logs in $OUT/bench_compare_logs.tgz.
#
# Time: the workloads run in the order below; before each, the compile mode
# gets BENCH_COMPILE_TIMEOUT = the least of: what is left of the budget minus
# 35 s for each workload still to come and 25 s for this one's pipeline and
# eager runs; 1.6x an even share of what is left, minus those 25 s (81 s for
# the first of six out of 400 s; time a workload leaves unused goes to the
# later ones); 150 s. A compile mode past it is reported "failed (timed out ...)"
# and the bench goes on. Under 20 s for it, the compile mode is not run (eager
# only, said in the notes); a workload is skipped when under 30 s is left; each
# process is killed at its compile limit + 90 s (its pipeline run, eager run
# and the compile mode's unwinding; then that workload's line is lost).
#
# --device cpu --tiny: the control flow on a machine without a GPU (a few
# steps each; compilation takes tens of seconds to minutes per workload on a
# small CPU: --budget 700 lets all six finish, a small budget makes the later
# compile modes time out and the last workloads be skipped). --no-compile:
# eager only.
#
# Environment: PIPELINE_BIN (default .device/build/core/pipeline when there,
# else build-release/core/pipeline, else build/core/pipeline), PYTHON, BENCH_COMMIT
# (the commit to print where the copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
device=cuda tiny=0 compile=1 budget=400 outdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2; shift ;;
        --tiny) tiny=1 ;;
        --no-compile) compile=0 ;;
        --budget) budget=$2; shift ;;
        -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_compare: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) outdir=$1 ;;
    esac
    shift
done
case "$device" in cuda|cpu) ;; *) echo "gpu_compare: --device cuda|cpu, not '$device'" >&2; exit 2 ;; esac
py=${PYTHON:-python3}
if [ -z "${PIPELINE_BIN:-}" ]; then
    for c in .device/build/core/pipeline build-release/core/pipeline build/core/pipeline; do
        [ -x "$c" ] && PIPELINE_BIN=$PWD/$c && break
    done
fi
[ -x "${PIPELINE_BIN:-}" ] || { echo "gpu_compare: no pipeline binary (build, or set PIPELINE_BIN)" >&2; exit 1; }
export PIPELINE_BIN PYTHONUNBUFFERED=1
out=${outdir:-bench/results/compare-$device-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
: >"$out/results.jsonl"
: >"$out/notes.txt"
export BENCH_RESULTS=$out/results.jsonl
export BENCH_COMPILE=$compile
cora=data/cora.h5
[ -e "$cora" ] || cora=../shared/data/planetoid/cora.h5

# step counts: about 7 minutes on one H200 with compilation (--tiny: seconds of work each)
if [ $tiny = 1 ]; then
    b_teacher=6 b_pretrain=6 e_cora=8 e_mol=2 e_lstm=1 e_stocks=2
else
    # (the teacher benches: one epoch of MovieLens' 2,285 training rows is 142 batches of 16)
    b_teacher=140 b_pretrain=140 e_cora=300 e_mol=3 e_lstm=5 e_stocks=4
fi
# name | data it needs | python modules | command (after $py)
workloads=(
    "pretrain|data/movielens.h5|h5py|bench/teacher/bench_teacher.py --config configs/pretrain.ini --batches $b_pretrain"
    "teacher|data/movielens.h5|h5py|bench/teacher/bench_teacher.py --batches $b_teacher"
    "gat_cora|$cora|h5py torch_geometric|bench/gat/bench_gat.py --data $cora --epochs $e_cora"
    "gat_molecules|data/nci_tpsa.h5|h5py torch_geometric|bench/gat/bench_gat_molecules.py --epochs $e_mol"
    "lstm|data/chicago.h5|h5py numpy|bench/lstm/bench_lstm.py --epochs $e_lstm"
    "stocks|data/dowjones30.h5|h5py numpy|bench/stocks/bench_stocks.py --epochs $e_stocks --no-graph-compare"
)
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    if git rev-parse --short HEAD >/dev/null 2>&1; then
        echo "commit: $(git rev-parse --short HEAD) ($(git status --porcelain | grep -c '^ M\|^M') modified tracked files)"
    else
        echo "commit: ${BENCH_COMMIT:-unknown (no git here: set BENCH_COMMIT)}"
    fi
    echo "device: $device; pipeline: $PIPELINE_BIN (trainer.cuda_graphs=auto on cuda)"
    [ "$device" = cuda ] && echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
    lscpu | grep -E "^(Model name|CPU\(s\))" | sed 's/  */ /g'
    echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} OMP_NUM_THREADS=${OMP_NUM_THREADS:-(unset)}"
    timeout 120 "$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "threads", torch.get_num_threads())' 2>&1 | tail -1
    echo "PyTorch compile mode: torch.compile(mode=\"reduce-overhead\")$([ $compile = 0 ] && echo ' (not run: --no-compile)')"
} >"$out/env.txt"
t_start=$SECONDS
n=${#workloads[@]}
failed=()
for i in "${!workloads[@]}"; do
    IFS='|' read -r name data mods cmd <<<"${workloads[$i]}"
    left=$((budget - (SECONDS - t_start)))
    after=$((n - i - 1))
    if [ $left -lt 30 ]; then
        echo "$name: skipped, the ${budget} s budget is spent" | tee -a "$out/notes.txt"
        continue
    fi
    if [ ! -e "$data" ]; then
        echo "$name: skipped, $data missing (tools/prepare_data.sh --use-shared --molecules)" | tee -a "$out/notes.txt"
        continue
    fi
    missing=""
    for m in $mods; do "$py" -c "import $m" 2>/dev/null || missing="$missing $m"; done
    if [ -n "$missing" ]; then
        echo "$name: skipped, python module(s)$missing missing" | tee -a "$out/notes.txt"
        continue
    fi
    ct=$((left - 35 * after - 25))
    fair=$((left * 16 / 10 / (after + 1) - 25)) # 1.6x an even share of what is left
    [ $ct -gt $fair ] && ct=$fair
    [ $ct -gt 150 ] && ct=150
    export BENCH_COMPILE=$compile BENCH_COMPILE_TIMEOUT=$ct
    if [ $compile = 1 ] && [ $ct -lt 20 ]; then
        # too little left to compile: eager only, rather than lose the workload
        export BENCH_COMPILE=0
        ct=0
        echo "$name: compile mode not run (${left} s of the budget left, ${after} workloads after it)" | tee -a "$out/notes.txt"
    fi
    kill_at=$((ct + 90))
    echo "== $name ($((SECONDS - t_start)) s in; compile limit ${ct} s)" >&2
    # shellcheck disable=SC2086  # cmd is a word list
    timeout --kill-after=10 $kill_at "$py" $cmd --device "$device" >"$out/$name.log" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        failed+=("$name")
        why="exit $rc"
        [ $rc = 124 ] || [ $rc = 137 ] && why="killed after $kill_at s"
        echo "$name: failed ($why; last line: $(grep -v '^ ' "$out/$name.log" | tail -1 | cut -c1-200))" | tee -a "$out/notes.txt"
    fi
    grep -E "ratio|compile: failed|peak device" "$out/$name.log" >&2
done
echo "total: $((SECONDS - t_start)) s for ${n} workloads" >>"$out/notes.txt"
"$py" bench/table.py "$out" >"$out/table.md"
cat "$out/table.md"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$out/table.md" "$OUT/bench_compare.md"
    tar -czf "$OUT/bench_compare_logs.tgz" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_compare: failed: ${failed[*]} (logs in $out)" >&2
    exit 1
fi
