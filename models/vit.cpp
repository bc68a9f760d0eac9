// Vision Transformer (torchvision/models/vision_transformer.py), attention included.
#include "models/vit.h"
#include <algorithm>
#include <cmath>
#include <regex>
#include "engine/allocator.h"
#include "engine/autograd.h"

namespace duet::models {

namespace {
Tensor new_parameter(const Shape& shape) {
  MemTagGuard tag(MemTag::parameter);
  return Tensor::zeros(shape);
}
std::string shape_or_undefined(const Tensor& x) { return x.defined() ? shape_str(x.shape()) : "undefined"; }
}  // namespace

// ---- attention -----------------------------------------------------------------------------------
MultiheadSelfAttention::MultiheadSelfAttention(int64_t dim_, int64_t heads, double attn_dropout, bool init)
    : dim(dim_), num_heads(heads), attention_dropout(attn_dropout) {
  DUET_CHECK(dim_ >= 1 && heads >= 1 && dim_ % heads == 0,
             "MultiheadAttention: embed_dim={} and num_heads={}: expected num_heads >= 1 dividing embed_dim", dim_, heads);
  DUET_CHECK(attn_dropout >= 0 && attn_dropout < 1, "MultiheadAttention: dropout {} given, expected [0, 1)",
             attn_dropout);
  // torch.nn.MultiheadAttention._reset_parameters: xavier-uniform in_proj, zero biases; out_proj
  // keeps nn.Linear's default weight.
  in_proj_weight = register_parameter("in_proj_weight", new_parameter({3 * dim_, dim_}));
  in_proj_bias = register_parameter("in_proj_bias", new_parameter({3 * dim_}));
  out_proj = register_module("out_proj", std::make_shared<nn::Linear>(dim_, dim_));
  if (init) {
    nn::xavier_uniform_(in_proj_weight);
    out_proj->bias.zero_();
  }
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 3 && x.size(2) == dim,
             "MultiheadAttention: input has shape {}, expected [N, S, {}]", shape_or_undefined(x), dim);
  // One GEMM for q, k and v side by side, then the heads' attention (engine/ops/attention.cpp).
  const Tensor qkv = linear(x, in_proj_weight, in_proj_bias);
  return (*out_proj)(attention(qkv, num_heads, attention_dropout, is_training()));
}

std::string MultiheadSelfAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, dropout={}, batch_first=True", dim, num_heads, attention_dropout);
}

// ---- encoder -------------------------------------------------------------------------------------
EncoderBlock::EncoderBlock(int64_t heads, int64_t hidden, int64_t mlp_dim, double drop, double attn_drop, double eps,
                           bool init) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(hidden, eps));
  self_attention = register_module("self_attention", std::make_shared<MultiheadSelfAttention>(hidden, heads, attn_drop, init));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(drop));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(hidden, eps));
  mlp = register_module("mlp", std::make_shared<nn::Sequential>());
  auto fc1 = std::make_shared<nn::Linear>(hidden, mlp_dim), fc2 = std::make_shared<nn::Linear>(mlp_dim, hidden);
  mlp->push_back(fc1);
  mlp->push_back(nn::GELU());
  mlp->push_back(std::make_shared<nn::Dropout>(drop));
  mlp->push_back(fc2);
  mlp->push_back(std::make_shared<nn::Dropout>(drop));
  // torchvision's MLPBlock: xavier-uniform weights, N(0, 1e-6) biases.
  for (const auto& fc : {fc1, fc2}) {
    if (!init) break;
    nn::xavier_uniform_(fc->weight);
    nn::normal_(fc->bias, 0.0, 1e-6);
  }
}

Tensor EncoderBlock::forward(const Tensor& x) {
  const Tensor h = add((*dropout)((*self_attention)((*ln_1)(x))), x);
  return add(h, (*mlp)((*ln_2)(h)));
}

