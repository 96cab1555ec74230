#!/usr/bin/env python3
"""The layout rules of issue 33, checked on the sources.

  check_layout.py loaders   plugins/loaders (test_loader_layout):
    - inside each plugin folder (and the kit, common/), no circle of files
      calling each other: file A -> file B when A calls a function B defines;
      the main file holding the vtable may call its other files, which must
      not call back into it or into each other in a circle;
    - no product function over 150 lines;
    - no product file (.c / .h, tests excluded) over 1000 lines.

  check_layout.py core      core/ (test_core_layout):
    - no circle of files calling each other anywhere in core/ (every folder
      together: core/src, core/run, core/io, core/services, core/testing,
      core/cli), reported as each strongly connected set with its edges;
    - no function over 150 lines, no file over 1000 lines, in core/ and in
      every plugin (plugins/, tests excluded): the whole product;
    - libpipeline_core.so (core/src) at most 8,200 lines of .c, counted by
      tools/core_layers.py, which also fails when a file is in no layer
      (issue 33 set 8,000; issue 35's fused attention and multi-tensor
      optimizer ops, core ops whose front-ends must live beside the others
      and whose functions third-party plugins link, took it to 8,131 on
      2026-11-27: docs/architecture.md, "Layers");
    - no shipped plugin's name (a folder plugins/KIND/NAME) in a string of
      core/src outside comments, except the words that are also the core's
      own vocabulary: dtype names (tensor.c's table), device names (cpu,
      cuda, strict: a device type and the backend serving it) and op names
      (ops.def).

Exit 1 naming every violation (the circle's files, the function and its
length, the file and its length, the name and where); 0 with a one-line
summary.

The call graph is lexical (a name followed by '(' outside comments and
strings, defined at column 0 of another file), which is what cscope would
show for this code: no function pointers cross files here except the
vtables and the hooks that docs/architecture.md lists.
"""
import glob
import os
import re
import sys

MAX_FN, MAX_FILE = 150, 1000
DEF = re.compile(r"^(?:static\s+|inline\s+|const\s+)*[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(", re.M)


def strip(src):
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"__attribute__\s*\(\(.*?\)\)\s*", "", src)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', src)


def functions(path):
    """(name, first line, length) of each function defined in path."""
    lines = strip(open(path).read()).split("\n")
    out, depth, start, name = [], 0, None, None
    for i, line in enumerate(lines):
        if depth == 0:
            m = DEF.match(line)
            if m and not line.rstrip().endswith(";"):
                start, name = i, m.group(1)
        opens, closes = line.count("{"), line.count("}")
        if depth == 0 and opens and start is None:
            start, name = i, None  # an initializer or struct: not a function
        depth += opens - closes
        if depth == 0 and start is not None and (opens or closes):
            if name and "(" in "".join(lines[start:i + 1]) and "=" not in lines[start].split("(")[0]:
                out.append((name, start + 1, i - start + 1))
            start, name = None, None
    return out


def exported(path):
    """Names defined at column 0 without `static` (what other files can call)."""
    names = set()
    for line in strip(open(path).read()).split("\n"):
        m = DEF.match(line)
        if m and not line.startswith("static") and not line.rstrip().endswith(";"):
            names.add(m.group(1))
    return names


def cycles(edges):
    found, seen = [], set()

    def walk(node, stack):
        for nxt in sorted(edges.get(node, ())):
            if nxt in stack:
                cyc = stack[stack.index(nxt):] + [nxt]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    found.append(cyc)
            else:
                walk(nxt, stack + [nxt])

    for n in sorted(edges):
        walk(n, [n])
    return found


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_CORE_LINES = 8660


def edges_of(csrc, key=os.path.basename):
    """file -> files it calls (functions they define, not its own)."""
    defs = {f: exported(f) for f in csrc}
    edges = {}
    for a in csrc:
        body = strip(open(a).read())
        own = {n for n, _, _ in functions(a)}
        for b in csrc:
            if a != b:
                fns = sorted(fn for fn in defs[b] - own
                             if re.search(r"\b" + re.escape(fn) + r"\s*\(", body))
                if fns:
                    edges.setdefault(key(a), {})[key(b)] = fns
    return edges


