"""The output discipline of the data converters (tools/*_to_h5.py), the
product's own (docs/security.md, "Converters"):

  refuse_input_as_output  an output that is, or resolves to, one of the inputs
                          (the same path, a symlink or a hard link to it: a
                          typo such as `csv_to_h5.py a.csv a.csv` replaced the
                          CSV with HDF5), or that is a directory, is refused
                          before anything is read or written;
  atomic_output           the output is written to a temporary name in its own
                          directory and renamed over OUT only once complete
                          (flushed to disk): a failed or interrupted conversion
                          (full disk, bad row found late, Ctrl-C) leaves the
                          previous OUT as it was and no partial file under its
                          name; a symlink OUT is replaced, never written
                          through;
  check_names             column (or target) names that are empty or repeated
                          are refused, naming their positions: a repeated name
                          made csv_to_h5 store the first column's values twice.

Every refusal exits with status 1 and a message naming the file."""
import contextlib
import os
import sys
import tempfile


def _fail(prog, msg):
    sys.exit(f"{prog}: {msg}")


def refuse_input_as_output(prog, out, inputs):
    """Exit when `out` is a directory or names the same file as one of `inputs`
    (files or directories read by the converter)."""
    if os.path.isdir(out):
        _fail(prog, f"output {out} is a directory; give the path of the .h5 file to write")
    real_out = os.path.realpath(out)
    for i in inputs:
        same = real_out == os.path.realpath(i)
        if not same and os.path.exists(out) and os.path.exists(i):
            try:
                same = os.path.samefile(out, i)
            except OSError:
                pass
        if same:
            _fail(prog, f"output {out} is the input {i}"
                  + (f" (both are {real_out})" if out != i else "")
                  + "; writing it would destroy the input: give another output path")


@contextlib.contextmanager
def atomic_output(out):
    """Yield a temporary path next to `out`; on success flush it and rename it
    to `out`, on any exception remove it (and leave `out` untouched)."""
    d = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 -> what a plain create gives
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_names(prog, where, names, what="column"):
    """Exit when a name in `names` is empty (after stripping) or repeated;
    positions are 1-based, as in the file."""
    seen = {}
    for i, n in enumerate(names, start=1):
        key = n.strip()
        if not key:
            _fail(prog, f"{where}: {what} {i} has an empty name; every {what} needs a name "
                  f"(the loaders select {what}s by name)")
        if key in seen:
            _fail(prog, f"{where}: {what}s {seen[key]} and {i} are both named '{key}'; rename one "
                  f"(a repeated name cannot say which {what} is meant)")
        seen[key] = i
