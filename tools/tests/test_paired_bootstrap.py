#!/usr/bin/env python3
"""Test bench/teacher/paired_bootstrap.py on cases checkable by hand and
against an independent pure-Python loop over the same resamples."""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "teacher"))
from paired_bootstrap import paired_bootstrap  # noqa: E402


def identical_arrays_give_zero():
    a = np.random.default_rng(1).random(671)
    m, lo, hi, _ = paired_bootstrap(a, a.copy())
    assert (m, lo, hi) == (0.0, 0.0, 0.0), (m, lo, hi)


def constant_shift_gives_exactly_the_shift():
    # values k/8 and a shift of 1/8: every sum is exact in binary
    b = np.random.default_rng(2).integers(0, 8, 300) / 8.0
    m, lo, hi, _ = paired_bootstrap(b + 0.125, b)
    assert (m, lo, hi) == (0.125, 0.125, 0.125), (m, lo, hi)


def two_users_by_hand():
    # d = [0, 1]: a resample of 2 users has mean 0 (p 1/4), 1/2 (p 1/2) or 1 (p 1/4),
    # so over 10,000 resamples the 2.5 % percentile is 0 and the 97.5 % one is 1
    m, lo, hi, st = paired_bootstrap([0.0, 1.0], [0.0, 0.0])
    assert (m, lo, hi) == (0.5, 0.0, 1.0), (m, lo, hi)
    assert set(np.unique(st)) == {0.0, 0.5, 1.0} and len(st) == 10000
    assert abs(np.mean(st == 0.0) - 0.25) < 0.02 and abs(np.mean(st == 0.5) - 0.5) < 0.02


def seeds_are_averaged_per_user_first():
    rng = np.random.default_rng(3)
    a, b = rng.random((3, 50)), rng.random((3, 50))
    got = paired_bootstrap(a, b, 2000, 7)[:3]
    want = paired_bootstrap(a.mean(0), b.mean(0), 2000, 7)[:3]
    assert got == want, (got, want)
    assert abs(got[0] - (a.mean() - b.mean())) < 1e-12


def matches_an_independent_loop():
    # 2,500 resamples: the function draws them in blocks of 1,000; the loop draws
    # all of them at once from the same generator, then averages and takes the
    # percentiles (linear interpolation between order statistics) by hand
    U, B, seed = 7, 2500, 11
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 2, U).astype(float), rng.random(U)
    m, lo, hi, st = paired_bootstrap(a, b, B, seed)
    idx = np.random.Generator(np.random.PCG64(seed)).integers(0, U, size=(B, U))
    d = [float(a[u] - b[u]) for u in range(U)]
    means = sorted(sum(d[u] for u in row) / U for row in idx.tolist())

    def pct(p):
        x = p / 100 * (B - 1)
        k = math.floor(x)
        return means[k] + (x - k) * (means[min(k + 1, B - 1)] - means[k])

    assert abs(m - sum(d) / U) < 1e-15
    assert abs(lo - pct(2.5)) < 1e-12 and abs(hi - pct(97.5)) < 1e-12, (lo, hi, pct(2.5), pct(97.5))
    assert abs(sorted(st.tolist())[100] - means[100]) < 1e-12


def bad_inputs_are_refused():
    for a, b in (([1.0, 2.0], [1.0]), ([], [])):
        try:
            paired_bootstrap(a, b)
        except ValueError:
            continue
        raise AssertionError(f"accepted {a} vs {b}")


def main():
    identical_arrays_give_zero()
    constant_shift_gives_exactly_the_shift()
    two_users_by_hand()
    seeds_are_averaged_per_user_first()
    matches_an_independent_loop()
    bad_inputs_are_refused()
    print("test_paired_bootstrap: OK")


if __name__ == "__main__":
    main()
