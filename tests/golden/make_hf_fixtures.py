#!/usr/bin/env python3
"""Writes tests/golden/fixtures/hf_<name>.safetensors: small ViT and DeiT models of Hugging Face
transformers (PyPI, in the bench environment:
    .venv-bench/bin/python tests/golden/make_hf_fixtures.py), randomly initialised, saved by
transformers' own save_pretrained (its model.safetensors, byte for byte, as published models
are), and hf_<name>.check.safetensors beside each: a fixed input, transformers' eval-mode logits
and the configuration, so tests/test_model_goldens.cpp checks that duet's Hugging Face import
(models/hugging_face.h) reproduces transformers' model.

save_pretrained writes the layout of the published checkpoints
(vit.encoder.layer.0.attention.attention.query.weight, ...); hf_vit_state_dict.safetensors holds
the same ViT under the names transformers 5 uses in memory (vit.layers.0.attention.q_proj.weight,
...), which a user's own torch.save of model.state_dict() has.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, num_labels=10)

def duet_config(distilled):
    """SMALL in the keys tests/test_model_goldens.cpp's ViT builder reads."""
    return {"image_size": SMALL["image_size"], "patch_size": SMALL["patch_size"],
            "num_layers": SMALL["num_hidden_layers"], "num_heads": SMALL["num_attention_heads"],
            "hidden_dim": SMALL["hidden_size"], "mlp_dim": SMALL["intermediate_size"],
            "num_classes": SMALL["num_labels"], "distilled": distilled, "norm_eps": 1e-12}


def make(name, model, config):
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():  # zero-initialised biases and heads would hide a misplaced tensor
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    model.eval()
    x = torch.randn(3, 3, SMALL["image_size"], SMALL["image_size"])
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    path = os.path.join(HERE, "fixtures", f"{name}.safetensors")
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        shutil.copyfile(os.path.join(d, "model.safetensors"), path)
    meta = {"config": json.dumps(config), "transformers": transformers.__version__}
    save_check(name, x, logits, meta)
    print(f"{path}: {len(load_file(path))} tensors", file=sys.stderr)
    return model, x, logits, meta


def save_check(name, x, logits, meta):
    save_file({"input": x.contiguous(), "logits": logits.contiguous()},
              os.path.join(HERE, "fixtures", f"{name}.check.safetensors"), metadata=meta)


def main():
    torch.set_grad_enabled(True)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(**SMALL))
    model, x, logits, meta = make("hf_vit", vit, duet_config(distilled=False))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(HERE, "fixtures", "hf_vit_state_dict.safetensors"))
    save_check("hf_vit_state_dict", x, logits, meta)
    deit = transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**SMALL))
    make("hf_deit_distilled", deit, duet_config(distilled=True))


if __name__ == "__main__":
    main()
