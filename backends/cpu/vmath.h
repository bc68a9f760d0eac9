// Vectorisable f32 maths for the OpenMP loops: branch-free plain C++ (selects, bit casts, FMA-able
// polynomials) that GCC turns into SIMD inside an `omp simd` loop of a DUET_SIMD_CLONES function,
// where a libm call (erff, expf) would keep the loop scalar.
//
// Accuracy, measured against double-precision erfc/exp on every f32 in [-8, 12] step 3e-6
// (AVX-512 clone): exp_f32 1.9e-9 (polynomial) plus argument rounding; normal_cdf relative error
// <= 4.5e-7 (~4 ulp, the f32 rounding of t and of the polynomial, not the fit: 1.1e-8), including
// the negative tail, where the textbook 0.5 (1 + erf(x / sqrt2)) in f32 loses every digit
// (relative error 5% at x = -5, 100% below x = -5.5).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace duet::cpu::vmath {

// exp(x + lo) for a small correction lo (the rounding error of x, or 0). Cody-Waite reduction
// x = n ln2 + r, |r| <= ln2 / 2, a degree-6 minimax polynomial for exp(r) (relative error
// 1.9e-9) and 2^n through the exponent bits. Underflows to 0 below -87 (also for -inf),
// saturates near 2^127 above 88; NaN propagates.
inline float exp_f32(float x, float lo = 0.0f) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds x log2(e) to an integer
  const int32_t n = std::bit_cast<int32_t>(t) - 0x4B400000;
  const float nf = t - 12582912.0f;
  const float r = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f + lo;  // ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.383683910e-03f;
  p = p * r + 8.374814730e-03f;
  p = p * r + 4.166822558e-02f;
  p = p * r + 1.666642018e-01f;
  p = p * r + 4.999999208e-01f;
  p = p * r + 1.000000036e+00f;
  p = p * r + 1.000000001e+00f;
  const float res = p * std::bit_cast<float>((n + 127) << 23);
  return x < -87.0f ? 0.0f : res;
}

struct CdfGauss {
  float cdf;    // Phi(x) = 0.5 erfc(-x / sqrt2)
  float gauss;  // exp(-x^2 / 2)
};

// The standard normal CDF with exp(-x^2/2) as a by-product (GELU's backward needs both):
// erfc(z) = t Q(t) exp(-z^2) with z = |x| / sqrt2, t = 1 / (1 + z / 2), and Q a degree-10
// minimax fit of erfc(z) exp(z^2) / t over t in [0, 1] (all z >= 0; relative error 1.1e-8).
// Phi(x) = 1 - erfc(z) / 2 for x >= 0, erfc(z) / 2 below, so the tail keeps relative accuracy.
// -x^2/2 is carried as a rounded value plus its exact error (one FMA), so exp's argument does not
// lose the ~|x|^2 ulps it otherwise would.
inline CdfGauss normal_cdf(float x) {
  const float z = std::abs(x) * 0.70710678118654752440f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float q = 4.235008454e-02f;
  q = q * t + -2.308458654e-01f;
  q = q * t + 4.861552564e-01f;
  q = q * t + -4.469511179e-01f;
  q = q * t + 1.270715420e-01f;
  q = q * t + -5.722481052e-02f;
  q = q * t + 9.299853540e-02f;
  q = q * t + 1.753771588e-01f;
  q = q * t + 2.468805574e-01f;
  q = q * t + 2.820938538e-01f;
  q = q * t + 2.820947948e-01f;
  const float hx = -0.5f * x;
  const float sq = hx * x;                   // -x^2/2, rounded
  const float sq_lo = std::fma(hx, x, -sq);  // its rounding error, exact
  const float g = exp_f32(sq, sq_lo);
  const float half_erfc = 0.5f * (t * q) * g;
  return {x >= 0.0f ? 1.0f - half_erfc : half_erfc, g};
}

}  // namespace duet::cpu::vmath
