#!/usr/bin/env python3
"""Writes the fixtures of the models torchvision lacks, from timm (PyPI, in the bench
environment: .venv-bench/bin/python tests/golden/make_timm_goldens.py):

    tests/golden/timm_specs.json          for each full-size model: timm's parameter count and its
                                          (name, shape) list under duet's names
    tests/golden/fixtures/<name>.safetensors
                                          a reduced configuration run once by PyTorch in float64,
                                          in make_model_goldens.py's format (its writer and script
                                          are reused), weights under duet's names

duet's ViT and ConvNeXt keep torchvision's parameter names; timm's are mapped to them by
duet_name below, the same mapping a user's timm checkpoint needs.
"""
import json
import os
import re
import sys

import timm
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_goldens as mg  # noqa: E402  (save_safetensors, run_script, rel_errors, randomize)

HERE = os.path.dirname(os.path.abspath(__file__))

# timm VisionTransformer(Distilled) name -> duet/torchvision name
VIT_NAMES = [
    (r"^cls_token$", "class_token"),
    (r"^dist_token$", "dist_token"),
    (r"^pos_embed$", "encoder.pos_embedding"),
    (r"^patch_embed\.proj\.", "conv_proj."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.encoder_layer_\1.ln_1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.encoder_layer_\1.ln_2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.weight$", r"encoder.layers.encoder_layer_\1.self_attention.in_proj_weight"),
    (r"^blocks\.(\d+)\.attn\.qkv\.bias$", r"encoder.layers.encoder_layer_\1.self_attention.in_proj_bias"),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.encoder_layer_\1.self_attention.out_proj."),
    (r"^blocks\.(\d+)\.mlp\.fc1\.", r"encoder.layers.encoder_layer_\1.mlp.0."),
    (r"^blocks\.(\d+)\.mlp\.fc2\.", r"encoder.layers.encoder_layer_\1.mlp.3."),
    (r"^norm\.", "encoder.ln."),
    (r"^head\.", "heads.head."),
    (r"^head_dist\.", "head_dist."),
]


# timm ConvNeXt (V2: use_grn, no layer scale) -> torchvision's layout: the stem is features.0,
# stage i is features.(2i+1), the downsampling before it features.(2i); in a block, torchvision's
# Sequential indices (dw conv 0, LayerNorm 2, Linear 3, GRN 5, Linear 6).
BLOCK_PARTS = {"conv_dw": "0", "norm": "2", "mlp.fc1": "3", "mlp.grn": "5", "mlp.fc2": "6"}


CONVNEXT_NAMES = [
    (r"^stem\.(\d)\.(.*)$", lambda m: f"features.0.{m[1]}.{m[2]}"),
    (r"^stages\.(\d+)\.downsample\.(\d)\.(.*)$", lambda m: f"features.{2 * int(m[1])}.{m[2]}.{m[3]}"),
    (r"^stages\.(\d+)\.blocks\.(\d+)\.(conv_dw|norm|mlp\.fc1|mlp\.grn|mlp\.fc2)\.(.*)$",
     lambda m: f"features.{2 * int(m[1]) + 1}.{m[2]}.block.{BLOCK_PARTS[m[3]]}.{m[4]}"),
    (r"^head\.(norm|fc)\.(.*)$", lambda m: f"classifier.{0 if m[1] == 'norm' else 2}.{m[2]}"),
]


def convnext_name(name):
    for pattern, to in CONVNEXT_NAMES:
        m = re.match(pattern, name)
        if m:
            return to(m)
    return None


def duet_name(name):
    if name.startswith(("stem.", "stages.", "head.norm.", "head.fc.")):
        mapped = convnext_name(name)
        if mapped:
            return mapped
    for pattern, repl in VIT_NAMES:
        if re.search(pattern, name):
            return re.sub(pattern, repl, name)
    raise SystemExit(f"no duet name for timm parameter {name}")


SPECS = {  # duet name: timm name
    "deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224", "deit_base": "deit_base_patch16_224",
    "deit_tiny_distilled": "deit_tiny_distilled_patch16_224",
    "deit_small_distilled": "deit_small_distilled_patch16_224",
    "deit_base_distilled": "deit_base_distilled_patch16_224",
    "convnextv2_nano": "convnextv2_nano", "convnextv2_tiny": "convnextv2_tiny",
}


def duet_shape(duet, shape):
    """timm builds the small ConvNeXt V2s (atto to nano) with conv_mlp: their MLP 'Linear' weights
    are 1x1 convolutions, [out, in, 1, 1], the same numbers as duet's Linear [out, in]."""
    if re.search(r"\.block\.[36]\.weight$", duet) and len(shape) == 4 and shape[2:] == [1, 1]:
        return shape[:2]
    return shape


def specs():
    out = {"timm_version": timm.__version__, "torch_version": torch.__version__, "models": {}}
    for name, timm_name in SPECS.items():
        with torch.device("meta"):
            m = timm.create_model(timm_name, pretrained=False)
        out["models"][name] = {
            "timm_name": timm_name,
            "num_parameters": sum(p.numel() for p in m.parameters()),
            "parameters": sorted([duet_name(n), duet_shape(duet_name(n), list(p.shape))]
                                 for n, p in m.named_parameters()),
        }
    path = os.path.join(HERE, "timm_specs.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{path}: {len(out['models'])} models", file=sys.stderr)


class Renamed(torch.nn.Module):
    """A timm model whose named_parameters/buffers/state_dict speak duet's names, so that
    make_model_goldens' script and writer serve it unchanged."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)

    def named_parameters(self, *args, **kwargs):
        return [(duet_name(n), p) for n, p in self.inner.named_parameters()]

    def named_buffers(self, *args, **kwargs):
        return [(duet_name(n), b) for n, b in self.inner.named_buffers()]

    def state_dict(self, *args, **kwargs):
        return {duet_name(n): t for n, t in self.inner.state_dict().items()}

    def load_state_dict(self, state, strict=True):
        back = {n: None for n in self.inner.state_dict()}
        by_duet = {duet_name(n): n for n in back}
        return self.inner.load_state_dict({by_duet[k]: v for k, v in state.items()}, strict=strict)


def deit_distilled_reduced():
    inner = timm.models.deit.VisionTransformerDistilled(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                                                        mlp_ratio=2.0, num_classes=10)
    return Renamed(inner)


def convnextv2_reduced():
    return Renamed(timm.models.convnext.ConvNeXt(num_classes=10, depths=(2, 1, 1, 1), dims=(8, 12, 16, 24),
                                                 ls_init_value=None, use_grn=True, drop_path_rate=0.0))


FIXTURES = {
    "deit_distilled": (deit_distilled_reduced,
                       {"image_size": 16, "patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 32,
                        "mlp_dim": 64, "num_classes": 10, "distilled": True, "timm": timm.__version__}, 16),
    "convnextv2": (convnextv2_reduced,
                   {"stages": [[8, 2], [12, 1], [16, 1], [24, 1]], "stochastic_depth_prob": 0.0, "version": 2,
                    "num_classes": 10, "timm": timm.__version__}, 32),
}


def main():
    torch.set_grad_enabled(True)
    specs()
    os.makedirs(os.path.join(HERE, "fixtures"), exist_ok=True)
    for name, (build, config, size) in FIXTURES.items():
        mg.make(name, build, config, size)


if __name__ == "__main__":
    main()
