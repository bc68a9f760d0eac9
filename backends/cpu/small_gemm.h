// duet's own batched f32 GEMM for small matrices: the products of attention, one [S, S] or
// [S, head_dim] matrix per image and head (ViT-tiny on CIFAR: 192 products of 65 x 64 x 65 a
// step). oneDNN 2.6's batched matmul runs them at 250-350 GFLOP/s with two threads here when an
// operand is transposed (q @ k^T and two of the four backward products; ~415 when none is),
// because it repacks the transposed operand with a generic copy for every matrix; this kernel
// transposes it in 16 x 16 register blocks and keeps each product in L1/L2: 305-390 transposed,
// ~415 not (medians of alternating runs, docs/cpu_backend.md).
//
// The kernel is AVX-512 (intrinsics, in small_gemm.cpp); on other CPUs, or for products it does
// not take, the caller uses oneDNN.
#pragma once
#include <cstdint>

#include "backends/cpu/kernel_policy.h"

namespace duet::cpu {

// Element (b, i, j) of a batch of matrices lies at data[b * batch + i * row + j * col]; batch = 0
// repeats one matrix for the whole batch (broadcasting). row or col is 1: the stored matrix or its
// transpose is row-major.
struct MatrixView {
  const float* data;
  int64_t batch, row, col;
};

// automatic: the own kernel for f32 products with every dimension <= 128 and at least as many
// matrices as threads (it parallelises over the batch only), on CPUs with AVX-512; else oneDNN.
// never: always oneDNN (DUET_SMALL_GEMM=0 in the environment sets this at start-up).
// always: the own kernel wherever the CPU has AVX-512, any size (tests use it).
void set_small_gemm_policy(KernelPolicy p);
bool small_gemm_available();  // this CPU has AVX-512
KernelPolicy small_gemm_policy();

// Whether the policy gives this product, C[batch] = A[batch] @ B[batch] with A [M, K] and
// B [K, N], to small_gemm_f32.
bool small_gemm_wanted(int64_t batch, int64_t M, int64_t N, int64_t K);

// C[b] = A[b] @ B[b] for every b < batch; c is dense row-major [batch, M, N]. K >= 1.
void small_gemm_f32(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixView a, MatrixView b, float* c);

// One product C = A B on the calling thread (the views' batch strides unused), C written with row
// stride ldc: for kernels that chain several small products per task (cpu attention). `scratch`
// holds small_gemm_scratch_floats(K, N) floats, any alignment. Needs AVX-512.
int64_t small_gemm_scratch_floats(int64_t K, int64_t N);
void small_gemm_one(int64_t M, int64_t N, int64_t K, const MatrixView& a, const MatrixView& b, float* c, int64_t ldc,
                    float* scratch);

// Shared by the AVX-512 kernels (small_gemm.cpp, skinny_gemm.cpp, attention.cpp): the attribute
// that compiles a function for AVX-512 whatever the build's target, the first 64-byte boundary at
// or after p (scratch buffers carry 16 floats of slack for it), and the mask (a __mmask16) of the
// low n lanes of a 16-float vector, all 16 from n >= 16.
#define DUET_AVX512 __attribute__((target("avx512f")))
inline float* align64(float* p) { return p + (16 - reinterpret_cast<uintptr_t>(p) / sizeof(float) % 16) % 16; }
inline uint16_t low_lanes(int64_t n) { return n >= 16 ? uint16_t{0xFFFF} : static_cast<uint16_t>((1u << n) - 1); }

}  // namespace duet::cpu
