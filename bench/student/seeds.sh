#!/bin/bash
# bench/student/seeds.sh [SEED...] - the student table of the README (issue 19).
# 1. The teacher, one run per seed: configs/teacher.ini pipeline.seed=SEED
#    into runs/kd_teacher_sSEED, all on the same backbone (runs/pretrain/latest,
#    reused through `requires`; run first when there is none).
# 2. For each seed, configs/student.ini alone (model.kd_weight=0, no teacher)
#    and distilled (the config's settings), both distilling from ONE fixed
#    teacher run, TEACHER_RUN (default runs/kd_teacher_s1/latest), into
#    runs/student_alone_sSEED and runs/student_kd_sSEED.
# 3. The inference timing (infer.sh) and the table (table.py).
# Every training job is niced and runs one thread (the machine is shared);
# a run that already ended ok is reused.
#   PIPELINE=build/core/pipeline bash bench/student/seeds.sh 1 2 3
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${PIPELINE:-build/core/pipeline}
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3)
export OMP_WAIT_POLICY=PASSIVE
done_ok() {
    python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "ok")' \
        "runs/$1/latest/summary.json" 2>/dev/null
}
train() { # NAME CONFIG OVERRIDE...
    local name=$1 ini=$2
    shift 2
    if done_ok "$name"; then
        echo "$name: done already"
        return
    fi
    nice -n 10 "$bin" run "$ini" pipeline.name="$name" pipeline.threads=1 "$@" \
        > "/tmp/$name.log" 2>&1 || { tail -20 "/tmp/$name.log"; exit 1; }
    grep -E "^test:" "/tmp/$name.log" | tail -1
}
for s in "${seeds[@]}"; do
    train kd_teacher_s$s configs/teacher.ini pipeline.seed=$s
done
teacher=$(readlink -f "${TEACHER_RUN:-runs/kd_teacher_s1/latest}")
echo "students distil from $teacher"
for s in "${seeds[@]}"; do
    train student_alone_s$s configs/student.ini pipeline.seed=$s model.kd_weight=0 \
        pipeline.requires= data.teacher_outputs=
    train student_kd_s$s configs/student.ini pipeline.seed=$s pipeline.requires= \
        data.teacher_outputs="$teacher/outputs/teacher_outputs.h5"
done
TEACHER_RUN=$teacher STUDENT_RUN=runs/student_kd_s${seeds[0]}/latest bash bench/student/infer.sh
python3 bench/student/table.py "${seeds[@]}"
