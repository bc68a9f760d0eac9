#!/usr/bin/env python3
"""Inference of duet against PyTorch eager, torch.compile and ONNX Runtime, side by side: the same
model (fresh weights, eval mode), input size, batch and threads, in one run.

duet runs `duet profile --inference` (eval-mode forward passes without gradients and the top-1
class of every image: what `duet eval` and `duet predict` run per batch; --amp bf16 for bf16).
PyTorch runs model.eval() under torch.inference_mode() (bf16: torch.autocast), NCHW and
channels-last both timed and the faster kept, eagerly and compiled (torch.compile, default mode;
compilation in the untimed warm-up). ONNX Runtime runs duet's own ONNX export of the same model
(`duet export --onnx`, fresh weights) with its CPU execution provider, f32 only: its CPU kernels
have no bf16 convolutions. Every side runs in its own process, alternating, and reports the median
step after warm-up. Batch 1 is latency (ms per image), batch 64 throughput (images/s).

The load average is read before and after every row; a row during which it moved by more than
--load-tolerance is measured once more and the quieter of the two kept (the JSON says which).

  .venv-bench/bin/python bench/infer_throughput.py --duet build/duet --threads 2 \\
      --json bench/results/infer_throughput.json

--where adds, per model, duet's per-op profile of batch 1: where a single image's time goes (the
ops, and the step time no op accounts for: dispatch, allocation, thread wake-up).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import MODELS, duet_profile, machine, run_measured, torch_model  # noqa: E402


# ---- the PyTorch and ONNX Runtime sides (child processes) ----
def torch_worker(a):
    import contextlib
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch_model(a.model, a.classes, a.image_size)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt).eval()
    x = torch.randn(a.batch, 3, a.image_size, a.image_size).contiguous(memory_format=fmt)
    if a.compile:
        model = torch.compile(model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()
    warmup = max(a.warmup, 2) if a.compile else a.warmup
    times = []
    with torch.inference_mode(), autocast:
        for i in range(warmup + a.steps):
            t0 = time.perf_counter()
            model(x).argmax(1)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    print(json.dumps({"median_step_s": statistics.median(times), "torch": torch.__version__}))


def ort_worker(a):
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((a.batch, 3, a.image_size, a.image_size)).astype(np.float32)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        sess.run(None, {name: x})[0].argmax(1)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"median_step_s": statistics.median(times), "onnxruntime": ort.__version__}))


# ---- the driver ----
def loadavg():
    return os.getloadavg()[0]


def duet_side(a, model, size, classes, batch, dtype):
    r, _ = duet_profile(a.duet, model, size, classes, batch, a.steps, a.warmup, a.threads,
                        "bf16" if dtype == "bf16" else "off", inference=True)
    return r["phases"]["median_step_ns"] * 1e-9


def child(a, worker, extra, timeout=None):
    cmd = [a.python, os.path.abspath(__file__), worker, "--threads", str(a.threads), "--steps", str(a.steps),
           "--warmup", str(a.warmup)] + extra
    out, _ = run_measured(cmd, timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])["median_step_s"]


def torch_side(a, model, size, classes, batch, dtype, compile):
    best = None
    for cl in (False, True):
        extra = ["--model", model, "--image-size", str(size), "--classes", str(classes), "--batch", str(batch),
                 "--dtype", dtype, "--compile" if compile else "--no-compile"] + (["--channels-last"] if cl else [])
        try:
            t = child(a, "--torch-worker", extra, a.compile_timeout if compile else None)
        except (RuntimeError, TimeoutError) as e:
            print(f"  torch{' compile' if compile else ''} {'NHWC' if cl else 'NCHW'}: {str(e).splitlines()[0]}")
            continue
        if best is None or t < best[0]:
            best = (t, "channels_last" if cl else "nchw")
    return best


def onnx_export(a, model, size, classes, folder):
    path = os.path.join(folder, f"{model}.onnx")
    cmd = [a.duet, "export", "--onnx", path, "--model", model, "--image-size", str(size), "--classes", str(classes)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout).strip() else "failed"
    return path, None


def ort_side(a, onnx_path, size, batch):
    extra = ["--onnx", onnx_path, "--image-size", str(size), "--batch", str(batch)]
    try:
        return child(a, "--ort-worker", extra)
    except (RuntimeError, TimeoutError) as e:
        print(f"  onnxruntime: {str(e).splitlines()[0]}")
        return None


def where_batch1(a, model, size, classes, dtype):
    """duet's per-op profile of one image: the top ops and the untracked step time."""
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        cmd = [a.duet, "profile", "--inference", "--model", model, "--image-size", str(size), "--classes",
               str(classes), "--batch", "1", "--steps", str(a.steps), "--warmup", str(a.warmup), "--mode", "per-op",
               "--threads", str(a.threads), "--amp", "bf16" if dtype == "bf16" else "off", "--out", report]
        run_measured(cmd)
        with open(report) as f:
            r = json.load(f)
    ph = r["phases"]
    steps = max(1, len(r.get("steps", [])) or a.steps)
    ops = sorted(r["op_table"], key=lambda o: -o["self_ns"])[:6]
    return {"step_ms": ph["mean_step_ns"] * 1e-6, "untracked_ms": ph["mean_untracked_ns"] * 1e-6,
            "ops": [{"op": o["key"] if "key" in o else o.get("name", "?"), "calls_per_step": o["calls"] / steps,
                     "ms_per_step": o["self_ns"] * 1e-6 / steps} for o in ops]}


