#!/usr/bin/python3
"""Writes tests/golden/fixtures/<family>.safetensors: reduced-size configurations of each model
family, built with torchvision's own classes (MobileNet v1, which torchvision lacks, with the
small definition below), run once by PyTorch in float64. tests/test_model_goldens.cpp loads the
same weights into duet and compares.

Each file holds
    state/<name>          the weights and buffers before anything ran
    input, labels         a fixed batch of 4 images (float32) and class labels
    logits_train          train-mode forward (batch-norm uses batch statistics)
    loss_train            cross-entropy of logits_train against labels
    grad/<name>           gradients after loss_train.backward() (all parameters, or a subset
                          for the larger fixtures, to stay well under 1 MB)
    after/<name>          buffers after that forward (running statistics, num_batches_tracked)
    logits_eval, loss_eval, grad_eval/<name>
                          the same in eval mode, after the train step updated the statistics
and, in the metadata, the configuration ("config") and PyTorch's own float32 error against its
float64 result for each quantity ("torch_f32_error"), the yardstick for duet's float32 run.

Zero or constant initialisations (ViT's head, ConvNeXt's 1e-6 layer scale, batch-norm affine
parameters and running statistics) are replaced by random values first, so every parameter
changes the output and a wrong formula cannot hide behind a zero.

Run with Debian's torch/torchvision (apt-get install python3-torch python3-torchvision):
    /usr/bin/python3 tests/golden/make_model_goldens.py
The safetensors files are written by hand (json + struct): no extra package is needed.
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models import convnext as tv_convnext
from torchvision.models import densenet as tv_densenet
from torchvision.models import mobilenetv2 as tv_mobilenetv2
from torchvision.models import resnet as tv_resnet
from torchvision.models import vision_transformer as tv_vit
from torchvision.ops import Conv2dNormActivation

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_PARAMS_WITH_ALL_GRADS = 30000


# ---- reduced configurations, using torchvision's classes -----------------------------------------
class NarrowResNet(tv_resnet.ResNet):
    """torchvision's ResNet with the stem/layer1 width as a parameter (torchvision fixes 64) and
    optionally the CIFAR stem. Only __init__ is re-stated; blocks, _make_layer and forward are
    torchvision's."""

    def __init__(self, block, layers, width, num_classes, cifar_stem=False, groups=1, width_per_group=64):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = width
        self.dilation = 1
        self.groups = groups
        self.base_width = width_per_group
        if cifar_stem:
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if cifar_stem else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * block.expansion, num_classes)


class DepthwiseSeparable(nn.Module):
    def __init__(self, inp, out, stride):
        super().__init__()
        self.conv = nn.Sequential(
            Conv2dNormActivation(inp, inp, 3, stride, groups=inp, activation_layer=nn.ReLU),
            Conv2dNormActivation(inp, out, 1, 1, activation_layer=nn.ReLU),
        )

    def forward(self, x):
        return self.conv(x)


