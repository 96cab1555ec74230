#!/usr/bin/env bash
# test_strict_graphs.sh - [trainer] cuda_graphs on the strict device (issue 35):
# every shipped config, short, with cuda_graphs false and true.
#  - Static batch shapes (every config; gat_molecules padded): the step is captured
#    once and replayed (the log's replay count >= 2) and the losses are the
#    eager run's bit for bit (train_loss, epoch_train_loss, val_loss rows of
#    metrics.csv: the optimizer's coefficients and dropout's counters that
#    change every step reach the replays through the device).
#    gat_stocks_recipe accumulates gradients (accumulate_grad_batches = 2):
#    one graph per micro-batch of a step; 2 epochs of 5 batches of 4 days
#    (validation: January 1998, 20 days), so each epoch's last step is cut short (in the
#    second, its micro-batch replayed and its optimizer step eager). student
#    distills a tiny teacher export made here (the
#    teacher and the student on a 40-item MovieLens-shaped file,
#    tests/support/make_ml_tiny.py, as teacher_llm).
#    The last checkpoint's tensors (parameters, optimizer state) are the eager
#    run's bit for bit too, and what the strict device fused (backend.h,
#    "Seeing the step") adds up: the log's group count is the sum of its
#    families' counts, and each linear layer with a bias in the model's
#    forward is one matmul+bias group (bias_linears below: the number a step
#    records). The gradient norm's square + sum (+ the add to its running
#    total) is checked only through the call count below, so the assertions
#    hold whether the trainer's norm records that pattern or not (it does not
#    since the norm is sum_squares_multi, ops.h; strict_fuse.c's unit tests
#    build it by hand).
#  - Fusion off (PL_GRAPH_FUSION=0, the cheapest config): the same losses and
#    parameters, and exactly the calls the fusions saved more per replayed
#    step (one per square+sum and per matmul+bias, two per square+sum+add;
#    summary.json's kernel_calls_per_step).
#  - gat_molecules: its config pads every batch of molecules to fixed node,
#    edge and graph totals off the CPU (hdf5_graph pad = auto, jraph
#    pad_with_graphs), so it is captured and replayed like the others. With
#    data.pad=off (node and edge counts change every batch) nothing is
#    captured, the run says why exactly once, its losses are the eager
#    run's, and they agree with the padded run's to 1e-5 relative (padding
#    changes f32 rounding only: the masked mean's scale, zero rows in the
#    weight gradients' sums).
#  - A short last batch (lstm_chicago on 41 training windows in batches of
#    12) runs eagerly with one logged reason, the others replay.
#  - A host read forced inside the captured step (the test hook
#    PL_GRAPH_TEST_VIOLATION=host_read) fails the run with the strict
#    device's message naming it; auto leaves strict eager.
# The lstm op is captured here (the strict device runs the CPU's kernels);
# on the cuda backend cuDNN's RNN refuses a capture with its reason and
# `auto` trains lstm_chicago, lstm_usdthb and gat_stocks eagerly: this test
# proves the rest of their step (trainer, model, optimizer) capturable.
# Short runs: 2 epochs of 4 batches (gat_cora: 5 epochs of its one
# full-graph batch).
#
# Data as test_strict_configs.sh: data/*.h5 of the repo, else converted from
# ../shared/data; a config whose data is missing is skipped with its reason.
# usage: test_strict_graphs.sh SOURCE_DIR BUILD_DIR [CONFIG_NAME...]
#   (none named: every configs/*.ini; a shipped config this test does not
#   know fails it)
set -euo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)/core/pipeline
shift 2
only=("$@")
if [ ${#only[@]} -eq 0 ]; then
    for ini in "$src"/configs/*.ini; do only+=("$(basename "$ini" .ini)"); done
fi
tmp=$(mktemp -d /tmp/pl_test_graphs_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/data"
for f in movielens.h5 chicago.h5 cora.h5 nci_tpsa.h5 usdthb_1h.h5 dowjones30.h5; do
    [ -e "$src/data/$f" ] && ln -s "$src/data/$f" "$tmp/data/$f"
done
if [ ! -e "$tmp/data/movielens.h5" ] || [ ! -e "$tmp/data/chicago.h5" ] || [ ! -e "$tmp/data/cora.h5" ]; then
    if [ -d "$src/../shared/data" ]; then
        sh "$src/tools/prepare_data.sh" --use-shared --data-dir "$tmp/data" >"$tmp/prepare.log" 2>&1 ||
            { cat "$tmp/prepare.log"; fail "prepare_data.sh --use-shared"; }
    fi
fi

short="pipeline.device=strict trainer.early_stopping=false trainer.test=false trainer.export=false
       trainer.log_every_n_steps=1 trainer.limit_val_batches=1 trainer.checkpoint_every_n_epochs=0"
lim="trainer.max_epochs=2 trainer.limit_train_batches=4"
tiny="data.path=data/ml_tiny.h5 data.history= model.max_len=8"
declare -A data_of=([gat_cora]=cora.h5 [gat_molecules]=nci_tpsa.h5 [lstm_chicago]=chicago.h5
                    [pretrain]=movielens.h5 [pretrain_early]=movielens.h5
                    [teacher]=movielens.h5 [teacher_llm]=ml_tiny.h5
                    [student]=ml_tiny.h5 [lstm_usdthb]=usdthb_1h.h5
                    [gat_stocks]=dowjones30.h5 [gat_stocks_recipe]=dowjones30.h5)
declare -A extra=([gat_cora]="trainer.max_epochs=5"
                  [gat_stocks_recipe]="trainer.max_epochs=2 trainer.limit_train_batches=5 data.batch_size=4
                   data.val_end=1998-01-31 data.test_end=1998-02-28"
                  [teacher]="$lim pipeline.requires= trainer.init_from="
                  [student]="$lim $tiny data.teacher_top_k=5 data.batch_size=4 pipeline.requires=
                   data.teacher_outputs=$tmp/runs/teacher_kd/latest/outputs/teacher_outputs.h5"
                  [teacher_llm]="$lim data.path=data/ml_tiny.h5 data.history= data.batch_size=4 data.eval_batch_size=8
                   model.backbone=$src/tests/data/hf_llama/gqa_tied model.item_dim=8 model.max_len=8
                   model.export_top_k=5 pipeline.requires= trainer.init_from=")
# the forward's linear layers with a bias (pl_linear: matmul + add of a bias row) that one
# captured step fuses into one matmul+bias call each (strict_fuse.c): lstm_chicago's head,
# gat_stocks' projection and head (2), the teacher's item projection. 0: none recorded
# (gat_cora, the decoder configs), or not fusable: lstm_usdthb's head product [32, 1] has
# its bytes read by a later copy of the step before one writes them whole (the liveness
# rule keeps it), teacher_llm's linears run in bf16 (autocast casts sit between),
# gat_molecules' head after the readout (2 linears, counted 2026-11-27 on data/nci_tpsa.h5, padded)
declare -A bias_linears=([gat_cora]=0 [gat_molecules]=2 [gat_stocks]=2 [gat_stocks_recipe]=2 [lstm_chicago]=1
                         [lstm_usdthb]=0 [pretrain]=0 [pretrain_early]=0 [student]=0 [teacher]=1
                         [teacher_llm]=0)
# batches whose shapes change every step: eager, with this reason logged once
# (gat_molecules with data.pad=off: checked after the loop)
declare -A eager_why=()
if [[ " ${only[*]} " =~ " teacher_llm " ]] || [[ " ${only[*]} " =~ " student " ]]; then
    python3 "$src/tests/support/make_ml_tiny.py" "$tmp/data/ml_tiny.h5"
fi
cd "$tmp"
losses() { grep -E ',(train_loss|epoch_train_loss|val_loss),' "$1/metrics.csv"; }
# the tensors of two safetensors files (not their metadata: run name, config) are equal
params_equal() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None)
    return {k: b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]] for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
if bad or not a:
    print("tensors that differ:", ", ".join(bad[:10]) or "(none stored)")
sys.exit(1 if bad or not a else 0)
PY
}
# kernel_calls per step of the steps that log (after the first epoch: replays) in summary.json
kcalls() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['device_stats']['logged_steps']['kernel_calls_per_step'])" "$1/summary.json"; }
ran=0
for name in "${only[@]}"; do
    [ -n "${data_of[$name]+x}" ] || fail "$name: a config this test does not know; add its data and overrides here"
    if [ ! -e "data/${data_of[$name]}" ]; then
        echo "SKIP $name: data/${data_of[$name]} not available (tools/prepare_data.sh; ../shared/data absent)"
        continue
    fi
    if [ "$name" = student ]; then # distills a teacher's export: a tiny one first (eager)
        # shellcheck disable=SC2086
        "$bin" run "$src/configs/teacher.ini" pipeline.name=teacher_kd pipeline.run_dir="$tmp/runs" \
            pipeline.device=strict trainer.test=false trainer.limit_val_batches=1 $tiny model.export_top_k=6 pipeline.requires= trainer.init_from= trainer.max_epochs=1 \
            trainer.limit_train_batches=2 trainer.export=true >"$tmp/teacher_kd.log" 2>&1 ||
            { tail -20 "$tmp/teacher_kd.log"; fail "student: the teacher export it distills"; }
    fi
    for g in false true; do
        # shellcheck disable=SC2086
        "$bin" run "$src/configs/$name.ini" pipeline.run_dir="$tmp/runs" pipeline.name="${name}_$g" \
            $short ${extra[$name]-$lim} trainer.cuda_graphs=$g >"$tmp/${name}_$g.log" 2>&1 ||
            { tail -20 "$tmp/${name}_$g.log"; fail "$name with cuda_graphs=$g"; }
    done
    e="$tmp/runs/${name}_false/latest" c="$tmp/runs/${name}_true/latest"
    n=$(losses "$e" | wc -l)
    [ "$n" -ge 4 ] || fail "$name: only $n loss rows in the eager run's metrics.csv"
    if ! diff <(losses "$e") <(losses "$c") >"$tmp/$name.diff"; then
        head -20 "$tmp/$name.diff"
        fail "$name: the cuda_graphs=true run's losses differ from the eager run's (above: < eager, > graphs)"
    fi
    grep -q "cuda_graphs: captured" "$tmp/${name}_false.log" && fail "$name: cuda_graphs=false captured"
    if [ -n "${eager_why[$name]+x}" ]; then
        grep -q "cuda_graphs: captured" "$tmp/${name}_true.log" &&
            { grep cuda_graphs "$tmp/${name}_true.log"; fail "$name: captured a step (its batch shapes change)"; }
        k=$(grep -c "cuda_graphs: ${eager_why[$name]}" "$tmp/${name}_true.log" || true)
        [ "$k" = 1 ] || { grep cuda_graphs "$tmp/${name}_true.log";
                          fail "$name: the reason it runs eagerly ('${eager_why[$name]}') logged $k times, expected once"; }
        echo "ok $name: $n loss rows equal; eager with its one logged reason: ${eager_why[$name]}"
        ran=$((ran + 1))
        continue
    fi
    line=$(grep "cuda_graphs: the training step was captured" "$tmp/${name}_true.log" || true)
    reps=$(sed -n 's/.*replayed \([0-9]*\) times.*/\1/p' <<<"$line")
    [ -n "$reps" ] && [ "$reps" -ge 2 ] || { grep cuda_graphs "$tmp/${name}_true.log"; fail "$name: the step was not replayed (log above)"; }
    # the parameters (and optimizer state) of the last checkpoint: the eager run's bit for bit
    params_equal "$e/checkpoints/last.safetensors" "$c/checkpoints/last.safetensors" ||
        fail "$name: the cuda_graphs=true run's last checkpoint differs from the eager run's"
    # seeing the step (backend.h, capture_end_step): the families' counts add up to the
    # groups fused, and every linear layer with a bias is one matmul+bias group
    cl=$(grep "cuda_graphs: captured" "$tmp/${name}_true.log" | tail -1)
    fz=$(sed -n 's/.*the backend fused \([0-9]*\) call groups (.*/\1/p' <<<"$cl")
    fz=${fz:-0}
    fams=$(sed -n 's/.*the backend fused [0-9]* call groups (\([^;]*\);.*/\1/p' <<<"$cl")
    sum=0
    for c in $(grep -o ' x[0-9]*' <<<"$fams" | tr -d ' x'); do sum=$((sum + c)); done
    [ "$sum" = "$fz" ] || { echo "$cl"; fail "$name: $fz call groups fused, its families ($fams) count $sum"; }
    kb=$(grep -o 'matmul+bias x[0-9]*' <<<"$fams" | grep -o '[0-9]*$' || echo 0)
    if [ -n "${bias_linears[$name]+x}" ]; then
        [ "$kb" = "${bias_linears[$name]}" ] && [ "$fz" -ge "$kb" ] ||
            { echo "$cl"; fail "$name: expected its ${bias_linears[$name]} linear layers with a bias fused as matmul+bias, found $kb"; }
    fi
    if [ "$name" = gat_stocks_recipe ]; then # accumulate_grad_batches = 2: both micro-batches' graphs
        [ "$(grep -c 'cuda_graphs: captured micro-batch [12] of 2 ' "$tmp/${name}_true.log")" = 2 ] &&
            [[ "$line" =~ "2 of its 2 micro-batch graphs captured" ]] ||
            { grep cuda_graphs "$tmp/${name}_true.log"; fail "$name: expected a graph for each of its 2 micro-batches"; }
    fi
    echo "ok $name: $n loss rows and the checkpoint's tensors equal, eager vs captured ($fz groups fused: ${fams:-none}); $line"
    ran=$((ran + 1))
done
[ $ran -gt 0 ] || { echo "SKIP: no data for any config"; exit 0; }

# a short last batch runs eagerly (one logged reason), the others replay: lstm_chicago on 41
# training windows (targets up to 2001-03-31) in batches of 12 (4 an epoch, the last one of 5), 2 epochs
if [ -e data/chicago.h5 ] && [[ " ${only[*]} " =~ " lstm_chicago " ]]; then
    for g in false true; do
        # shellcheck disable=SC2086
        "$bin" run "$src/configs/lstm_chicago.ini" pipeline.run_dir="$tmp/runs" pipeline.name="short_$g" \
            $short trainer.max_epochs=2 data.train_end=2001-03-31 data.batch_size=12 \
            trainer.cuda_graphs=$g >"$tmp/short_$g.log" 2>&1 ||
            { tail -20 "$tmp/short_$g.log"; fail "lstm_chicago, short last batch, cuda_graphs=$g"; }
    done
    grep -q "train 41 windows" "$tmp/short_true.log" ||
        { grep "^data:" "$tmp/short_true.log"; fail "short last batch: expected 41 training windows (4 batches of 12, the last of 5)"; }
    diff <(losses "$tmp/runs/short_false/latest") <(losses "$tmp/runs/short_true/latest") ||
        fail "lstm_chicago with a short last batch: the losses differ (above: < eager, > graphs)"
    line=$(grep "cuda_graphs: the training step was captured" "$tmp/short_true.log" || true)
    [[ "$line" =~ replayed\ ([1-9][0-9]*)\ times\;\ ([1-9][0-9]*)\ steps\ after ]] ||
        { grep cuda_graphs "$tmp/short_true.log"; fail "short last batch: expected replays and eager steps after the capture"; }
    [ "$(grep -c 'that step runs eagerly (logged once)' "$tmp/short_true.log")" = 1 ] ||
        { grep cuda_graphs "$tmp/short_true.log"; fail "short last batch: the eager fallback's reason is not logged exactly once"; }
    echo "ok lstm_chicago with a short last batch: losses equal; $line"
fi

# gat_molecules unpadded (data.pad=off): node and edge counts change every batch, so nothing
# is captured and the reason is logged once; its losses are its eager run's, and the padded
# run's (above) to f32 rounding
if [ -e data/nci_tpsa.h5 ] && [[ " ${only[*]} " =~ " gat_molecules " ]]; then
    for g in false true; do
        # shellcheck disable=SC2086
        "$bin" run "$src/configs/gat_molecules.ini" pipeline.run_dir="$tmp/runs" pipeline.name="unpadded_$g" \
            $short $lim data.pad=off trainer.cuda_graphs=$g >"$tmp/unpadded_$g.log" 2>&1 ||
            { tail -20 "$tmp/unpadded_$g.log"; fail "gat_molecules, data.pad=off, cuda_graphs=$g"; }
    done
    grep -q "padded to" "$tmp/gat_molecules_true.log" ||
        { grep "^data:" "$tmp/gat_molecules_true.log"; fail "gat_molecules on strict: its batches are not padded"; }
    grep -q "padded to" "$tmp/unpadded_true.log" && fail "gat_molecules with data.pad=off: padded"
    diff <(losses "$tmp/runs/unpadded_false/latest") <(losses "$tmp/runs/unpadded_true/latest") ||
        fail "gat_molecules unpadded: the cuda_graphs=true run's losses differ from the eager run's"
    grep -q "cuda_graphs: captured" "$tmp/unpadded_true.log" &&
        { grep cuda_graphs "$tmp/unpadded_true.log"; fail "gat_molecules unpadded: captured a step (its batch shapes change)"; }
    why="batch shapes change from step to step"
    k=$(grep -c "cuda_graphs: $why" "$tmp/unpadded_true.log" || true)
    [ "$k" = 1 ] || { grep cuda_graphs "$tmp/unpadded_true.log";
                      fail "gat_molecules unpadded: the reason it runs eagerly ('$why') logged $k times, expected once"; }
    # padded vs unpadded, step by step (the same rows: step, epoch, key)
    paste -d, <(losses "$tmp/runs/gat_molecules_false/latest") <(losses "$tmp/runs/unpadded_false/latest") |
        awk -F, '$1 != $5 || $3 != $7 { print "row " NR ": " $0; bad = 1; next }
                 { d = $4 - $8; if (d < 0) d = -d; a = $8 < 0 ? -$8 : $8
                   if (d > 1e-5 * a) { print "row " NR " (" $3 " at step " $1 "): padded " $4 ", unpadded " $8; bad = 1 } }
                 END { exit bad }' || fail "gat_molecules: the padded run's losses are not the unpadded run's to 1e-5"
    n=$(losses "$tmp/runs/unpadded_false/latest" | wc -l)
    [ "$n" = "$(losses "$tmp/runs/gat_molecules_false/latest" | wc -l)" ] || fail "gat_molecules: padded and unpadded runs log different loss rows"
    echo "ok gat_molecules with data.pad=off: eager with its one logged reason ($why); its $n loss rows the padded run's to 1e-5"
fi

# a host read inside the captured step: the run fails, the message names it
name=${only[0]}
[[ " ${only[*]} " =~ " lstm_chicago " ]] && name=lstm_chicago # the cheapest
[ -z "${eager_why[$name]+x}" ] || fail "$name captures nothing: name a config with static shapes first"
if [ -e "data/${data_of[$name]}" ]; then
    rc=0
    # shellcheck disable=SC2086
    PL_GRAPH_TEST_VIOLATION=host_read "$bin" run "$src/configs/$name.ini" pipeline.run_dir="$tmp/runs" \
        pipeline.name="${name}_violation" $short ${extra[$name]-$lim} trainer.cuda_graphs=true \
        >"$tmp/violation.log" 2>&1 || rc=$?
    [ $rc -ne 0 ] || fail "a host read inside the captured step did not fail the run"
    grep -q "error: .*a host read (device-to-host copy) of [0-9]* bytes while capturing a graph" "$tmp/violation.log" ||
        { tail -20 "$tmp/violation.log"; fail "the violation's error does not name the host read"; }
    grep -q "pl_tensor_item" "$tmp/violation.log" ||
        { tail -30 "$tmp/violation.log"; fail "no call stack naming pl_tensor_item"; }
    echo "ok a host read inside the captured step fails the run naming it"
    # PL_GRAPH_FUSION=0: nothing fused, the same losses and parameters, and exactly the kernel
    # calls each fusion saved more per replayed step (summary.json, the strict device's counters)
    # shellcheck disable=SC2086
    PL_GRAPH_FUSION=0 "$bin" run "$src/configs/$name.ini" pipeline.run_dir="$tmp/runs" \
        pipeline.name="${name}_nofuse" $short ${extra[$name]-$lim} trainer.cuda_graphs=true \
        >"$tmp/nofuse.log" 2>&1 || { tail -20 "$tmp/nofuse.log"; fail "PL_GRAPH_FUSION=0"; }
    grep -q "the backend fused" "$tmp/nofuse.log" && fail "PL_GRAPH_FUSION=0 fused"
    f="$tmp/runs/${name}_true/latest" u="$tmp/runs/${name}_nofuse/latest"
    diff <(losses "$f") <(losses "$u") || fail "$name: the losses with and without fusion differ"
    params_equal "$f/checkpoints/last.safetensors" "$u/checkpoints/last.safetensors" ||
        fail "$name: the parameters with and without fusion differ"
    # calls saved: one per square+sum and per matmul+bias, two per square+sum+add (the norm's
    # running total)
    cl=$(grep "cuda_graphs: captured" "$tmp/${name}_true.log" | tail -1)
    k2=$(grep -o 'square+sum x[0-9]*' <<<"$cl" | grep -o '[0-9]*$' || echo 0)
    k3=$(grep -o 'square+sum+add x[0-9]*' <<<"$cl" | grep -o '[0-9]*$' || echo 0)
    kb=$(grep -o 'matmul+bias x[0-9]*' <<<"$cl" | grep -o '[0-9]*$' || echo 0)
    saved=$((k2 + 2 * k3 + kb))
    kf=$(kcalls "$f") ku=$(kcalls "$u")
    # (matmul+bias only in the shipped configs: the gradient norm is sum_squares_multi)
    python3 -c "import sys; sys.exit(0 if float('$ku') - float('$kf') == $saved >= 0 else 1)" ||
        fail "$name: $kf kernel calls per replayed step fused, $ku not: expected $saved fewer ($cl)"
    echo "ok fusion: square+sum x$k2, square+sum+add x$k3, matmul+bias x$kb: $kf kernel calls per replayed step instead of $ku, same losses and parameters"
    # auto: off on strict (on for the cuda backend only)
    # shellcheck disable=SC2086
    "$bin" run "$src/configs/$name.ini" pipeline.run_dir="$tmp/runs" pipeline.name="${name}_auto" \
        $short ${extra[$name]-$lim} >"$tmp/auto.log" 2>&1 || { tail -20 "$tmp/auto.log"; fail "auto"; }
    grep -q "cuda_graphs: captured" "$tmp/auto.log" && fail "cuda_graphs=auto captured on strict"
    echo "ok cuda_graphs=auto stays eager on strict"
fi
echo "PASS: $ran configs: the captured runs give the eager losses (gat_molecules padded; unpadded: eager, its reason logged once)"
