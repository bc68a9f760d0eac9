#include "datasets/transforms.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/rng.h"

namespace duet::datasets {

Image::Image(int64_t h_, int64_t w_, int64_t c_, uint8_t fill) : h(h_), w(w_), c(c_) {
  DUET_CHECK(h_ >= 0 && w_ >= 0 && c_ >= 1, "Image: invalid size {}x{}x{}", h_, w_, c_);
  pixels.assign(static_cast<size_t>(h_ * w_ * c_), fill);
}

// ---- random numbers -----------------------------------------------------------------------------
SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index)
    : key_(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) ^ splitmix64(static_cast<uint64_t>(index))))) {}

double SampleRng::uniform() { return uniform01(key_, counter_++); }
double SampleRng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
int64_t SampleRng::integer(int64_t lo, int64_t hi) {
  const auto v = lo + static_cast<int64_t>(uniform() * static_cast<double>(hi - lo + 1));
  return std::min(v, hi);
}

Normalization cifar10_normalization() { return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}; }
Normalization imagenet_normalization() { return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}; }

// ---- building blocks ---------------------------------------------------------------------------
Image flip_horizontal(const Image& src) {
  Image out(src.h, src.w, src.c);
  const auto px = static_cast<size_t>(src.c);
  for (int64_t y = 0; y < src.h; ++y)
    for (int64_t x = 0; x < src.w; ++x) std::memcpy(out.at(y, src.w - 1 - x), src.at(y, x), px);
  return out;
}

Image crop(const Image& src, int64_t top, int64_t left, int64_t h, int64_t w) {
  DUET_CHECK(h >= 1 && w >= 1, "crop: size {}x{} must be positive", h, w);
  Image out(h, w, src.c);
  // The columns that land inside src are one memcpy per row.
  const int64_t x0 = std::max<int64_t>(0, -left), x1 = std::min(w, src.w - left);
  if (x1 <= x0) return out;
  for (int64_t y = 0; y < h; ++y) {
    const int64_t sy = top + y;
    if (sy < 0 || sy >= src.h) continue;
    std::memcpy(out.at(y, x0), src.at(sy, left + x0), static_cast<size_t>((x1 - x0) * src.c));
  }
  return out;
}

namespace {

// For each output position along one axis: the first input index and the normalised weights of
// a triangle filter, PIL's precompute_coeffs restricted to the region [start, start + len).
struct AxisCoeffs {
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  int64_t taps = 0;
  std::vector<float> w;  // out * taps
};

AxisCoeffs axis_coeffs(int64_t start, int64_t len, int64_t out, bool antialias) {
  AxisCoeffs a;
  const double scale = static_cast<double>(len) / static_cast<double>(out);
  const double filter_scale = antialias ? std::max(scale, 1.0) : 1.0;
  const double support = filter_scale;  // the triangle filter's support is 1, widened
  a.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<size_t>(out));
  a.count.resize(static_cast<size_t>(out));
  a.w.assign(static_cast<size_t>(out * a.taps), 0.0f);
  std::vector<double> weights(static_cast<size_t>(a.taps));
  for (int64_t i = 0; i < out; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    int64_t lo = static_cast<int64_t>(std::floor(center - support + 0.5));
    int64_t hi = static_cast<int64_t>(std::floor(center + support + 0.5));
    lo = std::max<int64_t>(lo, 0);
    hi = std::min(hi, len);
    hi = std::min(hi, lo + a.taps);
    double total = 0;
    double* ws = weights.data();
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((static_cast<double>(x) + 0.5 - center) / filter_scale);
      const double v = d < 1.0 ? 1.0 - d : 0.0;
      ws[x - lo] = v;
      total += v;
    }
    if (total <= 0) {  // cannot happen for a non-empty window, but never divide by zero
      ws[0] = 1.0;
      total = 1.0;
      hi = lo + 1;
    }
    a.first[static_cast<size_t>(i)] = start + lo;
    a.count[static_cast<size_t>(i)] = hi - lo;
    for (int64_t x = lo; x < hi; ++x) a.w[static_cast<size_t>(i * a.taps + x - lo)] = static_cast<float>(ws[x - lo] / total);
  }
  return a;
}

}  // namespace

