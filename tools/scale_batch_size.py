#!/usr/bin/env python3
"""scale_batch_size.py - the largest training batch size of a config that fits
a GPU of a given memory, found without the GPU (Lightning's
`Tuner.scale_batch_size`, mode "power" then "binsearch").

usage: tools/scale_batch_size.py CONFIG --capacity 24GiB [--init N] [--max N]
                                 [--key data.batch_size] [--pipeline BIN]
                                 [section.key=value ...]

Each trial is one optimizer step of CONFIG on the strict device in its
memory-only mode (PL_STRICT_MEMORY_ONLY=1: allocations are made and counted
as on a GPU, no kernel runs, seconds even at 7B) with the device's memory set
to --capacity (PL_STRICT_MEMORY_CAPACITY): a trial fits when the run ends
with exit 0, and does not when it fails with the core's out-of-memory error.
The batch size doubles from --init (default: the config's own) until a trial
does not fit or --max is reached, then a binary search between the last size
that fit and the first that did not. Any other failure stops the search with
the run's error. Sizes above the training split's rows (summary.json's
data.num_train, where the loader reports it) are not tried: a batch that
large is the whole split.

What it measures is what the strict device counts: tensors, the caching
allocator's blocks, the graph pool. Not counted: the CUDA context, cuBLAS /
cuDNN workspaces and kernels' transient buffers: give --capacity as the
card's memory less a margin (an 80 GiB H100: --capacity 76GiB).

Trial runs go to a temporary run_dir, deleted at the end; they do not
validate, test, export or save checkpoints (as Lightning's tuner, the
training step is what is sized: validation runs without a tape, with its own
eval_batch_size), and start from the model's initialization: a
config that requires another run (`[pipeline] requires`, `trainer.init_from`)
is measured without it (neither the requirement nor its checkpoint changes
the step's memory). Output: one line per trial (batch size, fits or not,
peak allocated and reserved MiB), then `data.batch_size=N` (the key given by
--key). Exit status: 0 with a result, 1 when even --init does not fit or a
trial failed otherwise, 2 for bad arguments.
"""
import argparse
import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

OOM = "out of memory allocating"


def parse_bytes(s):
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(B|KiB|MiB|GiB)?\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(
            "'%s': expected bytes or a number with a KiB, MiB or GiB suffix (e.g. 24GiB)" % s)
    unit = {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
    return int(float(m.group(1)) * unit)


def find_pipeline(arg):
    if arg:
        return arg
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for c in ("build/core/pipeline", "build-release/core/pipeline"):
        p = os.path.join(root, c)
        if os.access(p, os.X_OK):
            return p
    return shutil.which("pipeline") or "pipeline"


def config_value(path, key):
    """section.key of an INI file, or None (the file's own value, no overrides)."""
    sec, _, k = key.partition(".")
    cp = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), strict=False,
                                   interpolation=None)
    try:
        cp.read(path)
        return cp.get(sec, k, fallback=None)
    except configparser.Error:
        return None


