// Vision Transformer (Dosovitskiy et al. 2020) as torchvision builds it: strided-conv patch
// embedding, class token, learned position embedding, pre-norm encoder blocks, head on the class
// token; torchvision's names (conv_proj, class_token, encoder.pos_embedding,
// encoder.layers.encoder_layer_0.self_attention.in_proj_weight, ..., heads.head).
//
// DeiT (Touvron et al. 2021) is this network trained differently; its distilled variant adds a
// distillation token after the class token and a second head on it (dist_token, head_dist, timm's
// names), and predicts the mean of the two heads, as timm's VisionTransformerDistilled does outside
// distillation training.
#pragma once
#include <memory>
#include <string>
#include "engine/nn/layers.h"

namespace duet::models {

struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t hidden_dim = 768;
  int64_t mlp_dim = 3072;
  double dropout = 0.0;            // after the embedding, attention output and MLP layers
  double attention_dropout = 0.0;  // on the attention weights
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  double norm_eps = 1e-6;          // torchvision's LayerNorm eps
  bool distilled = false;          // DeiT's distillation token and head
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

// torch.nn.MultiheadAttention (batch_first, self-attention, need_weights=False) written with
// engine ops so each step is its own profiler entry: linear (qkv), views, matmul (q k^T),
// softmax, matmul (attn v), linear (out_proj). Parameters: in_proj_weight [3D, D],
// in_proj_bias [3D], out_proj.{weight, bias}.
class MultiheadSelfAttention : public nn::Module {
public:
  MultiheadSelfAttention(int64_t dim, int64_t num_heads, double attention_dropout, bool init = true);
  Tensor forward(const Tensor& x) override;  // x [N, S, D] -> [N, S, D]
  std::string type_name() const override { return "MultiheadAttention"; }
  std::string extra_repr() const override;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<nn::Linear> out_proj;
  int64_t dim, num_heads;
  double attention_dropout;
};

// x + attn(ln_1(x)), then + mlp(ln_2(.)); mlp = Linear, GELU (erf), Dropout, Linear, Dropout.
class EncoderBlock : public nn::Module {
public:
  EncoderBlock(int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim, double dropout, double attention_dropout,
               double eps, bool init = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "EncoderBlock"; }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadSelfAttention> self_attention;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Sequential> mlp;
};

class Encoder : public nn::Module {
public:
  Encoder(int64_t seq_length, int64_t num_layers, int64_t num_heads, int64_t hidden_dim, int64_t mlp_dim,
          double dropout, double attention_dropout, double eps, bool init = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Encoder"; }
  Tensor pos_embedding;  // [1, seq_length, hidden_dim]
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Sequential> layers;  // encoder_layer_0, ...
  std::shared_ptr<nn::LayerNorm> ln;
};

class VisionTransformer : public nn::Module {
public:
  explicit VisionTransformer(const ViTConfig& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "VisionTransformer"; }
  ViTConfig config;
  Tensor class_token;  // [1, 1, hidden_dim]
  Tensor dist_token;   // [1, 1, hidden_dim], distilled only
  std::shared_ptr<nn::Conv2d> conv_proj;
  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<nn::Sequential> heads;  // "head": Linear on the class token
  std::shared_ptr<nn::Linear> head_dist;  // distilled only: Linear on the distillation token
  int64_t prefix_tokens() const { return config.distilled ? 2 : 1; }
};

// Presets: torchvision's "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14" (224 px),
// duet's "vit_tiny", "vit_small", "vit_base" (192/384/768 wide, 12 layers, 3/6/12 heads) with a
// "_p<patch>" suffix ("vit_tiny_p4": patch 4, default image size 32; "_p16": 224), and DeiT's
// "deit_tiny", "deit_small", "deit_base" and their "_distilled" variants (patch 16, 224 px, timm's
// deit_*_patch16_224). image_size 0 keeps the preset's; the image size must be a multiple of the
// patch size.
ViTConfig vit_config(const std::string& name, int64_t num_classes, int64_t image_size = 0);
std::shared_ptr<VisionTransformer> vit(const std::string& name, int64_t num_classes, int64_t image_size = 0);

// Pretrained weights for another image size (torchvision's interpolate_embeddings): the embeddings
// of the `prefix` tokens (the class token; DeiT's distillation token too) are kept and the grid of
// patch embeddings, [1, prefix + g*g, D], is resized to new_grid x new_grid by bicubic
// interpolation (A = -0.75, align_corners=True), as torchvision does, so a checkpoint fine-tuned
// at 224 px can start a 32 px run and match PyTorch. Computed on the host in double; returns the
// input's dtype on the input's device.
Tensor interpolate_pos_embedding(const Tensor& pos_embedding, int64_t new_grid, int64_t prefix = 1);

}  // namespace duet::models