Image resize_region(const Image& src, int64_t top, int64_t left, int64_t h, int64_t w, int64_t out_h, int64_t out_w,
                    bool antialias) {
  DUET_CHECK(out_h >= 1 && out_w >= 1, "resize: output size {}x{} must be positive", out_h, out_w);
  DUET_CHECK(h >= 1 && w >= 1 && top >= 0 && left >= 0 && top + h <= src.h && left + w <= src.w,
             "resize: region (top {}, left {}, {}x{}) is not inside the {}x{} image", top, left, h, w, src.h, src.w);
  const int64_t c = src.c;
  if (h == out_h && w == out_w) return crop(src, top, left, h, w);
  const AxisCoeffs cx = axis_coeffs(left, w, out_w, antialias);
  const AxisCoeffs cy = axis_coeffs(top, h, out_h, antialias);
  // Horizontal pass over the rows of the region into floats, then the vertical pass; keeping
  // the intermediate in float avoids a second rounding.
  std::vector<float> tmp(static_cast<size_t>(h * out_w * c));
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* row = src.at(top + y, 0);
    float* dst = tmp.data() + y * out_w * c;
    for (int64_t x = 0; x < out_w; ++x) {
      const float* wt = cx.w.data() + x * cx.taps;
      const int64_t first = cx.first[static_cast<size_t>(x)], n = cx.count[static_cast<size_t>(x)];
      for (int64_t ch = 0; ch < c; ++ch) {
        float acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += wt[k] * static_cast<float>(row[(first + k) * c + ch]);
        dst[x * c + ch] = acc;
      }
    }
  }
  Image out(out_h, out_w, c);
  const int64_t row_len = out_w * c;
  std::vector<float> acc(static_cast<size_t>(row_len));
  for (int64_t y = 0; y < out_h; ++y) {
    const float* wt = cy.w.data() + y * cy.taps;
    const int64_t first = cy.first[static_cast<size_t>(y)] - top, n = cy.count[static_cast<size_t>(y)];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      const float* in = tmp.data() + (first + k) * row_len;
      const float wk = wt[k];
      for (int64_t i = 0; i < row_len; ++i) acc[static_cast<size_t>(i)] += wk * in[i];
    }
    uint8_t* dst = out.at(y, 0);
    for (int64_t i = 0; i < row_len; ++i)
      dst[i] = static_cast<uint8_t>(std::clamp(std::lround(acc[static_cast<size_t>(i)]), 0L, 255L));
  }
  return out;
}

Image resize(const Image& src, int64_t out_h, int64_t out_w, bool antialias) {
  return resize_region(src, 0, 0, src.h, src.w, out_h, out_w, antialias);
}

void shorter_side_size(int64_t h, int64_t w, int64_t size, int64_t& out_h, int64_t& out_w) {
  DUET_CHECK(size >= 1 && h >= 1 && w >= 1, "resize: invalid size {} for a {}x{} image", size, h, w);
  if (h <= w) {
    out_h = size;
    out_w = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(size) * static_cast<double>(w) / static_cast<double>(h)));
  } else {
    out_w = size;
    out_h = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(size) * static_cast<double>(h) / static_cast<double>(w)));
  }
}

CropBox random_resized_crop_box(int64_t h, int64_t w, double scale_lo, double scale_hi, double ratio_lo,
                                double ratio_hi, SampleRng& rng) {
  const double area = static_cast<double>(h * w);
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale_lo, scale_hi);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    // Python's round() rounds halves to even; nearbyint does the same in the default mode.
    const auto cw = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto ch = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      const int64_t top = rng.integer(0, h - ch);
      const int64_t left = rng.integer(0, w - cw);
      return {top, left, ch, cw};
    }
  }
  CropBox b;
  const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
  if (in_ratio < ratio_lo) {
    b.w = w;
    b.h = static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / ratio_lo));
  } else if (in_ratio > ratio_hi) {
    b.h = h;
    b.w = static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * ratio_hi));
  } else {
    b.w = w;
    b.h = h;
  }
  b.h = std::clamp<int64_t>(b.h, 1, h);
  b.w = std::clamp<int64_t>(b.w, 1, w);
  b.top = (h - b.h) / 2;
  b.left = (w - b.w) / 2;
  return b;
}

