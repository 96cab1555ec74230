#!/bin/bash
# bench/student/sweep.sh TEACHER_RUN SEED TAG [OVERRIDE...] - one student of
# the validation sweep (issue 19): configs/student.ini with the overrides,
# seed SEED, distilled from TEACHER_RUN's outputs (or alone when the
# overrides hold model.kd_weight=0), one thread, niced, into
# runs/kd_sweep_TAG; skipped when that run ended ok. Prints the validation
# metrics of the checkpoint the run tests (val_at_best.py), never test ones.
#   bash bench/student/sweep.sh runs/kd_teacher_s1/latest 1 d16_kd1 model.dim=16
# Another distillation temperature needs the teacher's outputs exported at it
# (kd_temperature must equal the export's); the same teacher, re-exported
# without training:
#   pipeline run configs/teacher.ini pipeline.name=kd_teacher_s1_T2 pipeline.seed=1 \
#     trainer.init_from=runs/kd_teacher_s1/latest/checkpoints/best.safetensors \
#     trainer.max_epochs=0 scheduler.plugin=constant model.export_temperature=2
# The settings tried and their results: sweep_result.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${PIPELINE:-build/core/pipeline}
teacher=$(readlink -f "$1")
seed=$2
tag=$3
shift 3
name=kd_sweep_$tag
outputs=$teacher/outputs/teacher_outputs.h5
for o in "$@"; do # alone: no teacher outputs read at all
    [ "$o" = model.kd_weight=0 ] && outputs=
done
over=(pipeline.seed=$seed pipeline.name=$name pipeline.threads=1 pipeline.requires=
      data.teacher_outputs=$outputs)
export OMP_WAIT_POLICY=PASSIVE
if ! python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "ok")' \
    runs/$name/latest/summary.json 2>/dev/null; then
    nice -n 10 "$bin" run configs/student.ini "${over[@]}" "$@" > "/tmp/$name.log" 2>&1 ||
        { tail -20 "/tmp/$name.log"; exit 1; }
fi
python3 bench/student/val_at_best.py runs/$name/latest
