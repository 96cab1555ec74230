#!/usr/bin/env bash
# gpu_check.sh [OUTDIR] - everything a lent GPU machine is for, in one command.
#
# Steps (each with its own timeout; one failing does not stop the others):
#   build        RelWithDebInfo build with -DPL_CUDA=ON into build-gpu/ (reused
#                when there), -j$(nproc) with a GPU, at most -j2 without one
#   conformance  tests/core/test_backend_conformance.c: its op table, GPU vs CPU
#                (PL_CONFORMANCE_REQUIRE_ALL=1: an unsupported row fails it)
#   test_cuda    the cuda plugin's own test (plugins/backends/cuda/test_cuda.c)
#   curves       every configs/*.ini for a few hundred steps on pipeline.device=cuda
#                and on cpu, loss curves compared by tools/compare_curves.py
#   memcheck     compute-sanitizer --tool memcheck on the conformance binary and
#                on 5 training steps of gat_cora on the GPU
#   racecheck    compute-sanitizer --tool racecheck on the conformance binary (passes on
#                racecheck's `RACECHECK SUMMARY: N hazards displayed (0 errors, W warnings)`)
#   bench        bench/{gat,teacher (teacher.ini and pretrain.ini),lstm} with --device cuda: pipeline beside PyTorch
#   ctest        the whole test suite of the GPU build
#   mainjob      the main job as documented, `pipeline run configs/teacher.ini
#                pipeline.device=cuda`: pretraining, teacher, test, export; every run of
#                the chain must say it ran on the device (summary.json); wall time; then the
#                same chain on the CPU in the background, whose test HR@10 the device's is
#                compared with (GPU_CHECK_HR_TOL, default 0.02) when it finishes
#   chains       a `requires` chain from its end: `pipeline run configs/student.ini
#                pipeline.device=cuda` under the main job's run_dir (its finished runs are
#                reused); every run on the device, the inherited-override line printed
#   scale        the teacher on a 1.1 B Llama (bench/teacher/scale.ini, a config.json from
#                tools/llama_config.py, model.backbone_weights = random) in fp32, bf16-true and
#                qlora4: s/step, peak device memory (summary.json and nvidia-smi), frozen bytes
#   profile      PL_PROFILE_OPS=1 on the teacher at 7b, bf16-true, batch 64 (2 steps): the op
#                table (device time per op and pass), GPU_CHECK_PROFILE_SIZE / _PRECISION / _BATCH
# and writes OUTDIR/gpu_report.md (date, nvidia-smi, nvcc, git rev, one line per
# step: pass / fail / skip and why, then each step's tables). Logs: OUTDIR/logs/.
#
# Exit status: 0 when no step failed (all skipped for lack of a GPU included),
# 1 when one did (build failure, conformance mismatch or unsupported row, curve
# mismatch, sanitizer error, a benchmark or test that did not run through).
#
# Environment (all optional):
#   GPU_CHECK_ONLY="curves bench"  run only these steps; results of earlier calls
#                  with the same OUTDIR stay in the report (for machines that
#                  limit the length of one command: call it once per step group;
#                  GPU_CHECK_ONLY=report runs none and rewrites the report)
#   GPU_CHECK_BUILD=DIR            build directory (default: build-gpu)
#   GPU_CHECK_JOBS=N               build / ctest parallelism
#   GPU_CHECK_STEPS=N              training steps per config in `curves`
#   GPU_CHECK_CUDA_GRAPHS=false    [trainer] cuda_graphs of the device runs in `curves`
#                                  (default: the configs' own, auto = on for cuda; the
#                                  report lists each run's capture / replay line)
#   GPU_CHECK_DEVICE=cuda          the device compared with the CPU in `curves`
#                                  (cpu: a dry run of the step on a machine without GPU)
#   PL_CONFORMANCE_BACKEND=NAME    check backend plugin NAME instead of "cuda"
#   GPU_CHECK_DEVICE also names the device of mainjob / chains / scale (strict: a dry
#                  run of their logic on the CPU-side strict device, without a GPU)
#   GPU_CHECK_MAIN_CONFIG, GPU_CHECK_CHAIN_CONFIG   the configs of mainjob / chains
#                  (default configs/teacher.ini, configs/student.ini)
#   GPU_CHECK_MAIN_CPU=0           no CPU run of the main job (no HR@10 comparison);
#                  GPU_CHECK_MAIN_CPU_TIMEOUT (default 240 s), GPU_CHECK_MAIN_TIMEOUT (300),
#                  GPU_CHECK_CHAIN_TIMEOUT (240), GPU_CHECK_RACECHECK_TIMEOUT (180)
#   GPU_CHECK_SCALE_SIZE=1b, GPU_CHECK_SCALE_STEPS=6, GPU_CHECK_SCALE_PRECISIONS="fp32
#                  bf16-true qlora4", GPU_CHECK_SCALE_RUN_TIMEOUT (180 s per run)
#
#   GPU_CHECK_DEADLINE=S            start no step that would run past S seconds from
#                  the start (each step's usual seconds on an H200 are in step_secs
#                  below); a step left out so is reported "skip" with why
# The report is rewritten after every step and copied into $OUT when that is set
# (the lent machine's runner), so a call its time limit cuts still returns the
# steps that finished.
#
# A lent machine's 15 minutes (start included) in two calls, correctness first:
#   1. timeout_s 420: GPU_CHECK_DEADLINE=380 GPU_CHECK_ONLY="conformance test_cuda
#      memcheck curves bench mainjob" bash .device/run.sh
#   2. what is left: bash .device/run.sh bash bench/teacher/scale.sh --device cuda 1b 7b
#      (issue 31's table), or bench/gpu_compare.sh --budget N (issue 35's ratios)
# One call of under 8 minutes on an H100 with ../shared/gpu/pack.sh's build (issue 32):
#   GPU_CHECK_ONLY="racecheck mainjob chains scale" bash .device/run.sh
# (racecheck <= 180 s, the main job's GPU chain ~1-2 min, the student ~20 s, the 1.1 B
# table ~2-3 min with the CPU chain beside it, cut at 240 s; each part has its timeout).
#
# Budget: about 25 minutes on one H100 with 16 cores (build ~3, curves ~6,
# sanitizers ~5, bench ~3, ctest ~5). Data: the configs read data/*.h5 (run
# tools/prepare_data.sh first); a config whose data is missing is skipped.
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:-$repo/gpu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out/logs" "$out/steps" || exit 2
out=$(cd "$out" && pwd)
build=${GPU_CHECK_BUILD:-$repo/build-gpu}
case "$build" in /*) ;; *) build=$repo/$build ;; esac
only=${GPU_CHECK_ONLY:-}
# GPU_CHECK_DEADLINE=S: start no step that would end S seconds after this script
# began, by the step's usual time on an H100/H200 below (the 2026-11-26 H200 run,
# with margin); a lent machine's command limit is then never what ends the run
deadline=${GPU_CHECK_DEADLINE:-}
if [ -n "$deadline" ] && ! [[ $deadline =~ ^[0-9]+$ ]]; then
    echo "gpu_check: GPU_CHECK_DEADLINE = '$deadline': expected whole seconds (e.g. 380)" >&2
    exit 2
fi
declare -A step_secs=([build]=60 [conformance]=15 [test_cuda]=20 [curves]=90 [memcheck]=60
    [racecheck]=180 [bench]=120 [ctest]=300 [mainjob]=240 [chains]=120 [scale]=240 [profile]=120)
declare -A step_id=([build]=10 [conformance]=20 [test_cuda]=25 [curves]=30 [memcheck]=40
    [racecheck]=45 [bench]=50 [ctest]=60 [mainjob]=70 [chains]=75 [scale]=80 [profile]=85)
device=${GPU_CHECK_DEVICE:-cuda}
py=${PYTHON:-python3}
cd "$repo" || exit 2

say() { printf 'gpu_check: %s\n' "$*"; }

# ---- what this machine has -------------------------------------------------------

gpu_reason=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
    gpu_reason="no GPU: nvidia-smi not found (no NVIDIA driver)"
elif ! smi_list=$(timeout 60 nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$smi_list"; then
    gpu_reason="no GPU: nvidia-smi -L says: $(head -1 <<<"$smi_list")"
fi
have_gpu=0
[ -z "$gpu_reason" ] && have_gpu=1

nvcc=$(command -v nvcc 2>/dev/null || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -z "$sanitizer" ] && [ -x "$c" ] && sanitizer=$c
done

ncpu=$(nproc 2>/dev/null || echo 2)
if [ -n "${GPU_CHECK_JOBS:-}" ]; then
    jobs=$GPU_CHECK_JOBS
elif [ "$have_gpu" = 1 ]; then
    jobs=$ncpu
else
    jobs=$((ncpu < 2 ? ncpu : 2)) # a shared machine: nproc may say more than is free
fi

# ---- the report ------------------------------------------------------------------------

# write_report: OUTDIR/gpu_report.md from the steps recorded so far; publish:
# that, and a copy into $OUT when the lent machine's runner set it, after every
# step, so a run its command limit cuts short still returns what it finished
report=$out/gpu_report.md
torch_line=""
write_report() {
    [ -n "$torch_line" ] || torch_line=$(timeout 120 "$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')
    {
        echo "# GPU check report"
        echo
        echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
        echo "- host: $(hostname), $ncpu cpus"
        echo "- git: $(git -C "$repo" rev-parse HEAD 2>/dev/null) ($(git -C "$repo" rev-parse --abbrev-ref HEAD 2>/dev/null); $(git -C "$repo" status --porcelain 2>/dev/null | grep -c '^ M\|^M') modified tracked files)"
        echo "- build: $build"
        echo "- nvcc: $([ -n "$nvcc" ] && "$nvcc" --version | tail -2 | tr '\n' ' ' || echo 'not found')"
        echo "- compute-sanitizer: ${sanitizer:-not found}"
        echo "- python: $("$py" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null); torch: $torch_line"
        echo "- GPU: ${gpu_reason:-$(head -1 <<<"$smi_list")}"
        if [ "$have_gpu" = 1 ]; then
            echo
            echo '```'
            timeout 60 nvidia-smi 2>&1
            echo '```'
        fi
        echo
        echo "## Steps"
        echo
        echo "| step | status | seconds | details |"
        echo "|---|---|---|---|"
        for f in "$out"/steps/*.status; do
            [ -e "$f" ] || continue
            b=${f%.status}
            n=$(basename "$b")
            echo "| ${n#*-} | $(cat "$f") | $(cat "$b.secs") | $(tr '|' '/' <"$b.reason") |"
        done
        for f in "$out"/steps/*.md; do
            [ -e "$f" ] || continue
            n=$(basename "$f" .md)
            echo
            echo "## ${n#*-}"
            echo
            cat "$f"
        done
    } >"$report"
}
publish() {
    write_report
    if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
        cp "$report" "$OUT/gpu_report.md" 2>/dev/null
    fi
    return 0
}

# ---- step results: OUTDIR/steps/NN-name.{status,reason,secs,md} ---------------------

want() {
    [ -z "$only" ] || [[ " $only " == *" $1 "* ]] || return 1
    [ -n "$deadline" ] || return 0
    # a step that would not finish before GPU_CHECK_DEADLINE is not started: it
    # is recorded as skipped, so the steps after it (cheaper ones) still run
    local need=${step_secs[$1]:-60} left=$((deadline - SECONDS))
    [ "$need" -le "$left" ] && return 0
    result "${step_id[$1]:-99}" "$1" skip "GPU_CHECK_DEADLINE: needs about $need s, $left s left" 0
    return 1
}

# result ID NAME STATUS REASON SECONDS: record one step's outcome
result() {
    printf '%s\n' "$3" >"$out/steps/$1-$2.status"
    printf '%s\n' "$4" >"$out/steps/$1-$2.reason"
    printf '%s\n' "$5" >"$out/steps/$1-$2.secs"
    say "$(printf '%-12s %-4s (%ss) %s' "$2" "$3" "$5" "$4")"
    publish
}
# section ID NAME: stdin becomes the step's part of the report
section() { cat >"$out/steps/$1-$2.md"; }
# a fresh start for a step that runs now
begin() {
    rm -f "$out/steps/$1-$2".*
    say "--- $2"
    t_begin=$SECONDS
}
elapsed() { echo $((SECONDS - t_begin)); }

# logged TIMEOUT LOG CMD...: run with a time limit, output to LOG; the exit
# status (124 when the limit was hit)
logged() {
    local t=$1 log=$2
    shift 2
    timeout --kill-after=20 "$t" "$@" >"$log" 2>&1
}

build_ok() { [ "$(cat "$out/steps/10-build.status" 2>/dev/null)" != fail ] && [ -x "$build/core/pipeline" ]; }
conf_bin=$build/tests/test_backend_conformance

# ---- build ---------------------------------------------------------------------

if want build; then
    begin 10 build
    log=$out/logs/build.log
    if [ -n "$nvcc" ]; then
        cuda_flag=-DPL_CUDA=ON
    else
        cuda_flag=-DPL_CUDA=OFF
    fi
    if ! logged 600 "$log" cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$cuda_flag"; then
        result 10 build fail "cmake configure failed (logs/build.log): $(grep -m1 -i 'error' "$log")" "$(elapsed)"
    elif ! logged 1500 "$out/logs/build-compile.log" cmake --build "$build" -j"$jobs"; then
        result 10 build fail "compile failed or timed out (logs/build-compile.log): $(grep -m1 -E 'error|Error' "$out/logs/build-compile.log")" "$(elapsed)"
    elif [ -z "$nvcc" ] && [ "$have_gpu" = 1 ]; then
        result 10 build fail "a GPU but no nvcc (PATH, /usr/local/cuda/bin): built without the cuda plugin" "$(elapsed)"
    elif [ -z "$nvcc" ]; then
        result 10 build pass "CPU-only build: no nvcc found, cuda plugin not built (-j$jobs)" "$(elapsed)"
    elif [ ! -e "$build/plugins/cuda.so" ]; then
        result 10 build fail "built, but $build/plugins/cuda.so is missing" "$(elapsed)"
    else
        result 10 build pass "$build with -DPL_CUDA=ON, -j$jobs; cuda.so built ($("$nvcc" --version | grep -o 'release [0-9.]*'))" "$(elapsed)"
    fi
fi

# ---- conformance ---------------------------------------------------------------

if want conformance; then
    begin 20 conformance
    log=$out/logs/conformance.log
    if ! build_ok || [ ! -x "$conf_bin" ]; then
        result 20 conformance skip "no conformance binary (build step failed or not run)" "$(elapsed)"
    else
        PL_CONFORMANCE_REQUIRE_ALL=${PL_CONFORMANCE_REQUIRE_ALL:-1} CK_DEFAULT_TIMEOUT=300 \
            logged 400 "$log" "$conf_bin"
        rc=$?
        count=$(grep -m1 '^conformance .* rows:' "$log")
        if grep -q '^|' "$log"; then
            {
                grep -m1 '^backend conformance' "$log"
                echo
                grep '^|' "$log"
                echo
                [ -n "$count" ] && echo "$count"
            } | section 20 conformance
        fi
        if grep -q '^SKIP:' "$log" && [ "$rc" = 0 ]; then
            result 20 conformance skip "$(grep -m1 '^SKIP:' "$log" | cut -c7-)" "$(elapsed)"
        elif [ "$rc" = 0 ]; then
            result 20 conformance pass "$count" "$(elapsed)"
        elif [ "$rc" = 124 ]; then
            result 20 conformance fail "timed out after 400 s (logs/conformance.log)" "$(elapsed)"
        else
            result 20 conformance fail "${count:-exit $rc}: $(grep -m1 ':F:\|:E:' "$log" | sed 's/.*:0: //')" "$(elapsed)"
        fi
    fi
fi

# ---- test_cuda -------------------------------------------------------------------

if want test_cuda; then
    begin 25 test_cuda
    log=$out/logs/test_cuda.log
    bin=$(find "$build/plugins" -maxdepth 4 -name test_cuda -type f -perm -u+x 2>/dev/null | head -1)
    if ! build_ok || [ -z "$bin" ]; then
        result 25 test_cuda skip "no test_cuda binary (no cuda plugin in this build)" "$(elapsed)"
    elif [ "$have_gpu" = 0 ]; then
        result 25 test_cuda skip "$gpu_reason" "$(elapsed)"
    elif (cd "$(dirname "$bin")" && PIPELINE_PLUGIN_PATH=$build/plugins logged 300 "$log" "$bin"); then
        result 25 test_cuda pass "$(grep -m1 'Checks:' "$log")" "$(elapsed)"
    else
        result 25 test_cuda fail "$(grep -m1 'Checks:' "$log"): $(grep -m1 ':F:\|:E:' "$log")" "$(elapsed)"
    fi
fi

# ---- curves ----------------------------------------------------------------------

# ini_value FILE SECTION KEY: the value in the INI (first match), or ""
ini_value() {
    awk -v s="[$2]" -v k="$3" '
        /^\[/ { in_s = ($0 == s) }
        in_s && $0 ~ "^" k "[ \t]*=" { sub(/^[^=]*=[ \t]*/, ""); sub(/[ \t;]*$/, ""); print; exit }' "$1"
}

