#!/usr/bin/env python3
"""Writes tests/golden/fixtures/hf_<name>.safetensors: small ViT, DeiT, ConvNeXt and ConvNeXt V2
models of Hugging Face transformers (PyPI, in the bench environment:
    .venv-bench/bin/python tests/golden/make_hf_fixtures.py), randomly initialised, saved by
transformers' own save_pretrained (its model.safetensors, byte for byte, as published models
are), and hf_<name>.check.safetensors beside each: a fixed input, transformers' eval-mode logits
and the configuration, so tests/test_model_goldens.cpp checks that duet's Hugging Face import
(models/hugging_face.h) reproduces transformers' model.

save_pretrained writes the layout of the published checkpoints
(vit.encoder.layer.0.attention.attention.query.weight, ...); hf_vit_state_dict.safetensors holds
the same ViT under the names transformers 5 uses in memory (vit.layers.0.attention.q_proj.weight,
...), which a user's own torch.save of model.state_dict() has. ConvNeXt's names are the same in
both (convnext.encoder.stages.0.layers.0.dwconv.weight, ...); hf_convnext_no_layer_scale is a
ConvNeXt V1 built with layer_scale_init_value 0, which has no layer_scale_parameter at all.
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
# Three stages, so that the stage arithmetic (transformers' stages.i is duet's features.2i+1, its
# downsampling layer features.2i) is tested past the first downsampling; 32x32 gives 8x8, 4x4, 2x2.
SMALL_CONVNEXT = dict(num_channels=3, patch_size=4, num_stages=3, hidden_sizes=[8, 12, 16], depths=[2, 1, 1],
                      image_size=32, num_labels=10)

def duet_config(distilled):
    """SMALL in the keys tests/test_model_goldens.cpp's ViT builder reads."""
    return {"image_size": SMALL["image_size"], "patch_size": SMALL["patch_size"],
            "num_layers": SMALL["num_hidden_layers"], "num_heads": SMALL["num_attention_heads"],
            "hidden_dim": SMALL["hidden_size"], "mlp_dim": SMALL["intermediate_size"],
            "num_classes": SMALL["num_labels"], "distilled": distilled, "norm_eps": 1e-12}


def duet_convnext_config(version, hf_config):
    """SMALL_CONVNEXT in the keys of tests/test_model_goldens.cpp's ConvNeXt builder. transformers'
    final LayerNorm (duet's classifier.0) uses the config's layer_norm_eps (1e-12), duet's 1e-6."""
    return {"version": version, "stages": [[c, d] for c, d in zip(SMALL_CONVNEXT["hidden_sizes"], SMALL_CONVNEXT["depths"])],
            "stochastic_depth_prob": 0.0, "num_classes": SMALL_CONVNEXT["num_labels"],
            "head_norm_eps": hf_config.layer_norm_eps}


def make(name, model, config, image_size=SMALL["image_size"], batch=3):
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():  # zero-initialised biases and heads would hide a misplaced tensor
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    model.eval()
    x = torch.randn(batch, 3, image_size, image_size)
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
    # The random init above also gives GRN and layer scale values far from transformers' zeros and
    # 1e-6, so a misplaced one changes the logits. Two images keep the check files small.
    for name, model_class, config_class, version, extra in [
            ("hf_convnext", transformers.ConvNextForImageClassification, transformers.ConvNextConfig, 1, {}),
            ("hf_convnext_no_layer_scale", transformers.ConvNextForImageClassification, transformers.ConvNextConfig, 1,
             {"layer_scale_init_value": 0.0}),
            ("hf_convnextv2", transformers.ConvNextV2ForImageClassification, transformers.ConvNextV2Config, 2, {})]:
        hf_config = config_class(**SMALL_CONVNEXT, **extra)
        make(name, model_class(hf_config), duet_convnext_config(version, hf_config),
             image_size=SMALL_CONVNEXT["image_size"], batch=2)


if __name__ == "__main__":
    main()
