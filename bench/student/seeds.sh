#!/bin/bash
# bench/student/seeds.sh [SEED...] - the student table of the README (issue 19):
# for each seed, configs/student.ini alone (model.kd_weight=0) and distilled
# (kd_weight from the config), both from the same teacher outputs (the
# latest ok run of configs/teacher.ini, run first through `requires` when
# there is none), then the inference timing (infer.sh) and the table
# (table.py). Runs go to runs/student_alone_sSEED and runs/student_kd_sSEED.
#   PIPELINE=build/core/pipeline bash bench/student/seeds.sh 1 2 3
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${PIPELINE:-build/core/pipeline}
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3)
export OMP_WAIT_POLICY=PASSIVE
for s in "${seeds[@]}"; do
    for v in alone kd; do
        over=(pipeline.seed=$s pipeline.name=student_${v}_s$s)
        # alone: no teacher needed (no requires, no teacher outputs)
        [ $v = alone ] && over+=(model.kd_weight=0 pipeline.requires= data.teacher_outputs=)
        if python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "ok")' \
            runs/student_${v}_s$s/latest/summary.json 2>/dev/null; then
            echo "student_${v}_s$s: done already"
            continue
        fi
        nice -n 5 "$bin" run configs/student.ini "${over[@]}" > "/tmp/student_${v}_s$s.log" 2>&1 ||
            { tail -20 "/tmp/student_${v}_s$s.log"; exit 1; }
        grep -E "^test:" "/tmp/student_${v}_s$s.log" | tail -1
    done
done
bash bench/student/infer.sh
python3 bench/student/table.py "${seeds[@]}"
