#!/usr/bin/env python3
"""The loaders' layout rules (issue 33), checked on the sources:

  - inside each plugin folder of plugins/loaders/ (and the kit, common/), no
    circle of files calling each other: file A -> file B when A calls a
    function B defines; the main file holding the vtable may call its other
    files, which must not call back into it or into each other in a circle;
  - no product function over 150 lines;
  - no product file (.c / .h, tests excluded) over 1000 lines.

usage: check_layout.py [LOADERS_DIR]   (default: the folder above this one)
Exit 1 naming every violation (the circle's files, the function and its
length, the file and its length); 0 with a one-line summary.

The call graph is lexical (a name followed by '(' outside comments and
strings, defined at column 0 of another file), which is what cscope would
show for this code: no function pointers cross files here except the
vtables, which only entry.c / alias.c take the address of.
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


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