Encoder::Encoder(int64_t seq_length, int64_t num_layers, int64_t heads, int64_t hidden, int64_t mlp_dim, double drop,
                 double attn_drop, double eps, bool init) {
  pos_embedding = register_parameter("pos_embedding", new_parameter({1, seq_length, hidden}));
  if (init) nn::normal_(pos_embedding, 0.0, 0.02);  // from BERT, as torchvision
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(drop));
  layers = register_module("layers", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < num_layers; ++i)
    layers->push_back(fmt::format("encoder_layer_{}", i),
                      std::make_shared<EncoderBlock>(heads, hidden, mlp_dim, drop, attn_drop, eps, init));
  ln = register_module("ln", std::make_shared<nn::LayerNorm>(hidden, eps));
}

Tensor Encoder::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 3 && x.size(1) == pos_embedding.size(1) && x.size(2) == pos_embedding.size(2),
             "Encoder: input has shape {}, expected [N, {}, {}]", shape_or_undefined(x), pos_embedding.size(1),
             pos_embedding.size(2));
  return (*ln)((*layers)((*dropout)(add(x, pos_embedding))));
}

// ---- the network ---------------------------------------------------------------------------------
VisionTransformer::VisionTransformer(const ViTConfig& cfg) : config(cfg) {
  DUET_CHECK(cfg.patch_size >= 1 && cfg.image_size >= cfg.patch_size && cfg.image_size % cfg.patch_size == 0,
             "VisionTransformer: image_size={} and patch_size={}: expected the image size to be a positive multiple of "
             "the patch size",
             cfg.image_size, cfg.patch_size);
  DUET_CHECK(cfg.num_layers >= 1 && cfg.hidden_dim >= 1 && cfg.mlp_dim >= 1 && cfg.num_classes >= 1 &&
                 cfg.in_channels >= 1,
             "VisionTransformer: num_layers={}, hidden_dim={}, mlp_dim={}, num_classes={}, in_channels={}: expected "
             "all >= 1",
             cfg.num_layers, cfg.hidden_dim, cfg.mlp_dim, cfg.num_classes, cfg.in_channels);
  const int64_t D = cfg.hidden_dim;
  // Registered in torchvision's order: parameters of this module first (class_token), then
  // conv_proj, encoder, heads.
  class_token = register_parameter("class_token", new_parameter({1, 1, D}));
  if (cfg.distilled) dist_token = register_parameter("dist_token", new_parameter({1, 1, D}));
  conv_proj = register_module("conv_proj", std::make_shared<nn::Conv2d>(
                                               cfg.in_channels, D, cfg.patch_size,
                                               nn::Conv2dOptions{.stride = cfg.patch_size}));
  const int64_t side = cfg.image_size / cfg.patch_size;
  encoder = register_module("encoder", std::make_shared<Encoder>(side * side + prefix_tokens(), cfg.num_layers, cfg.num_heads, D,
                                                                 cfg.mlp_dim, cfg.dropout, cfg.attention_dropout,
                                                                 cfg.norm_eps, cfg.init));
  heads = register_module("heads", std::make_shared<nn::Sequential>());
  auto head = std::make_shared<nn::Linear>(D, cfg.num_classes);
  heads->push_back("head", head);
  if (cfg.distilled) head_dist = register_module("head_dist", std::make_shared<nn::Linear>(D, cfg.num_classes));

  // torchvision: conv_proj truncated-normal with std sqrt(1 / fan_in) and zero bias; class
  // token zero; head zero (so a fresh model starts at uniform predictions).
  if (cfg.init) {
    nn::trunc_normal_(conv_proj->weight, std::sqrt(1.0 / static_cast<double>(nn::fan_in(conv_proj->weight))));
    conv_proj->bias.zero_();
    head->weight.zero_();
    head->bias.zero_();
    if (cfg.distilled) {  // timm's: the distillation token like the position embedding, the head like any Linear
      nn::trunc_normal_(dist_token, 0.02);
      nn::trunc_normal_(head_dist->weight, 0.02);
      head_dist->bias.zero_();
    }
  }
}

