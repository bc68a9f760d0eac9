#!/usr/bin/env python3
"""How close the GEMM-bound ops come to this machine's fp32 GEMM ceiling.

The target (issue #3): the ResNet-18 CIFAR 64->64 3x3 convolution at 32x32, batch 64, and
ViT-tiny's MLP and attention products reach at least 80% of the fp32 GEMM GFLOP/s, forward and
forward+backward; the fused attention op (both products and the softmax between them, whose
FLOPs it counts too) is listed beside them. The ceiling is duet_bench_ops'
matmul_fwd/gemm_ceiling_2048, the same 2048^3 product `duet probe` times. Each round runs the
ceiling and then each target, and divides the target's GFLOP/s by the ceiling's of that round, so
that the load changes of a shared machine mostly cancel; the report gives the median fraction
over the rounds.

GFLOP/s are the benchmark's own counters (engine/op_cost.h formulas): a forward+backward counts
three products, and a Winograd convolution counts the direct convolution's FLOPs, so its
fraction is the speed of the layer against a GEMM doing the direct algorithm's work.

  python3 bench/ceiling.py build/bench/duet_bench_ops [--rounds 5] [--threads 2] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_ops import bench_runs  # noqa: E402  (runs one benchmark of duet_bench_ops)

CEILING = "matmul_fwd/gemm_ceiling_2048"
TARGETS = [
    f"{op}_{pass_}/{shape}"
    for op, shape in [
        ("conv2d", "resnet_l1_64x64_32_nhwc"),
        ("linear", "vit_qkv_4160x192x576"),
        ("linear", "vit_fc1_4160x192x768"),
        ("linear", "vit_fc2_4160x768x192"),
        ("matmul", "vit_attn_qk_192x65x64x65"),
        ("matmul", "vit_attn_av_192x65x65x64"),
        ("attention", "vit_64x65x3x64"),  # the fused op: both products and the softmax between them
    ]
    for pass_ in ("fwd", "fwdbwd")
]


def gflops(binary, key, threads, min_time, repetitions):
    """Best GFLOP/s of one benchmark over `repetitions` runs."""
    runs = [b["GFLOP"] for b in bench_runs(binary, key, threads, min_time, repetitions)]
    if not runs:
        raise SystemExit(f"{binary} has no benchmark {key}/cpu")
    return max(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="path of duet_bench_ops")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--filter", default="", help="only targets containing this")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    targets = [t for t in TARGETS if args.filter in t]
    ceil, got = [], {t: [] for t in targets}
    for r in range(args.rounds):
        c = gflops(args.binary, CEILING, args.threads, args.min_time, args.repetitions)
        ceil.append(c)
        for t in targets:
            got[t].append(gflops(args.binary, t, args.threads, args.min_time, args.repetitions) / c)
        print(f"round {r + 1}/{args.rounds}: ceiling {c:.0f} GFLOP/s", file=sys.stderr, flush=True)
    print(f"fp32 GEMM ceiling ({CEILING}, {args.threads} threads): median {statistics.median(ceil):.0f} GFLOP/s, "
          f"range {min(ceil):.0f}-{max(ceil):.0f} over {args.rounds} rounds")
    print(f"\n{'op/shape':50s} {'of ceiling':>10s} {'range':>13s}  (median of rounds; target 80%)")
    below = 0
    for t in targets:
        med = statistics.median(got[t])
        below += med < 0.8
        print(f"{t:50s} {100 * med:9.0f}% {100 * min(got[t]):5.0f}-{100 * max(got[t]):.0f}%{'  <80%' if med < 0.8 else ''}")
    print(f"\nbelow 80%: {below} of {len(targets)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "ceiling_gflops": ceil, "fraction": got}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
