"""Shared helpers of the benchmarks: run `pipeline` on a config and read its
summary, read INI values the PyTorch peer must mirror, print the comparison.

Both sides run in the same process environment (OPENBLAS_CORETYPE is left as
the environment sets it and reported), on the same machine, in the same run.
With `--device cuda` (add_device_arg) both run on the GPU: pipeline with
`pipeline.device=cuda`, PyTorch with tensors on 'cuda' (timings synchronize).
"""
import configparser
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def pipeline_bin():
    for cand in (os.environ.get("PIPELINE_BIN"), os.path.join(ROOT, "build/core/pipeline")):
        if cand and os.path.exists(cand):
            return cand
    sys.exit("bench: build first (cmake -S . -B build && cmake --build build) or set PIPELINE_BIN")


def read_ini(path):
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(os.path.join(ROOT, path))
    return cp


def run_pipeline(config, overrides, label, test=False):
    """Run `pipeline run config overrides` in a temp run dir; return summary.json.
    test=True also evaluates the test split with the final weights."""
    run_dir = tempfile.mkdtemp(prefix="pl_bench_")
    cmd = [pipeline_bin(), "run", config, f"pipeline.run_dir={run_dir}", f"trainer.test={str(test).lower()}",
           "trainer.export=false", "trainer.save_best=false", "trainer.save_last=false",
           "trainer.early_stopping=false"] + overrides
    if not any(o.startswith("trainer.log_every_n_steps=") for o in overrides):
        cmd.append("trainer.log_every_n_steps=1")  # every step's wall seconds in metrics.csv
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        sys.exit(f"bench: pipeline failed on {config} ({label})")
    wall = time.time() - t0
    summaries = []
    for dp, _, files in os.walk(run_dir):
        if "summary.json" in files:
            summaries.append(os.path.join(dp, "summary.json"))
    summaries.sort()
    with open(summaries[-1]) as f:
        s = json.load(f)
    s["_wall"] = wall
    s["_step_seconds"] = []
    metrics = os.path.join(os.path.dirname(summaries[-1]), "metrics.csv")
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                parts = line.rstrip("\n").split(",")
                if len(parts) == 4 and parts[2] == "step_seconds":
                    s["_step_seconds"].append(float(parts[3]))
    return s


class StepTimer:
    """Wall seconds of each step of the PyTorch side: `with timer: step()`.
    Synchronizes the device around the step on cuda."""

    def __init__(self, device="cpu"):
        self.device, self.seconds = device, []

    def __enter__(self):
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.seconds.append(time.perf_counter() - self._t0)
        return False


def peak_rss_bytes():
    """Peak resident memory of this (PyTorch) process, bytes."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def add_device_arg(ap):
    """--device cpu|cuda: where both sides run."""
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="run pipeline (pipeline.device) and PyTorch on this device")


def device_overrides(device):
    """The pipeline overrides for --device. On a GPU the loss is not read back
    every step (log_every_n_steps=1 would: a device sync per step, which the
    PyTorch side does not do; its per-step seconds are then host launch
    times, the throughput is the synchronized figure)."""
    if device == "cpu":
        return []
    return [f"pipeline.device={device}", "trainer.log_every_n_steps=1000"]


def sync(device):
    """Wait for the device's queued work (before reading a clock)."""
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def environment(device="cpu"):
    import torch
    env = (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
           f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; "
           f"torch {torch.__version__} with {torch.get_num_threads()} threads")
    if device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench: --device cuda but torch.cuda.is_available() is False")
        env += (f"; device cuda: {torch.cuda.get_device_name(0)}, torch CUDA {torch.version.cuda}, "
                f"cuDNN {torch.backends.cudnn.version()}")
    return env


def _stats(xs):
    if not xs:
        return None
    xs = sorted(xs)
    n = len(xs)
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    return {"median": med, "min": xs[0], "max": xs[-1], "n": n}


def report(workload, unit, ours, theirs, extra="", ours_steps=None, theirs_steps=None,
           ours_rss=None, theirs_rss=None):
    """Print one comparison line: throughput (higher is better) and the ratio.
    With per-step seconds (pipeline: run_pipeline's s["_step_seconds"];
    PyTorch: StepTimer.seconds) and peak resident bytes, also their median /
    min / max. With BENCH_RESULTS set (bench/run), the line is appended there
    as JSON for the summary table."""
    ratio = ours / theirs if theirs else float("nan")
    print(f"{workload:<28} pipeline {ours:10.2f} {unit}   pytorch {theirs:10.2f} {unit}   "
          f"ratio (pipeline/pytorch) {ratio:5.2f}x {extra}")
    so, st = _stats(ours_steps or []), _stats(theirs_steps or [])
    for side, x in (("pipeline", so), ("pytorch", st)):
        if x:
            print(f"    {side} step: median {x['median'] * 1e3:.2f} ms (min {x['min'] * 1e3:.2f}, "
                  f"max {x['max'] * 1e3:.2f}, {x['n']} steps)")
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"workload": workload, "unit": unit, "pipeline": ours, "pytorch": theirs,
                                "ratio": ratio, "pipeline_step": so, "pytorch_step": st,
                                "pipeline_rss": ours_rss, "pytorch_rss": theirs_rss}) + "\n")
    return ratio
