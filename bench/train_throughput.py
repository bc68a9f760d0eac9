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
same direct-convolution algorithms PyTorch runs; --also-autotune one with DUET_CONV_AUTOTUNE=1 (each
convolution's algorithm timed on this machine in the first step, docs/cpu_backend.md).

PyTorch runs at its best: torch.set_num_threads(threads), and for conv nets both NCHW and
channels-last inputs and weights are timed and the faster is kept (the table says which).
Stronger peers, each a column of its own in the same run:
  --compile  PyTorch with torch.compile (inductor, default mode; compilation happens in the warm-up
             steps and is not timed; a model whose compilation takes over --compile-timeout seconds
             gets no number);
  --bf16     duet with --amp bf16 against PyTorch under torch.autocast("cpu", torch.bfloat16), the
             same mixed-precision policy (matrix ops in bf16, the rest in f32).
The CPU's model name, family and model numbers and the instruction sets that matter (AVX-512,
AVX-512 BF16/FP16, AMX) are printed and kept in the JSON.

  .venv-bench/bin/python bench/train_throughput.py --duet build/duet --threads 2 --compile --bf16 \
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
import threading
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
    if a.compile:
        model = torch.compile(model)
    autocast = torch.bfloat16 if a.amp == "bf16" else None
    # torch.compile compiles the forward and the backward at the first step and may recompile at
    # the second: at least two warm-up steps, untimed.
    warmup = max(a.warmup, 2) if a.compile else a.warmup
    times = time_torch_steps(model, x, y, warmup, a.steps, a.device, autocast)
    print(json.dumps({"median_step_s": statistics.median(times), "parameters": params, "torch": torch.__version__}))