class MobileNetV1(nn.Module):
    """duet's MobileNet v1 (models/mobilenet.h) in PyTorch, same names."""

    BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
              (512, 1), (1024, 2), (1024, 1)]

    def __init__(self, num_classes, width_mult, dropout=0.0):
        super().__init__()
        ch = lambda c: tv_mobilenetv2._make_divisible(c * width_mult, 8)
        inp = ch(32)
        layers = [Conv2dNormActivation(3, inp, 3, 2, activation_layer=nn.ReLU)]
        for c, s in self.BLOCKS:
            layers.append(DepthwiseSeparable(inp, ch(c), s))
            inp = ch(c)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(inp, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# name -> (constructor, config recorded in the metadata, input size)
CONFIGS = {
    # 64x64 for the ImageNet stems (here and below): at 32x32 layer4 runs on 1x1 maps and its
    # train-mode batch norms see 4 values per channel, which makes float32 gradients noisy.
    "resnet_basic": (lambda: NarrowResNet(tv_resnet.BasicBlock, [1, 1, 1, 1], 4, 10),
                     {"block": "basic", "layers": [1, 1, 1, 1], "width": 4, "num_classes": 10}, 64),
    "resnet_bottleneck_grouped": (
        lambda: NarrowResNet(tv_resnet.Bottleneck, [2, 1, 1, 1], 4, 10, groups=2, width_per_group=32),
        {"block": "bottleneck", "layers": [2, 1, 1, 1], "width": 4, "groups": 2, "width_per_group": 32,
         "num_classes": 10}, 64),
    "resnet_cifar": (lambda: NarrowResNet(tv_resnet.BasicBlock, [1, 1, 1, 1], 4, 10, cifar_stem=True),
                     {"block": "basic", "layers": [1, 1, 1, 1], "width": 4, "cifar_stem": True, "num_classes": 10}, 32),
    "densenet": (lambda: tv_densenet.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2,
                                              num_classes=10),
                 {"growth_rate": 4, "block_config": [2, 2], "num_init_features": 8, "bn_size": 2, "num_classes": 10}, 32),
    "mobilenet_v1": (lambda: MobileNetV1(num_classes=10, width_mult=0.125),
                     {"width_mult": 0.125, "dropout": 0.0, "num_classes": 10}, 64),
    "mobilenet_v2": (lambda: tv_mobilenetv2.MobileNetV2(num_classes=10, width_mult=0.25, dropout=0.0,
                                                        inverted_residual_setting=[[1, 16, 1, 1], [6, 24, 2, 2],
                                                                                   [6, 32, 1, 2]]),
                     {"width_mult": 0.25, "dropout": 0.0, "setting": [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2]],
                      "num_classes": 10}, 32),
    "vit": (lambda: tv_vit.VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32,
                                             mlp_dim=64, num_classes=10),
            {"image_size": 16, "patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 32, "mlp_dim": 64,
             "num_classes": 10}, 16),
    "convnext": (lambda: tv_convnext.ConvNeXt([tv_convnext.CNBlockConfig(8, 16, 2), tv_convnext.CNBlockConfig(16, None, 1)],
                                              stochastic_depth_prob=0.0, num_classes=10),
                 {"stages": [[8, 2], [16, 1]], "stochastic_depth_prob": 0.0, "num_classes": 10}, 32),
}


def randomize(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "layer_scale":
                p.uniform_(0.5, 1.0)
            elif name in ("class_token", "encoder.pos_embedding"):
                p.normal_(0.0, 0.5)
            elif p.dim() == 1 and leaf == "weight":  # batch/layer-norm scales
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1:  # every bias
                p.uniform_(-0.2, 0.2)
            elif p.abs().max() == 0:  # zero-initialised heads
                p.normal_(0.0, 0.2)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.uniform_(-0.2, 0.2)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 1.5)


def check_narrow_resnet_is_torchvision():
    """At full width NarrowResNet must be torchvision's resnet18/resnet50 exactly."""
    for mine, ref in ((NarrowResNet(tv_resnet.BasicBlock, [2, 2, 2, 2], 64, 1000), torchvision.models.resnet18()),
                      (NarrowResNet(tv_resnet.Bottleneck, [3, 4, 6, 3], 64, 1000), torchvision.models.resnet50())):
        a = [(n, tuple(t.shape)) for n, t in mine.state_dict().items()]
        b = [(n, tuple(t.shape)) for n, t in ref.state_dict().items()]
        assert a == b, "NarrowResNet drifted from torchvision's ResNet"


# ---- safetensors by hand ---------------------------------------------------------------------------
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}