# curve_run REF|DEV DEVICE CONFIG LOG OVERRIDES...: one training run
curve_run() {
    local which=$1 dev=$2 cfg=$3 log=$4
    shift 4
    logged "${GPU_CHECK_RUN_TIMEOUT:-420}" "$log" "$build/core/pipeline" run "$cfg" \
        "pipeline.run_dir=$out/runs/$which" "pipeline.device=$dev" "$@"
}

if want curves; then
    begin 30 curves
    rows=$out/steps/30-curves.rows
    : >"$rows"
    n_pass=0 n_fail=0 n_skip=0
    row_skip() { echo "| $1 | - | - | - | - | - | skip: $2 |" >>"$rows"; n_skip=$((n_skip + 1)); }
    if ! build_ok; then
        result 30 curves skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ "$device" != cpu ] && [ "$have_gpu" = 0 ]; then
        result 30 curves skip "$gpu_reason" "$(elapsed)"
    else
        rm -rf "$out/runs/ref" "$out/runs/dev"
        # pretrain first: teacher and teacher_llm start from its CPU run
        cfgs=$(ls configs/*.ini | sort | awk '/pretrain\.ini$/ { print; next } { rest = rest $0 "\n" } END { printf "%s", rest }')
        for cfg in $cfgs; do
            name=$(basename "$cfg" .ini)
            steps=${GPU_CHECK_STEPS:-300}
            precision=f32
            extra=()
            reqs=$(ini_value "$cfg" pipeline requires)
            data=$(ini_value "$cfg" data path)
            case "$name" in
            gat_cora) steps=${GPU_CHECK_STEPS:-200} ;;
            teacher | teacher_llm)
                steps=${GPU_CHECK_STEPS:-200}
                ck=$(readlink -f "$out/runs/ref/pretrain/latest" 2>/dev/null)/checkpoints/last.safetensors
                if [ ! -f "$ck" ]; then
                    row_skip "$name" "needs the CPU pretrain run's checkpoint ($ck), which did not finish"
                    continue
                fi
                extra+=("pipeline.requires=" "trainer.init_from=$ck")
                ;;
            esac
            if [ "$name" = teacher_llm ]; then
                # the tiny Llama shape keeps the CPU side to seconds; qlora4 with bf16 compute
                precision=bf16
                bb=$repo/models/llama-tiny
                if [ ! -f "$bb/config.json" ]; then
                    bb=$out/work/llama-tiny
                    [ -f "$bb/config.json" ] ||
                        logged 300 "$out/logs/make_hf_llama.log" "$py" tools/make_hf_llama.py tiny "$bb"
                fi
                if [ ! -f "$bb/config.json" ]; then
                    row_skip "$name" "no backbone: models/llama-tiny absent and tools/make_hf_llama.py tiny failed ($(tail -1 "$out/logs/make_hf_llama.log"))"
                    continue
                fi
                extra+=("model.backbone=$bb")
            elif [ -n "$reqs" ] && [ "$name" != teacher ]; then
                row_skip "$name" "requires = $reqs: no recipe in gpu_check.sh for this chain"
                continue
            fi
            case "$(ini_value "$cfg" precision plugin)" in
            *bf16* | *qlora* | *fp16*) precision=bf16 ;;
            esac
            if [ -n "$data" ] && [ ! -e "$data" ]; then
                row_skip "$name" "$data missing (tools/prepare_data.sh makes it)"
                continue
            fi
            common=(trainer.max_epochs=-1 "trainer.max_steps=$steps" trainer.log_every_n_steps=1
                trainer.limit_train_batches=1.0 trainer.limit_val_batches=2
                trainer.early_stopping=false trainer.save_best=false trainer.test=false
                trainer.export=false)
            say "curves: $name, $steps steps on cpu and on $device"
            curve_run ref cpu "$cfg" "$out/logs/curves-$name-cpu.log" "${common[@]}" "${extra[@]}" &
            p_ref=$!
            # the device run with [trainer] cuda_graphs as GPU_CHECK_CUDA_GRAPHS says (default:
            # the config's own, auto: the step captured and replayed on cuda)
            graphs=()
            [ -n "${GPU_CHECK_CUDA_GRAPHS:-}" ] && graphs=("trainer.cuda_graphs=$GPU_CHECK_CUDA_GRAPHS")
            curve_run dev "$device" "$cfg" "$out/logs/curves-$name-$device.log" "${common[@]}" "${extra[@]}" "${graphs[@]}" &
            p_dev=$!
            wait $p_ref
            rc_ref=$?
            wait $p_dev
            rc_dev=$?
            if [ "$rc_ref" != 0 ] || [ "$rc_dev" != 0 ]; then
                why=""
                for w in "cpu:$rc_ref" "$device:$rc_dev"; do
                    d=${w%%:*} rc=${w##*:}
                    [ "$rc" = 0 ] && continue
                    msg=$(grep -m1 -i 'error' "$out/logs/curves-$name-$d.log" | cut -c1-200)
                    [ "$rc" = 124 ] && msg="timed out"
                    why="$why$d run exit $rc ($msg, logs/curves-$name-$d.log); "
                done
                echo "| $name | - | - | - | - | - | FAIL: ${why%; } |" >>"$rows"
                n_fail=$((n_fail + 1))
                continue
            fi
            "$py" tools/compare_curves.py "$out/runs/dev/$name" "$out/runs/ref/$name" \
                --precision "$precision" --label "$name" --markdown >>"$rows" 2>"$out/logs/curves-$name-compare.log"
            case $? in
            0) n_pass=$((n_pass + 1)) ;;
            *) n_fail=$((n_fail + 1)) ;;
            esac
        done
        {
            echo "Loss curves, $device run vs cpu run (same seed, same batches; train_loss every step;"
            echo "tolerances first / max / final of the relative difference, see tools/compare_curves.py):"
            echo
            echo "| config | steps | first | max (step) | final | tolerance | status |"
            echo "|---|---|---|---|---|---|---|"
            cat "$rows"
            echo
            echo "Whole-step graphs of the $device runs ([trainer] cuda_graphs${GPU_CHECK_CUDA_GRAPHS:+ = $GPU_CHECK_CUDA_GRAPHS}; the runs' own lines):"
            echo
            for f in "$out"/logs/curves-*-"$device".log; do
                [ -e "$f" ] || continue
                n=${f##*/curves-}
                grep -h 'cuda_graphs:' "$f" | sed "s|^|- ${n%-"$device".log}: |" | head -4
            done
        } | section 30 curves
        summary="$n_pass pass, $n_fail fail, $n_skip skipped of $((n_pass + n_fail + n_skip)) configs ($device vs cpu)"
        if [ "$n_fail" -gt 0 ]; then
            result 30 curves fail "$summary" "$(elapsed)"
        elif [ "$n_pass" -gt 0 ]; then
            result 30 curves pass "$summary" "$(elapsed)"
        else
            result 30 curves skip "$summary" "$(elapsed)"
        fi
    fi