def measure_row(a, model, size, classes, batch, dtype, onnx_path):
    before = loadavg()
    row = {"model": model, "batch": batch, "dtype": dtype, "load_before": before}
    row["duet_s"] = duet_side(a, model, size, classes, batch, dtype)
    eager = torch_side(a, model, size, classes, batch, dtype, False)
    row["torch_s"], row["torch_format"] = eager if eager else (None, None)
    if a.compile:
        comp = torch_side(a, model, size, classes, batch, dtype, True)
        row["compile_s"], row["compile_format"] = comp if comp else (None, None)
    row["ort_s"] = ort_side(a, onnx_path, size, batch) if onnx_path and dtype == "f32" else None
    row["load_after"] = loadavg()
    return row


def fmt_ms(s):
    return f"{s * 1e3:9.2f}" if s else "        -"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default="build/duet")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch, torchvision, onnxruntime")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--compile-timeout", type=float, default=600)
    ap.add_argument("--load-tolerance", type=float, default=0.5)
    ap.add_argument("--where", action="store_true", help="duet's per-op profile of batch 1 per model")
    ap.add_argument("--json")
    # child processes
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--classes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="f32", help=argparse.SUPPRESS)
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if a.ort_worker:
        return ort_worker(a)

    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        sys.exit(f"infer_throughput: unknown model(s) {', '.join(unknown)}; expected some of {', '.join(MODELS)}")
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        sys.exit(f"infer_throughput: --batches takes a comma list of integers, got '{a.batches}'")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if any(d not in ("f32", "bf16") for d in dtypes):
        sys.exit(f"infer_throughput: --dtypes takes f32 and/or bf16, got '{a.dtypes}'")

    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}; {', '.join(m['isa'])}; {m['cores']} cores)")
    print(f"{a.threads} threads, {a.warmup} warm-up + {a.steps} timed passes; load average {loadavg():.2f}")
    print(f"{'model':<16}{'dtype':>5}{'batch':>6}  {'duet ms':>9} {'eager ms':>9} {'compile':>9} {'ORT ms':>9}"
          f"  {'vs best':>8}  load")
    rows, where = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for model in models:
            size, classes = MODELS[model]
            onnx_path, why = onnx_export(a, model, size, classes, folder)
            if why:
                print(f"  {model}: no ONNX Runtime column ({why})")
            for dtype in dtypes:
                for batch in batches:
                    row = measure_row(a, model, size, classes, batch, dtype, onnx_path)
                    if abs(row["load_after"] - row["load_before"]) > a.load_tolerance:
                        again = measure_row(a, model, size, classes, batch, dtype, onnx_path)
                        again["remeasured"] = True
                        row = min(row, again, key=lambda r: abs(r["load_after"] - r["load_before"]))
                    peers = [t for t in (row["torch_s"], row.get("compile_s"), row["ort_s"]) if t]
                    row["best_peer_s"] = min(peers) if peers else None
                    ratio = row["best_peer_s"] / row["duet_s"] if row["best_peer_s"] else None
                    row["speedup_vs_best"] = ratio
                    rows.append(row)
                    print(f"{model:<16}{dtype:>5}{batch:>6}  {fmt_ms(row['duet_s'])} {fmt_ms(row['torch_s'])} "
                          f"{fmt_ms(row.get('compile_s'))} {fmt_ms(row['ort_s'])}  "
                          f"{(f'{ratio:.2f}x' if ratio else '-'):>8}  {row['load_before']:.2f}->{row['load_after']:.2f}"
                          f"{' (remeasured)' if row.get('remeasured') else ''}")
            if a.where:
                where[model] = {d: where_batch1(a, model, size, classes, d) for d in dtypes}
                for d, w in where[model].items():
                    top = ", ".join(f"{o['op']} {o['ms_per_step']:.2f} ms" for o in w["ops"][:4])
                    print(f"  {model} {d} batch 1: step {w['step_ms']:.2f} ms, untracked {w['untracked_ms']:.2f} ms; {top}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": m, "date": time.strftime("%Y-%m-%d", time.gmtime()), "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "rows": rows,
                       "where_batch1": where}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
