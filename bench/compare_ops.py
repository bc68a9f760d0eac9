#!/usr/bin/env python3
"""Puts duet's op benchmarks next to PyTorch's: per op, the speed-up of duet's cpu backend over
PyTorch (torch time / duet time: above 1 means duet is faster) and the geometric mean.

  duet_bench_ops --benchmark_filter=/cpu --benchmark_repetitions=3 --benchmark_format=json > duet_ops.json
  OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= .venv-bench/bin/python bench/torch_ops.py --out torch_ops.json
  python3 bench/compare_ops.py duet_ops.json torch_ops.json

With repetitions, the fastest repetition of each benchmark is used on both sides (the machine is
shared; the minimum is the least disturbed measurement).

On a machine whose load changes minute to minute, --interleave measures each benchmark with duet
and then at once with PyTorch (run it with the venv's python, which has torch):

  OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= .venv-bench/bin/python bench/compare_ops.py \
      --interleave build/bench/duet_bench_ops [--filter conv2d] [--json both.json]

Before/after: --baseline OLD_duet_bench_ops times an older build in the same round (duet, old
duet, PyTorch, back to back); --rounds R repeats each round R times and reports medians. --cpu-time compares CPU time instead
of wall time (duet's cpu_time, PyTorch's process time): with --threads 1 on a shared machine it
leaves out the time the process was descheduled (not meaningful with several threads, whose
OpenMP spin-waits count as CPU time).
"""
import json
import math
import sys


def duet_times(path, field="real_time"):
    with open(path) as f:
        data = json.load(f)
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    best = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b["name"]).replace("/real_time", "")
        if not name.endswith("/cpu"):
            continue
        t = b[field] * scale[b.get("time_unit", "ns")]
        key = name[: -len("/cpu")]
        best[key] = min(best.get(key, float("inf")), t)
    return best


def torch_times(path):
    with open(path) as f:
        data = json.load(f)
    return {b["name"][: -len("/torch")]: b["real_time_s"] for b in data["benchmarks"]}


def bench_runs(binary, key, threads, min_time, repetitions):
    """The JSON entries of `repetitions` runs of one cpu benchmark of a duet_bench_ops binary
    (aggregates left out)."""
    import os
    import re
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([binary, f"--benchmark_filter=^{re.escape(key)}/cpu(/real_time)?$", f"--benchmark_min_time={min_time}",
                        f"--benchmark_repetitions={repetitions}", f"--benchmark_out={f.name}",
                        "--benchmark_out_format=json"], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return [b for b in json.load(f)["benchmarks"] if b.get("run_type") != "aggregate"]


def run_duet(binary, key, threads, min_time, repetitions, field="real_time"):
    """Fastest of `repetitions` runs of one benchmark of a duet_bench_ops binary, in seconds."""
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    runs = [b[field] * scale[b.get("time_unit", "ns")] for b in bench_runs(binary, key, threads, min_time, repetitions)]
    return min(runs) if runs else None


def interleave(argv):
    import argparse
    import os
    import statistics
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch_ops
    ap = argparse.ArgumentParser()
    ap.add_argument("--interleave", required=True, help="path of duet_bench_ops")
    ap.add_argument("--baseline", default="", help="an older duet_bench_ops, timed in the same round (before/after)")
    ap.add_argument("--filter", default="")
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="repeat duet/baseline/torch this often; report medians")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true",
                    help="compare CPU time, not wall time (with --threads 1 on a loaded machine)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    field = "real_time"
    if args.cpu_time:
        import time
        field, torch_ops.clock = "cpu_time", time.process_time
    d, t, base = {}, {}, {}
    for sp in torch_ops.specs():
        for bwd in ([False, True] if sp["backward"] else [False]):
            key = f'{sp["op"]}_{"fwdbwd" if bwd else "fwd"}/{sp["shape"]}'
            if args.filter and args.filter not in key:
                continue
            ds, bs, ts = [], [], []
            for _ in range(args.rounds):
                ds.append(run_duet(args.interleave, key, args.threads, args.min_time, args.repetitions, field))
                if ds[-1] is None:
                    break
                if args.baseline:
                    bs.append(run_duet(args.baseline, key, args.threads, args.min_time, args.repetitions, field))
                ts.append(torch_ops.bench(sp, bwd, args.min_time, args.repetitions))
            if ds[-1] is None:
                print(f"{key}: not in duet's benchmarks")
                continue
            d[key], t[key] = statistics.median(ds), statistics.median(ts)
            line = f"{key:66s} {d[key] * 1e6:10.1f} {t[key] * 1e6:10.1f} {t[key] / d[key]:8.2f}x"
            if bs and None not in bs:
                base[key] = statistics.median(bs)
                line += f"   baseline {base[key] * 1e6:10.1f} {t[key] / base[key]:8.2f}x"
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "duet_s": d, "torch_s": t, "baseline_s": base}, f, indent=1)
    return report(d, t, base)


def report(d, t, base=None):
    base = base or {}
    common = [k for k in d if k in t]
    if not common:
        print("no benchmark names in common")
        return 1
    head = f"\n{'op/shape':66s} {'duet us':>10s} {'torch us':>10s} {'speed-up':>9s}"
    print(head + (f" {'baseline us':>12s} {'speed-up':>9s}" if base else ""))
    logs, blogs = [], []
    for k in common:
        r = t[k] / d[k]
        logs.append(math.log(r))
        flag = "  <0.9" if r < 0.9 else ""
        extra = ""
        if k in base:
            blogs.append(math.log(t[k] / base[k]))
            extra = f" {base[k] * 1e6:12.1f} {t[k] / base[k]:8.2f}x"
        print(f"{k:66s} {d[k] * 1e6:10.1f} {t[k] * 1e6:10.1f} {r:8.2f}x{extra}{flag}")
    gm = math.exp(sum(logs) / len(logs))
    print(f"\ngeometric mean speed-up of duet over torch on {len(common)} benchmarks: {gm:.2f}x")
    print(f"below 0.9x: {sum(1 for x in logs if x < math.log(0.9))}")
    if blogs:
        print(f"baseline: geometric mean speed-up {math.exp(sum(blogs) / len(blogs)):.2f}x on {len(blogs)} benchmarks, "
              f"below 0.9x: {sum(1 for x in blogs if x < math.log(0.9))}")
    missing = sorted(set(d) ^ set(t))
    if missing:
        print("only on one side:", ", ".join(missing))
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1].startswith("--interleave"):
        return interleave(sys.argv[1:])
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    return report(duet_times(sys.argv[1]), torch_times(sys.argv[2]))


if __name__ == "__main__":
    sys.exit(main())