void write_normalized(const Image& img, const Normalization& norm, bool channels_last, float* dst) {
  const int64_t c = img.c;
  DUET_CHECK(static_cast<int64_t>(norm.mean.size()) == c && static_cast<int64_t>(norm.std.size()) == c,
             "normalize: the image has {} channels but mean/std have {}/{} values", c, norm.mean.size(),
             norm.std.size());
  // One table per channel: a lookup is cheaper than a divide per pixel.
  std::vector<float> lut(static_cast<size_t>(256 * c));
  for (int64_t ch = 0; ch < c; ++ch) {
    const float m = norm.mean[static_cast<size_t>(ch)], s = norm.std[static_cast<size_t>(ch)];
    DUET_CHECK(s > 0, "normalize: std of channel {} must be positive, got {}", ch, s);
    for (int v = 0; v < 256; ++v) lut[static_cast<size_t>(ch * 256 + v)] = (static_cast<float>(v) / 255.0f - m) / s;
  }
  const int64_t n = img.h * img.w;
  const uint8_t* src = img.pixels.data();
  if (channels_last) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch) dst[i * c + ch] = lut[static_cast<size_t>(ch * 256 + src[i * c + ch])];
    return;
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    const float* l = lut.data() + ch * 256;
    float* plane = dst + ch * n;
    for (int64_t i = 0; i < n; ++i) plane[i] = l[src[i * c + ch]];
  }
}

// ---- pipeline steps ----------------------------------------------------------------------------
namespace {

class RandomCrop final : public Transform {
public:
  RandomCrop(int64_t size, int64_t padding) : size_(size), pad_(padding) {
    DUET_CHECK(size >= 1 && padding >= 0, "random_crop: size {} must be >= 1 and padding {} >= 0", size, padding);
  }
  Image apply(Image img, SampleRng& rng) const override {
    const int64_t ph = img.h + 2 * pad_, pw = img.w + 2 * pad_;
    DUET_CHECK(ph >= size_ && pw >= size_, "random_crop: a {}x{} crop does not fit a {}x{} image padded by {}", size_,
               size_, img.h, img.w, pad_);
    const int64_t top = rng.integer(0, ph - size_), left = rng.integer(0, pw - size_);
    return crop(img, top - pad_, left - pad_, size_, size_);
  }
  std::string describe() const override { return fmt::format("random_crop({}, padding={})", size_, pad_); }

private:
  int64_t size_, pad_;
};

class RandomFlip final : public Transform {
public:
  explicit RandomFlip(double p) : p_(p) {
    DUET_CHECK(p >= 0 && p <= 1, "random_horizontal_flip: p must be in [0, 1], got {}", p);
  }
  Image apply(Image img, SampleRng& rng) const override {
    return rng.uniform() < p_ ? flip_horizontal(img) : img;
  }
  std::string describe() const override { return fmt::format("random_horizontal_flip({})", p_); }

private:
  double p_;
};

class ResizeShorter final : public Transform {
public:
  ResizeShorter(int64_t size, bool aa) : size_(size), aa_(aa) {
    DUET_CHECK(size >= 1, "resize_shorter: size must be >= 1, got {}", size);
  }
  Image apply(Image img, SampleRng&) const override {
    int64_t oh, ow;
    shorter_side_size(img.h, img.w, size_, oh, ow);
    return (oh == img.h && ow == img.w) ? img : resize(img, oh, ow, aa_);
  }
  std::string describe() const override { return fmt::format("resize_shorter({}{})", size_, aa_ ? "" : ", no antialias"); }

private:
  int64_t size_;
  bool aa_;
};

class ResizeTo final : public Transform {
public:
  ResizeTo(int64_t h, int64_t w, bool aa) : h_(h), w_(w), aa_(aa) {
    DUET_CHECK(h >= 1 && w >= 1, "resize_to: size {}x{} must be positive", h, w);
  }
  Image apply(Image img, SampleRng&) const override {
    return (img.h == h_ && img.w == w_) ? img : resize(img, h_, w_, aa_);
  }
  std::string describe() const override { return fmt::format("resize_to({}x{})", h_, w_); }

private:
  int64_t h_, w_;
  bool aa_;
};

class CenterCrop final : public Transform {
public:
  explicit CenterCrop(int64_t size) : size_(size) { DUET_CHECK(size >= 1, "center_crop: size must be >= 1, got {}", size); }
  Image apply(Image img, SampleRng&) const override {
    auto offset = [&](int64_t have) {
      // torchvision: round((have - size) / 2) (halves to even) when cropping, and padding of
      // (size - have) // 2 before the image when it is smaller.
      if (have >= size_) return static_cast<int64_t>(std::nearbyint(static_cast<double>(have - size_) / 2.0));
      return -((size_ - have) / 2);
    };
    if (img.h == size_ && img.w == size_) return img;
    return crop(img, offset(img.h), offset(img.w), size_, size_);
  }
  std::string describe() const override { return fmt::format("center_crop({})", size_); }

private:
  int64_t size_;
};

class RandomResizedCrop final : public Transform {
public:
  RandomResizedCrop(int64_t size, double slo, double shi, double rlo, double rhi, bool aa)
      : size_(size), slo_(slo), shi_(shi), rlo_(rlo), rhi_(rhi), aa_(aa) {
    DUET_CHECK(size >= 1 && slo > 0 && slo <= shi && shi <= 1 && rlo > 0 && rlo <= rhi,
               "random_resized_crop: expected size >= 1, 0 < scale_lo <= scale_hi <= 1, 0 < ratio_lo <= ratio_hi; got "
               "size {}, scale ({}, {}), ratio ({}, {})",
               size, slo, shi, rlo, rhi);
  }
  Image apply(Image img, SampleRng& rng) const override {
    const CropBox b = random_resized_crop_box(img.h, img.w, slo_, shi_, rlo_, rhi_, rng);
    return resize_region(img, b.top, b.left, b.h, b.w, size_, size_, aa_);
  }
  std::string describe() const override {
    return fmt::format("random_resized_crop({}, scale=({}, {}), ratio=({:.4g}, {:.4g}))", size_, slo_, shi_, rlo_, rhi_);
  }

private:
  int64_t size_;
  double slo_, shi_, rlo_, rhi_;
  bool aa_;
};

}  // namespace

