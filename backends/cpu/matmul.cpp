// Matrix products on the cpu backend: oneDNN's matmul primitive (brgemm AVX-512 kernels), and
// duet's own kernels for batches of small f32 matrices (small_gemm.h: attention), for f32
// products of at most four rows (skinny_gemm.h) and, below AVX-512, for small f32 products of more
// rows (direct_conv.h: the direct convolution's tile); run_gemm asks them in that order. A
// transposed operand is the stored block described with swapped strides, so q @ k^T and the
// weight-gradient products need no copy; a batch-1 operand broadcasts through oneDNN's own batch
// broadcasting. linear is a 2-D matmul (gemm.h) whose weights are the [out, in] matrix read
// transposed, with the bias fused into the primitive. bf16 (autocast) runs the same primitive
// with bf16 memory and f32 accumulation, or, where this CPU runs bf16 arithmetic in f32
// (bf16_speed.h), the f32 primitive on converted copies; f16 goes to the reference backend
// (lowp_on_reference in common.h).
#include "backends/cpu/bf16_speed.h"
#include "backends/cpu/common.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/skinny_gemm.h"
#include "backends/cpu/small_gemm.h"
#include "engine/half.h"

namespace duet {
using namespace cpu;

namespace {

struct MatmulEntry {
  std::string packed_b;  // a frozen b's kept packed copy: named by the cache key
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc a, b, bias, c, residual;
  bool pack_b = false;  // b frozen and the kernel's layout (pd.weights_desc()) not b's own: packed once per freeze
};

// [B, rows, cols] contiguous, read as [B, M, K] (trans = false) or its transpose.
dnnl::memory::desc operand_md(const Tensor& t, bool trans) {
  const int64_t B = t.size(0), R = t.size(1), C = t.size(2);
  if (!trans) return dnnl::memory::desc({B, R, C}, dt_of(t.dtype()), dims{R * C, C, 1});
  return dnnl::memory::desc({B, C, R}, dt_of(t.dtype()), dims{R * C, 1, C});
}

// A [B, rows, cols] contiguous block (B = 1 broadcasts), or its transpose, as small_gemm's view.
MatrixView matrix_view(const Tensor& t, bool trans, int64_t batch) {
  const int64_t R = t.size(1), C = t.size(2);
  const int64_t bs = t.size(0) == 1 && batch > 1 ? 0 : R * C;
  const float* p = static_cast<const float*>(t.raw_data());
  return trans ? MatrixView{p, bs, 1, C} : MatrixView{p, bs, C, 1};
}

constexpr const char* kSmallGemm = "duet:small_gemm_avx512";

dnnl::memory::desc matrix_md(const MatrixOperand& m, int64_t batch) {
  if (batch == 1) return dnnl::memory::desc({m.rows, m.cols}, dt_of(m.t.dtype()), dims{m.row, m.col});
  return dnnl::memory::desc({batch, m.rows, m.cols}, dt_of(m.t.dtype()), dims{m.batch_stride, m.row, m.col});
}
Key& add_operand(Key& k, const MatrixOperand& m) {
  return k.add(m.rows).add(m.cols).add(m.row).add(m.col).add(m.batch_stride).add(static_cast<int64_t>(m.t.dtype()));
}

// ---- bf16 products computed in f32 (bf16_speed.h) ----
// How many elements an operand spans in memory, from its first to its last (strides are never
// negative here).
int64_t span_of(const MatrixOperand& m, int64_t batch) {
  return (batch - 1) * m.batch_stride + (m.rows - 1) * m.row + (m.cols - 1) * m.col + 1;
}
// The span of a bf16 operand as f32 elements at the same offsets, so the same strides read it; the
// gaps of a strided view are converted too and never read. A frozen operand (an inference model's
// weights) is converted once per freeze, and the copy frozen too, so the product packs it once.
Tensor f32_span(const MatrixOperand& m, int64_t batch) {
  const int64_t n = span_of(m, batch);
  const auto convert = [&] {
    Tensor f = Tensor::empty({n});
    const uint16_t* src = static_cast<const uint16_t*>(m.t.raw_data());
    float* dst = f.data<float>();
    parallel_for(n, n, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) dst[i] = bf16_to_float(src[i]);
    });
    return f;
  };
  if (!m.t.is_frozen()) return convert();
  return frozen_copy(m.t, fmt::format("f32 span of {}", n), [&] {
    Tensor f = convert();
    f.freeze();
    return f;
  });
}
// c's elements rounded from the dense [batch, rows, cols] f32 result, or the other way (c's old
// contents for a product that accumulates into them).
void copy_matrix(const MatrixOperand& c, int64_t batch, float* dense, bool into_c) {
  uint16_t* cp = static_cast<uint16_t*>(c.t.raw_data());
  const int64_t bs = batch > 1 ? c.batch_stride : 0;
  parallel_for(batch * c.rows, batch * c.rows * c.cols, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      uint16_t* row = cp + (r / c.rows) * bs + (r % c.rows) * c.row;
      float* d = dense + r * c.cols;
      if (into_c)
        for (int64_t j = 0; j < c.cols; ++j) row[j * c.col] = float_to_bf16(d[j]);
      else
        for (int64_t j = 0; j < c.cols; ++j) d[j] = bf16_to_float(row[j * c.col]);
    }
  });
}

