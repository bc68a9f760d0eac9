#!/usr/bin/env python3
"""Is duet's mixed precision as accurate as PyTorch's autocast? Both frameworks start from the same
weights and see the same CIFAR-10 images; each computes the gradients of one batch (and, with
--steps, a short SGD trajectory) in f32 and under bf16 autocast, and the script prints how far each
framework's bf16 result is from its own f32 result, per parameter tensor:

    relative error = ||g_bf16 - g_f32|| / ||g_f32||     (trajectories: on the change of the weights)

If duet rounds where PyTorch does, its errors match PyTorch's; a duet op that loses more precision
(a bf16 accumulation, a truncating cast) shows up as a larger error in the layers that use it.
Also printed: each framework's f32 result against PyTorch in f64 (the f32 arithmetic's own error, so
the bf16 columns can be read against it), and the norm ratio ||g_bf16|| / ||g_f32|| averaged over
tensors (a systematic bias shows as a ratio away from 1).

    .venv-bench/bin/python bench/amp_numerics.py                              # fresh initialisation
    .venv-bench/bin/python bench/amp_numerics.py --checkpoint run.safetensors # trained weights
    .venv-bench/bin/python bench/amp_numerics.py --steps 30                   # 30-step trajectories

The model is resnet18_cifar at half width (the accuracy recipe's, bench/train_accuracy.py) in
PyTorch from bench/torch_train.py; --checkpoint takes a duet checkpoint of that model.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_train  # noqa: E402  (the PyTorch model and normalisation of the accuracy recipe)


def cifar_batches(root, n):
    raw = np.fromfile(os.path.join(root, "data_batch_1.bin"), dtype=np.uint8).reshape(-1, 3073)[:n]
    y = torch.from_numpy(raw[:, 0].astype(np.int64))
    img = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255)
    mean = torch.tensor(torch_train.CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(torch_train.CIFAR_STD).view(1, 3, 1, 1)
    return ((img - mean) / std).contiguous(), y


def torch_run(sd, x, y, a, amp, dtype=torch.float32):
    m = torch_train.make_model("resnet18_cifar", 10, a.width_mult)
    m.load_state_dict(sd, strict=False)
    m = m.to(dtype=dtype, memory_format=torch.channels_last).train()
    x = x.to(dtype)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    slices = len(y) // a.batch
    for s in range(max(a.steps, 1)):
        i = s % slices
        xb = x[i * a.batch:(i + 1) * a.batch].contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(m(xb), y[i * a.batch:(i + 1) * a.batch], label_smoothing=0.1)
        loss.backward()
        if a.steps > 0:
            opt.step()
    if a.steps == 0:
        return {k: p.grad.detach().float().clone() for k, p in m.named_parameters()}
    return {k: v.detach().float().clone() for k, v in m.state_dict().items() if v.is_floating_point()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet-tool", default=os.path.join(HERE, "..", "build", "bench", "duet_amp_numerics"))
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "cifar10"))
    ap.add_argument("--checkpoint", help="a duet checkpoint of resnet18_cifar (default: a fresh initialisation)")
    ap.add_argument("--width-mult", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=0, help="0: one batch's gradients; K: the weights after K SGD steps")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)

    m = torch_train.make_model("resnet18_cifar", 10, a.width_mult)
    sd = {k: v.contiguous() for k, v in m.state_dict().items() if v.is_floating_point()}
    if a.checkpoint:
        ck = load_file(a.checkpoint)
        sd = {k[len("model."):]: v.contiguous() for k, v in ck.items()
              if k.startswith("model.") and v.is_floating_point()}
    x, y = cifar_batches(a.data, a.batch * (10 if a.steps > 0 else 1))

    with tempfile.TemporaryDirectory() as tmp:
        w_path, b_path, out = (os.path.join(tmp, n) for n in ("weights.safetensors", "batches.safetensors", "duet"))
        save_file(sd, w_path)
        save_file({"x": x, "y": y}, b_path)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        subprocess.run([a.duet_tool, "--model", "resnet18_cifar", "--width-mult", str(a.width_mult), "--classes", "10",
                        "--image-size", "32", "--weights", w_path, "--batches", b_path, "--batch", str(a.batch),
                        "--amp", "bf16", "--steps", str(a.steps), "--lr", str(a.lr), "--out", out],
                       check=True, env=env)
        d32, d16 = load_file(out + ".f32.safetensors"), load_file(out + ".bf16.safetensors")
    t32, t16 = torch_run(sd, x, y, a, False), torch_run(sd, x, y, a, True)
    t64 = torch_run(sd, x, y, a, False, torch.float64)

    base = (lambda k, t: t[k].double()) if a.steps == 0 else (lambda k, t: t[k].double() - sd[k].double())
    rel = lambda u, v: ((u - v).norm() / v.norm().clamp_min(1e-30)).item()
    names = [k for k in t32 if k in d32 and (a.steps == 0 or "running" not in k)]
    what = "gradients of one batch" if a.steps == 0 else f"weight change after {a.steps} SGD steps"
    print(f"resnet18_cifar x{a.width_mult}, {what}, batch {a.batch}, "
          f"{'checkpoint ' + a.checkpoint if a.checkpoint else 'fresh initialisation (seed %d)' % a.seed}")
    print(f"{'tensor':34s} {'torch f32 vs f64':>16s} {'duet f32 vs f64':>15s} {'torch bf16 vs f32':>17s} "
          f"{'duet bf16 vs f32':>16s}")
    rows = []
    for k in names:
        r = (rel(base(k, t32), base(k, t64)), rel(base(k, d32), base(k, t64)), rel(base(k, t16), base(k, t32)),
             rel(base(k, d16), base(k, d32)), (base(k, t16).norm() / base(k, t32).norm()).item(),
             (base(k, d16).norm() / base(k, d32).norm()).item())
        rows.append(r)
        if k.endswith("weight") and ("conv" in k or "fc" in k or "downsample.0" in k):
            print(f"{k:34s} {r[0]:16.2e} {r[1]:15.2e} {r[2]:17.4f} {r[3]:16.4f}")
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(6)]
    print(f"{'mean over ' + str(len(rows)) + ' tensors':34s} {mean[0]:16.2e} {mean[1]:15.2e} {mean[2]:17.4f} {mean[3]:16.4f}")
    print(f"norm ratio bf16/f32, mean over tensors: torch {mean[4]:.4f}, duet {mean[5]:.4f}")
    if not all(math.isfinite(v) for v in mean):
        sys.exit("a result is not finite")


if __name__ == "__main__":
    main()
