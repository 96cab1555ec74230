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
#   racecheck    compute-sanitizer --tool racecheck on the conformance binary
#   bench        bench/{gat,teacher,lstm} with --device cuda: pipeline beside PyTorch
#   ctest        the whole test suite of the GPU build
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
#   GPU_CHECK_DEVICE=cuda          the device compared with the CPU in `curves`
#                                  (cpu: a dry run of the step on a machine without GPU)
#   PL_CONFORMANCE_BACKEND=NAME    check backend plugin NAME instead of "cuda"
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

# ---- step results: OUTDIR/steps/NN-name.{status,reason,secs,md} ---------------------

want() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }

# result ID NAME STATUS REASON SECONDS: record one step's outcome
result() {
    printf '%s\n' "$3" >"$out/steps/$1-$2.status"
    printf '%s\n' "$4" >"$out/steps/$1-$2.reason"
    printf '%s\n' "$5" >"$out/steps/$1-$2.secs"
    say "$(printf '%-12s %-4s (%ss) %s' "$2" "$3" "$5" "$4")"
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
            curve_run dev "$device" "$cfg" "$out/logs/curves-$name-$device.log" "${common[@]}" "${extra[@]}" &
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
        summary=$(grep -m1 'ERROR SUMMARY' "$log")
        if [ "$rc" = 124 ]; then
            [ "$tool" = racecheck ] && [ "$status" = pass ] && status=skip
            [ "$tool" = memcheck ] && status=fail
            why="$why$t: timed out after $limit s; "
        elif [ -z "$summary" ]; then
            status=fail
            why="$why$t: no ERROR SUMMARY (exit $rc, logs/$name-$t.log); "
        elif ! grep -q 'ERROR SUMMARY: 0 errors' <<<"$summary"; then
            status=fail
            why="$why$t: $summary (logs/$name-$t.log); "
        else
            why="$why$t: $summary; "
        fi
    done
    result "$id" "$name" "$status" "${why%; }" "$(elapsed)"
}

want memcheck && sanitize 40 memcheck memcheck 300
want racecheck && sanitize 45 racecheck racecheck 300

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
        for b in gat teacher lstm; do
            case $b in
            gat) script=bench/gat/bench_gat.py data=data/cora.h5 mods="h5py torch_geometric"
                args=(--data "$repo/data/cora.h5") ;;
            teacher) script=bench/teacher/bench_teacher.py data=data/movielens.h5 mods="h5py" args=() ;;
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

# ---- the report ------------------------------------------------------------------------

report=$out/gpu_report.md
{
    echo "# GPU check report"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- host: $(hostname), $ncpu cpus"
    echo "- git: $(git -C "$repo" rev-parse HEAD 2>/dev/null) ($(git -C "$repo" rev-parse --abbrev-ref HEAD 2>/dev/null); $(git -C "$repo" status --porcelain 2>/dev/null | grep -c '^ M\|^M') modified tracked files)"
    echo "- build: $build"
    echo "- nvcc: $([ -n "$nvcc" ] && "$nvcc" --version | tail -2 | tr '\n' ' ' || echo 'not found')"
    echo "- compute-sanitizer: ${sanitizer:-not found}"
    echo "- python: $("$py" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null); torch: $(timeout 120 "$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')"
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

fails=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^fail$')
passes=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^pass$')
skips=$(cat "$out"/steps/*.status 2>/dev/null | grep -c '^skip$')
say "report: $report"
say "steps: $passes pass, $fails fail, $skips skip${gpu_reason:+ ($gpu_reason)}"
[ "$fails" = 0 ]