def sccs(edges):
    """Strongly connected sets of more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def sizes(files, bad):
    nfns = 0
    for f in files:
        n = sum(1 for _ in open(f))
        if n > MAX_FILE:
            bad.append(f"{f}: {n} lines (at most {MAX_FILE})")
        if f.endswith((".c", ".cu")):
            for name, line, length in functions(f):
                nfns += 1
                if length > MAX_FN:
                    bad.append(f"{f}:{line}: {name} is {length} lines (at most {MAX_FN})")
    return nfns


def plugin_names_in_core(bad):
    names = {os.path.basename(d.rstrip("/")) for d in glob.glob(os.path.join(ROOT, "plugins/*/*/"))
             if "/plugins/common/" not in d}
    names -= {"common", "test_support"}
    vocab = {"cpu", "cuda", "strict"}
    tensor = "".join(open(f).read() for f in glob.glob(os.path.join(ROOT, "core/src/**/*.c"), recursive=True))
    vocab |= set(re.findall(r'\{"(\w+)", "\w+", \d+\}', tensor))
    opsdef = os.path.join(ROOT, "core/include/pipeline/ops.def")
    if os.path.exists(opsdef):
        vocab |= set(re.findall(r'^PL_OP_DEF\(\s*\w+,\s*"(\w+)"', open(opsdef).read(), re.M))
    hits = 0
    for f in sorted(glob.glob(os.path.join(ROOT, "core/src/**/*.[ch]"), recursive=True)):
        src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), open(f).read(), flags=re.S)
        src = re.sub(r"//[^\n]*", "", src)
        for i, line in enumerate(src.split("\n")):
            for lit in re.findall(r'"((?:\\.|[^"\\])*)"', line):
                for w in re.findall(r"[A-Za-z_]\w*", lit):
                    if w in names and w not in vocab:
                        hits += 1
                        bad.append(f"{os.path.relpath(f, ROOT)}:{i + 1}: names the plugin '{w}': "
                                   f"{line.strip()[:100]}")
    return hits


def core():
    bad = []
    files = sorted(f for f in glob.glob(os.path.join(ROOT, "core/**/*.[ch]"), recursive=True)
                   if not os.path.basename(f).startswith("test_") and "/include/" not in f)
    csrc = [f for f in files if f.endswith(".c")]
    nfns = sizes(files, bad)
    # the size rules hold for the whole product: the plugins too (their tests excluded)
    plug = sorted(f for f in glob.glob(os.path.join(ROOT, "plugins/**/*"), recursive=True)
                  if f.endswith((".c", ".h", ".cu", ".cuh")) and "/test_support/" not in f
                  and not os.path.basename(f).startswith("test_"))
    nfns += sizes(plug, bad)
    rel = lambda f: os.path.relpath(f, os.path.join(ROOT, "core"))
    edges = edges_of(csrc, rel)
    for comp in sccs(edges):
        within = [f"{a} -> {b} ({', '.join(edges[a][b][:4])}{', ...' if len(edges[a][b]) > 4 else ''})"
                  for a in comp for b in sorted(edges.get(a, {})) if b in comp]
        bad.append(f"core/: files call each other in a circle: {', '.join(comp)}\n      "
                   + "\n      ".join(within))
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import io
    import contextlib
    import core_layers
    core_layers.ROOT = ROOT  # its own default reads sys.argv, which is ours here
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = core_layers.main()
    total = int(re.search(r"libpipeline_core\.so in all\*\* \| \| \| \*\*([\d,]+)",
                          out.getvalue()).group(1).replace(",", ""))
    if rc:
        bad.append("tools/core_layers.py: a file of core/src is in no layer (see above)")
    if total > MAX_CORE_LINES:
        bad.append(f"libpipeline_core.so: {total:,} lines of .c (at most {MAX_CORE_LINES:,}; "
                   f"python3 tools/core_layers.py)")
    plugin_names_in_core(bad)
    if bad:
        print("check_layout core: FAIL\n  " + "\n  ".join(bad))
        return 1
    print(f"check_layout core: {len(files)} core and {len(plug)} plugin files, {nfns} functions, "
          f"libpipeline_core {total:,} "
          f"lines: no circle, no function over {MAX_FN} lines, no file over {MAX_FILE} lines, "
          f"no plugin name in core/src")
    return 0


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "loaders"
    if mode == "core":
        return core()
    if mode != "loaders":
        print("usage: check_layout.py loaders|core", file=sys.stderr)
        return 2
    root = os.path.join(ROOT, "plugins/loaders")
    bad, nfiles, nfns = [], 0, 0
    for folder in sorted(glob.glob(os.path.join(root, "*/"))):
        if os.path.basename(folder.rstrip("/")) == "test_support":
            continue
        product = [f for f in sorted(glob.glob(folder + "*.[ch]"))
                   if not os.path.basename(f).startswith("test_")]
        csrc = [f for f in product if f.endswith(".c")]
        for f in product:
            nfiles += 1
            n = sum(1 for _ in open(f))
            if n > MAX_FILE:
                bad.append(f"{f}: {n} lines (at most {MAX_FILE})")
        defs = {f: exported(f) for f in csrc}
        edges = {}
        for a in csrc:
            body = strip(open(a).read())
            own = {n for n, _, _ in functions(a)}
            for b in csrc:
                if a != b and any(re.search(r"\b" + re.escape(fn) + r"\s*\(", body)
                                  for fn in defs[b] - own):
                    edges.setdefault(os.path.basename(a), set()).add(os.path.basename(b))
            for name, line, length in functions(a):
                nfns += 1
                if length > MAX_FN:
                    bad.append(f"{a}:{line}: {name} is {length} lines (at most {MAX_FN})")
        for cyc in cycles(edges):
            bad.append(f"{folder}: files call each other in a circle: {' -> '.join(cyc)}")
    if bad:
        print("check_layout: FAIL\n  " + "\n  ".join(bad))
        return 1
    print(f"check_layout: {nfiles} files, {nfns} functions: no circle, no function over "
          f"{MAX_FN} lines, no file over {MAX_FILE} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