Tensor VisionTransformer::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == config.in_channels && x.size(2) == config.image_size &&
                 x.size(3) == config.image_size,
             "VisionTransformer: input has shape {}, expected [N, {}, {}, {}] (the position embedding fixes the image "
             "size)",
             shape_or_undefined(x), config.in_channels, config.image_size, config.image_size);
  const int64_t N = x.size(0), D = config.hidden_dim;
  // [N, D, h, w] -> [N, h*w, D]: one token per patch.
  const Tensor patches = (*conv_proj)(x).reshape({N, D, -1}).permute({0, 2, 1});
  if (!config.distilled) {
    const Tensor tokens = cat({class_token.expand({N, -1, -1}), patches}, 1);
    return (*heads)((*encoder)(tokens).select(1, 0));
  }
  const Tensor tokens = cat({class_token.expand({N, -1, -1}), dist_token.expand({N, -1, -1}), patches}, 1);
  const Tensor h = (*encoder)(tokens);
  return mul(add((*heads)(h.select(1, 0)), (*head_dist)(h.select(1, 1))), 0.5);
}

ViTConfig vit_config(const std::string& name, int64_t num_classes, int64_t image_size) {
  ViTConfig c;
  std::smatch m;
  static const std::regex duet_preset("vit_(tiny|small|base)_p([0-9]+)");
  static const std::regex tv_preset("vit_([bhl])_([0-9]+)");
  static const std::regex deit_preset("deit_(tiny|small|base)(_distilled)?");
  if (std::regex_match(name, m, deit_preset)) {
    const std::string size = m[1];
    c.patch_size = 16;
    c.image_size = 224;
    c.num_layers = 12;
    if (size == "tiny") c.hidden_dim = 192, c.num_heads = 3;
    else if (size == "small") c.hidden_dim = 384, c.num_heads = 6;
    else c.hidden_dim = 768, c.num_heads = 12;
    c.mlp_dim = 4 * c.hidden_dim;
    c.distilled = m[2].matched;
  } else if (std::regex_match(name, m, duet_preset)) {
    const std::string size = m[1];
    c.patch_size = std::stoll(m[2]);
    c.image_size = c.patch_size <= 8 ? 32 : 224;
    c.num_layers = 12;
    if (size == "tiny") c.hidden_dim = 192, c.num_heads = 3;
    else if (size == "small") c.hidden_dim = 384, c.num_heads = 6;
    else c.hidden_dim = 768, c.num_heads = 12;
    c.mlp_dim = 4 * c.hidden_dim;
  } else if (std::regex_match(name, m, tv_preset) &&
             (name == "vit_b_16" || name == "vit_b_32" || name == "vit_l_16" || name == "vit_l_32" || name == "vit_h_14")) {
    const std::string size = m[1];
    c.patch_size = std::stoll(m[2]);
    c.image_size = 224;
    if (size == "b") c.num_layers = 12, c.num_heads = 12, c.hidden_dim = 768, c.mlp_dim = 3072;
    else if (size == "l") c.num_layers = 24, c.num_heads = 16, c.hidden_dim = 1024, c.mlp_dim = 4096;
    else c.num_layers = 32, c.num_heads = 16, c.hidden_dim = 1280, c.mlp_dim = 5120;
  } else {
    throw Error(fmt::format("vit: unknown configuration '{}': expected vit_b_16, vit_b_32, vit_l_16, vit_l_32, "
                            "vit_h_14, vit_tiny_p<patch>, vit_small_p<patch>, vit_base_p<patch> (e.g. vit_tiny_p4), "
                            "deit_tiny, deit_small, deit_base, or deit_<size>_distilled",
                            name));
  }
  if (image_size > 0) c.image_size = image_size;
  c.num_classes = num_classes;
  return c;
}

std::shared_ptr<VisionTransformer> vit(const std::string& name, int64_t num_classes, int64_t image_size) {
  return std::make_shared<VisionTransformer>(vit_config(name, num_classes, image_size));
}

