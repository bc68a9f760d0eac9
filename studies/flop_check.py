#!/usr/bin/env python3
"""Study 4, part 1: are duet's FLOP counts right? duet's FLOPs per training step, from its
profiler's cost formulas (engine/op_cost.cpp), beside an independent count of the same step:
PyTorch's torch.utils.flop_counter on the torchvision model of the same name, batch and size.

PyTorch's counter counts the matrix work only (convolutions, matrix products, attention) at
2 FLOPs per multiply-add, forward and backward; duet counts every op. The table compares the
matrix work op for op and shows the rest of duet's count (normalisation, activations, pooling,
loss, optimizer) beside it. Convolutions get a third count, the textbook formula applied to each
layer's shapes, as a referee where the two differ.

  .venv-bench/bin/python studies/flop_check.py --duet build/duet            # resnet50, vit_b_16, mobilenet_v2
  .venv-bench/bin/python studies/flop_check.py --models resnet50 --batch 8   # quicker

duet runs one real training step per model (batch 64 at 224 px: about a minute for vit_b_16 on two
cores); PyTorch's count needs no arithmetic (meta tensors). Writes the table as markdown to
--out (default studies/results/flop_check.md) and the numbers as JSON beside it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# duet op names (profiler keys) that do matrix work, by the group PyTorch's counter reports
MATRIX_OPS = {
    "conv2d": "convolution", "conv2d.backward_data": "convolution", "conv2d.backward_weight": "convolution",
    "matmul": "matmul", "matmul.backward_a": "matmul", "matmul.backward_b": "matmul",
    "linear": "matmul", "linear.backward_data": "matmul", "linear.backward_weight": "matmul",
}


def duet_counts(duet, model, batch, size, classes, threads):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "profile.json")
        cmd = [duet, "--threads", str(threads), "profile", "--model", model, "--batch", str(batch), "--image-size",
               str(size), "--classes", str(classes), "--steps", "1", "--warmup", "0", "--mode", "per-op", "--out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            report = json.load(f)
    steps = len(report["steps"])
    counts = {}  # (phase, group) -> FLOPs per step
    for row in report["op_table"]:
        group = MATRIX_OPS.get(row["key"], "other: " + row["key"])
        key = (row["phase"], group)
        counts[key] = counts.get(key, 0.0) + row["flops"] / steps
    return counts


def torch_counts(model, batch, size, classes):
    import torch
    import torchvision.models as tvm
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net = getattr(tvm, model)(num_classes=classes)
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, classes, (batch,))
    net.train()
    groups = {"convolution": ("convolution", "convolution_backward"),
              "matmul": ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_efficient_attention",
                         "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
                         "_scaled_dot_product_efficient_attention_backward",
                         "_scaled_dot_product_flash_attention_backward")}
    counts = {}
    for phase in ("forward", "backward"):
        counter = FlopCounterMode(display=False)
        if phase == "forward":
            with counter:
                loss = torch.nn.functional.cross_entropy(net(x), y)
        else:
            with counter:
                loss.backward()
        for op, n in counter.get_flop_counts()["Global"].items():
            name = str(op).replace("aten.", "").split(".")[0]
            group = next((g for g, names in groups.items() if name in names), "other: " + name)
            counts[(phase, group)] = counts.get((phase, group), 0.0) + float(n)
    return counts


def analytic_conv_counts(model, batch, size, classes):
    """Convolution FLOPs by the textbook formula from each layer's shapes, as a referee where the two
    counts differ: forward 2 N Cout Ho Wo (Cin / groups) kh kw per layer, backward the same once for
    the weight gradient and once for the input gradient (not for the first layer: the image needs none)."""
    import torch
    import torchvision.models as tvm

    with torch.device("meta"):
        net = getattr(tvm, model)(num_classes=classes)
        x = torch.randn(batch, 3, size, size)
    layers = []
    hooks = [m.register_forward_hook(lambda m, i, o: layers.append(
        2 * o.shape[0] * o.shape[1] * o.shape[2] * o.shape[3] * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]))
        for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    net(x)
    for h in hooks:
        h.remove()
    forward = float(sum(layers))
    return {("forward", "convolution"): forward, ("backward", "convolution"): 2 * forward - layers[0]}


def table(model, d, t, a):
    rows = []
    for phase in ("forward", "backward"):
        for group in ("convolution", "matmul"):
            dv, tv = d.get((phase, group), 0.0), t.get((phase, group), 0.0)
            if dv == 0 and tv == 0:
                continue
            diff = (dv - tv) / tv * 100 if tv else float("inf")
            av = a.get((phase, group))
            rows.append((model, phase, group, dv / 1e9, tv / 1e9, diff, None if av is None else av / 1e9))
    for (phase, group), tv in sorted(t.items()):
        if group.startswith("other"):
            rows.append((model, phase, "PyTorch only: " + group[7:], 0.0, tv / 1e9, float("nan"), None))
    other = {}
    for (phase, group), dv in d.items():
        if group.startswith("other"):
            other[phase] = other.get(phase, 0.0) + dv
    for phase, dv in sorted(other.items(), key=lambda kv: ("forward", "backward", "optimizer").index(kv[0])):
        rows.append((model, phase, "duet only: elementwise, norm, pool, loss, optimizer", dv / 1e9, 0.0, float("nan"), None))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "duet"))
    ap.add_argument("--models", default="resnet50,vit_b_16,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "flop_check.md"))
    a = ap.parse_args()

    all_rows, raw = [], {}
    for model in a.models.split(","):
        t0 = time.time()
        d = duet_counts(a.duet, model, a.batch, a.image_size, a.classes, a.threads)
        t = torch_counts(model, a.batch, a.image_size, a.classes)
        print(f"{model}: counted in {time.time() - t0:.0f} s", file=sys.stderr)
        an = analytic_conv_counts(model, a.batch, a.image_size, a.classes)
        all_rows += table(model, d, t, an)
        raw[model] = {name: {f"{p}/{g}": v for (p, g), v in c.items()} for name, c in (("duet", d), ("torch", t), ("formula", an))}

    import torch
    lines = [f"FLOPs per training step, batch {a.batch}, {a.image_size} px, {a.classes} classes; duet "
             f"`{os.path.relpath(a.duet, ROOT)}` against torch.utils.flop_counter (PyTorch {torch.__version__})", "",
             "| model | phase | op group | duet GFLOP | PyTorch GFLOP | difference | textbook formula GFLOP |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for model, phase, group, dv, tv, diff, av in all_rows:
        ds = "" if diff != diff else f"{diff:+.2f}%"
        avs = "" if av is None else f"{av:.3f}"
        lines.append(f"| {model} | {phase} | {group} | {dv:.3f} | {tv:.3f} | {ds} | {avs} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"batch": a.batch, "image_size": a.image_size, "classes": a.classes, "counts": raw}, f, indent=1)


if __name__ == "__main__":
    main()
