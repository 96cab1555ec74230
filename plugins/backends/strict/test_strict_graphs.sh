#!/usr/bin/env bash
# test_strict_graphs.sh - [trainer] cuda_graphs on the strict device (issue 35
# item 1): configs with static batch shapes train with the step captured once
# and replayed, and give the eager run's losses bit for bit (train_loss,
# epoch_train_loss, val_loss rows of metrics.csv: the optimizer's coefficients
# and dropout's counters that change every step reach the replays through the
# device); the log says the step was replayed; a host read forced inside the
# captured step (the test hook PL_GRAPH_TEST_VIOLATION=host_read) fails the run
# with the strict device's message naming it; auto leaves strict eager. Short
# runs: 2 epochs of 4 batches (gat_cora: 5 epochs of its one full-graph batch).
#
# Data as test_strict_configs.sh: data/*.h5 of the repo, else converted from
# ../shared/data; a config whose data is missing is skipped with its reason.
# usage: test_strict_graphs.sh SOURCE_DIR BUILD_DIR [CONFIG_NAME...]
set -euo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)/core/pipeline
shift 2
only=("$@")
[ ${#only[@]} -gt 0 ] || only=(lstm_chicago gat_cora teacher)
tmp=$(mktemp -d /tmp/pl_test_graphs_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/data"
for f in movielens.h5 chicago.h5 cora.h5; do
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
declare -A data_of=([gat_cora]=cora.h5 [lstm_chicago]=chicago.h5 [teacher]=movielens.h5)
declare -A extra=([gat_cora]="trainer.max_epochs=5"
                  [teacher]="$lim pipeline.requires= trainer.init_from=")
cd "$tmp"
losses() { grep -E ',(train_loss|epoch_train_loss|val_loss),' "$1/metrics.csv"; }
ran=0
for name in "${only[@]}"; do
    [ -n "${data_of[$name]+x}" ] || fail "$name: a config this test does not know"
    if [ ! -e "data/${data_of[$name]}" ]; then
        echo "SKIP $name: data/${data_of[$name]} not available (tools/prepare_data.sh; ../shared/data absent)"
        continue
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
        fail "$name: the replayed run's losses differ from the eager run's (above: < eager, > graphs)"
    fi
    line=$(grep "cuda_graphs: the training step was captured" "$tmp/${name}_true.log" || true)
    reps=$(sed -n 's/.*replayed \([0-9]*\) times.*/\1/p' <<<"$line")
    [ -n "$reps" ] && [ "$reps" -ge 2 ] || { grep cuda_graphs "$tmp/${name}_true.log"; fail "$name: the step was not replayed (log above)"; }
    grep -q "cuda_graphs: captured" "$tmp/${name}_false.log" && fail "$name: cuda_graphs=false captured"
    echo "ok $name: $n loss rows equal, eager vs captured; $line"
    ran=$((ran + 1))
done
[ $ran -gt 0 ] || { echo "SKIP: no data for any config"; exit 0; }

# a host read inside the captured step: the run fails, the message names it
name=${only[0]}
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
    # auto: off on strict (on for the cuda backend only)
    # shellcheck disable=SC2086
    "$bin" run "$src/configs/$name.ini" pipeline.run_dir="$tmp/runs" pipeline.name="${name}_auto" \
        $short ${extra[$name]-$lim} >"$tmp/auto.log" 2>&1 || { tail -20 "$tmp/auto.log"; fail "auto"; }
    grep -q "cuda_graphs: captured" "$tmp/auto.log" && fail "cuda_graphs=auto captured on strict"
    echo "ok cuda_graphs=auto stays eager on strict"
fi
echo "PASS: $ran configs replay their captured step with the eager losses"