// ---- position embeddings for another image size ------------------------------------------------
namespace {
// Keys' cubic convolution kernel with A = -0.75, PyTorch's choice for bicubic upsampling.
double cubic_inner(double x) { return ((1.25 * x - 2.25) * x) * x + 1.0; }                // |x| <= 1
double cubic_outer(double x) { return ((-0.75 * x + 3.75) * x - 6.0) * x + 3.0; }         // 1 < |x| < 2

// out[j] = sum_k w[j][k] * in[clamp(i0(j) - 1 + k)]: the 1-D resampling matrix, align_corners=True.
std::vector<std::vector<double>> bicubic_matrix(int64_t in, int64_t out) {
  std::vector<std::vector<double>> m(static_cast<size_t>(out), std::vector<double>(static_cast<size_t>(in), 0.0));
  const double scale = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  for (int64_t j = 0; j < out; ++j) {
    const double src = scale * static_cast<double>(j);
    const auto i0 = static_cast<int64_t>(std::floor(src));
    const double t = src - static_cast<double>(i0);
    const double w[4] = {cubic_outer(t + 1.0), cubic_inner(t), cubic_inner(1.0 - t), cubic_outer(2.0 - t)};
    for (int k = 0; k < 4; ++k) {
      const int64_t i = std::clamp<int64_t>(i0 - 1 + k, 0, in - 1);  // border pixels repeat
      m[static_cast<size_t>(j)][static_cast<size_t>(i)] += w[k];
    }
  }
  return m;
}
}  // namespace

Tensor interpolate_pos_embedding(const Tensor& pos, int64_t new_grid, int64_t prefix) {
  DUET_CHECK(prefix >= 0 && pos.defined() && pos.dim() == 3 && pos.size(0) == 1 && pos.size(1) >= prefix + 1,
             "interpolate_pos_embedding: pos_embedding has shape {}, expected [1, {} + grid*grid, hidden]",
             shape_or_undefined(pos), prefix);
  const int64_t n = pos.size(1) - prefix, hidden = pos.size(2);
  const auto grid = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  DUET_CHECK(grid * grid == n, "interpolate_pos_embedding: {} patch positions are not a square grid (pos_embedding {})",
             n, shape_str(pos.shape()));
  DUET_CHECK(new_grid >= 1, "interpolate_pos_embedding: new grid {} must be at least 1", new_grid);
  const std::vector<double> in = pos.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
  const auto m = bicubic_matrix(grid, new_grid);
  const int64_t head = prefix * hidden;  // the prefix tokens' embeddings, kept
  std::vector<double> out(static_cast<size_t>(head + new_grid * new_grid * hidden));
  std::copy(in.begin(), in.begin() + head, out.begin());
  // Separable: rows first (grid x grid -> new_grid x grid), then columns.
  std::vector<double> rows(static_cast<size_t>(new_grid * grid * hidden), 0.0);
  for (int64_t y = 0; y < new_grid; ++y)
    for (int64_t sy = 0; sy < grid; ++sy) {
      const double w = m[static_cast<size_t>(y)][static_cast<size_t>(sy)];
      if (w == 0.0) continue;
      for (int64_t x = 0; x < grid * hidden; ++x)
        rows[static_cast<size_t>(y * grid * hidden + x)] += w * in[static_cast<size_t>(head + sy * grid * hidden + x)];
    }
  for (int64_t y = 0; y < new_grid; ++y)
    for (int64_t x = 0; x < new_grid; ++x)
      for (int64_t sx = 0; sx < grid; ++sx) {
        const double w = m[static_cast<size_t>(x)][static_cast<size_t>(sx)];
        if (w == 0.0) continue;
        for (int64_t d = 0; d < hidden; ++d)
          out[static_cast<size_t>(head + (y * new_grid + x) * hidden + d)] +=
              w * rows[static_cast<size_t>((y * grid + sx) * hidden + d)];
      }
  return Tensor::from_vector(out, {1, prefix + new_grid * new_grid, hidden}, TensorOptions(pos.dtype()))
      .to(pos.device());
}

}  // namespace duet::models
