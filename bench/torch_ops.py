#!/usr/bin/env python3
"""Times the ops of bench/bench_ops.cpp with PyTorch on the same shapes and layouts.

Each benchmark has the name duet uses with the backend replaced by "torch":
"<op>_<fwd|fwdbwd>/<shape>/torch". fwd runs under no_grad; fwdbwd runs the op with inputs that
require grad, then backward with a fixed random output gradient, then drops the gradients (as
duet's benchmark does). Times are wall-clock seconds per iteration; with --repetitions R the
script keeps the fastest of R repetitions of at least --min-time seconds each, which is what
bench/compare_ops.py expects from duet's --benchmark_repetitions run as well.

  OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= .venv-bench/bin/python bench/torch_ops.py --out torch_ops.json
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

CL = torch.channels_last


def spec(op, shape, shapes, fn, channels_last=(), backward=True, labels=None, state=None):
    return dict(op=op, shape=shape, shapes=shapes, fn=fn, channels_last=channels_last, backward=backward,
                labels=labels or {}, state=state)


def conv(shape, x, o, k, stride, pad, groups, nhwc):
    w = [o, x[1] // groups, k, k]
    return spec("conv2d", shape, [x, w], lambda t: F.conv2d(t[0], t[1], None, stride, pad, 1, groups),
                channels_last=(nhwc, False))


def specs():
    s = [
        conv("resnet_l1_64x64_32_nhwc", [64, 64, 32, 32], 64, 3, 1, 1, 1, True),
        conv("resnet_l1_64x64_32_nchw", [64, 64, 32, 32], 64, 3, 1, 1, 1, False),
        conv("resnet_l3_256x256_8_nhwc", [64, 256, 8, 8], 256, 3, 1, 1, 1, True),
        conv("resnet_down_128x256_s2_nhwc", [64, 128, 16, 16], 256, 3, 2, 1, 1, True),
        conv("cifar_stem_3x64_32_nhwc", [64, 3, 32, 32], 64, 3, 1, 1, 1, True),
        conv("cifar_stem_3x64_32_nchw", [64, 3, 32, 32], 64, 3, 1, 1, 1, False),
        conv("mbv2_dw3x3_144_16_nhwc", [64, 144, 16, 16], 144, 3, 1, 1, 144, True),
        conv("mbv2_dw3x3_144_16_nchw", [64, 144, 16, 16], 144, 3, 1, 1, 144, False),
        conv("mbv2_expand1x1_24x144_16_nhwc", [64, 24, 16, 16], 144, 1, 1, 0, 1, True),
        conv("mbv2_expand1x1_24x144_16_nchw", [64, 24, 16, 16], 144, 1, 1, 0, 1, False),
        conv("mbv2_project1x1_144x24_16_nhwc", [64, 144, 16, 16], 24, 1, 1, 0, 1, True),
        conv("densenet_bottleneck1x1_160x128_16_nhwc", [64, 160, 16, 16], 128, 1, 1, 0, 1, True),
        conv("densenet_growth3x3_128x32_16_nhwc", [64, 128, 16, 16], 32, 3, 1, 1, 1, True),
        conv("densenet_growth3x3_128x32_2_nhwc", [64, 128, 2, 2], 32, 3, 1, 1, 1, True),
        conv("densenet_growth3x3_128x32_1_nhwc", [64, 128, 1, 1], 32, 3, 1, 1, 1, True),
        conv("densenet_bottleneck1x1_512x128_2_nhwc", [64, 512, 2, 2], 128, 1, 1, 0, 1, True),
        conv("mbv2_dw3x3_576_2_nhwc", [64, 576, 2, 2], 576, 3, 1, 1, 576, True),
        conv("mbv2_dw3x3_960_1_nhwc", [64, 960, 1, 1], 960, 3, 1, 1, 960, True),
        conv("convnext_dw7x7_96_16_nhwc", [64, 96, 16, 16], 96, 7, 1, 3, 96, True),
        conv("mbv2_project1x1_960x160_1_nhwc", [64, 960, 1, 1], 160, 1, 1, 0, 1, True),
        conv("resnet_l4_512x512_4_nhwc", [64, 512, 4, 4], 512, 3, 1, 1, 1, True),
    ]
    # conv + bias + ReLU: PyTorch at its best runs the ReLU in place on the conv's output.
    s.append(spec("conv2d_bias_relu", "resnet_l1_64x64_32_nhwc", [[64, 64, 32, 32], [64, 64, 3, 3], [64]],
                  lambda t: F.relu(F.conv2d(t[0], t[1], t[2], 1, 1), inplace=True), channels_last=(True, False)))
    for name, rows, i, o in [("vit_qkv_4160x192x576", 4160, 192, 576), ("vit_fc1_4160x192x768", 4160, 192, 768),
                             ("vit_fc2_4160x768x192", 4160, 768, 192)]:
        s.append(spec("linear", name, [[64, rows // 64, i], [o, i], [o]], lambda t: F.linear(t[0], t[1], t[2])))
    s.append(spec("matmul", "vit_attn_qk_192x65x64x65", [[64, 3, 65, 64], [64, 3, 65, 64]],
                  lambda t: t[0] @ t[1].transpose(-1, -2)))
    s.append(spec("matmul", "vit_attn_av_192x65x65x64", [[64, 3, 65, 65], [64, 3, 65, 64]], lambda t: t[0] @ t[1]))
    s.append(spec("layer_norm", "vit_64x65x192", [[64, 65, 192], [192], [192]],
                  lambda t: F.layer_norm(t[0], (192,), t[1], t[2], 1e-5)))
    s.append(spec("gelu", "vit_64x65x768", [[64, 65, 768]], lambda t: F.gelu(t[0])))
    s.append(spec("softmax", "vit_attn_64x3x65x65", [[64, 3, 65, 65]], lambda t: torch.softmax(t[0], -1)))
    x = [64, 64, 32, 32]
    s.append(spec("batch_norm", "resnet_64x64x32x32_nhwc", [x, [64], [64]],
                  lambda t: F.batch_norm(t[0], None, None, t[1], t[2], True), channels_last=(True,)))
    s.append(spec("batch_norm", "resnet_64x64x32x32_nchw", [x, [64], [64]],
                  lambda t: F.batch_norm(t[0], None, None, t[1], t[2], True)))
    s.append(spec("relu", "resnet_64x64x32x32_nhwc", [x], lambda t: F.relu(t[0]), channels_last=(True,)))
    # PyTorch's function for each of duet's activations (bench_ops.cpp's act_<name>), default parameters.
    torch_activations = {"relu": F.relu, "relu6": F.relu6, "gelu": F.gelu,
                         "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "sigmoid": torch.sigmoid,
                         "silu": F.silu, "hardswish": F.hardswish, "leaky_relu": lambda v: F.leaky_relu(v, 0.01)}
    for name, fn in torch_activations.items():
        s.append(spec("act_" + name, "resnet_64x64x32x32_nhwc", [x], lambda t, fn=fn: fn(t[0]), channels_last=(True,)))
    s.append(spec("batch_norm_relu", "resnet_64x64x32x32_nhwc", [x, [64], [64]],
                  lambda t: F.relu(F.batch_norm(t[0], None, None, t[1], t[2], True), inplace=True),
                  channels_last=(True,)))
    s.append(spec("add", "densenet_grad_slices_64x32x2x2_of_256_nhwc", [[64, 256, 2, 2], [64, 256, 2, 2]],
                  lambda t: t[0][:, 0:32] + t[1][:, 64:96], channels_last=(True, True)))
    s.append(spec("add", "resnet_residual_64x64x32x32_nhwc", [x, x], lambda t: t[0] + t[1], channels_last=(True, True)))
    s.append(spec("add", "bias_broadcast_64x64x32x32_nhwc", [x, [1, 64, 1, 1]], lambda t: t[0] + t[1],
                  channels_last=(True, False)))
    s.append(spec("mul_scalar", "64x64x32x32", [x], lambda t: t[0] * 0.5))
    s.append(spec("max_pool2d", "3x3s2_64x64x32x32_nhwc", [x], lambda t: F.max_pool2d(t[0], 3, 2, 1),
                  channels_last=(True,)))
    s.append(spec("avg_pool2d", "densenet_transition_2x2_64x128x16x16_nhwc", [[64, 128, 16, 16]],
                  lambda t: F.avg_pool2d(t[0], 2, 2), channels_last=(True,)))
    s.append(spec("adaptive_avg_pool2d", "global_64x512x4x4_nhwc", [[64, 512, 4, 4]],
                  lambda t: F.adaptive_avg_pool2d(t[0], 1), channels_last=(True,)))
    s.append(spec("sum", "channels_64x64x32x32", [x], lambda t: t[0].sum(dim=(0, 2, 3))))
    s.append(spec("cat", "densenet_128+32_16x16_nhwc", [[64, 128, 16, 16], [64, 32, 16, 16]],
                  lambda t: torch.cat(t, 1), channels_last=(True, True)))
    s.append(spec("cross_entropy", "cifar_256x10", [[256, 10], [256]],
                  lambda t: F.cross_entropy(t[0], t[1], label_smoothing=0.1), labels={1: 10}))
    w = [512, 512, 3, 3]
    s.append(spec("sgd_momentum", "resnet_512x512x3x3", [w], None, backward=False,
                  state=lambda p: torch.optim.SGD([p], lr=0.01, momentum=0.9, weight_decay=5e-4)))
    s.append(spec("adamw", "resnet_512x512x3x3", [w], None, backward=False,
                  state=lambda p: torch.optim.AdamW([p], lr=1e-3, weight_decay=0.05)))
    return s


def make_inputs(sp, grad):
    g = torch.Generator().manual_seed(1234)
    out = []
    for i, shape in enumerate(sp["shapes"]):
        if i in sp["labels"]:
            out.append(torch.arange(shape[0]) % sp["labels"][i])
            continue
        t = torch.randn(shape, generator=g)
        if i < len(sp["channels_last"]) and sp["channels_last"][i]:
            t = t.contiguous(memory_format=CL)
        out.append(t.requires_grad_(grad))
    return out


# The clock of time_loop: wall time by default; bench/compare_ops.py --cpu-time switches it to the
# process's CPU time (one thread on a shared machine: time spent descheduled is not counted).
clock = time.perf_counter


def time_loop(body, min_time, reps):
    body()
    body()  # warm-up: allocator, kernels, caches
    best = float("inf")
    for _ in range(reps):
        n, start = 0, clock()
        while True:
            body()
            n += 1
            el = clock() - start
            if el >= min_time and n >= 2:
                break
        best = min(best, el / n)
    return best


def bench(sp, bwd, min_time, reps):
    if sp["state"] is not None:  # optimizer step on one parameter with a gradient
        p = torch.randn(sp["shapes"][0]).requires_grad_(True)
        p.grad = torch.randn(sp["shapes"][0])
        opt = sp["state"](p)
        return time_loop(opt.step, min_time, reps)
    inputs = make_inputs(sp, bwd)
    if not bwd:
        def body():
            with torch.no_grad():
                sp["fn"](inputs)
        return time_loop(body, min_time, reps)
    with torch.no_grad():
        y = sp["fn"](inputs)
    dy = torch.randn(y.shape)
    if y.dim() == 4 and y.is_contiguous(memory_format=CL) and not y.is_contiguous():
        dy = dy.contiguous(memory_format=CL)

    def body():
        out = sp["fn"](inputs)
        out.backward(dy)
        for t in inputs:
            t.grad = None
    return time_loop(body, min_time, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="torch_ops.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for sp in specs():
        for bwd in ([False, True] if sp["backward"] else [False]):
            name = f'{sp["op"]}_{"fwdbwd" if bwd else "fwd"}/{sp["shape"]}/torch'
            if args.filter and args.filter not in name:
                continue
            t = bench(sp, bwd, args.min_time, args.repetitions)
            results.append({"name": name, "real_time_s": t})
            print(f"{name:70s} {t * 1e6:12.1f} us", flush=True)
    with open(args.out, "w") as f:
        json.dump({"torch_version": torch.__version__, "threads": args.threads, "benchmarks": results}, f, indent=1)


if __name__ == "__main__":
    main()
