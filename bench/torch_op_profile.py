#!/usr/bin/env python3
"""Where PyTorch's training step spends its time, op by op, beside duet's own per-op profile of
the same step: the question "how far is PyTorch from this CPU's ceilings, and is duet's lead
limited by the hardware" answered per op family instead of per step.

The PyTorch step is bench/train_throughput.py's (same model definitions, batch, optimizer, thread
count, channels-last for conv nets, optionally bf16 autocast), run under torch.profiler; each op's
self CPU time is summed per step and put in a family:
  conv      convolutions, forward and backward (aten::mkldnn_convolution, convolution_backward, ...)
  matmul    matrix products and linear layers (mm, addmm, bmm, linear)
  norm      batch and layer norm, forward and backward
  cast      dtype conversions (autocast's casts: _to_copy, copy_)
  other     everything else (activations, adds, pooling, loss, optimizer, ...)
With --duet-profile (a duet.profile/1 file from `duet profile --mode per-op --out F`), duet's ops go
into the same families and both columns are printed, with each family's share of the step. With
--ceiling (GFLOP/s, e.g. `duet probe`'s GEMM figure for the dtype), the convolution rows also
show the FLOP rate implied by duet's direct-convolution FLOP count (the profile's).

  build/duet profile --model resnet18_cifar --batch 64 --threads 2 --amp bf16 --mode per-op --out d.json
  .venv-bench/bin/python bench/torch_op_profile.py --model resnet18_cifar --amp bf16 --duet-profile d.json

Needs torch and torchvision. Profiling adds a few microseconds per op, which matters only for
models with thousands of small ops per step.
"""
import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import MODELS, time_torch_steps, torch_model  # noqa: E402

FAMILIES = ("conv", "matmul", "norm", "cast", "other")


def torch_family(name):
    n = name.lower()
    if "conv" in n:
        return "conv"
    if any(k in n for k in ("aten::mm", "addmm", "bmm", "aten::linear", "aten::matmul")):
        return "matmul"
    if "norm" in n:
        return "norm"
    if n in ("aten::_to_copy", "aten::copy_", "aten::to"):
        return "cast"
    return "other"


def duet_family(name):
    if name.startswith("conv2d"):
        return "conv"
    if name.startswith(("matmul", "linear")):
        return "matmul"
    if "norm" in name:
        return "norm"
    if name.startswith("cast"):
        return "cast"
    return "other"


def torch_profile(a):
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    size, classes = MODELS[a.model]
    size = a.image_size or size
    model = torch_model(a.model, classes, size)
    fmt = torch.contiguous_format if a.model.startswith("vit") else torch.channels_last
    model = model.to(memory_format=fmt).train()
    x = torch.randn(a.batch, 3, size, size).contiguous(memory_format=fmt)
    y = torch.arange(a.batch) % classes
    autocast = torch.bfloat16 if a.amp == "bf16" else None
    time_torch_steps(model, x, y, a.warmup, 0, "cpu", autocast)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_torch_steps(model, x, y, 0, a.steps, "cpu", autocast)
    per_op = collections.Counter()
    for e in prof.key_averages():
        per_op[e.key] += e.self_cpu_time_total / 1e3 / a.steps  # ms per step
    return per_op, torch.__version__


def duet_profile(path):
    d = json.load(open(path))
    steps = d["totals"]["steps"]
    per_op = collections.Counter()
    flops = collections.Counter()
    for row in d["op_table"]:
        per_op[row["key"]] += row["self_ns"] / 1e6 / steps
        flops[row["key"]] += row.get("flops", 0.0) / steps
    return per_op, flops, d["run_config"], d["phases"]["median_step_ns"] / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18_cifar", choices=sorted(MODELS))
    ap.add_argument("--image-size", type=int, default=0, help="default: the model's row in train_throughput.py")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=12, help="PyTorch ops listed one by one")
    ap.add_argument("--duet-profile", help="duet.profile/1 JSON of the same model, batch, threads and --amp")
    ap.add_argument("--ceiling", type=float, help="GEMM GFLOP/s for the convolutions' rate column")
    a = ap.parse_args()

    t_ops, version = torch_profile(a)
    print(f"PyTorch {version}, {a.model} batch {a.batch}, {a.threads} threads, amp {a.amp}: "
          f"{a.steps} profiled steps after {a.warmup} warm-up, self CPU ms per step")
    for name, ms in t_ops.most_common(a.top):
        print(f"  {name:44s} {ms:9.2f}  [{torch_family(name)}]")
    t_fam = collections.Counter()
    for name, ms in t_ops.items():
        t_fam[torch_family(name)] += ms
    t_total = sum(t_fam.values())

    d_fam, conv_flops, d_total = collections.Counter(), 0.0, None
    if a.duet_profile:
        d_ops, d_flops, cfg, d_step = duet_profile(a.duet_profile)
        if (cfg.get("model"), cfg.get("batch"), cfg.get("threads"), cfg.get("amp")) != (a.model, a.batch, a.threads, a.amp):
            sys.exit(f"--duet-profile is of {cfg.get('model')} batch {cfg.get('batch')} threads {cfg.get('threads')} "
                     f"amp {cfg.get('amp')}, not of this run")
        for name, ms in d_ops.items():
            d_fam[duet_family(name)] += ms
            if duet_family(name) == "conv":
                conv_flops += d_flops[name]
        d_total = sum(d_fam.values())

    print("\nper family, ms per step (share of the ops' time)")
    print(f"  {'family':8s} {'PyTorch':>16s}" + (f" {'duet':>16s} {'PyTorch/duet':>13s}" if d_total else ""))
    for f in FAMILIES:
        line = f"  {f:8s} {t_fam[f]:9.1f} ({t_fam[f] / t_total:4.0%})"
        if d_total:
            ratio = f"{t_fam[f] / d_fam[f]:.2f}x" if d_fam[f] > 0 else "-"
            line += f" {d_fam[f]:9.1f} ({d_fam[f] / d_total:4.0%}) {ratio:>13s}"
        print(line)
    line = f"  {'all ops':8s} {t_total:9.1f}       "
    if d_total:
        line += f" {d_total:9.1f}        {t_total / d_total:12.2f}x"
    print(line)
    if d_total and conv_flops > 0:
        gf = conv_flops / 1e9
        rates = f"duet {gf / (d_fam['conv'] / 1e3):.0f}, PyTorch {gf / (t_fam['conv'] / 1e3):.0f} GFLOP/s"
        if a.ceiling:
            rates += (f" = {gf / (d_fam['conv'] / 1e3) / a.ceiling:.0%} and "
                      f"{gf / (t_fam['conv'] / 1e3) / a.ceiling:.0%} of the {a.ceiling:.0f} GFLOP/s ceiling")
        print(f"\nconvolutions: {gf:.1f} GFLOP per step (direct count, duet's profile): {rates}")


if __name__ == "__main__":
    main()