fi

# ---- compute-sanitizer -----------------------------------------------------------

# sanitizer_verdict TOOL LOG: "ok SUMMARY", "bad SUMMARY" or "none WHAT" from the
# summary line compute-sanitizer printed: memcheck (and initcheck, synccheck) end with
# `ERROR SUMMARY: N errors`, racecheck with `RACECHECK SUMMARY: N hazards displayed
# (E errors, W warnings)`; racecheck passes with 0 errors (warnings, hazards such as
# benign same-value writes, are listed in the summary but do not fail it).
sanitizer_verdict() {
    local tool=$1 log=$2 line n
    if [ "$tool" = racecheck ]; then
        line=$(grep -m1 'RACECHECK SUMMARY' "$log" | sed 's/^=* *//')
        [ -z "$line" ] && { echo "none RACECHECK SUMMARY"; return; }
        n=$(sed -n 's/.*(\([0-9][0-9]*\) error.*/\1/p' <<<"$line")
        if [ "$n" = 0 ]; then echo "ok $line"; else echo "bad $line"; fi
    else
        line=$(grep -m1 'ERROR SUMMARY' "$log" | sed 's/^=* *//')
        [ -z "$line" ] && { echo "none ERROR SUMMARY"; return; }
        if grep -q 'ERROR SUMMARY: 0 errors' <<<"$line"; then echo "ok $line"; else echo "bad $line"; fi
    fi
}

