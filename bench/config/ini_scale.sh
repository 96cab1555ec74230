#!/usr/bin/env bash
# ini_scale.sh [N] - time `pipeline check` on INI files with N sections and with N keys
# in one section (default 100000): loading must stay linear (issue 16: quadratic parsing
# took minutes). Prints seconds per file; the files are invalid configs on purpose (the
# check fails after loading them all), so this measures the load, not a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-100000}
bin=${PIPELINE:-build/core/pipeline}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" "$n" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
with open(f"{d}/sections.ini", "w") as f:
    f.write("[pipeline]\nname = x\n")
    for i in range(n):
        f.write(f"[s{i}]\nk = 1\n")
with open(f"{d}/keys.ini", "w") as f:
    f.write("[pipeline]\nname = x\n[model]\nplugin = mlp\n")
    for i in range(n):
        f.write(f"k{i} = 1\n")
PY
for f in sections keys; do
    t0=$(date +%s.%N)
    "$bin" check "$tmp/$f.ini" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    printf '%-9s %7d  %.3f s\n' "$f" "$n" "$(echo "$t1 - $t0" | bc -l)"
done
