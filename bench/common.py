"""Shared helpers of the benchmarks: run `pipeline` on a config and read its
summary, read INI values the PyTorch peer must mirror, print the comparison.

Both sides run in the same process environment (OPENBLAS_CORETYPE is left as
the environment sets it and reported), on the same machine, in the same run.
With `--device cuda` (add_device_arg) both run on the GPU: pipeline with
`pipeline.device=cuda`, PyTorch with tensors on 'cuda' (throughputs synchronize
the device at both ends of the timed loop, not per step).
With `--compile` (or BENCH_COMPILE=1) the PyTorch side runs twice: eager, then
under torch.compile(mode="reduce-overhead") (CUDA graphs on cuda; on the CPU
the same mode compiles without them), timed the same way (warm-up excluded;
the warm-up's seconds, compilation included, reported apart). A compile that
raises prints `compile: failed (reason)` and the bench goes on (torch_sides).
"""
import configparser
import json
import os
import platform
import signal
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
    On the CPU these are the steps' times. On cuda the device is not
    synchronized per step (a wait per step would take away the overlap of
    host and device that the throughput, synchronized at the loop's ends,
    measures; pipeline's GPU runs do not wait per step either): the seconds
    are then the host's time to issue each step, as pipeline's step_seconds
    on a GPU (device_overrides)."""

    def __init__(self, device="cpu"):
        self.device, self.seconds = device, []

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds.append(time.perf_counter() - self._t0)
        return False


def peak_rss_bytes():
    """Peak resident memory of this (PyTorch) process, bytes."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def add_device_arg(ap):
    """--device cpu|cuda: where both sides run; --compile: also time the
    PyTorch side under torch.compile(mode="reduce-overhead")."""
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="run pipeline (pipeline.device) and PyTorch on this device")
    ap.add_argument("--compile", action="store_true", default=os.environ.get("BENCH_COMPILE") == "1",
                    help="also time PyTorch under torch.compile(mode='reduce-overhead'), timed as eager "
                         "(default from BENCH_COMPILE=1)")


def torch_modes(args):
    """The PyTorch variants --compile asks for: ["eager"] or ["eager", "compile"]."""
    return ["eager", "compile"] if getattr(args, "compile", False) else ["eager"]


COMPILE_MODE = "reduce-overhead"


def compiled(fn, mode):
    """fn itself in eager mode; torch.compile(fn, mode="reduce-overhead") in
    compile mode (a module or a function: the forward and loss of a step; the
    backward is compiled by AOTAutograd, the optimizer step stays eager)."""
    if mode != "compile":
        return fn
    import torch
    return torch.compile(fn, mode=COMPILE_MODE)


def step_begin(mode):
    """Start of a training step: under reduce-overhead, tells the CUDA graph
    trees that the previous step's outputs are dead (what PyTorch's docs ask
    of a training loop; without it a later replay may refuse to overwrite
    them). No-op in eager mode."""
    if mode == "compile":
        import torch
        torch.compiler.cudagraph_mark_step_begin()


def reset_peak(device):
    if device == "cuda":
        import torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_device_bytes(device):
    """PyTorch's peak device memory since reset_peak (torch.cuda.max_memory_allocated);
    None on the CPU (the process's peak RSS is reported instead)."""
    if device == "cuda":
        import torch
        return torch.cuda.max_memory_allocated()
    return None


def _reason(e):
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:300]


class CompileTimeout(Exception):
    pass


def _compile_alarm(signum, frame):
    raise CompileTimeout()


def _timed_out(e):
    """The alarm's exception, or one torch wrapped it in (__cause__ / __context__)."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, CompileTimeout) or "CompileTimeout" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def torch_sides(modes, device, run):
    """Run the PyTorch side once per mode: run(mode) returns a dict with at
    least "throughput" and "steps" (seconds of each timed step) and
    "warmup_s" (seconds of the untimed warm-up, compilation included).
    Adds "peak_device" (bytes, cuda) and, in compile mode, "graphs" and
    "graph_breaks" from torch._dynamo's counters. A compile
    mode that raises gives {"error": reason} and prints `compile: failed
    (reason)`; the eager mode raising stops the bench as before.
    BENCH_COMPILE_TIMEOUT=S (seconds): the compile mode, compilation and
    timed steps together, is stopped after S seconds and reported as failed
    (timed out), so one slow compilation cannot take a GPU session's time."""
    import torch
    res = {}
    for mode in modes:
        reset_peak(device)
        counters = None
        if mode == "compile":
            from torch._dynamo.utils import counters
            torch._dynamo.reset()
            counters.clear()
        limit = int(os.environ.get("BENCH_COMPILE_TIMEOUT", "0") or 0) if mode == "compile" else 0
        old_handler = None
        if limit > 0:
            old_handler = signal.signal(signal.SIGALRM, _compile_alarm)
            signal.alarm(limit)
        try:
            r = run(mode)
        except Exception as e:  # noqa: BLE001 - any compile failure is reported, not fatal
            if mode == "eager":
                raise
            r = {"error": _reason(e)}
            if _timed_out(e):
                r["error"] = f"timed out: warm-up and timed steps not done within BENCH_COMPILE_TIMEOUT={limit} s"
            print(f"compile: failed ({r['error']})", flush=True)
        else:
            r["peak_device"] = peak_device_bytes(device)
            if counters is not None:
                r["graphs"] = int(counters["stats"].get("unique_graphs", 0))
                r["graph_breaks"] = int(sum(counters["graph_break"].values()))
        finally:
            if limit > 0:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old_handler)
        res[mode] = r
        if mode == "compile":
            try:  # after a timeout the compiler's state may be half-built: best effort
                torch._dynamo.reset()
            except Exception as e:  # noqa: BLE001
                print(f"compile: torch._dynamo.reset() after the compile mode: {_reason(e)}")
    return res