def time_torch_steps(model, x, y, warmup, steps, device="cpu", autocast=None):
    """Seconds of each step after `warmup`: forward, cross-entropy, loss.item(), zero_grad,
    backward and an SGD step (momentum 0.9, weight decay 5e-4) on one batch; with `autocast` (a
    torch dtype) the forward and the loss run under torch.autocast. Also used by
    bench/dist_overlap.py (there `model` may be wrapped in DistributedDataParallel)."""
    import contextlib
    import torch
    import torch.nn.functional as F
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
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
def machine():
    """The CPU's model name, family and model numbers, and the instruction sets that decide the fast
    paths (from /proc/cpuinfo). A virtual machine may name only the vendor ("AMD EPYC"): the family
    and model numbers then tell the generation (AMD family 25 is Zen 3/4, 26 is Zen 5)."""
    info, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = [i for i in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile") if i in flags]
    return {"cpu": info.get("model name", "unknown"), "family": info.get("cpu family", "?"),
            "model": info.get("model", "?"), "isa": isa, "cores": os.cpu_count()}


def run_measured(cmd, env=None, timeout=None):
    """Runs cmd with os.wait4 to get its own peak RSS; returns (stdout, peak_rss_bytes). Past
    `timeout` seconds the process is killed and TimeoutError raised."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        # A timer kills it past the timeout; os.wait4 (not Popen.wait) reaps it, for its rusage.
        timer = threading.Timer(timeout, p.kill) if timeout is not None else None
        if timer:
            timer.start()
        _, status, ru = os.wait4(p.pid, 0)
        if timer:
            timer.cancel()
            if status == 9 or os.waitstatus_to_exitcode(status) == -9:
                raise TimeoutError(f"{' '.join(cmd[:6])} ... took over {timeout} s")
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.read()[-3000:]}")
        return out.read(), ru.ru_maxrss * 1024  # Linux reports KiB


def duet_profile(duet, model, image_size, classes, batch, steps, warmup, threads, amp="off", inference=False,
                 device="cpu", env=None, mode="throughput", report_path=None):
    """One `duet profile --mode throughput` run (eval-mode passes with inference=True; mode="per-op" times
    every op): its duet.profile/1 report, whose phases.median_step_ns is the median step, and the
    process's peak RSS in bytes. report_path keeps the report file there (for `duet report`)."""
    with tempfile.TemporaryDirectory() as d:
        report = report_path or os.path.join(d, "r.json")
        cmd = [duet, "profile", "--model", model, "--image-size", str(image_size), "--classes", str(classes),
               "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--mode", mode,
               "--threads", str(threads), "--device", device, "--amp", amp, "--out", report]
        if inference:
            cmd.append("--inference")
        _, rss = run_measured(cmd, env)
        with open(report) as f:
            return json.load(f), rss


def duet_side(a, model, image_size, classes, env=None, amp="off"):
    r, rss = duet_profile(a.duet, model, image_size, classes, a.batch, a.steps, a.warmup, a.threads, amp,
                          device=a.device, env=env)
    peak = next(m["peak"] for m in r["memory"]["devices"] if m["device"].startswith(a.device))
    return {"median_step_s": r["phases"]["median_step_ns"] * 1e-9, "parameters": r["run_config"]["parameters"],
            "peak_rss": rss, "allocator_peak": peak}


def torch_side(a, model, image_size, classes, channels_last, compile=False, amp="off", timeout=None):
    cmd = [a.python, os.path.abspath(__file__), "--torch-worker", "--model", model, "--image-size", str(image_size),
           "--classes", str(classes), "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--threads", str(a.threads), "--device", a.device, "--amp", amp] + (["--channels-last"] if channels_last else []) \
        + (["--compile"] if compile else [])
    env = dict(os.environ)
    # Pinning OpenBLAS (CI sets these for Debian's torch 1.13) halves a wheel's GEMM speed: unset.
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    out, rss = run_measured(cmd, env, timeout)
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
    ap.add_argument("--also-autotune", action="store_true",
                    help="also time duet with DUET_CONV_AUTOTUNE=1 (convolution algorithms measured per shape)")
    ap.add_argument("--compile", action="store_true", help="also time PyTorch under torch.compile (inductor)")
    ap.add_argument("--compile-timeout", type=float, default=900,
                    help="seconds a torch.compile run may take, compilation included (default 900)")
    ap.add_argument("--bf16", action="store_true",
                    help="also time duet --amp bf16 against PyTorch under torch.autocast(bfloat16)")
    ap.add_argument("--amp", default="off", help=argparse.SUPPRESS)  # worker: off | bf16
    # worker mode
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--classes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    unknown = [m for m in a.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; expected names from {', '.join(MODELS)}")

    rows = []
    m = machine()
    print(f"{m['cpu']} (family {m['family']} model {m['model']}; {', '.join(m['isa'])}; {m['cores']} cores)")
    print(f"batch {a.batch}, {a.threads} threads, {a.warmup} warm-up + {a.steps} timed steps, {a.rounds} round(s); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for model in a.models.split(","):
        image_size, classes = MODELS[model]
        d_runs, t_runs, direct_runs, tuned_runs, compile_runs, d_bf16_runs, t_bf16_runs = [], [], [], [], [], [], []
        layouts = [False] if model.startswith("vit") else [False, True]
        for _ in range(a.rounds):
            d_runs.append(duet_side(a, model, image_size, classes))
            if a.also_direct:
                direct_runs.append(duet_side(a, model, image_size, classes, dict(os.environ, DUET_WINOGRAD="0")))
            if a.also_autotune:
                tuned_runs.append(duet_side(a, model, image_size, classes, dict(os.environ, DUET_CONV_AUTOTUNE="1")))
            t_runs.append(min((torch_side(a, model, image_size, classes, cl) for cl in layouts),
                              key=lambda r: r["median_step_s"]))
            if a.compile:
                try:  # the faster layout of the eager runs
                    compile_runs.append(torch_side(a, model, image_size, classes, t_runs[-1]["channels_last"], compile=True,
                                                   timeout=a.compile_timeout))
                except (TimeoutError, RuntimeError) as e:
                    print(f"  torch.compile of {model}: {str(e).splitlines()[0][:200]}", flush=True)
            if a.bf16:
                d_bf16_runs.append(duet_side(a, model, image_size, classes, amp="bf16"))
                t_bf16_runs.append(min((torch_side(a, model, image_size, classes, cl, amp="bf16") for cl in layouts),
                                       key=lambda r: r["median_step_s"]))
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
        if tuned_runs:
            tuned_step = statistics.median(r["median_step_s"] for r in tuned_runs)
            row["duet_autotune_step_ms"] = tuned_step * 1e3
            row["speedup_autotune"] = t_step / tuned_step
        if compile_runs:
            c_step = statistics.median(r["median_step_s"] for r in compile_runs)
            row["torch_compile_step_ms"] = c_step * 1e3
            row["speedup_compile"] = c_step / d_step
        if d_bf16_runs:
            db = statistics.median(r["median_step_s"] for r in d_bf16_runs)
            tb = statistics.median(r["median_step_s"] for r in t_bf16_runs)
            row.update({"duet_bf16_step_ms": db * 1e3, "torch_bf16_step_ms": tb * 1e3, "speedup_bf16": tb / db,
                        "duet_bf16_peak_rss_mib": max(r["peak_rss"] for r in d_bf16_runs) / 2**20,
                        "torch_bf16_peak_rss_mib": max(r["peak_rss"] for r in t_bf16_runs) / 2**20})
        rows.append(row)
        warn = "" if row["duet_parameters"] == row["torch_parameters"] else "  PARAMETER COUNTS DIFFER"
        print(f"{model:15s} {image_size:3d}px  duet {row['duet_step_ms']:8.1f} ms  torch {row['torch_step_ms']:8.1f} ms "
              f"({row['torch_layout']})  ratio {row['speedup']:.2f}x  RSS duet {row['duet_peak_rss_mib']:.0f} MiB "
              f"torch {row['torch_peak_rss_mib']:.0f} MiB  (duet tensors {row['duet_allocator_peak_mib']:.0f} MiB){warn}"
              + (f"  | direct conv only: {row['duet_direct_step_ms']:.1f} ms, {row['speedup_direct']:.2f}x"
                 if direct_runs else "")
              + (f"  | autotuned: {row['duet_autotune_step_ms']:.1f} ms, {row['speedup_autotune']:.2f}x"
                 if tuned_runs else "")
              + (f"  | torch.compile {row['torch_compile_step_ms']:.1f} ms, duet {row['speedup_compile']:.2f}x"
                 if compile_runs else "")
              + (f"  | bf16: duet {row['duet_bf16_step_ms']:.1f} ms, torch autocast {row['torch_bf16_step_ms']:.1f} ms, "
                 f"{row['speedup_bf16']:.2f}x" if d_bf16_runs else ""), flush=True)
    geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    print(f"geometric mean of duet's speed-up: {geo:.2f}x over {len(rows)} models; load average "
          f"{os.getloadavg()[0]:.2f}")
    def geomean(key):
        vals = [r[key] for r in rows if key in r]
        return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None

    geo_direct, geo_compile, geo_bf16 = geomean("speedup_direct"), geomean("speedup_compile"), geomean("speedup_bf16")
    geo_tuned = geomean("speedup_autotune")
    if geo_direct:
        print(f"with direct convolution only (DUET_WINOGRAD=0): {geo_direct:.2f}x")
    if geo_tuned:
        print(f"with autotuned convolutions (DUET_CONV_AUTOTUNE=1): {geo_tuned:.2f}x")
    if geo_compile:
        print(f"against torch.compile: {geo_compile:.2f}x over {sum('speedup_compile' in r for r in rows)} models")
    if geo_bf16:
        print(f"bf16, duet --amp bf16 against torch.autocast: {geo_bf16:.2f}x")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "geomean_speedup": geo, "geomean_speedup_direct": geo_direct,
                       "geomean_speedup_autotune": geo_tuned,
                       "geomean_speedup_compile": geo_compile, "geomean_speedup_bf16": geo_bf16, "machine": m,
                       "date": time.strftime("%Y-%m-%d"), "batch": a.batch, "threads": a.threads,
                       "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
