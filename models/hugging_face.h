// Weights saved by Hugging Face transformers (model.safetensors) for ViT and DeiT, under duet's
// names, so --init-from takes them as they are published. Both of transformers' layouts are read:
// the one of the published checkpoints (vit.encoder.layer.0.attention.attention.query.weight, ...)
// and the one transformers 5 writes (vit.layers.0.attention.q_proj.weight, ...). The separate
// query, key and value projections become one in_proj_weight [3D, D] (q, k, v), as torch's
// MultiheadAttention and duet's ViT keep them.
//
// Models: ViTForImageClassification (classifier -> heads.head) and
// DeiTForImageClassificationWithTeacher (cls_classifier -> heads.head, distillation_classifier ->
// head_dist: duet's deit_*_distilled). Not representable, and refused with the reason:
// DeiTForImageClassification (a distillation token but one head on the class token only).
// transformers' LayerNorm eps is 1e-12, duet's (torchvision's and timm's) 1e-6: a relative
// difference of about 5e-7 in each normalised value.
#pragma once
#include "engine/serialize.h"

namespace duet::models {

// Whether the names are transformers' (a "vit." or "deit." prefix).
bool is_hugging_face_vit(const NamedTensors& tensors);
// The tensors under duet's names; duet::Error naming the tensor it cannot place.
NamedTensors from_hugging_face_vit(const NamedTensors& tensors);

}  // namespace duet::models
