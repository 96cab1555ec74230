#!/usr/bin/env python3
"""test_plot_png.py - `pipeline plot RUN_DIR OUT.png` writes the SVG's picture as a PNG.

Writes a metrics.csv of two runs (a falling train loss, a validation loss,
one test value), then checks with nothing but the standard library:
  - `plot RUN OUT.png` and `plot --compare A B -o OUT.png` write a valid PNG
    (signature, IHDR, CRCs, zlib stream), twice the size of the SVG that
    `plot RUN OUT.svg` writes, with no temporary file left beside it;
  - the picture is drawn, not blank: the curve colours the SVG names appear
    as pixels (the first run's colour in the single plot, both runs'
    colours in the compare plot);
  - a PNG that cannot be written (missing directory) is an error naming it,
    exit status 1, and an existing PNG is not replaced by a failed plot.
usage: test_plot_png.py BUILD_DIR   (ctest runs it)
"""
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def write_run(d, scale):
    os.makedirs(d)
    with open(os.path.join(d, "metrics.csv"), "w") as f:
        f.write("step,epoch,key,value\n")
        for s in range(1, 41):
            f.write(f"{s},{(s - 1) // 10},train_loss,{scale * (2.0 / s + 0.1)}\n")
            if s % 10 == 0:
                f.write(f"{s},{(s - 1) // 10},val_loss,{scale * (2.5 / s + 0.2)}\n")
        f.write(f"40,3,test_loss,{scale * 0.3}\n")


def decode_png(path):
    """-> (width, height, rows of RGB(A) tuples); checks signature and every chunk CRC."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG signature")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        crc = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if zlib.crc32(typ + body) & 0xFFFFFFFF != crc:
            fail(f"{path}: bad CRC in chunk {typ}")
        if typ == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    if ihdr is None:
        fail(f"{path}: no IHDR")
    w, h, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail(f"{path}: unexpected format depth {depth} colour type {ctype}")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def colour_pixels(rows, bpp, rgb, tol=8):
    n = 0
    for r in rows:
        for i in range(0, len(r), bpp):
            if all(abs(r[i + k] - rgb[k]) <= tol for k in range(3)):
                n += 1
    return n


def svg_size_and_colours(path):
    s = open(path).read()
    m = re.search(r'<svg[^>]*width="(\d+)" height="(\d+)"', s)
    if not m:
        fail(f"{path}: no svg size")
    cols = re.findall(r'class="curve"[^>]*stroke="#([0-9a-fA-F]{6})"', s)
    cols += re.findall(r'stroke="#([0-9a-fA-F]{6})"[^>]*class="curve"', s)
    return int(m.group(1)), int(m.group(2)), [tuple(int(c[i:i + 2], 16) for i in (0, 2, 4)) for c in cols]


def main():
    build = sys.argv[1]
    exe = os.path.join(build, "core", "pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        write_run(a, 1.0)
        write_run(b, 1.5)
        svg, png = os.path.join(tmp, "a.svg"), os.path.join(tmp, "a.png")
        for args in ([a, svg], [a, png]):
            r = subprocess.run([exe, "plot"] + args, capture_output=True, text=True)
            if r.returncode != 0:
                if "built without" in r.stderr and os.environ.get("CI") != "true":
                    print("SKIP: this build has no librsvg (install librsvg2-dev)")
                    sys.exit(77)
                fail(f"plot {args}: exit {r.returncode}: {r.stderr}")
        sw, sh, cols = svg_size_and_colours(svg)
        w, h, bpp, rows = decode_png(png)
        if (w, h) != (2 * sw, 2 * sh):
            fail(f"PNG is {w}x{h}, expected twice the SVG's {sw}x{sh}")
        if not cols:
            fail("the SVG names no curve colour")
        if colour_pixels(rows, bpp, cols[0]) < 200:
            fail(f"the PNG has almost no pixels of the curve colour {cols[0]}: blank picture?")
        leftovers = [f for f in os.listdir(tmp) if f not in ("a", "b", "a.svg", "a.png")]
        if leftovers:
            fail(f"temporary files left beside the PNG: {leftovers}")

        cmp_svg, cmp_png = os.path.join(tmp, "c.svg"), os.path.join(tmp, "c.png")
        for o in (cmp_svg, cmp_png):
            r = subprocess.run([exe, "plot", "--compare", a, b, "-o", o], capture_output=True,
                               text=True)
            if r.returncode != 0:
                fail(f"plot --compare -o {o}: exit {r.returncode}: {r.stderr}")
        _, _, ccols = svg_size_and_colours(cmp_svg)
        run_cols = sorted(set(ccols))
        if len(run_cols) < 2:
            fail(f"compare SVG has {len(run_cols)} curve colours, expected one per run")
        _, _, bpp, crow = decode_png(cmp_png)
        for c in run_cols:
            if colour_pixels(crow, bpp, c) < 100:
                fail(f"compare PNG lacks the run colour {c}")

        before = open(png, "rb").read()
        r = subprocess.run([exe, "plot", os.path.join(tmp, "missing"), png], capture_output=True,
                           text=True)
        if r.returncode != 1 or "missing" not in r.stderr:
            fail(f"plot of a missing run: exit {r.returncode}, stderr {r.stderr!r}")
        if open(png, "rb").read() != before:
            fail("a failed plot replaced the existing PNG")
        bad = os.path.join(tmp, "nodir", "x.png")
        r = subprocess.run([exe, "plot", a, bad], capture_output=True, text=True)
        if r.returncode != 1 or "nodir" not in r.stderr:
            fail(f"plot to a missing directory: exit {r.returncode}, stderr {r.stderr!r}")
    print("ok")


main()