def save_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def run_script(model, x, labels, grad_names, eval_grad_names):
    """The computation the C++ test repeats: train-mode forward, loss, backward; the buffers
    after it; then eval-mode forward, loss, backward."""
    params = dict(model.named_parameters())
    out = {}
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    out["logits_train"], out["loss_train"] = logits.detach(), loss.detach()
    for n in grad_names:
        out[f"grad/{n}"] = params[n].grad.clone()
    for k, b in model.named_buffers():
        out[f"after/{k}"] = b.clone()
    model.zero_grad()
    model.eval()
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    out["logits_eval"], out["loss_eval"] = logits.detach(), loss.detach()
    for n in eval_grad_names:
        out[f"grad_eval/{n}"] = params[n].grad.clone()
    return out


def rel_errors(got, want):
    """Worst error per quantity, as tests/test_model_goldens.cpp measures it: max |a - b| over
    max(max |b|, floor), floor = 1e-3 of the largest gradient for gradients, else 0."""
    grad_scale = max(v.abs().max().item() for k, v in want.items() if k.startswith("grad"))
    worst = {}
    for k, w in want.items():
        if k.endswith("num_batches_tracked"):
            continue
        floor = 1e-3 * grad_scale if k.startswith("grad") else 0.0
        e = ((got[k].double() - w).abs().max() / max(w.abs().max().item(), floor, 1e-300)).item()
        group = k.split("/")[0]
        worst[group] = max(worst.get(group, 0.0), e)
    return worst


def make(name, build, config, image_size):
    torch.manual_seed(1234)
    model = build().double()
    randomize(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    out = {f"state/{k}": v for k, v in state.items()}
    # Batch 4: with 2 images, train-mode batch norm on the 1x1 maps at the end of a stride-32
    # network sees 2 values per channel, maps them to exactly +-1 and passes back gradients that
    # are all eps-driven cancellation (condition number ~1e8): a test of rounding, not of the model.
    # The input is stored in float32 (exactly representable in float64): half the bytes.
    x = torch.randn(4, 3, image_size, image_size, dtype=torch.float32)
    labels = torch.tensor([1, 7, 3, 0], dtype=torch.int64)
    out["input"], out["labels"] = x, labels

    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    names = list(params)
    if total <= MAX_PARAMS_WITH_ALL_GRADS:
        grad_names = names
    else:  # first and last weights, and every small tensor
        grad_names = [n for n in names if n in (names[0], names[-2], names[-1]) or params[n].numel() <= 512]
    eval_grad_names = [names[0], names[-2], names[-1]]
    ref = run_script(model, x.double(), labels, grad_names, eval_grad_names)
    out.update(ref)

    # PyTorch's own float32 error against its float64 result, for the same script: the f32 test
    # holds duet to this (gradients of deep nets with train-mode batch norm on small batches are
    # ill-conditioned; a ReLU or max-pool decision flipped by rounding moves them discretely).
    model32 = build()
    model32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    f32_error = rel_errors(run_script(model32, x, labels, grad_names, eval_grad_names), ref)

    config = dict(config, image_size=image_size, torch=torch.__version__, torchvision=torchvision.__version__)
    path = os.path.join(HERE, "fixtures", f"{name}.safetensors")
    meta = {"config": json.dumps(config), "torch_f32_error": json.dumps(f32_error, sort_keys=True),
            "grads": str(len(grad_names)), "params": str(total)}
    save_safetensors(path, out, meta)
    print(f"{path}: {total} parameters, {len(grad_names)}/{len(names)} gradients, "
          f"{os.path.getsize(path) / 1024:.0f} KiB; torch f32 error: "
          + ", ".join(f"{k} {v:.1e}" for k, v in sorted(f32_error.items())), file=sys.stderr)


def main():
    torch.set_grad_enabled(True)
    check_narrow_resnet_is_torchvision()
    os.makedirs(os.path.join(HERE, "fixtures"), exist_ok=True)
    only = sys.argv[1:]
    for name, (build, config, size) in CONFIGS.items():
        if not only or name in only:
            make(name, build, config, size)


if __name__ == "__main__":
    main()
