// A bare oneDNN program (no duet code): times one convolution's forward, backward-data and
// backward-weights passes for each layout and algorithm oneDNN offers on this machine, so the
// choices backends/cpu/conv.cpp makes can be re-measured on another one:
//   nhwc direct       channels-last memory used in place (duet's default)
//   blocked direct    oneDNN picks its layout (nChw16c) and kernel
//   blocked winograd  Winograd F(4x4, 3x3), 3x3 stride 1 only
// Times are the median of 15 runs after 3 warm-up runs; GFLOP/s count direct convolution's FLOPs.
// The layout reorders duet pays around a blocked variant (channels-last activations in, blocked
// out and back) are timed apart, as "+ reorders": for the backward-weights pass that is its two
// inputs, x and dy, to the blocked layout.
//
//   OMP_NUM_THREADS=2 build/bench/duet_onednn_conv_algos 64 64 32 64 3 1 [bf16]  # N C H(=W) O K stride
//
// The source builds against oneDNN 2.x (Debian's 2.6, what duet links) and 3.x (PyPI's
// onednn-cpu-gomp), so bench/onednn_versions.py can time the same passes on both libraries.
#include <dnnl.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
using dnnl::memory;

template <class F>
double median_ms(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < 15; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// oneDNN 3 builds primitive descriptors directly from their arguments; 2.x from an operation
// descriptor. Both throw dnnl::error where no implementation fits.
using Fwd = dnnl::convolution_forward::primitive_desc;
using BwdData = dnnl::convolution_backward_data::primitive_desc;
using BwdWeights = dnnl::convolution_backward_weights::primitive_desc;
Fwd forward_pd(const dnnl::engine& e, dnnl::algorithm a, const memory::desc& x, const memory::desc& w,
               const memory::desc& y, const memory::dims& s, const memory::dims& p) {
#if DNNL_VERSION_MAJOR >= 3
  return Fwd(e, dnnl::prop_kind::forward_training, a, x, w, y, s, p, p);
#else
  return Fwd(dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, a, x, w, y, s, p, p), e);
#endif
}
BwdData backward_data_pd(const dnnl::engine& e, dnnl::algorithm a, const memory::desc& x, const memory::desc& w,
                         const memory::desc& y, const memory::dims& s, const memory::dims& p, const Fwd& hint) {
#if DNNL_VERSION_MAJOR >= 3
  return BwdData(e, a, x, w, y, s, p, p, hint);
#else
  return BwdData(dnnl::convolution_backward_data::desc(a, x, w, y, s, p, p), e, hint);
#endif
}
BwdWeights backward_weights_pd(const dnnl::engine& e, dnnl::algorithm a, const memory::desc& x,
                               const memory::desc& w, const memory::desc& y, const memory::dims& s,
                               const memory::dims& p, const Fwd& hint) {
#if DNNL_VERSION_MAJOR >= 3
  return BwdWeights(e, a, x, w, y, s, p, p, hint);
#else
  return BwdWeights(dnnl::convolution_backward_weights::desc(a, x, w, y, s, p, p), e, hint);
#endif
}
memory::dims dims_of(const memory::desc& m) {
#if DNNL_VERSION_MAJOR >= 3
  return m.get_dims();
#else
  return m.dims();
#endif
}

