// Softmax, log-softmax and cross-entropy on the cpu backend. f32 softmax forward and backward
// are oneDNN softmax_v2 primitives (accurate or log algorithm, any axis of the contiguous input;
// no f64: use the reference backend); the loss is an OpenMP loop over rows, computing each row's
// log-sum-exp once with the maximum subtracted and accumulating in double.
#include <cmath>
#include <limits>
#include "backends/cpu/common.h"

namespace duet {
using namespace cpu;

namespace {

struct SoftmaxFwd {
  dnnl::softmax_v2_forward::primitive_desc pd;
  dnnl::softmax_v2_forward prim;
  dnnl::memory::desc md;
};
struct SoftmaxBwd {
  dnnl::softmax_v2_backward::primitive_desc pd;
  dnnl::softmax_v2_backward prim;
  dnnl::memory::desc md;
};

// f32 or bf16 (oneDNN's softmax computes bf16 lines in f32).
dnnl::memory::desc softmax_md(const Tensor& t) {
  if (t.dim() == 0) return dnnl::memory::desc({1}, dt_of(t.dtype()), tag::a);
  return dnnl::memory::desc(to_dims(t.shape()), dt_of(t.dtype()), to_dims(contiguous_strides(t.shape())));
}

dnnl::softmax_v2_forward::primitive_desc softmax_fwd_pd(const dnnl::memory::desc& md, int axis, bool log) {
  return dnnl::softmax_v2_forward::primitive_desc(
      dnnl::softmax_v2_forward::desc(dnnl::prop_kind::forward_training,
                                     log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md, md,
                                     axis),
      engine());
}

void check_targets(const int64_t* t, int64_t N, int64_t st, int64_t C, const char* op) {
  for (int64_t i = 0; i < N; ++i)
    DUET_CHECK(t[i * st] >= 0 && t[i * st] < C, "{}: target[{}] = {} is not a valid class label, expected 0 <= label < {}",
               op, i, t[i * st], C);
}

// Row log-sum-exp with float exponentials (the loss is dominated by them) summed in double.
template <class T>
double row_lse(const T* row, int64_t C) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < C; ++c) mx = std::max(mx, row[c]);
  if (std::isinf(mx)) return double(mx);
  double sum = 0.0;
  for (int64_t c = 0; c < C; ++c) sum += double(std::exp(row[c] - mx));
  return double(mx) + std::log(sum);
}

template <class T>
void cross_entropy_loop(const Tensor& logits, const Tensor& target, const Tensor& loss, double ls) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const T* px = static_cast<const T*>(logits.raw_data());
  const int64_t* pt = target.data<int64_t>();
  const int64_t st = target.stride(0);
  check_targets(pt, N, st, C, "cross_entropy");
  const int nt = max_threads();
  std::vector<double> part(static_cast<size_t>(nt), 0.0);
  parallel_for(N, N * C * 4, [&](int64_t b, int64_t e) {
    double total = 0.0;
    for (int64_t i = b; i < e; ++i) {
      const T* row = px + i * C;
      const double lse = row_lse(row, C);
      double sum_x = 0.0;
      for (int64_t c = 0; c < C; ++c) sum_x += double(row[c]);
      const double sum_logp = sum_x - double(C) * lse;
      const double logp_t = double(row[pt[i * st]]) - lse;
      total += -(1.0 - ls) * logp_t - (ls / double(C)) * sum_logp;
    }
    part[static_cast<size_t>(omp_get_thread_num())] += total;
  });
  double total = 0.0;
  for (double v : part) total += v;
  static_cast<T*>(loss.raw_data())[0] = static_cast<T>(total / double(N));
}

template <class T>
void cross_entropy_backward_loop(const Tensor& logits, const Tensor& target, const Tensor& dloss, const Tensor& dlogits,
                                 double ls) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const T* px = static_cast<const T*>(logits.raw_data());
  const int64_t* pt = target.data<int64_t>();
  const int64_t st = target.stride(0);
  check_targets(pt, N, st, C, "cross_entropy_backward");
  T* pd = static_cast<T*>(dlogits.raw_data());
  const double scale = double(static_cast<const T*>(dloss.raw_data())[0]) / double(N);
  const double smooth = ls / double(C);
  parallel_for(N, N * C * 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* row = px + i * C;
      T* drow = pd + i * C;
      const int64_t t = pt[i * st];
      const double lse = row_lse(row, C);
      for (int64_t c = 0; c < C; ++c) {
        const double p = std::exp(double(row[c]) - lse);
        drow[c] = static_cast<T>(scale * (p - (c == t ? 1.0 - ls : 0.0) - smooth));
      }
    }
  });
}

}  // namespace

void CpuBackend::softmax(const Tensor& x, const Tensor& y, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  if (x.numel() == 0) return;
  guarded(name, {&x}, [&] {
    DUET_CHECK(x.is_contiguous() && y.is_contiguous(), "{} on backend 'cpu': x and y must be contiguous", name);
    Key key("softmax_fwd");
    key.add(x.shape()).add(dim).add(int64_t(log)).add(int64_t(x.dtype()));
    auto e = cached<SoftmaxFwd>(key, [&] {
      SoftmaxFwd r;
      r.md = softmax_md(x);
      r.pd = softmax_fwd_pd(r.md, x.dim() == 0 ? 0 : static_cast<int>(dim), log);
      r.prim = dnnl::softmax_v2_forward(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_SRC, mem(e->md, x)}, {DNNL_ARG_DST, mem(e->md, y)}});
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, int64_t dim, bool log) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  if (y.numel() == 0) return;
  guarded(name, {&y, &dy}, [&] {
    DUET_CHECK(y.is_contiguous() && dy.is_contiguous() && dx.is_contiguous(),
               "{} on backend 'cpu': y, dy and dx must be contiguous", name);
    Key key("softmax_bwd");
    key.add(y.shape()).add(dim).add(int64_t(log)).add(int64_t(y.dtype()));
    auto e = cached<SoftmaxBwd>(key, [&] {
      SoftmaxBwd r;
      r.md = softmax_md(y);
      const int axis = y.dim() == 0 ? 0 : static_cast<int>(dim);
      const auto alg = log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate;
      r.pd = dnnl::softmax_v2_backward::primitive_desc(dnnl::softmax_v2_backward::desc(alg, r.md, r.md, r.md, axis),
                                                       engine(), softmax_fwd_pd(r.md, axis, log));
      r.prim = dnnl::softmax_v2_backward(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_DST, mem(e->md, y)}, {DNNL_ARG_DIFF_DST, mem(e->md, dy)}, {DNNL_ARG_DIFF_SRC, mem(e->md, dx)}});
  });
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss, double label_smoothing) {
  DUET_CHECK(logits.is_contiguous(), "cross_entropy on backend 'cpu': expected contiguous logits");
  dispatch_float(logits.dtype(), "cross_entropy",
                 [&](auto tag) { cross_entropy_loop<decltype(tag)>(logits, target, loss, label_smoothing); });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& dloss,
                                        const Tensor& dlogits, double label_smoothing) {
  DUET_CHECK(logits.is_contiguous() && dlogits.is_contiguous(),
             "cross_entropy_backward on backend 'cpu': expected contiguous logits and dlogits");
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    cross_entropy_backward_loop<decltype(tag)>(logits, target, dloss, dlogits, label_smoothing);
  });
}

}  // namespace duet
