#!/usr/bin/env python3
"""core_layers.py - line counts of the core's layers (docs/architecture.md, "Layers").

Prints a Markdown table: each layer of core/, the library it is built into,
its files and its lines of .c (every line, comments included, as `wc -l`),
and the total of what libpipeline_core.so is built from (core/src,
recursively). The layers outside the core name their folder beside core/src
(core/run: libpipeline_run.so, core/io, core/services, core/testing,
core/cli). The CPU backend is listed too, as the plugin it is
(plugins/backends/cpu, its tests left out): counted beside the core, not in
it. A .c file anywhere under core/ that no layer lists is reported, and the
exit status is 1, so the table cannot leave a file out silently. Usage: python3 tools/core_layers.py
[--calls] [ROOT] (ROOT: the source root, default this file's parent).

--calls: which layer calls which (needs Universal Ctags): for each ordered
pair of layers, the functions one calls that the other defines (not
static; calls inside comments ignored), and the pairs that call each other
both ways, the circles issue 33 wants gone."""
import glob
import os
import re
import subprocess
import sys

ARGS = [a for a in sys.argv[1:] if a != "--calls"]
CALLS = "--calls" in sys.argv[1:]
ROOT = ARGS[0] if ARGS else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = "core/src/"

# (layer, library, files relative to core/, without .c; a trailing / is a folder)
LAYERS = [
    ("base (errors, hints, suggestions, file checks, messages, crash records)", "core", ["base/"]),
    ("tensor + ops (+ tape recording)", "core", ["tensor/"]),
    ("autograd (backward, checkpointing, custom ops)", "core", ["autograd/"]),
    ("backend registry", "core", ["backend/"]),
    ("CPU backend (kernels)", "`cpu.so` (plugin)", ["../../plugins/backends/cpu/"]),
    ("config + schema + plugin registry", "core", ["config/"]),
    ("the run (trainer, callbacks, chain, crash handler, config files)", "libpipeline_run.so",
     ["../run/"]),
    ("file formats (safetensors, nf4 load)", "libpipeline_io.so", ["../io/"]),
    ("CLI services (predict, export, plot, check groups)", "libpipeline_services.a",
     ["../services/"]),
    ("testing (the public harness)", "libpipeline_testing.so", ["../testing/"]),
    ("command line", "`pipeline`", ["../cli/"]),
]


def files_of(entry):
    base = os.path.join(ROOT, SRC)
    if entry.endswith("/"):  # a folder: its .c files but its tests
        return sorted(f for f in glob.glob(os.path.join(base, entry, "*.c"))
                      if not os.path.basename(f).startswith("test_"))
    return sorted(glob.glob(os.path.join(base, entry + ".c")))


def lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def calls():
    layer_of = {}
    for name, _, entries in LAYERS:
        for e in entries:
            for f in files_of(e):
                layer_of[os.path.normpath(f)] = name
    defined, text = {}, {}
    for f in layer_of:
        with open(f, encoding="utf-8") as fh:
            src = fh.read()
        text[f] = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
        out = subprocess.run(["ctags", "-x", "--c-kinds=f", f], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            fn = line.split()[0]
            if not re.search(r"^static[^;{]*\b" + re.escape(fn) + r"\s*\(", src, re.M):
                defined[fn] = f
    pairs = {}
    for f, src in text.items():
        for fn, df in defined.items():
            a, b = layer_of[f], layer_of[df]
            if a != b and re.search(r"\b" + re.escape(fn) + r"\s*\(", src):
                pairs.setdefault((a, b), set()).add(fn)
    for (a, b), fns in sorted(pairs.items()):
        print(f"{a} -> {b}: {', '.join(sorted(fns))}")
    circles = sorted({tuple(sorted(p)) for p in pairs if (p[1], p[0]) in pairs})
    for a, b in circles:
        print(f"circle: {a} <-> {b}")
    return 0


def main():
    if CALLS:
        return calls()
    seen, core_total, rows = set(), 0, []
    for name, lib, entries in LAYERS:
        fs = [f for e in entries for f in files_of(e)]
        n = sum(lines(f) for f in fs)
        seen.update(os.path.normpath(f) for f in fs)
        if lib == "core":
            core_total += n
        rows.append((name, lib, len(fs), n))
    print("| layer | library | .c files | lines of .c |")
    print("|---|---|---:|---:|")
    for name, lib, nf, n in rows:
        print(f"| {name} | {'libpipeline_core.so' if lib == 'core' else lib} | {nf} | {n:,} |")
    print(f"| **libpipeline_core.so in all** | | | **{core_total:,}** |")
    every = {os.path.normpath(f) for f in glob.glob(os.path.join(ROOT, "core", "**", "*.c"),
                                                   recursive=True)}
    missing = sorted(every - seen)
    for f in missing:
        print(f"core_layers.py: {os.path.relpath(f, ROOT)} is in no layer", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
