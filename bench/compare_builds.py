#!/usr/bin/env python3
"""Two builds of duet against each other on the same rows, alternating: what one change did.

For every row (model, batch) the two binaries run `duet profile --mode throughput` one after the
other, --rounds times (A B A B ...), and the median of each side's median step is kept; the ratio
is A's time over B's (above 1: B is faster). Nothing else should run meanwhile; the load average
is recorded before and after every row. Build the baseline in a worktree of the old commit:

  git worktree add ../duet-base <commit> && cmake -S ../duet-base -B ../duet-base/build -G Ninja \\
      && cmake --build ../duet-base/build --target duet
  python3 bench/compare_builds.py --a ../duet-base/build/duet --b build/duet --inference \\
      --a-label <commit> --b-label <commit> --rows resnet50_cifar:1,mobilenet_v2:64 --json bench/results/ab.json

Rows use bench/train_throughput.py's input size and classes per model.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import MODELS, duet_profile, machine  # noqa: E402


def median_step_s(duet, model, batch, a):
    size, classes = MODELS[model]
    r, _ = duet_profile(duet, model, size, classes, batch, a.steps or (200 if batch == 1 else 10), a.warmup, a.threads,
                        a.amp, inference=a.inference)
    return r["phases"]["median_step_ns"] * 1e-9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the baseline duet binary")
    ap.add_argument("--b", required=True, help="the changed duet binary")
    ap.add_argument("--a-label", help="what A is, for the table and the JSON (a commit); default its path")
    ap.add_argument("--b-label", help="what B is; default its path")
    ap.add_argument("--rows", required=True, help="model:batch, comma-separated")
    ap.add_argument("--inference", action="store_true", help="eval-mode forward passes instead of training steps")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, help="timed steps per run (default: 200 at batch 1, else 10)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for spec in a.rows.split(","):
        model, _, batch = spec.partition(":")
        if model not in MODELS or not batch.isdigit():
            sys.exit(f"compare_builds: bad row '{spec}': expected model:batch with a model of {', '.join(MODELS)}")
        rows.append((model, int(batch)))
    label_a, label_b = a.a_label or a.a, a.b_label or a.b
    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}; {', '.join(m['isa'])}); {a.threads} threads; "
          f"A = {label_a}, B = {label_b}")
    print(f"{'model':16s} {'batch':>5s} {'A ms':>9s} {'B ms':>9s} {'A/B':>6s}  load")
    out = []
    for model, batch in rows:
        load_before = os.getloadavg()[0]
        times = {"a": [], "b": []}
        for _ in range(a.rounds):
            for side in ("a", "b"):
                times[side].append(median_step_s(getattr(a, side), model, batch, a))
        ta, tb = statistics.median(times["a"]), statistics.median(times["b"])
        row = {"model": model, "batch": batch, "a_s": times["a"], "b_s": times["b"], "a_median_s": ta,
               "b_median_s": tb, "a_over_b": ta / tb, "load_before": load_before, "load_after": os.getloadavg()[0]}
        out.append(row)
        print(f"{model:16s} {batch:5d} {ta * 1e3:9.2f} {tb * 1e3:9.2f} {ta / tb:5.2f}x  "
              f"{row['load_before']:.2f}->{row['load_after']:.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": m, "a": label_a, "b": label_b, "inference": a.inference, "amp": a.amp, "threads": a.threads,
                       "rounds": a.rounds, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
