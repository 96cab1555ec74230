"""cli_util.py - what the CLI tests share: failing with a message, running
the pipeline binary and checking its exit status, writing an INI, reading a
run's summary.json. Imported by the tests in this folder (ctest runs them
with this folder first on sys.path)."""
import json
import os
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(argv, expect=0, env=None, timeout=240):
    """Run argv; fail (with the tail of stdout and stderr) unless it exits `expect`."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != expect:
        fail("%s exited %d (expected %d)\nstdout:\n%s\nstderr:\n%s" %
             (" ".join(argv), p.returncode, expect, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def write_ini(path, text):
    with open(path, "w") as f:
        f.write(text)


def summary(run_dir):
    """RUN_DIR/summary.json as a dict."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)