void run_gemm(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c,
              const Tensor& bias, const GemmEpilogue& epi);

// A product's FLOPs and the elements of a, b and c: what decides whether a bf16 one runs in f32
// (bf16_speed.h).
double product_flops(int64_t batch, const MatrixOperand& a, const MatrixOperand& b) {
  return 2.0 * static_cast<double>(batch) * static_cast<double>(a.rows * a.cols * b.cols);
}
double product_elements(int64_t batch, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c) {
  return static_cast<double>(batch) * static_cast<double>(a.rows * a.cols + b.rows * b.cols + c.rows * c.cols);
}
bool in_f32(int64_t batch, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c) {
  return bf16_product_in_f32(product_flops(batch, a, b), product_elements(batch, a, b, c));
}

// c = a @ b (+ epilogue) for bf16 operands in f32: each bf16 input converted (f32_span), the product
// run in f32 into c itself when c is f32, else into a dense f32 result rounded into c afterwards.
// Products of bf16 values are exact in f32, and both ways accumulate in f32.
void run_gemm_in_f32(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b,
                     const MatrixOperand& c, const Tensor& bias, const GemmEpilogue& epi) {
  const auto widened = [&](const MatrixOperand& m) { return m.t.dtype() == DType::bf16 ? f32_span(m, batch) : m.t; };
  const Tensor a32 = widened(a), b32 = widened(b);
  const MatrixOperand a2{a32, a.rows, a.cols, a.row, a.col, a.batch_stride};
  const MatrixOperand b2{b32, b.rows, b.cols, b.row, b.col, b.batch_stride};
  const Tensor bias32 = bias.defined() && bias.dtype() == DType::bf16 ? bias.to(DType::f32) : bias;
  Tensor res32;
  std::optional<MatrixOperand> res2;
  GemmEpilogue e = epi;
  if (epi.residual) {
    res32 = widened(*epi.residual);
    res2.emplace(MatrixOperand{res32, epi.residual->rows, epi.residual->cols, epi.residual->row, epi.residual->col,
                               epi.residual->batch_stride});
    e.residual = &*res2;
  }
  if (c.t.dtype() != DType::bf16) {
    run_gemm(op, batch, a2, b2, c, bias32, e);
  } else {
    const Tensor dense = Tensor::empty({batch * c.rows * c.cols});
    if (epi.accumulate) copy_matrix(c, batch, dense.data<float>(), false);
    run_gemm(op, batch, a2, b2, {dense, c.rows, c.cols, c.cols, 1, c.rows * c.cols}, bias32, e);
    copy_matrix(c, batch, dense.data<float>(), true);
  }
  // (The reason is formatted only for a profile: this runs at every call.)
  if (profiler::enabled())
    profiler::note_reason(bf16_math_in_f32_reason(product_flops(batch, a, b), product_elements(batch, a, b, c)));
}

