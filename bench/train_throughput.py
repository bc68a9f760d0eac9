#!/usr/bin/env python3
"""Training throughput of duet and PyTorch side by side: the same model, batch, input size and
optimizer (SGD, momentum 0.9, weight decay 5e-4), the same thread count, in one run.

Each side runs in its own process, one model at a time, alternating (duet, then torch) so both see
the same machine state. A step is forward, cross-entropy, loss.item(), zero_grad, backward and the
optimizer step on one batch generated once (no data pipeline in either). The time is the median
step after warm-up. Memory is each process's peak resident set (ru_maxrss: code, libraries and
allocator caches included) and, for duet, its allocator's peak of live tensor bytes.

duet's cpu backend runs dense 3x3 stride-1 convolutions with Winograd (docs/cpu_backend.md), which
PyTorch's CPU path does not use; --also-direct adds a column timing duet with DUET_WINOGRAD=0, the
same direct-convolution algorithms PyTorch runs.

PyTorch runs at its best: torch.set_num_threads(threads), and for conv nets both NCHW and
channels-last inputs and weights are timed and the faster is kept (the table says which).

  .venv-bench/bin/python bench/train_throughput.py --duet build/duet --threads 2 \
      --json bench/results/train_throughput.json

Needs torch and torchvision (model definitions only). Rows: resnet18_cifar, resnet50_cifar,
densenet121, mobilenet_v2, vit_tiny_p4 at 32x32 with 10 classes, and resnet18 at 128x128 with 2
classes (the cat/dog setting); --models picks a subset.
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    # name: (image size, classes)
    "resnet18_cifar": (32, 10),
    "resnet50_cifar": (32, 10),
    "densenet121": (32, 10),
    "mobilenet_v2": (32, 10),
    "vit_tiny_p4": (32, 10),
    "resnet18": (128, 2),
}


# ---- the PyTorch side (runs in a child process: --torch-worker) ----
def torch_model(name, classes, image_size):
    import torch.nn as nn
    import torchvision.models as tvm
    if name.endswith("_cifar"):
        # duet's CIFAR ResNets: torchvision's with a 3x3 stride-1 stem and no max-pool.
        m = getattr(tvm, name[: -len("_cifar")])(num_classes=classes)
        m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = nn.Identity()
        return m
    if name == "vit_tiny_p4":
        from torchvision.models.vision_transformer import VisionTransformer
        return VisionTransformer(image_size=image_size, patch_size=4, num_layers=12, num_heads=3, hidden_dim=192,
                                 mlp_dim=768, num_classes=classes)
    return getattr(tvm, name)(num_classes=classes)


def torch_worker(a):
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch_model(a.model, a.classes, a.image_size)
    params = sum(p.numel() for p in model.parameters())
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(a.device, memory_format=fmt).train()
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=a.device).contiguous(memory_format=fmt)
    y = torch.arange(a.batch, device=a.device) % a.classes
    times = time_torch_steps(model, x, y, a.warmup, a.steps, a.device)
    print(json.dumps({"median_step_s": statistics.median(times), "parameters": params, "torch": torch.__version__}))


def time_torch_steps(model, x, y, warmup, steps, device="cpu"):
    """Seconds of each step after `warmup`: forward, cross-entropy, loss.item(), zero_grad,
    backward and an SGD step (momentum 0.9, weight decay 5e-4) on one batch. Also used by
    bench/dist_overlap.py (there `model` may be wrapped in DistributedDataParallel)."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()  # the step is timed to its end on the GPU, as duet's is
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