struct Variant {
  const char* name;
  memory::format_tag act;
  dnnl::algorithm alg;
};
}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && !(argc == 8 && std::string(argv[7]) == "bf16")) {
    std::fprintf(stderr, "usage: %s N C H O K stride [bf16]   (square maps and kernels, padding K/2)\n", argv[0]);
    return 2;
  }
  // bf16: activations and weights in bf16 (as under duet's --amp bf16), f32 accumulation.
  const memory::data_type T = argc == 8 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dim N = std::atol(argv[1]), C = std::atol(argv[2]), H = std::atol(argv[3]), O = std::atol(argv[4]),
                    K = std::atol(argv[5]), S = std::atol(argv[6]), P = K / 2;
  const memory::dim OH = (H + 2 * P - K) / S + 1;
  const double flops = 2.0 * N * O * OH * OH * C * K * K;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  const memory::dims xs{N, C, H, H}, ws{O, C, K, K}, ys{N, O, OH, OH}, strides{S, S}, pad{P, P};
  const Variant variants[] = {{"nhwc direct", memory::format_tag::nhwc, dnnl::algorithm::convolution_direct},
                              {"blocked direct", memory::format_tag::any, dnnl::algorithm::convolution_direct},
                              {"blocked winograd", memory::format_tag::any, dnnl::algorithm::convolution_winograd}};
  const dnnl_version_t* ver = dnnl::version();
  std::printf("N=%ld C=%ld H=W=%ld O=%ld K=%ld stride=%ld %s, %s, oneDNN %d.%d.%d\n", long(N), long(C), long(H),
              long(O), long(K), long(S), T == memory::data_type::bf16 ? "bf16" : "f32", "ms (GFLOP/s) per pass",
              ver->major, ver->minor, ver->patch);
  for (const Variant& v : variants) {
    try {
      const memory::desc x(xs, T, v.act), y(ys, T, v.act);
      const memory::desc w(ws, T, memory::format_tag::any);
      const Fwd fwd = forward_pd(eng, v.alg, x, w, y, strides, pad);
      const BwdData bwd_d = backward_data_pd(eng, v.alg, x, w, y, strides, pad, fwd);
      const BwdWeights bwd_w = backward_weights_pd(eng, v.alg, x, w, y, strides, pad, fwd);
      memory src(fwd.src_desc(), eng), wei(fwd.weights_desc(), eng), dst(fwd.dst_desc(), eng);
      memory dsrc(bwd_d.diff_src_desc(), eng), wei_d(bwd_d.weights_desc(), eng), ddst(bwd_d.diff_dst_desc(), eng);
      memory src_w(bwd_w.src_desc(), eng), dwei(bwd_w.diff_weights_desc(), eng), ddst_w(bwd_w.diff_dst_desc(), eng);
      // Filled through f32 buffers and reorders, so bf16 gets the same values rounded.
      auto fill = [&](memory& m) {
        const memory::dims d = dims_of(m.get_desc());
        const memory::desc f32_md(d, memory::data_type::f32,
                                  d.size() == 4 ? memory::format_tag::abcd : memory::format_tag::abcde);
        memory tmp(f32_md, eng);
        float* p = static_cast<float*>(tmp.get_data_handle());
        for (size_t i = 0; i < f32_md.get_size() / sizeof(float); ++i) p[i] = 0.01f * float(i % 97) - 0.4f;
        dnnl::reorder(tmp, m).execute(st, tmp, m);
        st.wait();
      };
      for (memory* m : {&src, &wei, &ddst, &wei_d, &src_w, &ddst_w}) fill(*m);
      // The reorders from channels-last user memory into the backward-weights pass's inputs.
      const memory::desc x_user(xs, T, memory::format_tag::nhwc), y_user(ys, T, memory::format_tag::nhwc);
      memory xu(x_user, eng), yu(y_user, eng);
      fill(xu);
      fill(yu);
      const bool reorder_x = bwd_w.src_desc() != x_user, reorder_y = bwd_w.diff_dst_desc() != y_user;
      const double tr = reorder_x || reorder_y ? median_ms([&] {
        if (reorder_x) dnnl::reorder(xu, src_w).execute(st, xu, src_w);
        if (reorder_y) dnnl::reorder(yu, ddst_w).execute(st, yu, ddst_w);
        st.wait();
      })
                                               : 0.0;
      dnnl::convolution_forward f(fwd);
      dnnl::convolution_backward_data bd(bwd_d);
      dnnl::convolution_backward_weights bw(bwd_w);
      const double tf = median_ms([&] {
        f.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
        st.wait();
      });
      const double td = median_ms([&] {
        bd.execute(st, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei_d}, {DNNL_ARG_DIFF_SRC, dsrc}});
        st.wait();
      });
      const double tw = median_ms([&] {
        bw.execute(st, {{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, ddst_w}, {DNNL_ARG_DIFF_WEIGHTS, dwei}});
        st.wait();
      });
      std::printf("  %-17s fwd %8.3f (%4.0f) %-24s bwd-data %8.3f (%4.0f) %-24s bwd-weights %8.3f (%4.0f) %s"
                  " + reorders %.3f\n",
                  v.name, tf, flops / tf / 1e6, fwd.impl_info_str(), td, flops / td / 1e6, bwd_d.impl_info_str(), tw,
                  flops / tw / 1e6, bwd_w.impl_info_str(), tr);
    } catch (const dnnl::error& e) {
      std::printf("  %-17s not available for this shape (%s)\n", v.name, e.what());
    }
  }
  return 0;
}