void run_gemm(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c,
              const Tensor& bias, const GemmEpilogue& epi) {
  if ((a.t.dtype() == DType::bf16 || b.t.dtype() == DType::bf16) && in_f32(batch, a, b, c))
    return run_gemm_in_f32(op, batch, a, b, c, bias, epi);
  const MatrixOperand* res = epi.residual;
  guarded(op, {&a.t, &b.t, &c.t}, [&] {
    if (batch == 1 && skinny_gemm_wanted(a, b, c, bias, epi)) {
      profiler::note_impl(skinny_gemm_impl());
      return skinny_gemm_f32(a, b, c, bias, epi);
    }
    if (batch == 1 && own_direct_matmul_wanted(a, b, c, bias, epi)) {
      profiler::note_impl(kOwnDirectMatmul);
      return own_direct_matmul(a, b, c, bias, epi);
    }
    const bool pack_b = batch == 1 && b.t.is_frozen();
    Key key("gemm");
    add_operand(add_operand(add_operand(key, a), b), c);
    key.add(batch).add(bias.defined() ? bias.stride(0) : int64_t(-1)).add(epi.act ? 1 + static_cast<int64_t>(*epi.act) : 0);
    key.add(int64_t(epi.accumulate));
    if (bias.defined()) key.add(static_cast<int64_t>(bias.dtype()));
    if (res) add_operand(key, *res);
    key.add(int64_t(pack_b));
    auto e = cached<MatmulEntry>(key, [&] {
      MatmulEntry r;
      r.packed_b = "onednn matmul weights " + key.str();
      r.a = matrix_md(a, batch);
      r.b = matrix_md(b, batch);
      r.c = matrix_md(c, batch);
      if (res) r.residual = matrix_md(*res, batch);
      const dnnl::memory::desc b_kernel =
          pack_b ? dnnl::memory::desc(r.b.dims(), r.b.data_type(), dnnl::memory::format_tag::any) : r.b;
      if (bias.defined())
        r.bias = dnnl::memory::desc({1, c.cols}, dt_of(bias.dtype()), dims{c.cols * bias.stride(0), bias.stride(0)});
      const auto d = bias.defined() ? dnnl::matmul::desc(r.a, b_kernel, r.bias, r.c) : dnnl::matmul::desc(r.a, b_kernel, r.c);
      dnnl::primitive_attr attr;
      if (epi.accumulate || res || epi.act) {
        dnnl::post_ops ops;
        if (epi.accumulate) ops.append_sum(1.0f);
        if (res) ops.append_binary(dnnl::algorithm::binary_add, r.residual);
        if (epi.act) append_activation(ops, *epi.act);
        attr.set_post_ops(ops);
      }
      r.pd = dnnl::matmul::primitive_desc(d, attr, engine());
      // Packing pays where the kernel wants a blocked layout (brgemm's panels on AVX-512), which it
      // would otherwise build from b at every call. Where it asks for another plain layout
      // (oneDNN 2.6's jit sgemm, below AVX-512), the copy would only transpose b and run another
      // sgemm variant, whose rounding differs from the unfrozen model's (AMD Zen 3,
      // tests/test_nn.cpp, Freeze): b stays as it lies there.
      const dnnl::memory::desc kernel_b = r.pd.weights_desc();
      if (pack_b && kernel_b != r.b && kernel_b.data.format_desc.blocking.inner_nblks == 0) {
        const auto plain = bias.defined() ? dnnl::matmul::desc(r.a, r.b, r.bias, r.c) : dnnl::matmul::desc(r.a, r.b, r.c);
        r.pd = dnnl::matmul::primitive_desc(plain, attr, engine());
      }
      r.prim = dnnl::matmul(r.pd);
      r.pack_b = pack_b && r.pd.weights_desc() != r.b;
      return r;
    });
    // Named as a matmul, so that a profile shows which convolutions ran as one.
    if (profiler::enabled()) profiler::note_impl(std::string("matmul/") + e->pd.impl_info_str());
    const auto pack = [&](dnnl::memory& dst) {
      dnnl::memory src = mem(e->b, b.t);
      execute(dnnl::reorder(src, dst), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
    };
    const dnnl::memory bm = e->pack_b ? kept_in_layout(b.t, e->packed_b, e->pd.weights_desc(), pack) : mem(e->b, b.t);
    ExecArgs args{{DNNL_ARG_SRC, mem(e->a, a.t)}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, mem(e->c, c.t)}};
    if (bias.defined()) args.add(DNNL_ARG_BIAS, mem(e->bias, bias));
    // The binary post-op's index: after the sum post-op when there is one.
    if (res) args.add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(epi.accumulate ? 1 : 0) | DNNL_ARG_SRC_1, mem(e->residual, res->t));
    execute(e->prim, args);
  });
}

}  // namespace

