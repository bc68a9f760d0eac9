#!/usr/bin/env python3
"""duet's convolutions next to ONNX Runtime's, layer by layer, on one model's eval-mode forward: where
a whole-pass gap (bench/infer_throughput.py) comes from.

ONNX Runtime runs duet's own export of the model (`duet export --onnx`, fresh weights) with its
CPU execution provider and its profiler on (`SessionOptions.enable_profiling`); each node's kernel
time is its median over the timed runs. duet runs `duet profile --inference --mode per-op` and
`duet report --group-by-shape --csv`, a mean per call for each shape. The two are joined by the
convolution's input and weight shapes (duet fuses the batch norm, ONNX Runtime fuses the
activation and the residual add, so these are the same layers); the table lists each shape's
calls per pass, both sides' time per call and duet's excess per pass, largest first.

Both profilers add time of their own: ONNX Runtime's made resnet50_cifar's nodes at batch 1 sum to
13.1 ms against a 10.1 ms unprofiled pass, duet's per-op mode adds a few microseconds per op. The
totals printed with each side's unprofiled pass say how far to trust a row; the ranking of layers
is what the tool is for.

  .venv-bench/bin/python bench/ort_layers.py --duet build/duet --model resnet50_cifar --batch 1
"""
import argparse
import collections
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from infer_throughput import onnx_export, ort_side  # noqa: E402
from train_throughput import MODELS, duet_profile, machine  # noqa: E402


def ort_nodes(onnx_path, a):
    """{(input shape, weight shape): [median kernel us of each Conv node]}, from one profiled session."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    x = np.random.default_rng(0).standard_normal((a.batch, 3, a.image_size, a.image_size)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(d, "ort")
        s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        name = s.get_inputs()[0].name
        for _ in range(a.warmup + a.steps):
            s.run(None, {name: x})
        with open(s.end_profiling()) as f:
            events = json.load(f)
    per_node = collections.defaultdict(list)
    shapes = {}
    for e in events[1:] if events else []:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        if args.get("op_name") not in ("Conv", "FusedConv"):
            continue
        node = e["name"][: -len("_kernel_time")]
        per_node[node].append(e["dur"])
        ins = [list(v.values())[0] for v in args.get("input_type_shape", [])]
        shapes[node] = (tuple(ins[0]), tuple(ins[1]))
    by_shape = collections.defaultdict(list)
    for node, durs in per_node.items():
        by_shape[shapes[node]].append(statistics.median(durs[a.warmup:] or durs))
    return by_shape


def duet_layers(a):
    """{(input shape, weight shape): (calls per pass, mean us per call, implementation)}, the pass."""
    common = (a.duet, a.model, a.image_size, a.classes, a.batch, a.steps, a.warmup, a.threads)
    step = duet_profile(*common, inference=True)[0]["phases"]["median_step_ns"] * 1e-6
    with tempfile.TemporaryDirectory() as d:
        report, table = os.path.join(d, "r.json"), os.path.join(d, "r.csv")
        per_op, _ = duet_profile(*common, inference=True, mode="per-op", report_path=report)
        steps = len(per_op["steps"])  # the timed passes the per-op counts cover
        r = subprocess.run([a.duet, "report", report, "--group-by-shape", "--top", "0", "--csv", table],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"ort_layers: duet report failed:\n{r.stderr[-2000:]}")
        with open(table) as f:
            rows = list(csv.DictReader(f))
    # A layer shape can appear under several op names (conv2d+relu, conv2d+add+relu with the
    # residual as a third shape): its calls are summed and its time per call averaged over them.
    parts = collections.defaultdict(list)
    for row in rows:
        if not row["op"].startswith("conv2d") or row["phase"] != "forward":
            continue
        dims = [tuple(int(v) for v in s.split(",")) for s in re.findall(r"\[([\d, ]+)\]", row["shapes"])]
        parts[(dims[0], dims[1])].append((int(row["calls"]), float(row["mean_us"]), row["impl"]))
    layers = {}
    for key, ps in parts.items():
        calls = sum(c for c, _, _ in ps)
        layers[key] = (calls, sum(c * us for c, us, _ in ps) / calls, max(ps)[2])
    return layers, step, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default="build/duet")
    ap.add_argument("--model", default="resnet50_cifar")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--image-size", type=int, help="bench/train_throughput.py's size for the model when not given")
    ap.add_argument("--classes", type=int, help="bench/train_throughput.py's classes for the model when not given")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    a.python = sys.executable  # ort_side's worker runs under this interpreter
    size, classes = MODELS.get(a.model, (32, 10))
    a.image_size = a.image_size or size
    a.classes = a.classes or classes
    with tempfile.TemporaryDirectory() as d:
        onnx_path, why = onnx_export(a, a.model, a.image_size, a.classes, d)
        if onnx_path is None:
            sys.exit(f"ort_layers: duet export --onnx failed: {why}")
        load = [os.getloadavg()[0]]
        ort_pass = ort_side(a, onnx_path, a.image_size, a.batch)  # unprofiled, in a process of its own
        if ort_pass is None:
            sys.exit("ort_layers: ONNX Runtime's unprofiled pass failed")
        ort_pass *= 1e3
        ort = ort_nodes(onnx_path, a)
        duet, duet_pass, duet_steps = duet_layers(a)
        load.append(os.getloadavg()[0])
    rows = []
    for key, (calls, us, impl) in duet.items():
        theirs = ort.get(key)
        per_pass = calls / duet_steps
        ort_us = statistics.mean(theirs) if theirs else None
        rows.append({"input": list(key[0]), "weight": list(key[1]), "calls_per_pass": per_pass, "duet_us": us,
                     "ort_us": ort_us, "excess_us_per_pass": (us - ort_us) * per_pass if theirs else None,
                     "duet_impl": impl})
    rows.sort(key=lambda r: -(r["excess_us_per_pass"] or 0))
    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}); {a.model} batch {a.batch}, {a.threads} threads, "
          f"{a.steps} passes; load {load[0]:.2f} -> {load[1]:.2f}")
    print(f"unprofiled pass: duet {duet_pass:.2f} ms, ONNX Runtime {ort_pass:.2f} ms")
    sums = [sum(r["duet_us"] * r["calls_per_pass"] for r in rows if r["ort_us"] is not None),
            sum(r["ort_us"] * r["calls_per_pass"] for r in rows if r["ort_us"] is not None)]
    print(f"joined convolutions, profiled: duet {sums[0] / 1e3:.2f} ms, ONNX Runtime {sums[1] / 1e3:.2f} ms a pass")
    print(f"{'input':>18} {'weight':>20} {'/pass':>5} {'duet us':>8} {'ORT us':>8} {'excess':>8}  duet's kernel")
    for r in rows:
        ort_us = f"{r['ort_us']:8.0f}" if r["ort_us"] is not None else "       -"
        excess = f"{r['excess_us_per_pass']:8.0f}" if r["excess_us_per_pass"] is not None else "       -"
        print(f"{str(r['input']):>18} {str(r['weight']):>20} {r['calls_per_pass']:5.0f} {r['duet_us']:8.0f} {ort_us} "
              f"{excess}  {r['duet_impl']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": m, "model": a.model, "batch": a.batch, "threads": a.threads, "steps": a.steps,
                       "load": load, "duet_pass_ms": duet_pass, "ort_pass_ms": ort_pass, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