# sanitize ID NAME TOOL TIMEOUT: the conformance binary (and, for memcheck,
# 5 training steps of gat_cora) under compute-sanitizer --tool TOOL
sanitize() {
    local id=$1 name=$2 tool=$3 limit=$4
    begin "$id" "$name"
    if ! build_ok || [ ! -x "$conf_bin" ]; then
        result "$id" "$name" skip "no conformance binary (build step failed or not run)" "$(elapsed)"
        return
    elif [ "$have_gpu" = 0 ]; then
        result "$id" "$name" skip "$gpu_reason" "$(elapsed)"
        return
    elif [ -z "$sanitizer" ]; then
        result "$id" "$name" skip "compute-sanitizer not found (PATH, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer)" "$(elapsed)"
        return
    fi
    local targets=("conformance") status=pass why="" summary
    [ "$tool" = memcheck ] && [ -e data/cora.h5 ] && targets+=("gat_cora")
    for t in "${targets[@]}"; do
        local log=$out/logs/$name-$t.log cmd
        if [ "$t" = conformance ]; then
            cmd=("$conf_bin")
        else
            cmd=("$build/core/pipeline" run configs/gat_cora.ini pipeline.device=cuda trainer.max_steps=5
                trainer.test=false trainer.save_best=false trainer.save_last=false
                "pipeline.run_dir=$out/runs/$name")
        fi
        CK_FORK=no CK_DEFAULT_TIMEOUT=$limit logged "$limit" "$log" "$sanitizer" --tool "$tool" "${cmd[@]}"
        local rc=$?
        local verdict
        verdict=$(sanitizer_verdict "$tool" "$log")
        summary=${verdict#* }
        if [ "$rc" = 124 ]; then
            [ "$tool" = racecheck ] && [ "$status" = pass ] && status=skip
            [ "$tool" = memcheck ] && status=fail
            why="$why$t: timed out after $limit s; "
        elif [ "${verdict%% *}" = none ]; then
            status=fail
            why="$why$t: no $summary line (exit $rc, logs/$name-$t.log); "
        elif [ "${verdict%% *}" = bad ]; then
            status=fail
            why="$why$t: $summary (logs/$name-$t.log); "
        elif [ "$rc" != 0 ]; then
            # the sanitizer found nothing; the program's own failure is its step's to report
            why="$why$t: $summary (the program itself exited $rc, logs/$name-$t.log); "
        else
            why="$why$t: $summary; "
        fi
    done
    result "$id" "$name" "$status" "${why%; }" "$(elapsed)"
}

want memcheck && sanitize 40 memcheck memcheck 300
want racecheck && sanitize 45 racecheck racecheck "${GPU_CHECK_RACECHECK_TIMEOUT:-180}"

# ---- bench -----------------------------------------------------------------------

if want bench; then
    begin 50 bench
    torch_cuda=""
    [ "$have_gpu" = 1 ] &&
        torch_cuda=$(timeout 120 "$py" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)
    if ! build_ok; then
        result 50 bench skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ "$have_gpu" = 0 ]; then
        result 50 bench skip "$gpu_reason" "$(elapsed)"
    elif [ "$torch_cuda" != 1 ]; then
        result 50 bench skip "PyTorch with CUDA not importable by $py (torch.cuda.is_available() is not True)" "$(elapsed)"
    else
        n_ok=0 n_bad=0 n_no=0 notes=""
        : >"$out/steps/50-bench.lines"
        for b in gat teacher pretrain lstm; do
            case $b in
            gat) script=bench/gat/bench_gat.py data=data/cora.h5 mods="h5py torch_geometric"
                args=(--data "$repo/data/cora.h5") ;;
            teacher) script=bench/teacher/bench_teacher.py data=data/movielens.h5 mods="h5py" args=() ;;
            pretrain) script=bench/teacher/bench_teacher.py data=data/movielens.h5 mods="h5py"
                args=(--config configs/pretrain.ini) ;;
            lstm) script=bench/lstm/bench_lstm.py data=data/chicago.h5 mods="h5py numpy" args=() ;;
            esac
            missing=""
            for m in $mods; do
                "$py" -c "import $m" 2>/dev/null || missing="$missing $m"
            done
            if [ -n "$missing" ]; then
                notes="$notes$b: skipped, python module(s)$missing missing; "
                n_no=$((n_no + 1))
                continue
            elif [ ! -e "$data" ]; then
                notes="$notes$b: skipped, $data missing; "
                n_no=$((n_no + 1))
                continue
            fi
            log=$out/logs/bench-$b.log
            if PIPELINE_BIN=$build/core/pipeline logged 300 "$log" "$py" "$script" --device cuda "${args[@]}"; then
                grep -E 'ratio|^machine' "$log" >>"$out/steps/50-bench.lines"
                n_ok=$((n_ok + 1))
            else
                notes="$notes$b: failed (logs/bench-$b.log: $(grep -v '^ ' "$log" | tail -1 | cut -c1-200)); "
                n_bad=$((n_bad + 1))
            fi
        done
        {
            echo "Throughput on the GPU, pipeline beside PyTorch (same machine, same run; higher is better):"
            echo
            echo '```'
            awk '!seen[$0]++' "$out/steps/50-bench.lines"
            echo '```'
            [ -n "$notes" ] && echo && echo "${notes%; }"
        } | section 50 bench
        summary="$n_ok ran, $n_bad failed, $n_no skipped${notes:+: ${notes%; }}"
        if [ "$n_bad" -gt 0 ]; then
            result 50 bench fail "$summary" "$(elapsed)"
        elif [ "$n_ok" -gt 0 ]; then
            result 50 bench pass "$summary" "$(elapsed)"
        else
            result 50 bench skip "$summary" "$(elapsed)"
        fi
    fi
