#!/usr/bin/env python3
"""The rounding error of Winograd F(4x4, 3x3) in f32 for a choice of interpolation points, against a
direct sum in f32: the measurement behind the points backends/cpu/winograd_conv.cpp uses.

For each set of points the Toom-Cook matrices (A^T, G, B^T) are built exactly (fractions), checked
to compute the convolution in f64, then rounded to f32; one 4x4 output tile is summed over --channels
input channels, every step in f32, and compared with the exact (f64) sum. Inputs are uniform in
[-1, 1], weights in [-0.1, 0.1]; the table gives the median over --draws draws of the largest error
of the 16 outputs.

  .venv-bench/bin/python bench/winograd_error.py --channels 256 --draws 60 --seed 3
"""
import argparse
from fractions import Fraction as F

import numpy as np


def poly_from_roots(roots):
    """Ascending coefficients of the product of (x - r)."""
    c = [F(1)]
    for r in roots:
        c = [F(0)] + c  # times x
        for i in range(len(c) - 1):
            c[i] -= r * c[i + 1]
    return c


def toom_cook(points, m=4, r=3):
    """A^T (m x n), G (n x r), B^T (n x n) for n = m + r - 1 finite points plus infinity."""
    n = m + r - 1
    assert len(points) == n - 1
    AT = [[F(0)] * n for _ in range(m)]
    G = [[F(0)] * r for _ in range(n)]
    BT = [[F(0)] * n for _ in range(n)]
    for j, p in enumerate(points):
        others = [q for q in points if q != p]
        f = F(1)
        for q in others:
            f *= p - q
        for i in range(m):
            AT[i][j] = p ** i
        for k in range(r):
            G[j][k] = p ** k / f
        for k, c in enumerate(poly_from_roots(others)):
            BT[j][k] = c
    AT[m - 1][n - 1] = F(1)
    G[n - 1][r - 1] = F(1)
    for k, c in enumerate(poly_from_roots(points)):
        BT[n - 1][k] = c
    return [np.array([[float(x) for x in row] for row in M]) for M in (AT, G, BT)]


def tile(d, g, mats, dt):
    AT, G, BT = (M.astype(dt) for M in mats)
    M = np.zeros((6, 6), dt)
    for c in range(d.shape[0]):
        M += (G @ g[c].astype(dt) @ G.T) * (BT @ d[c].astype(dt) @ BT.T)
    return AT @ M @ AT.T


def direct(d, g, dt):
    out = np.zeros((4, 4), dt)
    for c in range(d.shape[0]):
        for i in range(4):
            for j in range(4):
                out[i, j] += (d[c, i:i + 3, j:j + 3].astype(dt) * g[c].astype(dt)).sum(dtype=dt)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--draws", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    h = F(1, 2)
    sets = {"0, 1, -1, 2, -2 (Lavin & Gray)": [F(0), F(1), F(-1), F(2), F(-2)],
            "0, 1, -1, 1/2, -1/2": [F(0), F(1), F(-1), h, -h],
            "0, 1, -1, 2, -1/2 (duet)": [F(0), F(1), F(-1), F(2), -h],
            "0, -1, 1, 1/2, -3": [F(0), F(-1), F(1), h, F(-3)]}
    rng = np.random.default_rng(a.seed)
    draws = [(rng.uniform(-1, 1, (a.channels, 6, 6)), rng.uniform(-0.1, 0.1, (a.channels, 3, 3)))
             for _ in range(a.draws)]
    exact = [direct(d, g, np.float64) for d, g in draws]
    print(f"largest error of a 4x4 tile over {a.channels} channels, median of {a.draws} draws")
    err = [np.abs(direct(d, g, np.float32) - e).max() for (d, g), e in zip(draws, exact)]
    print(f"  {'direct sum in f32':34s} {np.median(err):.2e}")
    for name, pts in sets.items():
        mats = toom_cook(pts)
        check = max(np.abs(tile(d, g, mats, np.float64) - e).max() for (d, g), e in zip(draws, exact))
        assert check < 1e-9, f"{name}: the matrices do not compute the convolution ({check})"
        err = [np.abs(tile(d, g, mats, np.float32) - e).max() for (d, g), e in zip(draws, exact)]
        print(f"  {name:34s} {np.median(err):.2e}")


if __name__ == "__main__":
    main()
