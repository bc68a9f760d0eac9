// Equality, hashing and printing of convolution keys, and the mutex-guarded algorithm cache.
#include "backends/cuda/conv_key.h"
#include <fmt/format.h>

namespace duet::cuda {

bool ConvKey::operator==(const ConvKey& k) const {
  return pass == k.pass && dtype == k.dtype && channels_last == k.channels_last && allow_tf32 == k.allow_tf32 &&
         benchmark == k.benchmark && device == k.device && n == k.n && c == k.c && h == k.h && w == k.w && o == k.o && kh == k.kh && kw == k.kw &&
         p.stride_h == k.p.stride_h && p.stride_w == k.p.stride_w && p.pad_h == k.p.pad_h && p.pad_w == k.p.pad_w &&
         p.dilation_h == k.p.dilation_h && p.dilation_w == k.p.dilation_w && p.groups == k.p.groups;
}

size_t ConvKeyHash::operator()(const ConvKey& k) const {
  // FNV-1a over the fields one by one (hashing the struct's bytes would hash its padding too).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(k.pass));
  mix(static_cast<uint64_t>(k.dtype));
  mix(k.channels_last);
  mix(k.allow_tf32);
  mix(k.benchmark);
  mix(static_cast<uint64_t>(k.device));
  for (int64_t v : {k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, k.p.stride_h, k.p.stride_w, k.p.pad_h, k.p.pad_w,
                    k.p.dilation_h, k.p.dilation_w, k.p.groups})
    mix(static_cast<uint64_t>(v));
  return static_cast<size_t>(h);
}

std::string ConvKey::str() const {
  static const char* passes[] = {"fwd", "bwd_data", "bwd_filter"};
  return fmt::format("{} {} {} x[{}, {}, {}, {}] w[{}, {}, {}, {}] stride {}x{} pad {}x{} dilation {}x{} groups {}{}{}",
                     passes[static_cast<int>(pass)], dtype_name(dtype), channels_last ? "nhwc" : "nchw", n, c, h, w, o,
                     p.groups > 0 ? c / p.groups : c, kh, kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h,
                     p.dilation_w, p.groups, allow_tf32 ? " tf32" : "", benchmark ? " benchmark" : "");
}

std::optional<ConvChoice> ConvAlgoCache::find(const ConvKey& k) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = map_.find(k);
  if (it == map_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  return it->second;
}

void ConvAlgoCache::insert(const ConvKey& k, const ConvChoice& c) {
  std::lock_guard<std::mutex> lk(mu_);
  map_[k] = c;
}

void ConvAlgoCache::erase(const ConvKey& k) {
  std::lock_guard<std::mutex> lk(mu_);
  map_.erase(k);
}

void ConvAlgoCache::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  map_.clear();
  hits_ = misses_ = 0;
}

int64_t ConvAlgoCache::hits() const {
  std::lock_guard<std::mutex> lk(mu_);
  return hits_;
}
int64_t ConvAlgoCache::misses() const {
  std::lock_guard<std::mutex> lk(mu_);
  return misses_;
}
size_t ConvAlgoCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return map_.size();
}

}  // namespace duet::cuda
