#!/usr/bin/env python3
"""test_full_disk.py - HDF5 writes onto a full disk (issue 34, class 1).

The teacher export of `pipeline run` and `pipeline predict` printed the
error, then crashed (SIGSEGV in HDF5's H5F__close_cb at exit: the failed
H5Fclose left a freed file id) and the run wrote no summary.json. A full
disk is simulated with RLIMIT_FSIZE (every file the process writes stops at
a limit; SIGXFSZ ignored, so the write fails with EFBIG): 200 KB for the
run, whose checkpoints (22 KB) fit but not its export (2 MB); 8 KB for
predict, which writes only its output (about 100 KB). Checked: exit status
1 (not a signal), the message names the temporary file and the reason, the
run's summary.json says "failed", and neither the final file nor the
temporary one is left.
usage: test_full_disk.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile

from cli_util import fail, make_movielens, run, write_ilora_ini


def full_disk(limit):
    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return set_limit


def run_full(argv, limit):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240,
                       preexec_fn=full_disk(limit))
    if p.returncode != 1:
        fail("%s on a full disk exited %d (expected 1; negative: killed by a signal)\n"
             "stderr:\n%s" % (" ".join(argv), p.returncode, p.stderr[-3000:]))
    return p


def why(p):
    return next(l for l in p.stderr.splitlines() if "File too large" in l)


def main():
    exe = os.path.join(sys.argv[1], "core", "pipeline")
    with tempfile.TemporaryDirectory(prefix="pl_full_disk_") as tmp:
        h5 = os.path.join(tmp, "ml.h5")
        make_movielens(h5, U=400)
        ini = os.path.join(tmp, "il.ini")
        write_ilora_ini(ini, f"{tmp}/runs", h5, 64, 100, dim=8, model="export_top_k = 39\n",
                        trainer="max_epochs = 1\nmonitor = val_ndcg@10\nmode = max\nexport = true\n")
        # the teacher export onto a full disk
        p = run_full([exe, "run", ini, "pipeline.name=full"], 200 * 1024)
        if "teacher_outputs.h5.tmp." not in p.stderr or "File too large" not in p.stderr:
            fail("export on a full disk: the message names neither the file nor the reason:\n"
                 + p.stderr)
        runs = os.path.join(tmp, "runs", "full")
        dirs = [d for d in os.listdir(runs) if d not in ("latest", "last_attempt")]
        if len(dirs) != 1:
            fail("export on a full disk: run directories %s" % dirs)
        rd = os.path.join(runs, dirs[0])
        try:
            with open(os.path.join(rd, "summary.json")) as f:
                status = json.load(f)["status"]
        except (OSError, ValueError, KeyError) as e:
            fail("export on a full disk: no readable summary.json in %s (%s)" % (rd, e))
        if status != "failed":
            fail("export on a full disk: summary.json status %r" % status)
        left = os.listdir(os.path.join(rd, "outputs"))
        if left:
            fail("export on a full disk left %s" % left)
        print("export on a full disk: exit 1, summary.json failed, nothing left: " + why(p))

        # predict onto a full disk (from a run trained with room to spare)
        run([exe, "run", ini, "trainer.export=false"])
        out = os.path.join(tmp, "pred.h5")
        p = run_full([exe, "predict", os.path.join(tmp, "runs", "il", "latest"), h5, out,
                      "model.predict_top_k=30"], 8 * 1024)
        if out + ".tmp." not in p.stderr or "File too large" not in p.stderr:
            fail("predict on a full disk: the message names neither the file nor the reason:\n"
                 + p.stderr)
        left = [n for n in os.listdir(tmp) if n.startswith("pred.h5")]
        if left:
            fail("predict on a full disk left %s" % left)
        print("predict on a full disk: exit 1, nothing left: " + why(p))


if __name__ == "__main__":
    main()
