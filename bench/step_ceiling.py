#!/usr/bin/env python3
"""A whole training step against this machine's GEMM ceiling (issue 18: resnet18_cifar's fp32
step at 70% or more of the `duet probe` ceiling measured beside it; issue 45: its bf16 step, with
--amp bf16, at 50% or more of the probe's bf16 ceiling).

Each round runs `duet probe` (the 2048^3 GEMM, best of 5: fp32, and bf16 with --amp bf16) and
then a throughput run of the model's step (`duet profile --mode throughput`, median step), so that the load changes of a
shared machine reach both halves of a pair; the report gives every pair's fraction, the median of
those, and the fraction of the two medians. Two-thread ceilings on the development machine moved
by 7% within minutes, so use several rounds (the default is 6).

FLOPs: the step's GEMM-like work (convolutions, linear layers, matmuls, attention) as one per-op
profile counts it, with the engine's formulas (engine/op_cost.cpp): a convolution counts the
direct algorithm's two FLOPs per multiply-add, also where Winograd computes it with fewer. The
issue 18 counts one per multiply-add (107 "GFLOP" for resnet18_cifar at batch 64, half of the
profile's 213.9); both fractions are printed, issue 18's count first. Issue 45's bf16 target is in
the profile's count.

  python3 bench/step_ceiling.py --duet build/duet [--model resnet18_cifar] [--batch 64]
      [--threads 2] [--rounds 6] [--steps 8] [--amp bf16] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GEMM_OPS = ("conv2d", "linear", "matmul", "attention")


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"step_ceiling: {' '.join(cmd)} exited with {r.returncode}:\n{r.stdout[-2000:]}")
    return r.stdout


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"step_ceiling: could not read the {what} duet wrote to {path}: {e}")


def probe(args, tmp):
    """The GEMM ceiling (GFLOP/s; bf16's with --amp bf16) at args.threads, and the machine record
    of the probe file."""
    out = os.path.join(tmp, "probe.json")
    run([args.duet, "--threads", str(args.threads), "probe", "--thread-counts", str(args.threads),
         "--size", str(args.probe_size), "--out", out])
    d = load(out, "probe file")
    points = [p for p in d["devices"]["cpu"]["points"] if p["threads"] == args.threads]
    if not points:
        sys.exit(f"step_ceiling: the probe file has no point for {args.threads} threads")
    key = "gemm_bf16_gflops" if args.amp == "bf16" else "gemm_gflops"
    if not points[0].get(key):
        why = (": the cpu backend computes bf16 on the reference loops here (oneDNN 2.6 needs AVX-512)"
               if args.amp == "bf16" and d.get("machine", {}).get("cpu_bf16") == "reference_loops" else "")
        sys.exit(f"step_ceiling: the probe measured no {key} on this machine{why}")
    return points[0][key], d.get("machine", {})


def profile(args, tmp, mode, steps):
    out = os.path.join(tmp, f"{mode}.json")
    run([args.duet, "--threads", str(args.threads), "profile", "--model", args.model, "--batch", str(args.batch),
         "--steps", str(steps), "--warmup", str(args.warmup), "--mode", mode, "--amp", args.amp, "--out", out])
    return load(out, f"{mode} profile")


def step_gflop(args, tmp):
    """The GEMM-like GFLOP of one step, from a per-op profile (the profiler's direct count)."""
    d = profile(args, tmp, "per-op", 2)
    steps = d["run_config"]["steps"]
    flops = sum(r["flops"] for r in d["op_table"] if r["key"].split(".")[0] in GEMM_OPS)
    if flops <= 0:
        sys.exit(f"step_ceiling: the per-op profile of {args.model} counts no convolution or matrix FLOPs")
    return flops / steps / 1e9


def median_step_ms(args, tmp):
    d = profile(args, tmp, "throughput", args.steps)
    durations = [s["dur_ns"] for s in d["steps"]]
    if not durations:
        sys.exit("step_ceiling: the throughput profile has no timed steps")
    return statistics.median(durations) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duet", required=True, help="the duet binary")
    ap.add_argument("--model", default="resnet18_cifar")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="probe + step pairs")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per throughput run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--probe-size", type=int, default=2048, help="the probe's square GEMM size")
    ap.add_argument("--amp", choices=("off", "bf16"), default="off",
                    help="bf16: the step under autocast against the probe's bf16 GEMM ceiling")
    ap.add_argument("--json", help="write the rounds and the summary here")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.threads < 1:
        sys.exit("step_ceiling: --rounds, --steps and --threads must be at least 1")

    with tempfile.TemporaryDirectory(prefix="step_ceiling.") as tmp:
        gflop = step_gflop(args, tmp)
        rows, machine = [], {}
        for i in range(args.rounds):
            ceiling, machine = probe(args, tmp)
            ms = median_step_ms(args, tmp)
            achieved = gflop / (ms / 1e3)
            rows.append({"round": i + 1, "probe_gflops": ceiling, "step_ms": ms,
                         "fraction": achieved / ceiling, "fraction_issue_count": achieved / 2 / ceiling})
            print(f"round {i + 1}: probe {ceiling:7.1f} GFLOP/s  step {ms:8.1f} ms  "
                  f"{100 * rows[-1]['fraction_issue_count']:5.1f}% (issue 18's count)  "
                  f"{100 * rows[-1]['fraction']:5.1f}% (profile's count)", flush=True)

    probe_med = statistics.median(r["probe_gflops"] for r in rows)
    step_med = statistics.median(r["step_ms"] for r in rows)
    of_medians = gflop / (step_med / 1e3) / probe_med
    pair_med = statistics.median(r["fraction"] for r in rows)
    cpu = f"{machine.get('cpu_model', '?')} (family {machine.get('cpu_family', '?')} model {machine.get('cpu_model_number', '?')})"
    print(f"{args.model} batch {args.batch}, amp {args.amp}, {args.threads} threads, {cpu}: {gflop:.1f} GFLOP per step "
          f"(the profile's count; {gflop / 2:.1f} in issue 18's)")
    print(f"probe median {probe_med:.1f} GFLOP/s, step median {step_med:.1f} ms: "
          f"{100 * of_medians / 2:.1f}% of the ceiling in issue 18's count, {100 * of_medians:.1f}% in the profile's; "
          f"median of the pairs {100 * pair_med / 2:.1f}% / {100 * pair_med:.1f}%")
    if args.json:
        summary = {"model": args.model, "batch": args.batch, "amp": args.amp, "threads": args.threads, "machine": machine,
                   "step_gflop_direct": gflop, "rounds": rows, "probe_median_gflops": probe_med,
                   "step_median_ms": step_med, "fraction_of_medians_issue_count": of_medians / 2,
                   "fraction_of_medians": of_medians, "median_pair_fraction_issue_count": pair_med / 2}
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