TransformPtr random_crop(int64_t size, int64_t padding) { return std::make_shared<RandomCrop>(size, padding); }
TransformPtr random_horizontal_flip(double p) { return std::make_shared<RandomFlip>(p); }
TransformPtr resize_shorter(int64_t size, bool antialias) { return std::make_shared<ResizeShorter>(size, antialias); }
TransformPtr resize_to(int64_t h, int64_t w, bool antialias) { return std::make_shared<ResizeTo>(h, w, antialias); }
TransformPtr center_crop(int64_t size) { return std::make_shared<CenterCrop>(size); }
TransformPtr random_resized_crop(int64_t size, double scale_lo, double scale_hi, double ratio_lo, double ratio_hi,
                                 bool antialias) {
  return std::make_shared<RandomResizedCrop>(size, scale_lo, scale_hi, ratio_lo, ratio_hi, antialias);
}

Image Pipeline::run(Image img, SampleRng& rng) const {
  for (const TransformPtr& t : steps) img = t->apply(std::move(img), rng);
  return img;
}

std::string Pipeline::describe() const {
  std::string s;
  for (const TransformPtr& t : steps) s += t->describe() + ", ";
  s += "normalize(mean=(";
  for (size_t i = 0; i < norm.mean.size(); ++i) s += fmt::format("{}{:.4g}", i ? ", " : "", norm.mean[i]);
  s += "), std=(";
  for (size_t i = 0; i < norm.std.size(); ++i) s += fmt::format("{}{:.4g}", i ? ", " : "", norm.std[i]);
  return s + "))";
}

Pipeline cifar10_train_pipeline() { return {{random_crop(32, 4), random_horizontal_flip()}, cifar10_normalization()}; }
Pipeline cifar10_eval_pipeline() { return {{}, cifar10_normalization()}; }
Pipeline imagenet_train_pipeline(int64_t size) {
  return {{random_resized_crop(size), random_horizontal_flip()}, imagenet_normalization()};
}
Pipeline imagenet_eval_pipeline(int64_t size) {
  // 256 -> 224 in the usual recipe: resize to 8/7 of the crop.
  return {{resize_shorter((size * 8 + 3) / 7), center_crop(size)}, imagenet_normalization()};
}

}  // namespace duet::datasets