namespace cpu {
void gemm(const char* op, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
          const GemmEpilogue& epilogue) {
  run_gemm(op, 1, a, b, c, bias, epilogue);
}
void gemm_batched(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b,
                  const MatrixOperand& c, const GemmEpilogue& epilogue) {
  run_gemm(op, batch, a, b, c, Tensor(), epilogue);
}
}  // namespace cpu

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b) {
  if (out.numel() == 0) return;
  const int64_t K = trans_a ? a.size(1) : a.size(2);
  if (K == 0) return fill(out, 0.0);
  DUET_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
             "matmul on backend 'cpu': operands must be contiguous 3-D blocks");
  const int64_t B = out.size(0), M = out.size(1), N = out.size(2);
  // bf16 where this CPU computes bf16 in f32 (bf16_speed.h), by the test gemm() applies: the f32
  // product of converted copies, rounded into out. Attention's small products (about 43 FLOPs an
  // element for ViT's 64-wide heads) fall under the threshold and stay bf16.
  const double flops = 2.0 * static_cast<double>(B * M) * static_cast<double>(N * K);
  const double elements = static_cast<double>(a.numel() + b.numel() + out.numel());
  if ((a.dtype() == DType::bf16 || b.dtype() == DType::bf16) && bf16_product_in_f32(flops, elements)) {
    const auto widened = [](const Tensor& t) {
      return t.dtype() == DType::bf16 ? f32_span({t, t.numel(), 1, 1, 1}, 1).view(t.shape()) : t;
    };
    const Tensor o32 = out.dtype() == DType::f32 ? out : Tensor::empty(out.shape());
    matmul(widened(a), widened(b), o32, trans_a, trans_b);
    if (o32.raw_data() != out.raw_data()) copy_matrix({out, B * M, N, N, 1}, 1, o32.data<float>(), true);
    if (profiler::enabled()) profiler::note_reason(bf16_math_in_f32_reason(flops, elements));
    return;
  }
  if (a.dtype() == DType::f32 && small_gemm_wanted(B, M, N, K)) {
    profiler::note_impl(kSmallGemm);
    return small_gemm_f32(B, M, N, K, matrix_view(a, trans_a, B), matrix_view(b, trans_b, B),
                          static_cast<float*>(out.raw_data()));
  }
  guarded("matmul", {&a, &b, &out}, [&] {
    Key key("matmul");
    key.add(a.shape()).add(b.shape()).add(out.shape()).add(int64_t(trans_a)).add(int64_t(trans_b));
    key.add(static_cast<int64_t>(a.dtype()));
    auto e = cached<MatmulEntry>(key, [&] {
      MatmulEntry r;
      r.a = operand_md(a, trans_a);
      r.b = operand_md(b, trans_b);
      r.c = dnnl::memory::desc(to_dims(out.shape()), dt_of(out.dtype()), tag::abc);
      r.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(r.a, r.b, r.c), engine());
      r.prim = dnnl::matmul(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_SRC, mem(e->a, a)}, {DNNL_ARG_WEIGHTS, mem(e->b, b)}, {DNNL_ARG_DST, mem(e->c, out)}});
  });
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  if (y.numel() == 0) return;
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  if (I == 0) return reference_fallback("no product with 0 input features, y = bias").linear(x, w, bias, y);
  DUET_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(),
             "linear on backend 'cpu': x, weight and y must be contiguous");
  // w [O, I] row-major, read as [I, O]
  gemm("linear", {x, N, I, I, 1}, {w, I, O, 1, I}, {y, N, O, O, 1}, bias);
}

}  // namespace duet
