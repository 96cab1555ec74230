#!/bin/bash
# bench/student/infer.sh [REPEATS] - full-ranking inference time, student vs
# teacher, same machine, same session. Builds bench_infer.c (with the ilora
# plugin's sources) against build/ and runs it on the best checkpoint of the
# teacher (TEACHER_RUN, default runs/kd_teacher_s1/latest: the teacher the
# students distil from, see seeds.sh) and of a distilled student
# (STUDENT_RUN, default runs/student_kd_s1/latest), alternating, 3 rounds;
# each round ranks the 671 test users over all 9,066 items REPEATS times
# (default 5, after one warm-up pass) in batches of 256, by the eval path
# (the model's test forward) and by the serving path (keys/values of every
# position, the last layer for the last position only, top 10; logits
# checked equal), see bench_infer.c. One thread (OMP_NUM_THREADS=1, niced:
# the machine is shared), median (min-max) over all passes, per 1,000
# users. Checks HR@10 against each run's summary.json. Writes
# infer_result.json.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
build=$(cd "${BUILD:-build}" && pwd)
reps=${1:-5}
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OMP_NUM_THREADS:-1}
teacher=$(readlink -f "${TEACHER_RUN:-runs/kd_teacher_s1/latest}")
student=$(readlink -f "${STUDENT_RUN:-runs/student_kd_s1/latest}")
tmp=$(mktemp -d /tmp/pl_infer.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
I=plugins/models/ilora
# every source of the plugin (its CMakeLists' ILORA_SOURCES: all but the tests)
srcs=$(ls $I/*.c | grep -v "/test_")
cc -O2 -std=gnu11 -fopenmp -o "$tmp/bench_infer" "$here/bench_infer.c" $srcs -Icore/include -I$I \
   -Iplugins/common/hdf5 $(pkg-config --cflags --libs hdf5 libcjson) -L"$build/core" \
   -L"$build/plugins/common/hdf5" -Wl,-rpath,"$build/core:$build/plugins/common/hdf5" \
   -lpipeline_testing -lpipeline_io -lpipeline_core -lpipeline_hdf5 -lm
for name in teacher student; do # the run's [model] section (less its plugin line)
    run=$([ $name = teacher ] && echo "$teacher" || echo "$student")
    python3 - "$run/config.ini" > "$tmp/$name.ini" <<'PY'
import sys
sec = None
for line in open(sys.argv[1]):
    s = line.split(";")[0].strip()
    if s.startswith("["):
        sec = s
    elif sec == "[model]" and "=" in s and not s.startswith("plugin"):
        print(s)
PY
done
for round in 1 2 3; do
    for name in teacher student; do
        run=$([ $name = teacher ] && echo "$teacher" || echo "$student")
        nice -n 10 "$tmp/bench_infer" "$tmp/$name.ini" "$run/checkpoints/best.safetensors" \
            data/movielens.h5 256 "$reps" "$build/plugins" > "$tmp/${name}_$round.json"
    done
done
python3 - "$tmp" "$teacher" "$student" <<'PY'
import json, os, statistics, sys
tmp, teacher, student = sys.argv[1:4]
out = {}
for name, run in (("teacher", teacher), ("student", student)):
    rs = [json.load(open(f"{tmp}/{name}_{r}.json")) for r in (1, 2, 3)]
    summ = json.load(open(f"{run}/summary.json"))
    hr = summ["test_metrics"]["hit_ratio@10"]
    o = {"run": run, "parameters": rs[0]["parameters"], "users": rs[0]["users"],
         "batch": rs[0]["batch"], "passes": 3 * rs[0]["repeats"], "test_hit_ratio@10": hr}
    for path in ("eval", "serving"):
        for r in rs:
            assert abs(r[path]["hit_ratio@10"] - hr) < 1e-5, (name, path, hr, r)
            assert r["serving"]["max_abs_logit_diff"] < 1e-4, (name, r)
        o[path] = {"s_per_1000_users_median": statistics.median(r[path]["s_per_1000_users_median"] for r in rs),
                   "s_per_1000_users_min": min(r[path]["s_per_1000_users_min"] for r in rs),
                   "s_per_1000_users_max": max(r[path]["s_per_1000_users_max"] for r in rs)}
        p = o[path]
        print(f"{name} {path}: {o['parameters']:,} parameters, {p['s_per_1000_users_median']:.4f} s "
              f"per 1,000 users (min {p['s_per_1000_users_min']:.4f}, max "
              f"{p['s_per_1000_users_max']:.4f}; {o['passes']} passes), HR@10 {hr:.4f} as in the run")
    out[name] = o
out["threads"] = int(os.environ.get("OMP_NUM_THREADS", "1"))
for path in ("eval", "serving"):
    out[f"speedup_{path}"] = (out["teacher"][path]["s_per_1000_users_median"] /
                              out["student"][path]["s_per_1000_users_median"])
    print(f"{path}: the student takes {out[f'speedup_{path}']:.1f}x less time than the teacher (median)")
json.dump(out, open("bench/student/infer_result.json", "w"), indent=1)
PY
