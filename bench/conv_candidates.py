#!/usr/bin/env python3
"""Every convolution pass of a model timed on every algorithm duet's cpu planner could give it, on
this machine: the autotuner as the judge of the planner's rules (backends/cpu/planner.h).

Each round runs `duet profile` once with DUET_CONV_AUTOTUNE=1 in a fresh process, so the first step
times every candidate of every pass (one warm-up and the median of three runs each) and the
profile's implementation column carries the timings ("autotuned: direct 1.20 ms, winograd
0.80 ms"). Over --rounds rounds the fastest time of each candidate is kept: other work on the
machine only ever adds time, so the minimum is the estimate least disturbed by it. A run without
autotuning gives the rule's choice and reason, and the calls per step. The table lists, per pass and
shape, each candidate, the rule's choice and what the best candidate would save per step.

  .venv-bench/bin/python bench/conv_candidates.py --duet build/duet --model resnet50_cifar --amp bf16 \\
      --rounds 3 --json bench/results/conv_candidates_amx_r50_bf16.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import machine  # noqa: E402

# The rule reasons' first words and the planner's names for the algorithms (planner.cpp's algo_name).
RULE_ALGO = [("winograd", "winograd"), ("matrix product:", "matrix product"), ("im2col:", "im2col + matrix product"),
             ("blocked layout:", "blocked direct"), ("direct:", "direct"), ("one tap:", "one tap as a matrix product"),
             ("duet depthwise:", "duet depthwise"), ("flipped forward:", "forward of dy by flipped weights"),
             ("col2im:", "matrix product + col2im"),
             ("duet direct:", "duet direct"), ("duet winograd:", "duet winograd")]


def profile(a, autotune):
    env = dict(os.environ)
    env.pop("DUET_CONV_AUTOTUNE", None)
    if autotune:
        env["DUET_CONV_AUTOTUNE"] = "1"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [a.duet, "profile", "--model", a.model, "--batch", str(a.batch), "--amp", a.amp, "--mode", "per-op",
               "--steps", "1", "--warmup", "0", "--threads", str(a.threads), "--out", out]
        if a.inference:
            cmd.append("--inference")
        if a.image_size:
            cmd += ["--image-size", str(a.image_size)]
        if a.classes:
            cmd += ["--classes", str(a.classes)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"conv_candidates: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def reasons(impl):
    return re.findall(r"\[([^\]]*)\]", impl)


def layer_keys(report):
    """(op, shapes) of every convolution pass, the shapes given as the forward's input and weight
    (a weight gradient's record shows x and dy only, which two layers of a bottleneck share)."""
    weight = {}
    for rec in report["op_records"]:
        if rec["name"] in ("conv2d", "conv2d+relu"):
            weight[rec["scope"]] = rec["shapes"]
    keys = {}
    for rec in report["op_records"]:
        if rec["name"].startswith("conv2d") and rec["name"] != "conv2d.backward":
            keys[id(rec)] = (rec["name"], weight.get(rec["scope"], rec["shapes"]))
    return keys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default="build/duet")
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--image-size", type=int, help="the model's own default when not given")
    ap.add_argument("--classes", type=int, help="the model's own default when not given")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inference", action="store_true", help="eval-mode forward passes (duet profile --inference)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("conv_candidates: --rounds must be at least 1")

    rule = {}
    report = profile(a, False)
    keys = layer_keys(report)
    for rec in report["op_records"]:
        if id(rec) in keys:
            rs = reasons(rec["impl"])
            algo = next((al for pre, al in RULE_ALGO for r in rs if r.startswith(pre)), "?")
            key = keys[id(rec)]
            entry = rule.setdefault(key, {"calls": 0, "algo": algo, "reason": rs[0] if rs else ""})
            entry["calls"] += rec["calls"]
    best = {}
    loads = []
    for _ in range(a.rounds):
        loads.append(os.getloadavg()[0])
        report = profile(a, True)
        keys = layer_keys(report)
        for rec in report["op_records"]:
            if id(rec) not in keys:
                continue
            for r in reasons(rec["impl"]):
                if not r.startswith("autotuned: "):
                    continue
                for name, ms in re.findall(r"([a-z0-9 +]+?) ([0-9.]+) ms", r[len("autotuned: "):]):
                    name = name.strip(", ")
                    cands = best.setdefault(keys[id(rec)], {})
                    cands[name] = min(float(ms), cands.get(name, float("inf")))
    loads.append(os.getloadavg()[0])

    rows = []
    for key, cands in best.items():
        r = rule.get(key, {"calls": 0, "algo": "?", "reason": ""})
        fastest = min(cands, key=cands.get)
        rule_ms = cands.get(r["algo"])
        saving = (rule_ms - cands[fastest]) * r["calls"] if rule_ms is not None else None
        rows.append({"op": key[0], "shapes": key[1], "calls_per_step": r["calls"], "candidates_ms": cands,
                     "rule": r["algo"], "rule_reason": r["reason"], "fastest": fastest,
                     "saving_ms_per_step": saving})
    rows.sort(key=lambda x: -(x["saving_ms_per_step"] or 0))
    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}; {', '.join(m['isa'])}); {a.model} batch {a.batch} "
          f"amp {a.amp}{' inference' if a.inference else ''}, {a.threads} threads, {a.rounds} rounds; "
          f"load {', '.join(f'{l:.2f}' for l in loads)}")
    for x in rows:
        cands = ", ".join(f"{n} {t:.2f}" for n, t in sorted(x["candidates_ms"].items(), key=lambda kv: kv[1]))
        save = f"{x['saving_ms_per_step']:.2f}" if x["saving_ms_per_step"] is not None else "?"
        print(f"{x['op']:<23} {x['shapes']:<34} x{x['calls_per_step']:<3} rule {x['rule']:<24} saves {save:>6} ms | {cands}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": m, "model": a.model, "batch": a.batch, "amp": a.amp, "inference": a.inference,
                       "threads": a.threads, "rounds": a.rounds, "load": loads, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
