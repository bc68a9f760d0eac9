#!/usr/bin/python3
"""Exports a torchvision model's weights to .safetensors with torchvision's tensor names, which are
duet's names for the same architecture (see docs/models.md), so duet loads them with
load_state_dict / load_backbone.

    /usr/bin/python3 scripts/export_torchvision.py resnet18 resnet18.safetensors                       # random init
    /usr/bin/python3 scripts/export_torchvision.py resnet18 resnet18.safetensors --weights DEFAULT     # torchvision's
    /usr/bin/python3 scripts/export_torchvision.py resnet18 r18.safetensors --weights my_resnet18.pth  # your checkpoint

--weights takes a torchvision weights name (DEFAULT, IMAGENET1K_V1, ...: torchvision downloads it,
or finds it in the torch hub cache) or a file saved with torch.save (a state_dict, or a dict
holding one under "state_dict" / "model", or a whole model). --reference also writes
<out>.reference.safetensors with a fixed input and the model's eval-mode logits, to check an
import in duet. Needs only torch and torchvision (Debian: python3-torch python3-torchvision); the
safetensors file is written by hand with json + struct.
"""
import argparse
import json
import os
import struct
import sys
import tempfile

import torch
import torchvision

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}
CAST = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: same bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata):
    """Writes the safetensors format (8-byte little-endian header length, JSON header padded to a
    multiple of 8, raw little-endian data) to a temporary file and renames it into place."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise SystemExit(f"export: tensor '{name}' has dtype {t.dtype}, which safetensors/duet do not support")
        data = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".export-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def build(name, weights, num_classes):
    builder = getattr(torchvision.models, name, None)
    if builder is None or not callable(builder):
        raise SystemExit(f"export: torchvision has no model '{name}'")
    kwargs = {}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    if weights is None or os.path.exists(weights):
        model = builder(weights=None, **kwargs)
        if weights is not None:
            obj = torch.load(weights, map_location="cpu")
            if isinstance(obj, torch.nn.Module):
                obj = obj.state_dict()
            for key in ("state_dict", "model"):
                if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
                    obj = obj[key]
            obj = {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items()}  # DataParallel
            model.load_state_dict(obj)
        return model
    # A torchvision weights name: the builder resolves "DEFAULT" / "IMAGENET1K_V1" itself.
    return builder(weights=weights, **kwargs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="torchvision model name: resnet18, densenet121, mobilenet_v2, vit_b_16, convnext_tiny, ...")
    p.add_argument("out", help="output .safetensors path")
    p.add_argument("--weights", help="torchvision weights name (DEFAULT, IMAGENET1K_V1, ...) or a torch.save file")
    p.add_argument("--num-classes", type=int, help="classifier size (only without pretrained weights)")
    p.add_argument("--dtype", choices=sorted(CAST), default="f32", help="floating-point dtype to store (default f32)")
    p.add_argument("--reference", action="store_true", help="also write <out>.reference.safetensors: input and logits")
    p.add_argument("--image-size", type=int, default=224, help="input size for --reference (default 224)")
    a = p.parse_args()

    model = build(a.model, a.weights, a.num_classes).eval()
    state = {}
    for name, t in model.state_dict().items():  # parameters and buffers, num_batches_tracked included
        state[name] = t.to(CAST[a.dtype]) if t.is_floating_point() else t
    meta = {"source": "torchvision", "model": a.model, "weights": a.weights or "none",
            "torch_version": torch.__version__, "torchvision_version": torchvision.__version__}
    save_safetensors(a.out, state, meta)
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.out}: {a.model}, {len(state)} tensors, {n} parameters, {a.dtype}", file=sys.stderr)

    if a.reference:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 3, a.image_size, a.image_size, generator=g)
        with torch.no_grad():
            logits = model(x)
        ref = os.path.splitext(a.out)[0] + ".reference.safetensors"
        save_safetensors(ref, {"input": x, "logits": logits}, dict(meta, mode="eval"))
        print(f"{ref}: input {list(x.shape)}, eval-mode logits {list(logits.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main()