fi

# ---- ctest -------------------------------------------------------------------------

if want ctest; then
    begin 60 ctest
    log=$out/logs/ctest.log
    if ! build_ok; then
        result 60 ctest skip "no build (build step failed or not run)" "$(elapsed)"
    elif [ "$have_gpu" = 0 ]; then
        result 60 ctest skip "$gpu_reason (without one the suite is the CPU suite: tools/run_tests.sh)" "$(elapsed)"
    elif logged 600 "$log" ctest --test-dir "$build" -j"$jobs" --timeout 300 --output-on-failure; then
        result 60 ctest pass "$(grep -m1 'tests passed' "$log")" "$(elapsed)"
    else
        result 60 ctest fail "$(grep -m1 'tests passed\|tests failed' "$log"): $(grep -A30 'The following tests FAILED' "$log" | grep -o '[a-z_0-9]* (Failed\|[a-z_0-9]* (Timeout' | tr '\n' ' ')" "$(elapsed)"
    fi
fi

# ---- the main job, a requires chain and the 1.1 B teacher, on the device ------------------------

# Why the device steps below cannot run here ("" when they can): on cuda only with a
# GPU; GPU_CHECK_DEVICE=strict runs them on the CPU-side strict device (a dry run).
dev_reason() {
    case "$device" in
    cuda* | auto) [ "$have_gpu" = 0 ] && echo "$gpu_reason" ;;
    esac
    true
}
dev_kind=${device%%:*}