class Trials:
    def __init__(self, a, run_root):
        self.a, self.run_root, self.n = a, run_root, 0
        self.rows = None  # the training split's rows, when the loader reports them
        self.extra = []
        if config_value(a.config, "pipeline.requires"):
            self.extra.append("~pipeline.requires")
        if config_value(a.config, "trainer.init_from"):
            self.extra.append("~trainer.init_from")

    def run(self, bs):
        """(fits, peak allocated bytes, peak reserved bytes); raises on another failure."""
        self.n += 1
        argv = [self.a.pipeline, "run", self.a.config, "pipeline.device=strict",
                "pipeline.run_dir=%s" % self.run_root, "pipeline.name=trial%d" % self.n,
                "%s=%d" % (self.a.key, bs), "trainer.max_steps=1", "trainer.test=false",
                "trainer.export=false", "trainer.save_best=false", "trainer.save_last=false",
                "trainer.early_stopping=false", "trainer.limit_val_batches=0"] + self.extra + \
            self.a.overrides
        env = dict(os.environ, PL_STRICT_MEMORY_ONLY="1",
                   PL_STRICT_MEMORY_CAPACITY=str(self.a.capacity))
        p = subprocess.run(argv, capture_output=True, text=True, env=env)
        out = p.stdout + p.stderr
        if p.returncode == 0:
            d = os.path.join(self.run_root, "trial%d" % self.n, "latest", "summary.json")
            with open(d) as f:
                s = json.load(f)
            n = (s.get("data") or {}).get("num_train")
            if isinstance(n, int) and n > 0:
                self.rows = n
            return True, s.get("peak_memory_allocated_bytes", 0), s.get(
                "peak_memory_reserved_bytes", 0)
        if OOM in out:
            return False, None, None
        tail = "\n".join(out.strip().splitlines()[-6:])
        raise RuntimeError("%s=%d: the trial failed (exit %d), not for memory:\n%s" %
                           (self.a.key, bs, p.returncode, tail))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--capacity", type=parse_bytes, required=True,
                    help="the device memory a run may use, e.g. 24GiB")
    ap.add_argument("--init", type=int, default=0,
                    help="first batch size tried (default: the config's own, else 1)")
    ap.add_argument("--max", type=int, default=1 << 16, help="largest batch size tried")
    ap.add_argument("--key", default="data.batch_size", help="the batch size's config key")
    ap.add_argument("--pipeline", default="", help="the pipeline binary")
    ap.add_argument("overrides", nargs="*", help="section.key=value applied to every trial")
    a = ap.parse_intermixed_args()
    a.pipeline = find_pipeline(a.pipeline)
    if not os.path.isfile(a.config):
        ap.error("%s: no such file" % a.config)
    if a.capacity <= 0:
        ap.error("--capacity must be above 0")
    if not a.init:
        v = config_value(a.config, a.key)
        a.init = int(v) if v and v.strip().isdigit() else 1
    if a.init < 1 or a.max < a.init:
        ap.error("need 1 <= --init (%d) <= --max (%d)" % (a.init, a.max))
    run_root = tempfile.mkdtemp(prefix="scale_batch_size.")
    mib = 1 << 20
    print("%s on strict, memory only, capacity %.1f MiB (%s)" %
          (a.config, a.capacity / mib, " ".join(a.overrides) or "no overrides"))
    trials = Trials(a, run_root)
    if trials.extra:
        print("measured without its requirement: %s" % " ".join(trials.extra))
    tried = {}

    def trial(bs):
        fits, al, rs = trials.run(bs)
        tried[bs] = fits
        print("  %s=%-7d %s" % (a.key, bs, "fits: peak allocated %.1f MiB, reserved %.1f MiB" %
                                (al / mib, rs / mib) if fits else "out of memory"), flush=True)
        return fits

    try:
        ok, bad, bs = 0, 0, a.init
        while True:  # power: double until a trial does not fit
            if trial(bs):
                ok = bs
                if trials.rows and a.max > trials.rows:  # a larger batch is the whole split
                    print("the training split has %d rows: sizes above are not tried" %
                          trials.rows)
                    a.max = trials.rows
                if bs >= a.max:
                    break
                bs = min(2 * bs, a.max)
            else:
                bad = bs
                break
        if ok == 0:
            print("even %s=%d does not fit %.1f MiB" % (a.key, a.init, a.capacity / mib))
            return 1
        while bad and bad - ok > 1:  # binsearch between the last fit and the first miss
            mid = (ok + bad) // 2
            if trial(mid):
                ok = mid
            else:
                bad = mid
    except RuntimeError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
    if not bad:
        print("every size tried fits, up to %d" % a.max)
    print("%s=%d" % (a.key, ok))
    return 0


if __name__ == "__main__":
    sys.exit(main())
