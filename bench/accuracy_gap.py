#!/usr/bin/env python3
"""Is bf16 training as accurate as f32? The paired seeds of bench/train_accuracy.py, summed up.

Each seed was trained twice with the same recipe, once in f32 and once with --amp bf16; the
final test accuracies of a pair differ by the gap (bf16 - f32). Seeds move a single run by more
than the gap we look for (10,000 test images, 18 epochs), so one pair says little: this prints
every pair, the mean gap with its Student-t 95% interval, and whether the data show the mean gap
above -TARGET points (issue 18 asks for 0.5), below it, or neither yet.

    python3 bench/accuracy_gap.py                          # bench/results/train_accuracy_bf16
    python3 bench/accuracy_gap.py --dir DIR --target 0.5 --seeds 10-21   # only those seeds

Reads DIR/f32[_seedN]_duet_cifar10.jsonl and DIR/bf16[_seedN]_duet_cifar10.jsonl (no _seedN:
seed 0), the per-epoch logs `duet train --log` writes; a seed with only one of the two logs, or
with a log that did not reach its last epoch, is listed and left out. Standard library only.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys


def t_cdf(x, df):
    """Student t's distribution function, by Simpson's rule on its density (exact to ~1e-9 here)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    pdf = lambda u: c * (1 + u * u / df) ** (-(df + 1) / 2)
    n = 4000
    h = abs(x) / n
    s = pdf(0) + pdf(abs(x)) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
    half = s * h / 3
    return 0.5 + half if x >= 0 else 0.5 - half


def t_quantile(p, df):
    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def final_accuracy(path, epochs):
    """The last epoch's test accuracy in percent, or None where the log stops short."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if not rows or (epochs is not None and rows[-1].get("epoch") != epochs):
        return None
    return 100.0 * rows[-1]["test_acc"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "train_accuracy_bf16"))
    ap.add_argument("--target", type=float, default=0.5, help="largest acceptable loss of bf16, in points")
    ap.add_argument("--epochs", type=int, default=18, help="the recipe's epoch count: shorter logs are unfinished")
    ap.add_argument("--seeds", default="", metavar="A-B", help="only the seeds A to B (e.g. those run by one binary)")
    a = ap.parse_args()
    first, last = 0, float("inf")
    if a.seeds:
        m = re.fullmatch(r"(\d+)-(\d+)", a.seeds)
        if not m or int(m.group(1)) > int(m.group(2)):
            sys.exit(f"--seeds {a.seeds}: expected FIRST-LAST, e.g. 10-21")
        first, last = int(m.group(1)), int(m.group(2))

    pattern = re.compile(r"^(f32|bf16)(?:_seed(\d+))?_duet_cifar10\.jsonl$")
    runs = {}
    for name in sorted(os.listdir(a.dir)):
        m = pattern.match(name)
        if m and first <= int(m.group(2) or 0) <= last:
            runs.setdefault(int(m.group(2) or 0), {})[m.group(1)] = final_accuracy(os.path.join(a.dir, name), a.epochs)
    if not runs:
        sys.exit(f"no f32_*/bf16_* duet logs{' of seeds ' + a.seeds if a.seeds else ''} in {a.dir}")

    gaps = []
    print(f"{'seed':>4}  {'f32':>7}  {'bf16':>7}  {'gap':>6}")
    for seed in sorted(runs):
        f32, bf16 = runs[seed].get("f32"), runs[seed].get("bf16")
        if f32 is None or bf16 is None:
            print(f"{seed:4d}  {'-' if f32 is None else f'{f32:.2f}':>7}  {'-' if bf16 is None else f'{bf16:.2f}':>7}"
                  f"  (left out: a run is missing or unfinished)")
            continue
        gaps.append(bf16 - f32)
        print(f"{seed:4d}  {f32:7.2f}  {bf16:7.2f}  {gaps[-1]:+6.2f}")
    n = len(gaps)
    if n < 2:
        sys.exit(f"{n} complete pair(s): at least two are needed for an interval")

    mean, sd = statistics.mean(gaps), statistics.stdev(gaps)
    se = sd / math.sqrt(n)
    two_sided = t_quantile(0.975, n - 1) * se
    one_sided = t_quantile(0.95, n - 1) * se
    print(f"\n{n} pairs: mean gap {mean:+.2f} points, standard deviation {sd:.2f}, standard error {se:.2f}")
    print(f"95% interval of the mean gap: {mean - two_sided:+.2f} to {mean + two_sided:+.2f}")
    lower, upper = mean - one_sided, mean + one_sided
    print(f"one-sided 95% bounds: the mean gap is above {lower:+.2f} and below {upper:+.2f}")
    if lower > -a.target:
        verdict = f"shown: bf16 loses less than {a.target} points (95% one-sided)"
    elif upper < -a.target:
        verdict = f"shown missed: bf16 loses more than {a.target} points (95% one-sided)"
    else:
        # The pairs a one-sided bound at -target would need if the mean and spread stayed as they are.
        need = math.ceil((t_quantile(0.95, max(n - 1, 1)) * sd / (mean + a.target)) ** 2) if mean > -a.target else None
        verdict = f"not settled at {n} pairs" + (f" (about {need} pairs would show it if mean and spread hold)"
                                                 if need else "")
    print(f"target: within {a.target} points of f32: {verdict}")


if __name__ == "__main__":
    main()
