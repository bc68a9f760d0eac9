#include "datasets/synthetic.h"
#include <cmath>
#include <cstring>
#include <numbers>
#include "engine/rng.h"

namespace duet::datasets {

namespace {
constexpr double kPi = std::numbers::pi;

// Independent uniform streams keyed by (seed, purpose, index).
struct Stream {
  uint64_t key;
  uint64_t counter = 0;
  Stream(uint64_t seed, uint64_t purpose, uint64_t index) : key(splitmix64(seed ^ splitmix64(purpose * 0x100000001b3ull + index))) {}
  double uniform() { return uniform01(key, counter++); }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
};

struct ClassPattern {
  double angle, freq;          // grating direction (radians) and cycles per image width
  std::vector<double> colour;  // per-channel tint, roughly unit norm
};

std::vector<ClassPattern> make_classes(int64_t classes, int64_t channels, uint64_t seed, int64_t w) {
  std::vector<ClassPattern> out;
  // Frequencies stay below Nyquist on small images so every class remains visible at 8x8.
  const double max_freq = std::min(4.0, 0.4 * static_cast<double>(w));
  for (int64_t k = 0; k < classes; ++k) {
    Stream s(seed, 1, static_cast<uint64_t>(k));
    ClassPattern p;
    // Evenly spaced orientations, each nudged by a small random offset, keep the classes apart.
    p.angle = kPi * (static_cast<double>(k) + 0.25 * s.uniform()) / static_cast<double>(classes);
    p.freq = 1.0 + (max_freq - 1.0) * s.uniform();
    double norm = 0;
    for (int64_t c = 0; c < channels; ++c) {
      p.colour.push_back(s.normal());
      norm += p.colour.back() * p.colour.back();
    }
    norm = std::sqrt(std::max(norm, 1e-12));
    for (double& v : p.colour) v /= norm;
    out.push_back(std::move(p));
  }
  return out;
}
}  // namespace

SyntheticDataset::SyntheticDataset(int64_t n, int64_t classes, int64_t channels, int64_t h, int64_t w, uint64_t seed,
                                   int64_t first_index)
    : n_(n), classes_(classes), c_(channels), h_(h), w_(w) {
  DUET_CHECK(n >= 0 && classes >= 2 && channels >= 1 && h >= 4 && w >= 4 && first_index >= 0,
             "SyntheticDataset(n={}, classes={}, channels={}, h={}, w={}, first_index={}): expected n >= 0, "
             "classes >= 2, channels >= 1, h and w >= 4, first_index >= 0",
             n, classes, channels, h, w, first_index);
  // Difficulty, tuned so the small CNN at 32x32 is well above chance after one epoch but still
  // improving after three: heavy pixel noise, a distracting grating of random orientation, an
  // orientation jitter that spans half the gap to the neighbouring classes, and a faint tint.
  constexpr double kNoise = 1.2, kDistractor = 0.8, kJitter = 1.0, kFreqJitter = 0.4, kTint = 0.1;
  const std::vector<ClassPattern> patterns = make_classes(classes, channels, seed, w);
  const int64_t plane = h * w, image = channels * plane;
  pixels_.resize(static_cast<size_t>(n * image));
  labels_.resize(static_cast<size_t>(n));
  // Each grating has variance ~contrast^2 / 2; dividing by the total standard deviation leaves
  // images of roughly zero mean and unit variance.
  const double scale =
      1.0 / std::sqrt(0.5 + 0.5 * kDistractor * kDistractor + kNoise * kNoise + kTint * kTint / static_cast<double>(channels));
  const double wd = static_cast<double>(w);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t global = first_index + i;
    const int64_t label = global % classes;
    labels_[static_cast<size_t>(i)] = label;
    const ClassPattern& p = patterns[static_cast<size_t>(label)];
    Stream s(seed, 2, static_cast<uint64_t>(global));
    const double contrast = 0.7 + 0.6 * s.uniform();
    const double angle = p.angle + (s.uniform() - 0.5) * kJitter * kPi / static_cast<double>(classes);
    const double freq = p.freq * (1.0 + kFreqJitter * (s.uniform() - 0.5));
    const double phase = 2.0 * kPi * s.uniform();
    const double kx = 2.0 * kPi * freq * std::cos(angle) / wd, ky = 2.0 * kPi * freq * std::sin(angle) / wd;
    const double d_angle = kPi * s.uniform(), d_freq = 1.0 + 3.0 * s.uniform(), d_phase = 2.0 * kPi * s.uniform();
    const double dkx = 2.0 * kPi * d_freq * std::cos(d_angle) / wd, dky = 2.0 * kPi * d_freq * std::sin(d_angle) / wd;
    float* img = pixels_.data() + i * image;
    for (int64_t c = 0; c < channels; ++c) {
      // The class grating shows in every channel, stronger where the class colour is.
      const double colour = p.colour[static_cast<size_t>(c)];
      const double gain = contrast * (0.5 + 0.5 * std::abs(colour) * std::sqrt(static_cast<double>(channels)));
      const double tint = kTint * colour;
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const double v = gain * std::cos(kx * x + ky * y + phase) +
                           kDistractor * contrast * std::cos(dkx * x + dky * y + d_phase) + tint + kNoise * s.normal();
          img[c * plane + y * w + x] = static_cast<float>(v * scale);
        }
    }
  }
}

int64_t SyntheticDataset::label(int64_t i) const {
  DUET_CHECK(i >= 0 && i < n_, "SyntheticDataset: index {} is out of range for a dataset of {} images", i, n_);
  return labels_[static_cast<size_t>(i)];
}

Batch SyntheticDataset::batch(const std::vector<int64_t>& indices) const {
  MemTagGuard tag(MemTag::data);
  const auto b = static_cast<int64_t>(indices.size());
  const int64_t image = c_ * h_ * w_;
  Batch out;
  out.images = Tensor::empty({b, c_, h_, w_});
  std::vector<int64_t> labels(static_cast<size_t>(b));
  float* dst = out.images.data<float>();
  for (int64_t k = 0; k < b; ++k) {
    const int64_t i = indices[static_cast<size_t>(k)];
    labels[static_cast<size_t>(k)] = label(i);
    std::memcpy(dst + k * image, pixels_.data() + i * image, static_cast<size_t>(image) * sizeof(float));
  }
  out.labels = Tensor::from_vector(labels, {b}, DType::i64);
  return out;
}

}  // namespace duet::datasets
