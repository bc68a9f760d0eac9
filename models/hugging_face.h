// Weights saved by Hugging Face transformers (model.safetensors) for ViT, DeiT, ConvNeXt and
// ConvNeXt V2, under duet's names, so --init-from takes them as they are published.
//
// ViT and DeiT. Both of transformers' layouts are read: the one of the published checkpoints
// (vit.encoder.layer.0.attention.attention.query.weight, ...) and the one transformers 5 writes
// (vit.layers.0.attention.q_proj.weight, ...). The separate query, key and value projections become
// one in_proj_weight [3D, D] (q, k, v), as torch's MultiheadAttention and duet's ViT keep them.
//
// Models: ViTForImageClassification (classifier -> heads.head) and
// DeiTForImageClassificationWithTeacher (cls_classifier -> heads.head, distillation_classifier ->
// head_dist: duet's deit_*_distilled). Not representable, and refused with the reason:
// DeiTForImageClassification (a distillation token but one head on the class token only).
// transformers' LayerNorm eps is 1e-12, duet's (torchvision's and timm's) 1e-6: a relative
// difference of about 5e-7 in each normalised value.
//
// ConvNeXt: ConvNextForImageClassification (names under "convnext.") into duet's V1 (convnext_*)
// and ConvNextV2ForImageClassification ("convnextv2.") into duet's V2 (convnextv2_*). The published
// checkpoints (facebook/convnext-tiny-224, facebook/convnextv2-tiny-1k-224, ...) and transformers
// 5's save_pretrained use the same names. transformers' stage i (encoder.stages.i.layers.j) is
// duet's (torchvision's) features.(2i+1).j, and the downsampling layer that transformers keeps at
// the start of stages 1, 2, ... is features.(2i). In a block, dwconv, layernorm and pwconv1 are
// block.0, block.2 and block.3; V1's pwconv2 is block.5, V2's grn and pwconv2 are block.5 and
// block.6; layer_scale_parameter is layer_scale. The final layernorm (on the pooled features) is
// classifier.0, the classifier classifier.2. The pointwise convs are Linear in both, so they keep
// their shapes; two tensors are reshaped: layer_scale_parameter [C] to [C, 1, 1] (transformers
// scales the NHWC branch, torchvision the NCHW one: the same products) and the GRN's weight and
// bias [1, 1, 1, C] (broadcast over NHWC) to [C]. A V1 built with layer_scale_init_value 0 has no
// layer scale at all: its blocks get a layer_scale of 1, which multiplies exactly.
// Not in the file, and so not checked: the activation (duet's is GELU with erf, transformers'
// default hidden_act "gelu") and the final LayerNorm's eps, transformers' config layer_norm_eps
// (1e-12 by default and in the published configs) where duet's classifier.0 has torchvision's 1e-6
// (ConvNeXtConfig::head_norm_eps): each normalised pooled feature differs by a relative 5e-7 / var,
// var being the pooled features' variance over the channels (5e-6 for a var of 0.1). Widths,
// depths and patch size are checked by the loader (names and shapes). Refused, naming the tensor:
// other models' parts (a V1 file with a GRN, a pooler, ConvNextBackbone's hidden_states_norms).
// A bare ConvNextModel's names have no prefix, so they reach the loader as unexpected names.
#pragma once
#include "engine/serialize.h"

namespace duet::models {

// Whether the names are transformers' (a "vit." or "deit." prefix).
bool is_hugging_face_vit(const NamedTensors& tensors);
// The tensors under duet's names; duet::Error naming the tensor it cannot place.
NamedTensors from_hugging_face_vit(const NamedTensors& tensors);

// Which ConvNeXt transformers' names describe: 1 for a "convnext." prefix
// (ConvNextForImageClassification), 2 for "convnextv2." (ConvNextV2ForImageClassification), 0 for
// neither.
int hugging_face_convnext_version(const NamedTensors& tensors);
// The tensors under duet's names (ConvNeXtConfig::version as hugging_face_convnext_version says);
// duet::Error naming the tensor it cannot place, or the tensors a block, stage or the stem lacks.
NamedTensors from_hugging_face_convnext(const NamedTensors& tensors);

}  // namespace duet::models
