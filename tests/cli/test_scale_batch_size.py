#!/usr/bin/env python3
"""test_scale_batch_size.py BUILD_DIR - tools/scale_batch_size.py on a tiny
ilora config: the batch size it finds fits the capacity and the next one does
not, each checked by a run of its own (strict, memory only, the capacity set);
a trial that fails for another reason stops it with that run's error (exit 1);
a capacity that does not parse is exit 2; even the first size not fitting is
exit 1 and says so."""
import os
import subprocess
import sys
import tempfile

from cli_util import fail, make_movielens, write_ilora_ini

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "tools", "scale_batch_size.py")


def main():
    exe = os.path.join(sys.argv[1], "core", "pipeline")
    tmp = tempfile.mkdtemp()
    h5 = os.path.join(tmp, "ml.h5")
    make_movielens(h5, U=200, N=300, L=16)
    ini = os.path.join(tmp, "il.ini")
    write_ilora_ini(ini, f"{tmp}/runs", h5, 4, 4, dim=32, layers=2, max_len=16, optimizer="")
    cap = 6 << 20
    p = subprocess.run([sys.executable, TOOL, ini, "--capacity", "6MiB", "--max", "512",
                        "--pipeline", exe], capture_output=True, text=True)
    print(p.stdout + p.stderr)
    if p.returncode != 0:
        fail("exit %d" % p.returncode)
    last = p.stdout.strip().splitlines()[-1]
    if not last.startswith("data.batch_size="):
        fail("last line %r" % last)
    n = int(last.split("=")[1])
    if not 4 < n < 200:
        fail("batch size %d: the test wants a capacity that cuts between 4 and the 200 rows" % n)

    def fits(bs):
        env = dict(os.environ, PL_STRICT_MEMORY_ONLY="1", PL_STRICT_MEMORY_CAPACITY=str(cap))
        r = subprocess.run([exe, "run", ini, "pipeline.device=strict", "data.batch_size=%d" % bs,
                            "trainer.max_steps=1", "trainer.test=false", "trainer.save_best=false",
                            "trainer.save_last=false", "trainer.limit_val_batches=0",
                            "pipeline.run_dir=%s/check" % tmp],
                           capture_output=True, text=True, env=env)
        if r.returncode and "out of memory allocating" not in r.stderr:
            fail("bs %d: exit %d, not for memory:\n%s" % (bs, r.returncode, r.stderr[-2000:]))
        if r.returncode and "hint: a smaller batch size (tools/scale_batch_size.py" not in r.stderr:
            fail("bs %d: out of memory without the hint:\n%s" % (bs, r.stderr[-2000:]))
        return r.returncode == 0

    if not fits(n) or fits(n + 1):
        fail("found %d, but a run of %d fits: %s, of %d fits: %s" % (n, n, fits(n), n + 1,
                                                                        fits(n + 1)))
    print("found data.batch_size=%d: it fits 6 MiB and %d does not (runs of their own)" % (n, n + 1))

    p = subprocess.run([sys.executable, TOOL, ini, "--capacity", "6MiB", "--pipeline", exe,
                        "model.no_such_key=1"], capture_output=True, text=True)
    if p.returncode != 1 or "not for memory" not in p.stderr or "no_such_key" not in p.stderr:
        fail("a failing trial: exit %d\n%s" % (p.returncode, p.stderr))
    p = subprocess.run([sys.executable, TOOL, ini, "--capacity", "6 potatoes", "--pipeline", exe],
                       capture_output=True, text=True)
    if p.returncode != 2 or "6 potatoes" not in p.stderr:
        fail("a bad capacity: exit %d\n%s" % (p.returncode, p.stderr))
    p = subprocess.run([sys.executable, TOOL, ini, "--capacity", "64KiB", "--pipeline", exe],
                       capture_output=True, text=True)
    if p.returncode != 1 or "does not fit" not in p.stdout:
        fail("a capacity nothing fits: exit %d\n%s" % (p.returncode, p.stdout + p.stderr))
    print("errors: another failure stops it (1), a bad capacity (2), nothing fits (1)")
    print("OK")


if __name__ == "__main__":
    main()
