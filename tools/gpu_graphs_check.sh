#!/usr/bin/env bash
# gpu_graphs_check.sh [BUILD_DIR] - [trainer] cuda_graphs on a GPU in a few minutes
# (issue 35 item 1): for lstm_chicago, gat_cora and teacher, the same short fit
# with the step eager (cuda_graphs = false) and captured + replayed (true):
#   1. curves: log_every_n_steps = 1, the two loss curves compared by
#      tools/compare_curves.py (f32 tolerances; the replays run the eager
#      kernels, so they differ only where atomics reorder sums);
#   2. speed: log_every_n_steps = 1000 (no read back per step), summary.json
#      seconds_per_step and train_samples_per_second of both, and their ratio;
#   3. the run's own cuda_graphs lines (captured at step N, replayed M times).
# Prints a markdown table; logs and runs under OUTDIR (default
# gpu-graphs-YYYYmmdd-HHMMSS/). Exit 1 when a run fails or a curve differs.
#
# Environment: GPU_GRAPHS_DEVICE (default cuda; strict: a dry run on the CPU),
# GPU_GRAPHS_STEPS (default 100 optimizer steps per run), GPU_GRAPHS_CONFIGS
# (default "lstm_chicago gat_cora teacher"), GPU_GRAPHS_OUT (OUTDIR).
# Data: data/*.h5 of the repo (tools/prepare_data.sh makes them), or
# GPU_GRAPHS_DATA=DIR.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-gpu}
case "$build" in /*) ;; *) build=$repo/$build ;; esac
bin=$build/core/pipeline
dev=${GPU_GRAPHS_DEVICE:-cuda}
steps=${GPU_GRAPHS_STEPS:-100}
out=${GPU_GRAPHS_OUT:-$repo/gpu-graphs-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out/logs"
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
# the configs read data/*.h5 relative to where they run: OUTDIR, with data/ linked
data=${GPU_GRAPHS_DATA:-$repo/data}
[ -e "$out/data" ] || ln -s "$(cd "$data" 2>/dev/null && pwd || echo "$data")" "$out/data"
cd "$out" || exit 1
py=${PYTHON:-python3}
fails=0
rows=$out/rows.md
: >"$rows"
for name in ${GPU_GRAPHS_CONFIGS:-lstm_chicago gat_cora teacher}; do
    extra=()
    case $name in
    teacher) extra=(pipeline.requires= trainer.init_from=) ;;
    esac
    common=(pipeline.device="$dev" trainer.max_epochs=-1 "trainer.max_steps=$steps"
        trainer.limit_val_batches=2 trainer.early_stopping=false trainer.save_best=false
        trainer.save_last=false trainer.test=false trainer.export=false
        trainer.checkpoint_every_n_epochs=0)
    ok=1
    for g in false true; do
        for kind in curve speed; do
            le=1
            [ $kind = speed ] && le=1000
            log=$out/logs/$name-$kind-$g.log
            if ! "$bin" run "$repo/configs/$name.ini" "pipeline.run_dir=$out/runs/$kind-$g" \
                "${common[@]}" "${extra[@]}" "trainer.log_every_n_steps=$le" \
                "trainer.cuda_graphs=$g" >"$log" 2>&1; then
                echo "| $name | FAIL: the $kind run with cuda_graphs=$g failed: $(grep -m1 '^error' "$log" | cut -c1-160) (logs/${log##*/}) | | | |" >>"$rows"
                ok=0
            fi
        done
    done
    if [ $ok = 0 ]; then
        fails=$((fails + 1))
        continue
    fi
    cmp=$("$py" "$repo/tools/compare_curves.py" "$out/runs/curve-true/$name" "$out/runs/curve-false/$name" \
        --precision f32 --label "$name" 2>&1)
    crc=$?
    [ $crc = 0 ] || fails=$((fails + 1))
    speed=$("$py" - "$out/runs/speed-false/$name/latest/summary.json" \
        "$out/runs/speed-true/$name/latest/summary.json" <<'PY'
import json, sys
e, g = (json.load(open(p)) for p in sys.argv[1:3])
se, sg = e["seconds_per_step"], g["seconds_per_step"]
print(f"{se * 1e3:.2f} ms -> {sg * 1e3:.2f} ms per step ({se / sg:.2f}x); "
      f"{e['train_samples_per_second']:.0f} -> {g['train_samples_per_second']:.0f} samples/s")
PY
)
    glines=$(grep -h 'cuda_graphs:' "$out/logs/$name-speed-true.log" | sed 's/^cuda_graphs: //' | tr '\n' ' ')
    echo "| $name | $([ $crc = 0 ] && echo pass || echo FAIL): ${cmp//|/\\|} | $speed | ${glines//|/\\|} |" >>"$rows"
done
{
    echo "cuda_graphs on $dev, $steps steps per run, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$repo" rev-parse --short HEAD)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1
    echo
    echo "| config | curves (graphs vs eager, compare_curves.py f32) | speed (eager -> graphs; log_every_n_steps 1000) | capture |"
    echo "|---|---|---|---|"
    cat "$rows"
} | tee "$out/report.md"
[ $fails = 0 ]
