// Image transforms on host u8 HWC buffers (crop, flip, resize, random resized crop) and the final
// normalised f32 write, CHW or channels-last. Pure host code: the loader's workers run them and
// never call engine ops, so they do not start OpenMP teams next to the training thread's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace duet::datasets {

// h rows of w pixels of c interleaved u8 channels (HWC, the order decoders produce).
struct Image {
  int64_t h = 0, w = 0, c = 0;
  std::vector<uint8_t> pixels;
  Image() = default;
  Image(int64_t h_, int64_t w_, int64_t c_, uint8_t fill = 0);
  uint8_t* at(int64_t y, int64_t x) { return pixels.data() + (y * w + x) * c; }
  const uint8_t* at(int64_t y, int64_t x) const { return pixels.data() + (y * w + x) * c; }
};

// A sample's random numbers are a pure function of (seed, epoch, index): augmentation does not
// depend on which worker makes the sample or when.
class SampleRng {
public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
  double uniform();                        // [0, 1)
  double uniform(double lo, double hi);    // [lo, hi)
  int64_t integer(int64_t lo, int64_t hi);  // uniform on [lo, hi], both included

private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Per-channel statistics of pixels scaled to [0, 1]: out = (p / 255 - mean) / std.
struct Normalization {
  std::vector<float> mean, std;
};
Normalization cifar10_normalization();   // (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
Normalization imagenet_normalization();  // (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

// ---- deterministic building blocks ------------------------------------------------------------
Image flip_horizontal(const Image& src);
// Rows top .. top+h-1 and columns left .. left+w-1 of src; whatever falls outside src is zero,
// which is exactly zero padding followed by a crop.
Image crop(const Image& src, int64_t top, int64_t left, int64_t h, int64_t w);
// Resamples the region (top, left, h, w) of src to out_h x out_w with a triangle filter:
// bilinear with half-pixel centres (PyTorch's align_corners=False). With antialias, a downscale
// widens the filter by the scale factor, as PIL and torchvision's antialias=True do, so thin
// detail averages out instead of aliasing.
Image resize_region(const Image& src, int64_t top, int64_t left, int64_t h, int64_t w, int64_t out_h,
                    int64_t out_w, bool antialias = true);
Image resize(const Image& src, int64_t out_h, int64_t out_w, bool antialias = true);
// The size torchvision's Resize(size) gives: the shorter side becomes `size`, the longer one
// keeps the aspect ratio (truncated).
void shorter_side_size(int64_t h, int64_t w, int64_t size, int64_t& out_h, int64_t& out_w);

// torchvision's RandomResizedCrop.get_params: 10 attempts at a crop with area fraction in
// `scale` and aspect ratio (log-uniform) in `ratio`, then a centre crop clamped to `ratio`.
struct CropBox {
  int64_t top = 0, left = 0, h = 0, w = 0;
};
CropBox random_resized_crop_box(int64_t h, int64_t w, double scale_lo, double scale_hi, double ratio_lo,
                                double ratio_hi, SampleRng& rng);

// Writes (p / 255 - mean[c]) / std[c] for every pixel to dst: CHW planes, or HWC when
// channels_last (the memory of one image of a channels-last [N, C, H, W] tensor).
void write_normalized(const Image& img, const Normalization& norm, bool channels_last, float* dst);

// ---- pipeline steps ---------------------------------------------------------------------------
class Transform {
public:
  virtual ~Transform() = default;
  virtual Image apply(Image img, SampleRng& rng) const = 0;
  virtual std::string describe() const = 0;
};
using TransformPtr = std::shared_ptr<const Transform>;

TransformPtr random_crop(int64_t size, int64_t padding);  // torchvision RandomCrop(size, padding)
TransformPtr random_horizontal_flip(double p = 0.5);
TransformPtr resize_shorter(int64_t size, bool antialias = true);  // torchvision Resize(int)
TransformPtr resize_to(int64_t h, int64_t w, bool antialias = true);
TransformPtr center_crop(int64_t size);  // zero-pads an image smaller than size, as torchvision
TransformPtr random_resized_crop(int64_t size, double scale_lo = 0.08, double scale_hi = 1.0,
                                 double ratio_lo = 3.0 / 4.0, double ratio_hi = 4.0 / 3.0, bool antialias = true);

// u8 steps in order, then the normalised f32 write.
struct Pipeline {
  std::vector<TransformPtr> steps;
  Normalization norm;
  Image run(Image img, SampleRng& rng) const;
  std::string describe() const;
};

// The standard recipes: CIFAR-10 (random crop 32 with padding 4, flip) and ImageNet-style
// (random resized crop, flip; eval: resize to size * 8/7, centre crop).
Pipeline cifar10_train_pipeline();
Pipeline cifar10_eval_pipeline();
Pipeline imagenet_train_pipeline(int64_t size);
Pipeline imagenet_eval_pipeline(int64_t size);

}  // namespace duet::datasets
