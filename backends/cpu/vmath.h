// Vectorisable f32 maths for the OpenMP loops: branch-free plain C++ (selects, bit casts, FMA-able
// polynomials) that GCC turns into SIMD inside an `omp simd` loop of a DUET_SIMD_CLONES function,
// where a libm call (erff, expf) would keep the loop scalar.
//
// Accuracy, measured against long-double erfc/exp on every 3e-6 step in [-8, 12] (AVX-512
// clone): exp_nonpositive 1.9e-9 (polynomial) plus argument rounding, exp(-x^2/2) 9.7e-8;
// normal_cdf relative error <= 3.9e-7 (~3 ulp, the f32 rounding of t and of the polynomial, not
// the fit: 4.4e-8), including the negative tail, where the textbook 0.5 (1 + erf(x / sqrt2)) in
// f32 loses every digit (relative error 5% at x = -5, 100% below x = -5.5).
#pragma once
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>

namespace duet::cpu::vmath {

// exp_nonpositive's constants, shared by its scalar form and its AVX-512 twin.
namespace exp_constants {
inline constexpr float kMin = -87.0f;              // exp underflows below this
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
inline constexpr int32_t kRoundBits = 0x4B400000;  // the bits of kRound
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = 2.12194440e-4f;  // ln2 = kLn2Hi - kLn2Lo
inline constexpr float kPoly[7] = {1.383683910e-03f, 8.374814730e-03f, 4.166822558e-02f, 1.666642018e-01f,
                                   4.999999208e-01f, 1.000000036e+00f, 1.000000001e+00f};  // highest degree first
}  // namespace exp_constants

// exp(x + lo) for x <= 0 and a small correction lo (the rounding error of x, or 0). Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-6 minimax polynomial for exp(r) (relative
// error 1.9e-9) and 2^n through the exponent bits. Underflows to 0 below -87 (also for -inf);
// NaN propagates. Only the lower clamp: its one user, normal_cdf, passes -x^2/2, and an upper
// clamp with its select cost GELU's forward 25% of its time (GCC turned the pair into chains of
// masked operations).
inline float exp_nonpositive(float x, float lo = 0.0f) {
  using namespace exp_constants;
  const float xc = std::max(x, kMin);
  const float t = xc * kLog2e + kRound;  // rounds x log2(e) to an integer
  const int32_t n = std::bit_cast<int32_t>(t) - kRoundBits;
  const float nf = t - kRound;
  const float r = (xc - nf * kLn2Hi) + nf * kLn2Lo + lo;
  float p = kPoly[0];
  p = p * r + kPoly[1];
  p = p * r + kPoly[2];
  p = p * r + kPoly[3];
  p = p * r + kPoly[4];
  p = p * r + kPoly[5];
  p = p * r + kPoly[6];
  const float res = p * std::bit_cast<float>((n + 127) << 23);
  return x < kMin ? 0.0f : res;
}

// The same exp on 16 lanes, for kernels written in AVX-512 intrinsics (the cpu attention's
// softmax, where GCC's vectorisation of the scalar form in short masked rows ran 3x slower).
// NaN propagates here too: vmaxps returns its second operand when either is NaN.
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive(__m512 x) {
  using namespace exp_constants;
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(kMin), x);
  const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(kLog2e), _mm512_set1_ps(kRound));
  const __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(kRoundBits));
  const __m512 nf = _mm512_sub_ps(t, _mm512_set1_ps(kRound));
  const __m512 r = _mm512_fmadd_ps(nf, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Hi), xc));
  __m512 p = _mm512_set1_ps(kPoly[0]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[5]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[6]));
  const __m512 res = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23)));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_NLT_UQ), res);
}

struct CdfGauss {
  float cdf;    // Phi(x) = 0.5 erfc(-x / sqrt2)
  float gauss;  // exp(-x^2 / 2)
};

// The standard normal CDF with exp(-x^2/2) as a by-product (GELU's backward needs both):
// erfc(z) = t Q(t) exp(-z^2) with z = |x| / sqrt2 and t = 1 / (1 + z / 2), where Q is a degree-8
// minimax fit of erfc(z) exp(z^2) / t over t in [0.15, 1], i.e. |x| <= 16 (relative error 4.4e-8;
// beyond |x| = 13.2 exp underflows and Q's value no longer matters). scripts/fit_vmath.py
// computes the coefficients, which hold 0.5 Q so that half_erfc needs no extra multiply.
// Phi(x) = 1 - erfc(z) / 2 for x >= 0, erfc(z) / 2 below, so the tail keeps relative accuracy.
// -x^2/2 is carried as a rounded value plus its exact error (one FMA), so exp's argument does not
// lose the ~|x|^2 ulps it otherwise would.
inline CdfGauss normal_cdf(float x) {
  const float t = 1.0f / (1.0f + std::abs(x) * 0.35355339059327376220f);  // 1 / (1 + |x| / sqrt8)
  float q = -2.965688519e-02f;
  q = q * t + 1.428852528e-01f;
  q = q * t + -2.448386848e-01f;
  q = q * t + 1.404516697e-01f;
  q = q * t + -1.429012418e-02f;
  q = q * t + 1.017569527e-01f;
  q = q * t + 1.214474216e-01f;
  q = q * t + 1.412019879e-01f;
  q = q * t + 1.410423964e-01f;
  const float hx = -0.5f * x;
  const float sq = hx * x;                   // -x^2/2, rounded
  const float sq_lo = std::fma(hx, x, -sq);  // its rounding error, exact
  const float g = exp_nonpositive(sq, sq_lo);
  const float half_erfc = (t * q) * g;
  return {x >= 0.0f ? 1.0f - half_erfc : half_erfc, g};
}

}  // namespace duet::cpu::vmath