# chain_of CFG: the configs of CFG's `requires` chain, required ones first, CFG last
chain_of() {
    local cfg=$1 r
    for r in $(ini_value "$cfg" pipeline requires | tr ',' ' '); do
        case "$r" in /*) ;; *) r=$(dirname "$cfg")/$r ;; esac
        chain_of "$r"
    done
    echo "$cfg"
}
chain_list() { chain_of "$1" | awk '!seen[$0]++'; }
# run_name CFG: its runs' directory name under run_dir ([pipeline] name, else the file stem)
run_name() {
    local n
    n=$(ini_value "$1" pipeline name)
    if [ -n "$n" ]; then echo "$n"; else basename "$1" .ini; fi
}

# run_info ROOT NAME: "DEVICE STATUS FIT_S HR@10 NDCG@10 OUTPUTS" of ROOT/NAME/latest
# (summary.json; "-" for what is missing; OUTPUTS: files under outputs/)
run_info() {
    "$py" - "$1" "$2" <<'PY'
import json, os, sys
root, name = sys.argv[1:3]
d = os.path.join(root, name, "latest")
try:
    with open(os.path.join(d, "summary.json")) as f:
        s = json.load(f)
except (OSError, ValueError):
    print("- missing - - - 0")
    sys.exit(0)
tm = s.get("test_metrics") or {}
hr = next((v for k, v in tm.items() if k.endswith(("hr@10", "hit_ratio@10"))), None)
nd = next((v for k, v in tm.items() if k.endswith("ndcg@10")), None)
fit = ((s.get("phases") or {}).get("fit") or {}).get("seconds")
fmt = lambda v, f: "-" if v is None else f % v
outs = os.path.join(d, "outputs")
n_out = len(os.listdir(outs)) if os.path.isdir(outs) else 0
print(s.get("device", "-"), s.get("status", "-"), fmt(fit, "%.1f"), fmt(hr, "%.4f"),
      fmt(nd, "%.4f"), n_out)
PY
}

# check_chain CFG ROOT LABEL ROWS: every run of CFG's chain under ROOT ran on $device and
# ended ok; its rows appended to ROWS; prints the problems ("" when none)
check_chain() {
    local cfg=$1 root=$2 label=$3 rows=$4 c name dev st fit hr nd nout bad=""
    for c in $(chain_list "$cfg"); do
        name=$(run_name "$c")
        read -r dev st fit hr nd nout < <(run_info "$root" "$name")
        echo "| $label | $name | $dev | $st | $fit | $hr | $nd | $nout |" >>"$rows"
        if [ "$st" = missing ]; then
            bad="$bad$name: no finished run under $root; "
        elif [ "${dev%%:*}" != "$label" ]; then
            bad="$bad$name ran on $dev, not $label; "
        elif [ "$st" != ok ]; then
            bad="$bad$name: status $st; "
        fi
        if [ "$(ini_value "$c" trainer export)" = true ] && [ "$nout" = 0 ] && [ "$st" != missing ]; then
            bad="$bad$name: nothing exported under outputs/; "
        fi
    done
    echo "${bad%; }"
}

chain_header() {
    echo "| run on | config | device (summary.json) | status | fit s | test HR@10 | test NDCG@10 | outputs |"
    echo "|---|---|---|---|---|---|---|---|"
}

# data_missing CFG: the first data file of CFG's chain that is not there ("" when none)
data_missing() {
    local c d
    for c in $(chain_list "$1"); do
        d=$(ini_value "$c" data path)
        if [ -n "$d" ] && [ ! -e "$d" ]; then
            echo "$d"
            return
        fi
    done
}

main_cfg=${GPU_CHECK_MAIN_CONFIG:-configs/teacher.ini}
main_root=$out/runs/main-$dev_kind
cpu_root=$out/runs/main-cpu
mkdir -p "$out/work"
main_pending=0 cpu_pid=""
# the CPU run of the main job runs in the background: it ends with this script
trap 'if [ -n "$cpu_pid" ]; then pkill -TERM -P "$cpu_pid" 2>/dev/null; kill "$cpu_pid" 2>/dev/null; fi' EXIT
cpu_threads=$((ncpu > 6 ? ncpu - 4 : 2))

# The main job as documented, `pipeline run configs/teacher.ini pipeline.device=cuda`:
# pretraining, teacher, test, export, every run on the device; then the same chain on
# the CPU in the background (while the steps after this one use the GPU), whose test
# HR@10 the device run's is compared with when it has finished (finish_mainjob).
if want mainjob; then
    begin 70 mainjob
    why=$(dev_reason)
    miss=$(data_missing "$main_cfg")
    if ! build_ok; then
        result 70 mainjob skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ -n "$why" ]; then
        result 70 mainjob skip "$why" "$(elapsed)"
    elif [ -n "$miss" ]; then
        result 70 mainjob skip "$miss missing (tools/prepare_data.sh makes it)" "$(elapsed)"
    else
        rm -rf "$main_root" "$cpu_root" "$out/work/mainjob-cpu.rc"
        say "mainjob: pipeline run $main_cfg pipeline.device=$device (the whole chain)"
        logged "${GPU_CHECK_MAIN_TIMEOUT:-300}" "$out/logs/mainjob-$dev_kind.log" "$build/core/pipeline" \
            run "$main_cfg" "pipeline.device=$device" "pipeline.run_dir=$main_root"
        main_rc=$?
        main_wall=$(elapsed)
        main_pending=1
        if [ "${GPU_CHECK_MAIN_CPU:-1}" = 1 ]; then
            say "mainjob: the same chain on the CPU in the background ($cpu_threads threads, at most ${GPU_CHECK_MAIN_CPU_TIMEOUT:-240} s)"
            cpu_t0=$SECONDS
            (
                logged "${GPU_CHECK_MAIN_CPU_TIMEOUT:-240}" "$out/logs/mainjob-cpu.log" "$build/core/pipeline" \
                    run "$main_cfg" pipeline.device=cpu "pipeline.run_dir=$cpu_root" "pipeline.threads=$cpu_threads"
                echo "$? $((SECONDS - cpu_t0))" >"$out/work/mainjob-cpu.rc"
            ) &
            cpu_pid=$!
        fi
    fi
fi

finish_mainjob() {
    [ "$main_pending" = 1 ] || return 0
    local rows=$out/steps/70-mainjob.rows status=pass why="" cpu_note="" hr_dev hr_cpu cpu_rc cpu_secs
    : >"$rows"
    if [ -n "$cpu_pid" ]; then
        wait "$cpu_pid"
        read -r cpu_rc cpu_secs <"$out/work/mainjob-cpu.rc" 2>/dev/null || cpu_rc="?"
    fi
    local bad
    bad=$(check_chain "$main_cfg" "$main_root" "$dev_kind" "$rows")
    if [ "$main_rc" = 124 ] || [ "$main_rc" = 137 ]; then
        status=fail why="timed out after ${GPU_CHECK_MAIN_TIMEOUT:-300} s (logs/mainjob-$dev_kind.log); "
    elif [ "$main_rc" != 0 ]; then
        status=fail why="exit $main_rc: $(grep -m1 '^error' "$out/logs/mainjob-$dev_kind.log" | cut -c1-200); "
    fi
    [ -n "$bad" ] && status=fail why="$why$bad; "
    read -r _ _ _ hr_dev _ _ < <(run_info "$main_root" "$(run_name "$main_cfg")")
    if [ -n "$cpu_pid" ]; then
        if [ "$cpu_rc" = 0 ]; then
            check_chain "$main_cfg" "$cpu_root" cpu "$rows" >/dev/null
            read -r _ _ _ hr_cpu _ _ < <(run_info "$cpu_root" "$(run_name "$main_cfg")")
            cpu_note="the CPU run of the chain took ${cpu_secs:-?} s ($cpu_threads threads, beside the GPU steps after this one)"
            if [ "$hr_dev" != - ] && [ "$hr_cpu" != - ]; then
                local cmp
                cmp=$("$py" -c "import sys; d, c, t = map(float, sys.argv[1:]); print('%+.4f %s' % (d - c, 'ok' if abs(d - c) <= t else 'bad'))" \
                    "$hr_dev" "$hr_cpu" "${GPU_CHECK_HR_TOL:-0.02}")
                why="${why}test HR@10 $hr_dev on $dev_kind vs $hr_cpu on cpu (${cmp% *}, tolerance ${GPU_CHECK_HR_TOL:-0.02}); "
                [ "${cmp#* }" = bad ] && status=fail
            fi
        elif [ "$cpu_rc" = 124 ] || [ "$cpu_rc" = 137 ]; then
            cpu_note="the CPU run did not finish within ${GPU_CHECK_MAIN_CPU_TIMEOUT:-240} s"
            why="${why}test HR@10 $hr_dev on $dev_kind (CPU run timed out"
            # the shipped teacher's documented CPU result instead (iLoRA, seeds 1-3:
            # bench/teacher/seeds_result.md, 0.1202 +- 0.0031)
            if [ "$main_cfg" = configs/teacher.ini ] && [ "$hr_dev" != - ]; then
                local cmp
                cmp=$("$py" -c "import sys; d, c, t = map(float, sys.argv[1:]); print('%+.4f %s' % (d - c, 'ok' if abs(d - c) <= t else 'bad'))" \
                    "$hr_dev" 0.1202 "${GPU_CHECK_HR_TOL:-0.02}")
                why="$why; vs the documented CPU 0.1202 +- 0.0031 of bench/teacher/seeds_result.md: ${cmp% *}"
                [ "${cmp#* }" = bad ] && status=fail
            fi
            why="$why); "
        else
            status=fail
            cpu_note="the CPU run failed (exit $cpu_rc, logs/mainjob-cpu.log)"
            why="${why}CPU run exit $cpu_rc; "
        fi
    else
        why="${why}test HR@10 $hr_dev on $dev_kind (no CPU run: GPU_CHECK_MAIN_CPU=0); "
    fi
    {
        echo "\`pipeline run $main_cfg pipeline.device=$device\`: wall time $main_wall s for the whole"
        echo "chain (every required run first, then test and export), exit $main_rc."
        [ -n "$cpu_note" ] && echo "Beside it $cpu_note."
        echo
        chain_header
        cat "$rows"
    } | section 70 mainjob
    result 70 mainjob "$status" "${why%; }" "$main_wall"
}

# A `requires` chain started from its last config: the student (student.ini needs
# teacher.ini needs pretrain.ini), under the main job's run_dir, so what the main job
# finished is reused and the rest runs; every run of it on the device.
if want chains; then
    begin 75 chains
    chain_cfg=${GPU_CHECK_CHAIN_CONFIG:-configs/student.ini}
    why=$(dev_reason)
    miss=$(data_missing "$chain_cfg")
    if ! build_ok; then
        result 75 chains skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ -n "$why" ]; then
        result 75 chains skip "$why" "$(elapsed)"
    elif [ -n "$miss" ]; then
        result 75 chains skip "$miss missing (tools/prepare_data.sh makes it)" "$(elapsed)"
    else
        log=$out/logs/chains-$(basename "$chain_cfg" .ini).log
        say "chains: pipeline run $chain_cfg pipeline.device=$device"
        logged "${GPU_CHECK_CHAIN_TIMEOUT:-240}" "$log" "$build/core/pipeline" \
            run "$chain_cfg" "pipeline.device=$device" "pipeline.run_dir=$main_root"
        rc=$?
        rows=$out/steps/75-chains.rows
        : >"$rows"
        bad=$(check_chain "$chain_cfg" "$main_root" "$dev_kind" "$rows")
        status=pass why=""
        if [ "$rc" != 0 ]; then
            status=fail
            why="exit $rc: $(grep -m1 '^error' "$log" | cut -c1-200); "
            [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="timed out after ${GPU_CHECK_CHAIN_TIMEOUT:-240} s; "
        fi
        [ -n "$bad" ] && status=fail why="$why$bad; "
        if [ "$(ini_value "$chain_cfg" pipeline requires)" != "" ] &&
            ! grep -q "the runs it requires inherit pipeline.device=$device" "$log"; then
            status=fail why="${why}no line saying the required runs inherit pipeline.device=$device; "
        fi
        reused=$(grep -o 'requirement [^ ]* satisfied' "$log" | awk '{print $2}' | tr '\n' ' ')
        ran=$(grep -o 'needs [^ ]*, which has no finished run' "$log" | awk '{sub(",", "", $2); print $2}' | tr '\n' ' ')
        read -r _ _ _ hr _ _ < <(run_info "$main_root" "$(run_name "$chain_cfg")")
        why="${why}test HR@10 $hr; reused: ${reused:-none}; ran first: ${ran:-none}; "
        {
            echo "\`pipeline run $chain_cfg pipeline.device=$device\` under the main job's run_dir (exit $rc):"
            echo
            chain_header
            cat "$rows"
        } | section 75 chains
        result 75 chains "$status" "${why%; }" "$(elapsed)"
    fi
fi

# The teacher on a 1.1 B Llama (bench/teacher/scale.ini, batch 16 x 50, iLoRA 4 experts
# rank 8 on every projection, no activation checkpointing), per precision: seconds per
# step, peak device memory (summary.json and nvidia-smi's), frozen bytes; the table of
# report-2026-11-26.md. Runs bench/teacher/scale.ini itself (bench/teacher/scale.sh runs
# the CPU table: both checkpointing settings and PyTorch).
if want scale; then
    begin 80 scale
    size=${GPU_CHECK_SCALE_SIZE:-1b}
    steps=${GPU_CHECK_SCALE_STEPS:-6}
    why=$(dev_reason)
    if ! build_ok; then
        result 80 scale skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ -n "$why" ]; then
        result 80 scale skip "$why" "$(elapsed)"
    elif [ ! -e "$(ini_value bench/teacher/scale.ini data path)" ]; then
        result 80 scale skip "$(ini_value bench/teacher/scale.ini data path) missing (tools/prepare_data.sh makes it)" "$(elapsed)"
    else
        # config.json alone: the backbone is drawn on the device (model.backbone_weights = random)
        bb=$out/work/llama-$size-config
        [ -f "$bb/config.json" ] || "$py" tools/llama_config.py "$size" "$bb" >"$out/logs/llama_config-$size.log" 2>&1
        if [ ! -f "$bb/config.json" ]; then
            result 80 scale fail "no $size config.json: tools/llama_config.py $size failed ($(tail -1 "$out/logs/llama_config-$size.log" 2>/dev/null))" "$(elapsed)"
        else
            rows=$out/steps/80-scale.rows
            : >"$rows"
            n_ok=0 n_bad=0 notes=""
            for prec in ${GPU_CHECK_SCALE_PRECISIONS:-fp32 bf16-true qlora4}; do
                case $prec in
                fp32) pargs=(precision.plugin=fp32) ;;
                bf16-true) pargs=(precision.plugin=bf16 precision.mode=bf16-true) ;;
                qlora4) pargs=(precision.plugin=qlora4 precision.compute_dtype=bf16) ;;
                *) notes="$notes$prec: unknown precision; "; n_bad=$((n_bad + 1)); continue ;;
                esac
                name=scale_${size}_$prec
                log=$out/logs/scale-$name.log
                smi_pid=""
                if [ "$have_gpu" = 1 ]; then
                    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
                        >"$out/logs/scale-$name.smi" 2>/dev/null &
                    smi_pid=$!
                fi
                say "scale: $name, $steps steps on $device"
                logged "${GPU_CHECK_SCALE_RUN_TIMEOUT:-180}" "$log" "$build/core/pipeline" run bench/teacher/scale.ini \
                    "pipeline.name=$name" "pipeline.run_dir=$out/runs/scale" "pipeline.device=$device" \
                    "model.backbone=$bb" model.backbone_weights=random model.gradient_checkpointing=false \
                    "trainer.max_steps=$steps" "${pargs[@]}"
                rc=$?
                [ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null && wait "$smi_pid" 2>/dev/null
                if [ "$rc" != 0 ]; then
                    n_bad=$((n_bad + 1))
                    msg=$(grep -m1 '^error' "$log" | cut -c1-200)
                    [ "$rc" = 124 ] || [ "$rc" = 137 ] && msg="timed out"
                    notes="$notes$prec: exit $rc ($msg, logs/scale-$name.log); "
                    echo "| $prec | FAIL | | | | |" >>"$rows"
                    continue
                fi
                n_ok=$((n_ok + 1))
                "$py" - "$out/runs/scale/$name/latest" "$prec" "$out/logs/scale-$name.smi" >>"$rows" <<'PY'
import csv, json, os, statistics, sys
d, prec, smi = sys.argv[1:4]
GiB = 1024 ** 3
with open(os.path.join(d, "summary.json")) as f:
    s = json.load(f)
steps = []
with open(os.path.join(d, "metrics.csv")) as f:
    for r in csv.DictReader(f):
        if r["key"] == "step_seconds":
            steps.append(float(r["value"]))
steps = steps[1:] if len(steps) > 1 else steps  # the first step warms up
med = "%.3f (%.3f-%.3f)" % (statistics.median(steps), min(steps), max(steps)) if steps else "-"
try:
    used = [float(x) for x in open(smi).read().split() if x.replace(".", "").isdigit()]
    smi_peak = "%.1f" % (max(used) / 1024) if used else "-"
except OSError:
    smi_peak = "-"
print("| %s | %s | %.1f | %s | %.2f | %.1f |" % (
    prec, med, s.get("peak_memory_bytes", 0) / GiB, smi_peak,
    s.get("frozen_parameter_bytes", 0) / 1e9, s.get("load_seconds", float("nan"))))
PY
            done
            {
                echo "The teacher on the $size Llama (\`bench/teacher/scale.ini\`, $steps steps, no activation"
                echo "checkpointing, \`pipeline.device=$device\`); step time: median (min-max) after the first step."
                echo "Earlier: ../shared/gpu/report-2026-11-26.md (H200: fp32 0.221 s, 13.3 GiB)."
                echo
                echo "| precision | s/step | peak device memory GiB (summary.json) | nvidia-smi peak GiB | frozen GB | load s |"
                echo "|---|---|---|---|---|---|"
                cat "$rows"
                [ -n "$notes" ] && echo && echo "${notes%; }"
            } | section 80 scale
            summary="$n_ok ran, $n_bad failed ($size backbone, $steps steps)${notes:+: ${notes%; }}"
            if [ "$n_bad" -gt 0 ]; then
                result 80 scale fail "$summary" "$(elapsed)"
            else
                result 80 scale pass "$summary" "$(elapsed)"
            fi
        fi
    fi
fi

# ---- profile: where the device time of a step goes, op by op -----------------------------
# PL_PROFILE_OPS=1 (core/src/tensor/op_profile.c): every kernel between two synchronizes; the
# teacher of bench/teacher/scale.ini on a GPU_CHECK_PROFILE_SIZE Llama (default 7b, batch 64,
# bf16-true: where the 2026-11-27 H200 step was 5x PyTorch's), 2 steps.
if want profile; then
    begin 85 profile
    size=${GPU_CHECK_PROFILE_SIZE:-7b}
    why=$(dev_reason)
    if ! build_ok; then
        result 85 profile skip "no pipeline binary (build step failed or not run)" "$(elapsed)"
    elif [ -n "$why" ]; then
        result 85 profile skip "$why" "$(elapsed)"
    else
        bb=$out/work/llama-$size-config
        [ -f "$bb/config.json" ] || "$py" tools/llama_config.py "$size" "$bb" >/dev/null 2>&1
        prec=${GPU_CHECK_PROFILE_PRECISION:-bf16-true}
        case $prec in
        fp32) pargs=(precision.plugin=fp32) ;;
        bf16-mixed) pargs=(precision.plugin=bf16 precision.mode=bf16-mixed) ;;
        qlora4) pargs=(precision.plugin=qlora4 precision.compute_dtype=bf16) ;;
        *) pargs=(precision.plugin=bf16 precision.mode=bf16-true) ;;
        esac
        log=$out/logs/profile-$size-$prec.log
        say "profile: $size $prec, batch ${GPU_CHECK_PROFILE_BATCH:-64}, 2 steps on $device with PL_PROFILE_OPS=1"
        PL_PROFILE_OPS=1 logged "${GPU_CHECK_PROFILE_TIMEOUT:-240}" "$log" "$build/core/pipeline" run \
            bench/teacher/scale.ini pipeline.name=profile_$size "pipeline.run_dir=$out/runs/profile" \
            "pipeline.device=$device" "model.backbone=$bb" model.backbone_weights=random \
            model.gradient_checkpointing=false "data.batch_size=${GPU_CHECK_PROFILE_BATCH:-64}" \
            trainer.max_steps=2 "${pargs[@]}"
        rc=$?
        {
            echo "\`PL_PROFILE_OPS=1\`: the teacher on the $size Llama, $prec, batch ${GPU_CHECK_PROFILE_BATCH:-64} x 50,"
            echo "2 steps (load and the first step included); the 30 largest rows:"
            echo
            echo '```'
            sed -n '/^op profile/,$p' "$log" | head -32
            echo '```'
        } | section 85 profile
        if [ "$rc" = 0 ] && grep -q '^op profile' "$log"; then
            result 85 profile pass "$size $prec: $(grep -m1 '^op profile' "$log" | sed 's/.*): //')" "$(elapsed)"
        else
            result 85 profile fail "exit $rc, no table (logs/profile-$size-$prec.log)" "$(elapsed)"
        fi
    fi
fi

finish_mainjob

publish
fails=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^fail$')
passes=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^pass$')
skips=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^skip$')
say "report: $report"
say "steps: $passes pass, $fails fail, $skips skip${gpu_reason:+ ($gpu_reason)}"
[ "$fails" = 0 ]
