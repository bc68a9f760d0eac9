#!/usr/bin/python3
"""Writes tests/golden/fixtures/vit_pos_interp.safetensors: a random ViT position embedding
[1, 1 + 5*5, 6] and torchvision's interpolate_embeddings of it to grids 2, 3, 8 and 13 (down and
up), in float64. tests/test_model_goldens.cpp checks models::interpolate_pos_embedding against it.

    /usr/bin/python3 tests/golden/make_vit_pos_interp.py     (Debian's python3-torch/torchvision)
"""
import os
from collections import OrderedDict

import torch
from torchvision.models.vision_transformer import interpolate_embeddings

from make_model_goldens import HERE, save_safetensors

torch.manual_seed(7)
pos = torch.randn(1, 1 + 5 * 5, 6, dtype=torch.float64)
tensors = {"pos_embedding": pos}
for grid in (2, 3, 8, 13):
    state = interpolate_embeddings(grid * 4, 4, OrderedDict([("encoder.pos_embedding", pos.clone())]))
    tensors[f"grid{grid}"] = state["encoder.pos_embedding"]
save_safetensors(os.path.join(HERE, "fixtures", "vit_pos_interp.safetensors"), tensors,
                 {"torch": torch.__version__, "source": "torchvision interpolate_embeddings, bicubic"})
print("wrote", {k: list(v.shape) for k, v in tensors.items()})
