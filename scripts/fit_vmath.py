#!/usr/bin/env python3
"""Fits the polynomial in backends/cpu/vmath.h's normal_cdf and prints its coefficients.

erfc(z) = t Q(t) exp(-z^2) with t = 1 / (1 + z / 2). Q is smooth on t in (0, 1], so a
polynomial fits it well; the fit only has to cover the z where the result is a normal f32:
exp(-z^2) underflows past z = 9.3 (|x| = 13.2), so t >= 1 / (1 + 16 / sqrt(8)) (|x| <= 16)
is enough, and a narrower interval buys a lower degree for the same error.

The fit minimises the maximum *relative* error of erfc (Lawson's iteratively reweighted least
squares, which converges to the minimax polynomial), in double precision against mpmath's
erfc at 30 digits. vmath.h stores 0.5 Q, which folds Phi's factor 1/2 into the coefficients.

Usage: python3 scripts/fit_vmath.py [degree]   (needs numpy and mpmath)
"""
import sys

import mpmath as mp
import numpy as np

mp.mp.dps = 30


def lawson(xs, f, degree, iters=400):
    """Minimax polynomial (coefficients, lowest power first) for the relative error of f."""
    vander = np.vander(xs, degree + 1, increasing=True)
    weights = np.ones_like(xs) / len(xs)
    for _ in range(iters):
        scale = np.sqrt(weights) / np.abs(f)
        coeffs, *_ = np.linalg.lstsq(vander * scale[:, None], f * scale, rcond=None)
        err = (vander @ coeffs - f) / np.abs(f)
        weights = weights * np.abs(err)
        weights /= weights.sum()
    return coeffs, np.max(np.abs(err))


def q_of_t(t):
    z = 2 * (1 / mp.mpf(t) - 1)
    return float(mp.erfc(z) * mp.exp(z * z) / t)


def main():
    degree = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    t_min = 1 / (1 + 0.5 * 16 / 2**0.5)
    ts = np.linspace(t_min, 1, 4000)
    q = np.array([q_of_t(t) for t in ts])
    coeffs, err = lawson(ts, q, degree)
    half = [np.float32(0.5 * c) for c in coeffs[::-1]]
    # The error that matters is that of the f32 coefficients, evaluated in f32.
    acc = np.full_like(ts, half[0], dtype=np.float32)
    t32 = ts.astype(np.float32)
    for c in half[1:]:
        acc = acc * t32 + c
    err32 = np.max(np.abs(2 * acc.astype(np.float64) - q) / q)
    print(f"// degree {degree} on t in [{t_min:.4f}, 1]: relative error {err:.2e} (fit), {err32:.2e} (f32 coefficients, f32 Horner)")
    print(f"float q = {half[0]:.9e}f;")
    for c in half[1:]:
        print(f"q = q * t + {c:.9e}f;")


if __name__ == "__main__":
    main()