# ---- the driver ----
def run_measured(cmd, env=None):
    """Runs cmd with os.wait4 to get its own peak RSS; returns (stdout, peak_rss_bytes)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.read()[-3000:]}")
        return out.read(), ru.ru_maxrss * 1024  # Linux reports KiB


def duet_side(a, model, image_size, classes, env=None):
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        cmd = [a.duet, "profile", "--model", model, "--image-size", str(image_size), "--classes", str(classes),
               "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup), "--mode", "throughput",
               "--threads", str(a.threads), "--device", a.device, "--out", report]
        _, rss = run_measured(cmd, env)
        with open(report) as f:
            r = json.load(f)
    peak = next(m["peak"] for m in r["memory"]["devices"] if m["device"].startswith(a.device))
    return {"median_step_s": r["phases"]["median_step_ns"] * 1e-9, "parameters": r["run_config"]["parameters"],
            "peak_rss": rss, "allocator_peak": peak}


def torch_side(a, model, image_size, classes, channels_last):
    cmd = [a.python, os.path.abspath(__file__), "--torch-worker", "--model", model, "--image-size", str(image_size),
           "--classes", str(classes), "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--threads", str(a.threads), "--device", a.device] + (["--channels-last"] if channels_last else [])
    env = dict(os.environ)
    # Pinning OpenBLAS (CI sets these for Debian's torch 1.13) halves a wheel's GEMM speed: unset.
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    out, rss = run_measured(cmd, env)
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss"] = rss
    r["channels_last"] = channels_last
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default="build/duet")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch + torchvision")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where both frameworks train: cpu, or cuda (duet's CUDA backend against PyTorch on the same GPU)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="alternate duet/torch this many times; medians are kept")
    ap.add_argument("--json", help="write the table as JSON here")
    ap.add_argument("--also-direct", action="store_true",
                    help="also time duet with DUET_WINOGRAD=0 (direct convolution only), as a third column")
    # worker mode
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--classes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    rows = []
    print(f"batch {a.batch}, {a.threads} threads, {a.warmup} warm-up + {a.steps} timed steps, {a.rounds} round(s); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for model in a.models.split(","):
        image_size, classes = MODELS[model]
        d_runs, t_runs, direct_runs = [], [], []
        for _ in range(a.rounds):
            d_runs.append(duet_side(a, model, image_size, classes))
            if a.also_direct:
                direct_runs.append(duet_side(a, model, image_size, classes, dict(os.environ, DUET_WINOGRAD="0")))
            candidates = [torch_side(a, model, image_size, classes, False)]
            if not model.startswith("vit"):
                candidates.append(torch_side(a, model, image_size, classes, True))
            t_runs.append(min(candidates, key=lambda r: r["median_step_s"]))
        d = min(d_runs, key=lambda r: r["median_step_s"]) if a.rounds == 1 else d_runs[len(d_runs) // 2]
        d_step = statistics.median(r["median_step_s"] for r in d_runs)
        t_step = statistics.median(r["median_step_s"] for r in t_runs)
        t = t_runs[0]
        row = {"model": model, "image_size": image_size, "classes": classes, "batch": a.batch, "threads": a.threads,
               "duet_step_ms": d_step * 1e3, "torch_step_ms": t_step * 1e3,
               "duet_images_per_s": a.batch / d_step, "torch_images_per_s": a.batch / t_step,
               "speedup": t_step / d_step,
               "duet_peak_rss_mib": max(r["peak_rss"] for r in d_runs) / 2**20,
               "torch_peak_rss_mib": max(r["peak_rss"] for r in t_runs) / 2**20,
               "duet_allocator_peak_mib": d["allocator_peak"] / 2**20,
               "torch_layout": "channels_last" if t["channels_last"] else "nchw",
               "duet_parameters": d["parameters"], "torch_parameters": t["parameters"], "torch": t["torch"]}
        if direct_runs:
            direct_step = statistics.median(r["median_step_s"] for r in direct_runs)
            row["duet_direct_step_ms"] = direct_step * 1e3
            row["speedup_direct"] = t_step / direct_step
        rows.append(row)
        warn = "" if row["duet_parameters"] == row["torch_parameters"] else "  PARAMETER COUNTS DIFFER"
        print(f"{model:15s} {image_size:3d}px  duet {row['duet_step_ms']:8.1f} ms  torch {row['torch_step_ms']:8.1f} ms "
              f"({row['torch_layout']})  ratio {row['speedup']:.2f}x  RSS duet {row['duet_peak_rss_mib']:.0f} MiB "
              f"torch {row['torch_peak_rss_mib']:.0f} MiB  (duet tensors {row['duet_allocator_peak_mib']:.0f} MiB){warn}"
              + (f"  | direct conv only: {row['duet_direct_step_ms']:.1f} ms, {row['speedup_direct']:.2f}x"
                 if direct_runs else ""), flush=True)
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    print(f"geometric mean of duet's speed-up: {geo:.2f}x over {len(rows)} models; load average "
          f"{os.getloadavg()[0]:.2f}")
    if a.also_direct:
        geo_direct = math.exp(sum(math.log(r["speedup_direct"]) for r in rows) / len(rows))
        print(f"with direct convolution only (DUET_WINOGRAD=0): {geo_direct:.2f}x")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "geomean_speedup": geo,
                       "geomean_speedup_direct": geo_direct if a.also_direct else None, "batch": a.batch, "threads": a.threads,
                       "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
