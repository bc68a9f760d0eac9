// The key of the cuDNN convolution-algorithm cache and the cache itself, as plain host code (no
// cuDNN types) so tests/test_cuda_host.cpp checks equality, hashing and hit counting without a GPU.
// cuDNN's heuristics cost tens of microseconds per query and a training step repeats the same
// convolutions every iteration, so each distinct problem is asked about once.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include "engine/dtype.h"
#include "engine/op_params.h"

namespace duet::cuda {

enum class ConvPass : uint8_t { forward, backward_data, backward_filter };

// Everything that changes which algorithm cuDNN may pick or how much workspace it needs.
struct ConvKey {
  ConvPass pass = ConvPass::forward;
  DType dtype = DType::f32;
  bool channels_last = false;
  bool allow_tf32 = false;
  bool benchmark = false;  // chosen by timing (cudnnFind) rather than by cuDNN's heuristics
  int device = 0;
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t o = 0, kh = 0, kw = 0;        // weight [o, c / groups, kh, kw]
  Conv2dParams p;

  bool operator==(const ConvKey& k) const;
  std::string str() const;  // "fwd f32 nchw x[8, 3, 32, 32] w[16, 3, 3, 3] stride 1x1 ... groups 1[ tf32][ benchmark]"
};

struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const;
};

// What was chosen for a key: the cuDNN algorithm enum value, the math type to set on the
// convolution descriptor and the workspace it needs.
struct ConvChoice {
  int algo = 0;
  int math_type = 0;
  size_t workspace = 0;
};

class ConvAlgoCache {
public:
  std::optional<ConvChoice> find(const ConvKey& k);  // counts a hit or a miss
  void insert(const ConvKey& k, const ConvChoice& c);
  void erase(const ConvKey& k);  // a cached choice that stopped working
  void clear();
  int64_t hits() const;
  int64_t misses() const;
  size_t size() const;

private:
  mutable std::mutex mu_;
  std::unordered_map<ConvKey, ConvChoice, ConvKeyHash> map_;
  int64_t hits_ = 0, misses_ = 0;
};

// The process-wide cache the cuDNN convolutions use (defined in ops_conv.cpp).
ConvAlgoCache& conv_algo_cache();

}  // namespace duet::cuda
