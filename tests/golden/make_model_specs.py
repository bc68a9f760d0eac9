#!/usr/bin/python3
"""Writes tests/golden/torchvision_specs.json: for each torchvision model duet reproduces, the
ordered (name, shape) lists of its parameters and buffers and its parameter count, so
tests/test_models.cpp checks duet's names against torchvision's without needing torch at run time.
The large models (BIG) are stored compactly: the count, the number of tensors and an FNV-1a hash
of the listing "name [shape]\n" per parameter, "--buffers--\n", then one line per buffer.

Run with Debian's torch/torchvision (apt-get install python3-torch python3-torchvision):
    /usr/bin/python3 tests/golden/make_model_specs.py
"""
import json
import os
import sys

import torch
import torchvision

MODELS = [
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "wide_resnet50_2",
    "densenet121", "densenet161", "densenet169", "densenet201",
    "mobilenet_v2",
    "vit_b_16", "vit_b_32",
    "convnext_tiny",
]
BIG = ["resnext101_32x8d", "wide_resnet101_2", "vit_l_16", "vit_l_32", "vit_h_14", "convnext_small",
       "convnext_base", "convnext_large"]


def fnv1a64(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def listing(model):
    line = lambda n, t: f"{n} [{', '.join(str(d) for d in t.shape)}]\n"
    text = "".join(line(n, p) for n, p in model.named_parameters()) + "--buffers--\n"
    return text + "".join(line(n, b) for n, b in model.named_buffers())


def build(name):
    # Meta tensors where torch has them (2.x): shapes without memory or init time.
    with torch.device("meta") if hasattr(torch.device, "__enter__") else _NullCtx():
        return getattr(torchvision.models, name)(weights=None)


def big_spec(name):
    model = build(name)
    return {"num_parameters": sum(p.numel() for p in model.parameters()),
            "num_tensors": len(list(model.parameters())) + len(list(model.buffers())),
            "listing_fnv1a64": fnv1a64(listing(model))}


def spec(name):
    model = build(name)
    params = [[n, list(p.shape)] for n, p in model.named_parameters()]
    buffers = [[n, list(b.shape)] for n, b in model.named_buffers()]
    return {
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "parameters": params,
        "buffers": buffers,
    }


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_specs.json")
    specs = {name: spec(name) for name in MODELS}
    # One tensor per line: the file stays small, diffable and readable.
    lines = ["{", f'  "torch_version": "{torch.__version__}",', f'  "torchvision_version": "{torchvision.__version__}",',
             '  "models": {']
    for i, (name, s) in enumerate(specs.items()):
        lines.append(f'    "{name}": {{')
        lines.append(f'      "num_parameters": {s["num_parameters"]},')
        for key in ("parameters", "buffers"):
            lines.append(f'      "{key}": [')
            entries = [f"        {json.dumps(e)}" for e in s[key]]
            lines.append(",\n".join(entries))
            lines.append("      ]" + ("," if key == "parameters" else ""))
        lines.append("    }" + ("," if i + 1 < len(specs) else ""))
    lines.append("  },")
    lines.append('  "big_models": {')
    big = [f'    "{name}": {json.dumps(big_spec(name))}' for name in BIG]
    lines.append(",\n".join(big))
    lines += ["  }", "}", ""]
    with open(out, "w") as f:
        f.write("\n".join(lines))
    json.load(open(out))  # the hand-written layout must still be valid JSON
    print(f"wrote {out}: {len(specs)} models listed, {len(BIG)} hashed", file=sys.stderr)


if __name__ == "__main__":
    main()
