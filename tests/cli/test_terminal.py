#!/usr/bin/env python3
"""test_terminal.py - what a user sees when `pipeline run` writes to a terminal.

Runs the CLI in a pseudo-terminal on a tiny synthetic dataset (an MLP on 48
rows, 2 epochs, validation twice an epoch), then replays its output as a
terminal would ('\\r' back to column 0, ESC[K clears to the end of the line,
'\\n' a new line) and checks the screen:
  - every validation line and the test line are whole lines that stayed on
    screen, with their metrics (val_loss, test_loss);
  - epochs are 0-based everywhere: the progress line says "epoch E/1" for
    max_epochs = 2, the validation and epoch-summary lines "epoch E", with
    the same E for one epoch;
  - the progress line carries a whole-run ETA ("run M:SS") and, after the
    last batch, is not left on screen above the epoch summary;
  - a plugin message (plateau's, through pl_message) is on screen and in
    log.txt, as the validation and test lines are.
usage: test_terminal.py BUILD_DIR   (ctest runs it)
"""
import os
import pty
import re
import select
import sys
import tempfile
import time

import h5py
import numpy as np


def fail(msg, screen=None):
    print("FAIL: " + msg, file=sys.stderr)
    if screen is not None:
        print("---- screen ----\n" + "\n".join(screen) + "\n----------------", file=sys.stderr)
    sys.exit(1)


def make_data(path):
    """x [N, 4] -> y = sum of x (regression), train/val/test groups."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for split, n in (("train", 48), ("val", 16), ("test", 16)):
            x = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
            g = f.create_group(split)
            g["x"] = x
            g["y"] = x.sum(axis=1, keepdims=True).astype(np.float32)


def run_in_pty(argv, timeout):
    """The bytes the command writes to its terminal (stdout and stderr), and its exit code."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm"
        os.execv(argv[0], argv)
    out = b""
    deadline = time.time() + timeout
    while True:
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            fail("timed out; output so far:\n" + out.decode(errors="replace"))
        r, _, _ = select.select([fd], [], [], 1.0)
        if not r:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def render(text):
    """The screen's lines after `text`: '\\r' to column 0, ESC[K clear to the
    end of the line, '\\n' next line (a pty turns "\\n" into "\\r\\n")."""
    lines, row, col = [[]], 0, 0
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\x1b":
            m = re.match(r"\x1b\[([0-9;]*)([A-Za-z])", text[i:])
            if not m:
                fail("unknown escape sequence %r" % text[i:i + 8])
            if m.group(2) == "K" and m.group(1) in ("", "0"):
                del lines[row][col:]
            else:
                fail("unexpected escape sequence %r" % m.group(0))
            i += len(m.group(0))
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append([])
        else:
            line = lines[row]
            if col < len(line):
                line[col] = c
            else:
                line.extend(" " * (col - len(line)))
                line.append(c)
            col += 1
        i += 1
    return ["".join(l).rstrip() for l in lines]


def main():
    build = os.path.abspath(sys.argv[1])
    exe = os.path.join(build, "core", "pipeline")
    with tempfile.TemporaryDirectory(prefix="pl_test_terminal_") as tmp:
        h5 = os.path.join(tmp, "d.h5")
        make_data(h5)
        ini = os.path.join(tmp, "t.ini")
        with open(ini, "w") as f:
            f.write(f"""[pipeline]
name = term
seed = 1
verbose = true
run_dir = {tmp}/runs
[data]
plugin = hdf5_rows
path = {h5}
datasets = x,y
batch_size = 8
[model]
plugin = mlp
in_features = 4
out_features = 1
hidden = 8
[optimizer]
plugin = adamw
lr = 0.01
[scheduler]
plugin = plateau
patience = 0
threshold = 10
[trainer]
max_epochs = 2
val_check_interval = 0.5
log_every_n_steps = 1
""")
        text, code = run_in_pty([exe, "run", ini], timeout=120)
        screen = render(text)
        if code != 0:
            fail("pipeline run exited %d" % code, screen)

        val = [l for l in screen if " validation (" in l]
        # two validations an epoch (val_check_interval = 0.5), two epochs
        if len(val) != 4:
            fail("expected 4 validation lines on screen, found %d" % len(val), screen)
        for l in val:
            if not re.match(r"^epoch [01] step \d+ validation \([0-9.]+s\):  val_loss [0-9.]+", l):
                fail("validation line is not whole: %r" % l, screen)
        test = [l for l in screen if l.startswith("test:")]
        if len(test) != 2 or not re.match(r"^test:  test_loss [0-9.]+  test_mae [0-9.]+$", test[1]):
            fail("test lines: %r" % test, screen)

        # 0-based epochs, the same on every line of an epoch
        summ = [l for l in screen if re.match(r"^epoch \d+: train_loss", l)]
        if [l.split(":")[0] for l in summ] != ["epoch 0", "epoch 1"]:
            fail("epoch summaries: %r" % summ, screen)
        val_epochs = [int(l.split()[1]) for l in val]
        if val_epochs != [0, 0, 1, 1]:
            fail("validation epochs %r, expected [0, 0, 1, 1]" % val_epochs, screen)
        # the progress line as it was drawn (the last state before each clear)
        drawn = re.findall(r"epoch (\d+)/(\d+)  batch (\d+)/(\d+) .*?eta epoch \S+ run (\S+)", text)
        if not drawn:
            fail("no progress line was drawn", screen)
        for e, last, b, nb, run_eta in drawn:
            if last != "1" or nb != "6" or e not in ("0", "1"):
                fail("progress line 'epoch %s/%s batch %s/%s': expected epoch 0/1 or 1/1 of 6 "
                     "batches" % (e, last, b, nb), screen)
            if not re.match(r"^\d+:\d\d$", run_eta):
                fail("progress line run ETA %r is not M:SS" % run_eta, screen)
        # no progress line stays on screen above an epoch summary or a validation
        left = [l for l in screen if re.search(r"epoch \d+/\d+  batch", l)]
        if left:
            fail("progress lines left on screen: %r" % left, screen)

        # a plugin's message (plateau, verbose) is on screen and in log.txt
        plat = [l for l in screen if l.startswith("plateau: ")]
        if not plat:
            fail("no plateau message on screen", screen)
        runs = os.path.join(tmp, "runs", "term")
        run_dir = [d for d in sorted(os.listdir(runs)) if os.path.isdir(os.path.join(runs, d))
                   and os.path.exists(os.path.join(runs, d, "log.txt"))][-1]
        log = open(os.path.join(runs, run_dir, "log.txt")).read()
        for want in (plat[0], val[0], test[1], summ[1]):
            if want not in log:
                fail("%r is on screen but not in log.txt:\n%s" % (want, log), screen)
    print("ok: validation, test and plugin lines stay on screen; epochs 0-based")


if __name__ == "__main__":
    main()