def device_overrides(device):
    """The pipeline overrides for --device. On a GPU the loss is not read back
    every step (log_every_n_steps=1 would: a device sync per step, which the
    PyTorch side does not do; its per-step seconds are then host launch
    times, the throughput is the synchronized figure). cuda_graphs=auto
    (the default, said explicitly): the step captured once and replayed."""
    if device == "cpu":
        return []
    return [f"pipeline.device={device}", "trainer.log_every_n_steps=1000", "trainer.cuda_graphs=auto"]


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


def _mib(b):
    return f"{b / 2**20:.1f}" if b else "-"


def report(workload, unit, ours, theirs=None, extra="", ours_steps=None, theirs_steps=None,
           ours_rss=None, theirs_rss=None, sides=None, ours_peak=None):
    """Print one comparison line: throughput (higher is better) and the ratio.
    With per-step seconds (pipeline: run_pipeline's s["_step_seconds"];
    PyTorch: StepTimer.seconds) and peak resident bytes, also their median /
    min / max. `sides` (torch_sides' result) gives PyTorch's figures instead
    of theirs / theirs_steps, and with a "compile" entry a second line:
    torch.compile(mode="reduce-overhead")'s throughput, pipeline's ratio to
    it, the warm-up seconds (compilation included) beside eager's, or
    `compile: failed (reason)`. ours_peak: pipeline's peak device memory
    (summary.json peak_memory_bytes), printed beside PyTorch's on cuda.
    With BENCH_RESULTS set (bench/run, bench/gpu_compare.sh), the line is
    appended there as JSON for the summary table."""
    eager = comp = None
    if sides:
        eager, comp = sides.get("eager"), sides.get("compile")
        theirs, theirs_steps = eager["throughput"], eager.get("steps")
    ratio = ours / theirs if theirs else float("nan")
    print(f"{workload:<28} pipeline {ours:10.2f} {unit}   pytorch {theirs:10.2f} {unit}   "
          f"ratio (pipeline/pytorch) {ratio:5.2f}x {extra}")
    c_tp = c_ratio = c_err = c_warm = None
    if comp is not None:
        if "error" in comp:
            c_err = comp["error"]
            print(f"    compile: failed ({c_err})")
        else:
            c_tp, c_warm = comp["throughput"], comp.get("warmup_s")
            c_ratio = ours / c_tp if c_tp else float("nan")
            e_warm = eager.get("warmup_s") if eager else None
            print(f"    torch.compile(mode=\"{COMPILE_MODE}\") {c_tp:10.2f} {unit}   "
                  f"ratio (pipeline/compile) {c_ratio:5.2f}x   warm-up with compilation "
                  f"{c_warm or 0:.1f} s (eager's warm-up {e_warm or 0:.1f} s); "
                  f"{comp.get('graphs')} graphs, {comp.get('graph_breaks')} graph breaks")
    so, st = _stats(ours_steps or []), _stats(theirs_steps or [])
    sc = _stats(comp.get("steps") or []) if comp and "error" not in comp else None
    for side, x in (("pipeline", so), ("pytorch", st), ("compile", sc)):
        if x:
            print(f"    {side} step: median {x['median'] * 1e3:.2f} ms (min {x['min'] * 1e3:.2f}, "
                  f"max {x['max'] * 1e3:.2f}, {x['n']} steps)")
    e_peak = eager.get("peak_device") if eager else None
    c_peak = comp.get("peak_device") if comp else None
    if e_peak is not None or c_peak is not None:
        print(f"    peak device memory MiB: pipeline {_mib(ours_peak)}, pytorch {_mib(e_peak)}"
              + (f", compile {_mib(c_peak)}" if comp is not None else ""))
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"workload": workload, "unit": unit, "pipeline": ours, "pytorch": theirs,
                                "ratio": ratio, "pipeline_step": so, "pytorch_step": st,
                                "pipeline_rss": ours_rss, "pytorch_rss": theirs_rss,
                                "compile_run": comp is not None, "compile": c_tp,
                                "compile_ratio": c_ratio, "compile_error": c_err,
                                "compile_warmup_s": c_warm,
                                "eager_warmup_s": eager.get("warmup_s") if eager else None,
                                "compile_step": sc, "pipeline_peak": ours_peak, "pytorch_peak": e_peak,
                                "compile_peak": c_peak}) + "\n")
    return ratio
