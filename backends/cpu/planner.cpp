// The cpu backend's planner (planner.h): every rule that picks a convolution's kernel, each with the
// measurement behind it, the autotuner that replaces them on request, and the reason each plan
// gives the profile. The numbers below were measured with oneDNN 2.6 at batch 64 and 2 threads
// (docs/cpu_backend.md has the tables and bench/onednn_conv_algos.cpp reproduces them).
#include "backends/cpu/planner.h"
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <fmt/format.h>
#include "backends/cpu/bf16_speed.h"
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/winograd_conv.h"

namespace duet::cpu {

namespace {
std::atomic<KernelPolicy> g_winograd{policy_from_env("DUET_WINOGRAD")};
std::atomic<KernelPolicy> g_pointwise_gemm{policy_from_env("DUET_POINTWISE_GEMM")};
std::atomic<KernelPolicy> g_im2col_wgrad{policy_from_env("DUET_IM2COL_WGRAD")};
std::atomic<KernelPolicy> g_im2col_forward{policy_from_env("DUET_IM2COL_FORWARD")};
std::atomic<KernelPolicy> g_flipped_dgrad{policy_from_env("DUET_FLIPPED_DGRAD")};
std::atomic<KernelPolicy> g_col2im_dgrad{policy_from_env("DUET_COL2IM_DGRAD")};
std::atomic<KernelPolicy> g_own_direct{policy_from_env("DUET_OWN_DIRECT")};
std::atomic<KernelPolicy> g_own_winograd{policy_from_env("DUET_OWN_WINOGRAD")};
std::atomic<bool> g_autotune{[] {
  const char* v = std::getenv("DUET_CONV_AUTOTUNE");
  return v != nullptr && std::string(v) == "1";
}()};
std::atomic<int64_t> g_tuning_runs{0};
}  // namespace

void set_winograd_policy(KernelPolicy p) { g_winograd.store(p); }
KernelPolicy winograd_policy() { return g_winograd.load(); }
void set_pointwise_gemm_policy(KernelPolicy p) { g_pointwise_gemm.store(p); }
KernelPolicy pointwise_gemm_policy() { return g_pointwise_gemm.load(); }
void set_im2col_weight_gradient_policy(KernelPolicy p) { g_im2col_wgrad.store(p); }
KernelPolicy im2col_weight_gradient_policy() { return g_im2col_wgrad.load(); }
void set_im2col_forward_policy(KernelPolicy p) { g_im2col_forward.store(p); }
KernelPolicy im2col_forward_policy() { return g_im2col_forward.load(); }
void set_flipped_data_gradient_policy(KernelPolicy p) { g_flipped_dgrad.store(p); }
KernelPolicy flipped_data_gradient_policy() { return g_flipped_dgrad.load(); }
void set_col2im_data_gradient_policy(KernelPolicy p) { g_col2im_dgrad.store(p); }
KernelPolicy col2im_data_gradient_policy() { return g_col2im_dgrad.load(); }
void set_own_direct_policy(KernelPolicy p) { g_own_direct.store(p); }
KernelPolicy own_direct_policy() { return g_own_direct.load(); }
void set_own_winograd_policy(KernelPolicy p) { g_own_winograd.store(p); }
KernelPolicy own_winograd_policy() { return g_own_winograd.load(); }
namespace {
// Every policy of the convolution rules, once, in the order rule_plan asks the rules, with the
// passes its algorithm can run. The plan's key holds them all. A rule chosen automatically yields
// where a test forces the algorithm of a later rule for its pass (an earlier rule, forced, has
// taken the layer already where it can run it). A policy added here is in both.
struct RulePolicy {
  ConvAlgo algo;
  KernelPolicy (*get)();
  bool forward, backward_data, backward_weight;
};
constexpr RulePolicy kRulePolicies[] = {
    {ConvAlgo::own_depthwise, depthwise_policy, true, true, true},
    {ConvAlgo::own_winograd, own_winograd_policy, true, true, true},
    {ConvAlgo::own_direct, own_direct_policy, true, true, true},
    {ConvAlgo::matmul, pointwise_gemm_policy, true, true, true},
    {ConvAlgo::im2col_matmul, im2col_weight_gradient_policy, false, false, true},
    {ConvAlgo::flipped_forward, flipped_data_gradient_policy, false, true, false},
    {ConvAlgo::col2im_matmul, col2im_data_gradient_policy, false, true, false},
    {ConvAlgo::im2col_matmul, im2col_forward_policy, true, false, false},
    {ConvAlgo::winograd, winograd_policy, true, true, true},
};

// Whether a test forces (policy always) the algorithm of a rule after `own`'s for this pass.
bool later_rule_forced(ConvAlgo own, ConvPass pass) {
  bool later = false;
  for (const RulePolicy& r : kRulePolicies) {
    const bool runs_pass = pass == ConvPass::forward ? r.forward
                           : pass == ConvPass::backward_data ? r.backward_data
                                                             : r.backward_weight;
    if (later && runs_pass && r.get() == KernelPolicy::always) return true;
    later = later || r.algo == own;
  }
  return false;
}
}  // namespace

void set_conv_autotune(bool on) { g_autotune.store(on); }
bool conv_autotune() { return g_autotune.load(); }
int64_t conv_autotune_runs() { return g_tuning_runs.load(); }

const char* algo_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::direct: return "direct";
    case ConvAlgo::direct_blocked: return "blocked direct";
    case ConvAlgo::winograd: return "winograd";
    case ConvAlgo::matmul: return "matrix product";
    case ConvAlgo::im2col_matmul: return "im2col + matrix product";
    case ConvAlgo::tap_matmul: return "one tap as a matrix product";
    case ConvAlgo::own_depthwise: return "duet depthwise";
    case ConvAlgo::flipped_forward: return "forward of dy by flipped weights";
    case ConvAlgo::col2im_matmul: return "matrix product + col2im";
    case ConvAlgo::own_direct: return "duet direct";
    case ConvAlgo::own_winograd: return "duet winograd";
  }
  return "?";
}

const CpuCaps& cpu_caps() {
  static const CpuCaps caps = [] {
    CpuCaps c;
    c.avx2 = onednn_isa_at_least(dnnl::cpu_isa::avx2) && __builtin_cpu_supports("fma");
    c.avx512 = onednn_isa_at_least(dnnl::cpu_isa::avx512_core);
    c.avx512_bf16 = onednn_isa_at_least(dnnl::cpu_isa::avx512_core_bf16);
    c.amx_bf16 = onednn_isa_at_least(dnnl::cpu_isa::avx512_core_amx);
    return c;
  }();
  return caps;
}
bool bf16_on_amx() { return cpu_caps().amx_bf16; }

namespace {
double conv_flops(const Tensor& w, const Tensor& y) {
  return 2.0 * static_cast<double>(y.numel()) * static_cast<double>(w.size(1) * w.size(2) * w.size(3));
}
double conv_elements(const Tensor& x, const Tensor& w, const Tensor& y) {
  return static_cast<double>(x.numel() + w.numel() + y.numel());
}
}  // namespace

bool bf16_conv_in_f32(const Tensor& x, const Tensor& w, const Tensor& y, int64_t groups) {
  if (groups > 1 && w.size(1) == 1) return false;
  return bf16_product_in_f32(conv_flops(w, y), conv_elements(x, w, y));
}
std::string bf16_conv_in_f32_reason(const Tensor& x, const Tensor& w, const Tensor& y) {
  return bf16_math_in_f32_reason(conv_flops(w, y), conv_elements(x, w, y));
}

// ---- what each algorithm can run --------------------------------------------------------------

bool winograd_applicable(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && p.groups == 1 && w.size(2) == 3 &&
         w.size(3) == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1;
}

bool pointwise_gemm_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  const bool shape = p.groups == 1 && w.size(2) == 1 && w.size(3) == 1 && p.stride_h == 1 && p.stride_w == 1 &&
                     p.pad_h == 0 && p.pad_w == 0;
  // Pixel rows of C channels each, and the weights as a row-major [O, C] matrix (a dense 1x1
  // kernel is that in both weight layouts).
  return shape && x.is_contiguous(MemoryFormat::channels_last) && y.is_contiguous(MemoryFormat::channels_last) &&
         w.stride(1) == 1 && w.stride(0) == w.size(1);
}

bool im2col_weight_gradient_applicable(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p) {
  return p.groups == 1 && (dw.size(2) > 1 || dw.size(3) > 1) && (x.dtype() == DType::f32 || x.dtype() == DType::bf16) &&
         x.is_contiguous(MemoryFormat::channels_last) && dy.is_contiguous(MemoryFormat::channels_last);
}

bool im2col_forward_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return im2col_weight_gradient_applicable(x, w, y, p);
}

bool flipped_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p) {
  return p.groups == 1 && p.stride_h == 1 && p.stride_w == 1 && (w.size(2) > 1 || w.size(3) > 1) &&
         (dx.dtype() == DType::f32 || dx.dtype() == DType::bf16) && p.pad_h <= p.dilation_h * (w.size(2) - 1) &&
         p.pad_w <= p.dilation_w * (w.size(3) - 1) && dy.size(1) > 0;
}

Conv2dParams flipped_forward_params(const Conv2dParams& p, const Tensor& w) {
  Conv2dParams q = p;
  q.pad_h = p.dilation_h * (w.size(2) - 1) - p.pad_h;
  q.pad_w = p.dilation_w * (w.size(3) - 1) - p.pad_w;
  q.act.reset();
  return q;
}

bool col2im_data_gradient_applicable(const Tensor& dx, const Tensor& /*w: one signature for the rules*/, const Tensor& dy,
                                     const Conv2dParams& p) {
  return p.groups == 1 && (dx.dtype() == DType::f32 || dx.dtype() == DType::bf16) &&
         dx.is_contiguous(MemoryFormat::channels_last) && dy.is_contiguous(MemoryFormat::channels_last);
}

bool single_tap(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p, int64_t& th, int64_t& tw) {
  const int64_t KH = w.size(2), KW = w.size(3);
  if (!(x.size(2) == 1 && x.size(3) == 1 && y.size(2) == 1 && y.size(3) == 1 && KH * KW > 1 && p.groups == 1))
    return false;
  if (p.pad_h % p.dilation_h != 0 || p.pad_w % p.dilation_w != 0) return false;
  th = p.pad_h / p.dilation_h;
  tw = p.pad_w / p.dilation_w;
  return th < KH && tw < KW;
}

namespace {

std::string channels(const Tensor& w) { return fmt::format("{}->{} channels", w.size(1), w.size(0)); }
// Whether a layer's products run on bf16 arithmetic: bf16 tensors, except where this CPU runs bf16
// convolutions in f32 (bf16_conv_in_f32), whose layers the f32 rules plan. The bf16 rules below were
// measured where bf16 arithmetic is the faster (AMX; AMD Zen 5's bf16 dot products).
bool bf16_products(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return x.dtype() == DType::bf16 && !bf16_conv_in_f32(x, w, y, p.groups);
}
std::string map_of(const Tensor& t) { return fmt::format("{}x{}", t.size(2), t.size(3)); }
int64_t pixel_rows(const Tensor& t) { return t.size(0) * t.size(2) * t.size(3); }

// ---- the rules ------------------------------------------------------------------------------------
// Each returns the reason when its algorithm is wanted, else "".

// Winograd F(4x4, 3x3) computes a 3x3 stride-1 convolution with 2.25x fewer multiplications, on
// oneDNN's blocked layout: ResNet's 3x3 layers ran 1.5-2.6x faster (forward plus backward) than
// the best direct kernel (Zen 4); its rounding error is about twice direct's. Its transforms work
// on 16-channel blocks: with fewer than 32 channels on either side they cost more than they save
// (a 3-channel stem 4.6 ms against 0.9 direct; 16->16 at 32x32 1.9 against 0.9; 32->32 at 16x16
// 0.58 against 0.72). Below 4x4 outputs the transform tiles are mostly padding (DenseNet's 128->32
// at 2x2: 0.16 ms against 0.06). oneDNN 2.6 has it in f32 only; bf16 tensors go through it (the
// reorders convert) where bf16 runs on avx512_bf16, and how far depends on how fast that is
// (bf16_speed.h). Where bf16 dot products do twice an FMA's work (AMD Zen 5), from 256 channels on
// both sides onto maps of 8x8 and up (256->256 at 8x8: 3.6 / 3.7 / 4.9 ms forward / data / weight
// gradient against 4.5 / 4.9 / 6.0 in bf16). Where they do no more than an FMA (Intel Xeon family 6
// model 207 without AMX: bf16 GEMM 190 GFLOP/s against f32's 266), such layers compute in f32
// (bf16_speed.h) and take f32's rule below: resnet18_cifar's bf16 step 1073 -> 597 ms on Winograd
// alone, bench/results/compare_xeon207_bf16_winograd_train.json.
// With AMX, bf16 has several times f32's peak: never there.
// Winograd transforms the weights at every call, work that only the output pixels amortise: below
// 1,024 of them (N*OH*OW) direct wins, at 512 they tie (Intel Xeon, f32 inference of
// resnet18_cifar, bench/results/conv_candidates_amx_r18_infer_b{1,8}.json: 512->512 at 4x4 ran
// 0.81 ms direct against 4.20 on Winograd for one image, 2.24 against 4.97 for 8; 256->256 at 8x8
// tied at 8 images, 1.75 against 1.76; from 1,024 pixels up Winograd won, 64->64 at 32x32 for 8
// images 1.22 against 1.63, resnet50_cifar's 512->512 at 4x4 for 64 images 9.48 against 11.42).
std::string winograd_rule(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  const KernelPolicy pol = winograd_policy();
  if (pol == KernelPolicy::never || !winograd_applicable(x, w, p)) return "";
  if (pol == KernelPolicy::always) return "winograd: DUET_WINOGRAD=always";
  if (w.size(0) < 32 || w.size(1) < 32) return "";
  const int64_t pixels = y.size(0) * y.size(2) * y.size(3);
  if (pixels < 1024) return "";
  if (bf16_products(x, w, y, p)) {
    if (bf16_on_amx()) return "";
    if (w.size(0) < 256 || w.size(1) < 256 || y.size(2) < 8 || y.size(3) < 8) return "";
    return fmt::format(
        "winograd in f32 for bf16: 3x3 stride 1, {} >= 256, output {} >= 8x8, {} >= 1024 pixels, bf16 without AMX",
        channels(w), map_of(y), pixels);
  }
  if (y.size(2) < 4 || y.size(3) < 4) return "";
  return fmt::format("winograd: 3x3 stride 1, {} >= 32, output {} >= 4x4, {} >= 1024 pixels", channels(w), map_of(y),
                     pixels);
}
// ... where oneDNN has a Winograd kernel for the channel counts and this ISA (it says so by
// building the primitive).
std::string winograd_plan(const ConvProblem& pb) {
  std::string why = winograd_rule(pb.x, pb.w, pb.y, pb.p);
  if (!why.empty() && onednn_conv_impl(ConvAlgo::winograd, pb.pass, pb.x, pb.w, pb.y, pb.p, pb.bias).empty()) return "";
  return why;
}

// bf16 on AMX (Intel Xeon, 2 threads, bench/results/conv_candidates_amx_r50_bf16.json): oneDNN 2.6's
// AMX matmul (brgemm) ran every pointwise weight gradient of resnet50_cifar 2.4-9x faster than its
// AMX 1x1 convolution kernel (1024->256 at 8x8: 1.39 against 7.08 ms; 2048<-512 at 4x4 1.45
// against 13.38) and every data gradient 1.2-1.9x faster; forwards gained up to 1.37x from 256
// input channels down (64->256 at 32x32: 1.71 against 2.34 ms) and lost from 512 up (512->256 at
// 16x16: 1.76 against 1.50). Onto 4x4 maps the forward is the matrix product's from any width
// (Intel Xeon family 6 model 167, 2 threads, bench/results/conv_candidates_amx_r50_bf16_{train,
// infer_b1,infer_b8}.json): 512->2048 for 64 images 0.83 ms against 1.68 and 2048->512 0.93 against
// 1.66, for 8 images 0.10 against 0.25 and 0.11 against 0.18, for one image 0.02 against 0.05. On
// larger maps the wide layers were within the timings' noise either way (DenseNet-121's 352->128
// to 480->128 at 28x28 won 10-15% on matmul, ResNet-50's 512->128 at 16x16 lost 20%).
std::string amx_pointwise_rule(ConvPass pass, const Tensor& w, const Tensor& y, int64_t rows) {
  if (pass != ConvPass::forward)
    return fmt::format("matrix product: bf16 pointwise {} on AMX, {} rows",
                       pass == ConvPass::backward_data ? "data gradient" : "weight gradient", rows);
  if (w.size(1) <= 256) return fmt::format("matrix product: bf16 pointwise forward on AMX, {} <= 256 inputs", w.size(1));
  if (y.size(2) * y.size(3) <= 16)
    return fmt::format("matrix product: bf16 pointwise forward on AMX onto {} <= 16 pixels", map_of(y));
  return "";
}

// A pointwise convolution of channels-last maps is one matrix product on the [N*H*W, C] pixel rows.
// On small maps oneDNN 2.6's 1x1 kernels split the work poorly between threads: DenseNet-121's
// bottlenecks at 32 px (2x2 and 1x1 maps, up to 1,000 channels) ran their weight gradients 3-6x and
// the other passes 1.2-2.8x faster as matmul (Zen 4). From a few thousand rows up the convolution
// kernels are as fast or faster, except for long backward sums: ResNet-50's 64->256 weight gradient
// at 32x32 (65,536 rows) ran 1.5x faster as matmul summed in one chunk per thread, its 256->64 data
// gradient 28 -> 23 ms per step, and no backward pass of 32,768 rows or more was slower there. bf16
// weight gradients: jit_bf16_1x1 ran ResNet-50's 8x8 and 16x16 layers (4,096 and 16,384 rows) at
// 645-711 GFLOP/s against 711-861 on matmul (Zen 5, avx512_bf16; not measured on AMX). A weight
// gradient that also sums the bias gradient keeps the convolution kernel, which fuses it.
std::string pointwise_rule(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p,
                           bool bias_gradient) {
  const KernelPolicy pol = pointwise_gemm_policy();
  if (pol == KernelPolicy::never || !pointwise_gemm_applicable(x, w, y, p)) return "";
  if (pass == ConvPass::backward_weight && bias_gradient) return "";
  if (pol == KernelPolicy::always) return "matrix product: DUET_POINTWISE_GEMM=always";
  const int64_t rows = pixel_rows(x);
  const bool bf16 = bf16_products(x, w, y, p);
  if (bf16 && bf16_on_amx()) return amx_pointwise_rule(pass, w, y, rows);
  if (rows <= 1024) return fmt::format("matrix product: pointwise, {} rows <= 1024", rows);
  if (pass != ConvPass::forward && rows >= 32768)
    return fmt::format("matrix product: pointwise backward, {} rows >= 32768", rows);
  if (pass == ConvPass::backward_weight && bf16 && rows >= 4096)
    return fmt::format("matrix product: bf16 pointwise weight gradient, {} rows >= 4096, bf16 without AMX", rows);
  return "";
}

// Below AVX-512 (AVX2 only: AMD Zen 3) oneDNN 2.6 has neither Winograd nor brgemm convolutions:
// its direct kernels (jit:avx2) fall well short of its jit sgemm, which the im2col and col2im paths
// run on. Measured on resnet50_cifar's f32 training step, batch 64 (AMD Zen 3, 2 threads, the
// autotuner's times, bench/results/conv_candidates_zen3_r50.json): every 3x3 weight gradient of 64
// inputs or more ran faster as im2col (64->64 at 32x32 43.1 ms against 78.5, 512->512 at 4x4 38.5
// against 70.3), the 3-channel stem's not (6.3 against 4.3); the data gradients of 128 channels and
// more as col2im (256->256 at 8x8 30.2 against 35.3, 512->512 at 8x8 42.9 against 64.3; 64->64 at
// 32x32 tied, 38.9 against 38.7); the strided forwards and those onto 4x4 as im2col (128->128
// strided onto 16x16 45.5 against 54.2 blocked; 512->512 at 4x4 35.2 against 49.1), while the
// stride-1 forwards onto 8x8 and larger ran fastest on the blocked direct kernel (64->64 at 32x32
// 39.7 against 43.9 direct and 53.7 im2col; 256->256 at 8x8 53.7 against 55.4 and 57.6).
bool dense_kernel_without_avx512(const Tensor& w, const Conv2dParams& p, int64_t min_channels) {
  return !cpu_caps().avx512 && p.groups == 1 && (w.size(2) > 1 || w.size(3) > 1) && w.size(0) >= min_channels &&
         w.size(1) >= min_channels;
}

// The weight gradient of a kernel larger than 1x1 as dy^T im2col(x). On small maps oneDNN 2.6's
// bf16 weight-gradient kernel (jit_bf16) runs far below the bf16 GEMM ceiling: ResNet's 512->512 3x3
// layer at 4x4 took 2.7x its forward's time (Zen 5). f32 has Winograd there, except on the strided
// layers that open ResNet's stages, where direct took 8.3 ms against 5.7 for 256->512 onto 4x4 and
// 7.0 against 6.0 for 128->256 onto 8x8 (onto 16x16, 7.3 against 7.7: direct stays). The
// convolution kernel fuses a bias gradient, so it keeps those. On AMX, oneDNN's bf16 weight-gradient
// kernel (jit:avx512_core_amx_bf16) is weak on small maps and strided layers while its AMX matmul is
// not: 256->256 at 8x8 3.42-3.88 ms on im2col against 5.04-5.21, the strided 256->512 onto 4x4 2.00
// against 11.87, 256 strided onto 8x8 3.46 against 10.99, 64->128 strided onto 16x16 3.40 against
// 4.22; from 16x16 maps of stride 1 up oneDNN's kernel wins (128->128: 3.57 against 5.16).
std::string im2col_rule(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p,
                        bool bias_gradient) {
  const KernelPolicy pol = im2col_weight_gradient_policy();
  if (pol == KernelPolicy::never || bias_gradient || !im2col_weight_gradient_applicable(x, dw, dy, p)) return "";
  if (pol == KernelPolicy::always) return "im2col: DUET_IM2COL_WGRAD=always";
  const int64_t pixels = dy.size(2) * dy.size(3);
  const bool strided = p.stride_h > 1 || p.stride_w > 1;
  const bool bf16 = bf16_products(x, dw, dy, p);
  if (bf16 && bf16_on_amx()) {
    if (pixels <= 64) return fmt::format("im2col: bf16 weight gradient on AMX onto {} <= 64 pixels", map_of(dy));
    if (strided && pixels <= 256)
      return fmt::format("im2col: bf16 strided weight gradient on AMX onto {} <= 256 pixels", map_of(dy));
    return "";
  }
  if (bf16)
    return pixels <= 16 && winograd_rule(x, dw, dy, p).empty()
               ? fmt::format("im2col: bf16 weight gradient onto {} <= 16 pixels", map_of(dy))
               : "";
  if (dense_kernel_without_avx512(dw, p, 64))
    return fmt::format("im2col: weight gradient without AVX-512, {} >= 64", channels(dw));
  if (pixels <= 64 && winograd_rule(x, dw, dy, p).empty())
    return fmt::format("im2col: weight gradient onto {} <= 64 pixels, no winograd", map_of(dy));
  return "";
}

// Two other ways to a data gradient, for CPUs where oneDNN 2.6's backward-data kernels lag its
// forward ones (on AMX the forward runs brgconv, the data gradient an older jit kernel):
// - the forward convolution of dy by the weights turned 180 degrees with their channels swapped
//   (stride 1 only): dx[c] = sum over o and taps of dy[o] w[o, c, K-1-kh, K-1-kw], the same sums;
// - dy W as a [pixels, K*K*C] column matrix in f32, scattered back onto dx (col2im), any stride.
// Measured with bf16 on AMX (Intel Xeon, 2 threads; bench/results/conv_candidates_amx_r50_bf16.json
// and resnet18_cifar's): the flipped forward ran 128->128 at 16x16 in 1.37-1.38 ms against 1.67-1.68
// and 64->64 at 32x32 1.38 against 1.48 (onto 8x8 it lost: 2.70 against 2.15); col2im ran 512->512
// from 4x4 in 2.81-3.13 ms against 7.61-7.68, the strided 256->512 from 4x4 1.65 against 5.09, 256
// strided from 8x8 1.93 against 2.47, and the strided 1x1 shortcuts from 4x4, 8x8 and 16x16 in 3.39
// / 3.50 / 4.65 ms against 11.57 / 7.22 / 6.98 (the strided 3x3 from 16x16 lost: 4.88 against 2.61).
std::string flipped_dgrad_rule(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p) {
  const KernelPolicy pol = flipped_data_gradient_policy();
  if (pol == KernelPolicy::never || !flipped_data_gradient_applicable(dx, w, dy, p)) return "";
  if (pol == KernelPolicy::always) return "flipped forward: DUET_FLIPPED_DGRAD=always";
  const int64_t pixels = dy.size(2) * dy.size(3);
  if (bf16_products(dx, w, dy, p) && bf16_on_amx() && pixels >= 256)
    return fmt::format("flipped forward: bf16 data gradient on AMX onto {} >= 256 pixels", map_of(dx));
  return "";
}
std::string col2im_dgrad_rule(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p) {
  const KernelPolicy pol = col2im_data_gradient_policy();
  if (pol == KernelPolicy::never || !col2im_data_gradient_applicable(dx, w, dy, p)) return "";
  if (pol == KernelPolicy::always) return "col2im: DUET_COL2IM_DGRAD=always";
  if (dx.dtype() == DType::f32 && dense_kernel_without_avx512(w, p, 128))
    return fmt::format("col2im: data gradient without AVX-512, {} >= 128", channels(w));
  if (!(bf16_products(dx, w, dy, p) && bf16_on_amx())) return "";
  const int64_t pixels = dy.size(2) * dy.size(3);
  const bool strided = p.stride_h > 1 || p.stride_w > 1, pointwise = w.size(2) == 1 && w.size(3) == 1;
  if (pixels <= 16) return fmt::format("col2im: bf16 data gradient on AMX from {} <= 16 pixels", map_of(dy));
  if (strided && pixels <= 64) return fmt::format("col2im: bf16 strided data gradient on AMX from {} <= 64 pixels", map_of(dy));
  if (strided && pointwise && pixels <= 256)
    return fmt::format("col2im: bf16 strided 1x1 data gradient on AMX from {} <= 256 pixels", map_of(dy));
  return "";
}

// The forward as im2col(x) times the weights' [O, KH*KW*C] matrix: below AVX-512 for strided layers
// and outputs of 16 pixels or fewer with 128 channels or more (above); elsewhere a candidate of the
// autotuner and forced with DUET_IM2COL_FORWARD=always. With AVX-512 it ran resnet18_cifar's
// 512->512 at 4x4 for one image about as fast as the blocked direct kernel it would replace (0.36
// ms against 0.37 direct and 0.40 blocked, bench/results/conv_candidates_amx_r18_infer_b1_winograd.json),
// and whole batch-1 passes with it on those layers did not differ beyond the host's noise
// (docs/journal.md). bf16 on AMX is different: there oneDNN 2.6 runs these forwards on brgconv at
// about half of what its AMX matmul does on the im2col rows, from two images up (Intel Xeon family 6
// model 167, 2 threads, bench/results/conv_candidates_amx_r18_bf16_{train,infer_b1,infer_b2,
// infer_b4,infer_b8}.json): 512->512 at 4x4 for 64 images 2.75 ms against 5.92 blocked, for 8 images
// 0.30 against 0.66, for 2 images 0.15 against 0.18, but for one image (16 rows) 0.11 against 0.08;
// 256->512 strided onto 4x4 for 64 images 1.17 against 2.22, for 2 images 0.05 against 0.08. Onto
// 8x8 im2col lost (256->256 for 64 images 2.66 against 1.43 direct).
std::string im2col_forward_rule(const ConvProblem& pb) {
  const KernelPolicy pol = im2col_forward_policy();
  if (pol == KernelPolicy::never || !im2col_forward_applicable(pb.x, pb.w, pb.y, pb.p)) return "";
  if (pol == KernelPolicy::always) return "im2col: DUET_IM2COL_FORWARD=always";
  const bool strided = pb.p.stride_h > 1 || pb.p.stride_w > 1;
  if (bf16_products(pb.x, pb.w, pb.y, pb.p) && bf16_on_amx() && pb.y.size(2) * pb.y.size(3) <= 16 &&
      pixel_rows(pb.y) >= 32)
    return fmt::format("im2col: bf16 forward on AMX onto {} <= 16 pixels, {} rows >= 32", map_of(pb.y),
                       pixel_rows(pb.y));
  if (pb.x.dtype() == DType::f32 && dense_kernel_without_avx512(pb.w, pb.p, 128) &&
      (strided || pb.y.size(2) * pb.y.size(3) <= 16))
    return fmt::format("im2col: forward without AVX-512, {} >= 128, {}", channels(pb.w),
                       strided ? "strided" : fmt::format("output {} <= 16 pixels", map_of(pb.y)));
  return "";
}

// The forward of a dense KxK convolution (K > 1) whose output map has at most 16 pixels runs on
// the blocked layout: oneDNN 2.6 picks brgconv for NHWC there and reaches about half of what its
// jit kernel does on nChw16c (512->512 at 4x4: 234 against 447 GFLOP/s; 256->512 stride 2 from 8x8
// 381 against 497; DenseNet's 128->32 at 2x2 342 against 446); from 8x8 outputs up NHWC is as fast
// or faster (256->256 at 8x8: 514 against 450). The backward passes stay NHWC.
std::string blocked_forward_rule(const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  if (p.groups == 1 && (w.size(2) > 1 || w.size(3) > 1) && y.size(2) * y.size(3) <= 16)
    return fmt::format("blocked layout: {}x{} kernel onto {} <= 16 pixels", w.size(2), w.size(3), map_of(y));
  if (dense_kernel_without_avx512(w, p, 64))  // the forwards im2col does not take below AVX-512 (above)
    return fmt::format("blocked layout: {}x{} kernel without AVX-512, {} >= 64", w.size(2), w.size(3), channels(w));
  return "";
}

// duet's own direct forward (direct_conv.h) below AVX-512, where oneDNN 2.6 has only its jit:avx2
// kernels, for kernels larger than 1x1 with 16 input channels or more onto maps of at most 256
// pixels or outputs of at most 4,096 pixels (N*OH*OW). Measured on AMD Zen 3 (2 threads, f32
// resnet18_cifar, bench/conv_candidates.py, bench/results/conv_candidates_zen3_r18_{infer_b1,
// infer_b64,train}.json; the host moved single timings by 10-15% between runs): for one image it
// won or tied every 3x3 layer but 256->256 at 8x8 (0.49 ms against 0.43 blocked; an earlier run
// had 0.55 against 0.62); for 64 images it won onto 8x8 (256->256 31.1 against 38.6 im2col) and
// on the strided 64->128 and 128->256 (18.4 against 22.9 blocked, 19.1 against 21.0 im2col), lost
// 5% at 16x16 (128->128 35.6 against 33.9 blocked) and on 512->512 at 4x4 (32.8 against 31.1
// im2col), and onto 32x32 lost in inference (64->64 37.9 against 35.6 blocked) and won in training
// (33.0 against 34.9), so 32x32 maps of many images stay on the blocked kernel. The 3-channel stem
// stays on oneDNN (8.0 ms against 1.8 direct: a sum of 27 products per pixel is mostly the
// kernel's set-up), and so do 1x1 kernels (jit_1x1: 2.0 against 3.0 ms for 64->128 at 32x32).
std::string own_direct_rule(const ConvProblem& pb) {
  const KernelPolicy pol = own_direct_policy();
  if (pol == KernelPolicy::never || !own_direct_applicable(pb.x, pb.w, pb.y, pb.p)) return "";
  if (pol == KernelPolicy::always) return "duet direct: DUET_OWN_DIRECT=always";
  const Tensor &w = pb.w, &y = pb.y;
  if (cpu_caps().avx512 || (w.size(2) == 1 && w.size(3) == 1) || w.size(1) < 16) return "";
  // The rule comes first, so that DUET_OWN_DIRECT=always forces it over the others; chosen
  // automatically, it yields to a later rule's algorithm that a test forces.
  if (later_rule_forced(ConvAlgo::own_direct, pb.pass)) return "";
  if (y.size(2) * y.size(3) <= 256)
    return fmt::format("duet direct: {}x{} kernel below AVX-512, output {} of <= 256 pixels", w.size(2), w.size(3),
                       map_of(y));
  if (pixel_rows(y) <= 4096)
    return fmt::format("duet direct: {}x{} kernel below AVX-512, {} output pixels <= 4096", w.size(2), w.size(3),
                       pixel_rows(y));
  return "";
}

// The data gradient of a stride-1 layer on the same kernel, as its forward of dy by the flipped
// weights (direct_conv.h): a candidate of the autotuner that no rule picks. In f32 training of
// resnet18_cifar at batch 64 on AMD Zen 3 it tied oneDNN's direct kernel at 64->64 on 32x32 (38.7
// ms against 37.8) and lost from 16x16 down (128->128 31.8 against 29.0; 256->256 at 8x8 36.2
// against 28.1; bench/results/conv_candidates_zen3_r18_train.json).
std::string own_direct_dgrad_rule(const ConvProblem& pb) {
  const KernelPolicy pol = own_direct_policy();
  if (pol == KernelPolicy::never || !own_direct_data_gradient_applicable(pb.x, pb.w, pb.y, pb.p)) return "";
  if (pol == KernelPolicy::always) return "duet direct: DUET_OWN_DIRECT=always, dy by the flipped weights";
  return "";
}

// The weight gradient on the same kernel's register tile (direct_conv.h): dy^T times x's taps,
// packed per chunk of 256 pixels, the padding skipped. Below AVX-512 it takes the dense layers of
// 64 channels or more on both sides with a kernel larger than 1x1 (the layers the im2col rule took
// before), and the 1x1 layers of 256 input channels or more that the matrix product's rule does
// not take. Measured on AMD Zen 3 (2 threads, f32 resnet50_cifar at batch 64, the autotuner's
// times, bench/results/conv_candidates_zen3_r50_wgrad.json): against the best other candidate,
// 256->256 at 8x8 31.0 ms against 43.4 (im2col), 512->512 at 4x4 27.5 against 35.7, 128->128 at
// 16x16 35.7 against 43.1, 64->64 at 32x32 39.5 against 43.6; the strided 3x3 layers within 12%
// either way (256 onto 8x8 36.9 against 42.4; 128 onto 16x16 46.3 against 41.5); 1x1 layers of 256
// inputs or more 0.62-0.92 of the time of oneDNN's jit_1x1 kernel, which the rules gave them before
// (1024->2048 strided 35.0 against 56.6; 1024->256 at 8x8 24.4 against 27.8; 1024->512 at 8x8 32.6
// against 46.5, where the matrix product, which no rule gives it, took 28.4), but 128->512 at 16x16
// 21.9 against 18.7, so 1x1 layers of fewer inputs keep oneDNN's kernel. The whole training step against the rules before (35c85c9, 4
// alternated rounds, bench/results/compare_zen3_own_wgrad_train.json): resnet50_cifar 1.03x,
// resnet18_cifar 1.04x, densenet121 0.99x, on a host whose load moved the same binary's
// densenet121 step from 236 to 292 ms between two runs; the run before, where 1x1 layers of 64
// inputs or more took it too, gave 1.08x, 1.08x and 1.02x.
std::string own_direct_wgrad_rule(const ConvProblem& pb) {
  const KernelPolicy pol = own_direct_policy();
  if (pol == KernelPolicy::never || pb.bias || !own_direct_applicable(pb.x, pb.w, pb.y, pb.p)) return "";
  if (pol == KernelPolicy::always) return "duet direct: DUET_OWN_DIRECT=always, weight gradient";
  const Tensor &x = pb.x, &w = pb.w, &y = pb.y;
  if (cpu_caps().avx512 || pb.p.groups != 1 || w.size(0) < 64 || w.size(1) < 64) return "";
  const bool pointwise = w.size(2) == 1 && w.size(3) == 1;
  if (pointwise && (w.size(1) < 256 || !pointwise_rule(pb.pass, x, w, y, pb.p, pb.bias).empty())) return "";
  // Chosen automatically, it yields to a later rule's algorithm that a test forces.
  if (later_rule_forced(ConvAlgo::own_direct, pb.pass)) return "";
  if (pointwise)
    return fmt::format("duet direct: 1x1 weight gradient below AVX-512, {} >= 256, {} rows", channels(w),
                       pixel_rows(y));
  return fmt::format("duet direct: {}x{} weight gradient below AVX-512, {} >= 64", w.size(2), w.size(3), channels(w));
}

// duet's own Winograd F(4x4, 3x3) (winograd_conv.h) for all three passes of 3x3 stride-1 layers
// below AVX-512, where oneDNN 2.6 has no Winograd kernel, and for some forwards with AVX-512 (the
// last paragraph): a quarter of a direct sum's
// multiplications, as 36 matrix products between transforms. It takes layers of 32 channels or
// more on both sides, output maps of at least 4x4, at least 4 tiles of 4x4 outputs and products of
// at least 2^21 multiply-adds. Measured on
// AMD Zen 3 (2 threads, bench/conv_candidates.py, the fastest of 2 rounds, bench/results/
// conv_candidates_zen3_r18_winograd_{train,infer_b1,infer_b8}.json and, 1 round,
// conv_candidates_zen3_dn121_winograd.json), its time over the best other candidate's: f32 training
// of resnet18_cifar at batch 64, every 3x3 stride-1 pass 0.35-0.93 (forward 256->256 at 8x8 11.7 ms
// against 33.1 duet direct; 64->64 at 32x32 23.4 against 38.0; the weight gradient of 512->512 at
// 4x4 24.8 against 26.6); DenseNet-121's 128->32 layers (224 px) 0.47-0.96 on every pass but the
// data gradient at 14x14 (6.05 against 5.59 direct); inference with frozen weights (their transform
// kept) 0.45-0.70 at batch 1 from 8x8 maps up (256->256 at 8x8, 4 tiles: 0.39 against 0.56) and
// 0.37-0.56 at batch 8 (512->512 at 4x4, 8 tiles: 2.33 against 4.16), but 2.5x at batch 1 on
// 512->512 at 4x4 (one tile: 1.67 against 0.67), where the products read 36 transformed kernels of
// 1 MB for one row each. Small products lose to the calls' own cost: DenseNet-121's 128->32 layers
// at 32 px (bench/results/conv_candidates_zen3_dn121_32px_winograd_infer_b{1,8}.json) tied at batch
// 1 onto 8x8 (4 tiles, 0.6 million multiply-adds in the 36 products: 0.04 ms each) and lost at
// batch 8 onto 4x4 (8 tiles, 1.2 million: 0.08 against 0.06), and won at batch 8 onto 8x8 (4.7
// million: 0.16 against 0.27); alternated whole batch-1 passes of DenseNet-121 with the rule at 4
// tiles took 1.25x the time without it (bench/results/compare_zen3_own_winograd_infer.json, load
// 2.0) and 1.06x in a second run of 4 rounds, so the products must
// have at least 2^21 multiply-adds (every layer above that won has 4.7 million or more). The
// 3-channel stem stays on oneDNN (10.7 ms against 2.0). Its rounding
// error is about 7x a direct sum's (winograd_conv.cpp).
// With AVX-512 oneDNN has a Winograd kernel of its own, and duet's takes only forwards over 32 to
// 255 tiles, frozen weights or not (the same algorithm either way, so freezing changes no bits).
// AMD Zen 5, 2 threads, resnet18_cifar: cache-warm forwards (bench/conv_candidates.py, fastest of 2
// rounds, weights not frozen: the kernel transform at every call), 256->256 at 8x8 for 8 images (32
// tiles) 0.80 ms against 1.13 for the best other, for 32 images (128 tiles) 2.08 against 2.85;
// 128->128 at 16x16 for 8 images (128 tiles) 0.53 against 0.76; 512->512 at 4x4 for 64 images (64
// tiles) 6.68 against 7.41, for 32 (32 tiles) 5.26 against 5.24, but for 16 (16 tiles) 4.47
// against 2.61, its 38 MB of transformed kernels made for little work. Frozen (inference, the
// transform kept; per-op profiles against the rule without it): 256->256 at 8x8 for 8 images 616
// us against 1119, 128->128 at 16x16 583 against 832; 512->512 at 4x4 for 64 images 3.46 ms against
// 7.21 (conv_candidates_zen5_r18_winograd_infer_b64.json). The bound of 256 tiles is for
// training: without it, inference at batch 64 gained more (resnet18_cifar 1.15x against 1.11x) but
// training steps lost 2-3% (compare_zen5_own_winograd_unbounded_{infer,train}.json), plausibly
// because oneDNN's Winograd forward shares its reorders with the backward passes. duet's data and
// weight gradients were within 1.5% of a ResNet-50 step of oneDNN's (conv_candidates_zen5_r50_
// winograd_train.json): oneDNN's keeps them.
std::string own_winograd_rule(const ConvProblem& pb) {
  const KernelPolicy pol = own_winograd_policy();
  const bool applies = pb.pass == ConvPass::backward_data ? own_winograd_data_gradient_applicable(pb.x, pb.w, pb.y, pb.p)
                                                          : own_winograd_applicable(pb.x, pb.w, pb.y, pb.p);
  if (pol == KernelPolicy::never || !applies || (pb.pass == ConvPass::backward_weight && pb.bias)) return "";
  if (pol == KernelPolicy::always) return "duet winograd: DUET_OWN_WINOGRAD=always";
  // Chosen automatically, it yields to a later rule's algorithm that a test forces.
  if (later_rule_forced(ConvAlgo::own_winograd, pb.pass)) return "";
  const Tensor &w = pb.w, &y = pb.y;  // y: the output, or dy (its map is the output's in every pass)
  const Tensor& out = pb.pass == ConvPass::backward_data ? pb.x : y;  // the map the 4x4 tiles cover
  const int64_t tiles = out.size(0) * ((out.size(2) + 3) / 4) * ((out.size(3) + 3) / 4);
  if (w.size(0) < 32 || w.size(1) < 32 || out.size(2) < 4 || out.size(3) < 4 || tiles < 4) return "";
  if (36 * tiles * w.size(0) * w.size(1) < (int64_t(1) << 21)) return "";  // the 36 products' multiply-adds
  if (cpu_caps().avx512) {
    if (pb.pass != ConvPass::forward || tiles < 32 || tiles >= 256) return "";
    return fmt::format("duet winograd: 3x3 stride 1 forward with AVX-512, {} >= 32, 32 <= {} tiles of 4x4 onto {} < 256",
                       channels(w), tiles, map_of(out));
  }
  return fmt::format("duet winograd: 3x3 stride 1 below AVX-512, {} >= 32, {} tiles of 4x4 onto {}", channels(w), tiles,
                     map_of(out));
}

// A KxK kernel over a 1x1 map with one output pixel sees the input through a single tap (DenseNet's
// 3x3 layers in its last block at 32 px, any padded 3x3 layer on a 1x1 map): it is the 1x1
// convolution with that tap, a matrix product over the N rows. oneDNN 2.6's 3x3 weight-gradient
// kernel ran these at ~5 GFLOP/s, products with the zero padding included.
std::string tap_rule(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  int64_t th = 0, tw = 0;
  if (!single_tap(x, w, y, p, th, tw)) return "";
  return fmt::format("one tap: a {}x{} kernel over a 1x1 map sees the input through tap ({}, {})", w.size(2),
                     w.size(3), th, tw);
}

// Depthwise shapes oneDNN has no depthwise kernel for (jit_dw, brdgmm_dw) run on duet's loops:
// MobileNet's last stages at 32 px (1x1 and 2x2 maps, 3x3 kernel) fell back to im2col + GEMM or
// reference loops, 13.5 ms forward and 29.5 ms backward for [64, 960, 1, 1] against 0.1 and 0.2.
// So do forwards too small to be worth a second thread (fewer multiply-adds than kParallelGrain,
// which duet's kernel runs on the calling thread): MobileNetV2's last stages for one image, where
// oneDNN's call costs more than the sums (about 2.5-3 against 4-7 us a layer of 192 x 4 x 4 to
// 960 x 1 x 1 at 32 px). Elsewhere oneDNN's depthwise kernels stay: about 2x faster per
// multiply-add than duet's (96 x 16 x 16 for 8 images: 34 against 20 us).
std::string depthwise_rule(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p,
                           bool bias) {
  if (!depthwise_applicable(x, w, y, p)) return "";
  const KernelPolicy pol = depthwise_policy();
  if (pol == KernelPolicy::never) return "";
  if (pol == KernelPolicy::always) return "duet depthwise: policy always";
  if (const int64_t macs = y.numel() * w.size(2) * w.size(3); pass == ConvPass::forward && macs < kParallelGrain)
    return fmt::format("duet depthwise: a forward of {} multiply-adds, one thread's work", macs);
  const std::string onednn = onednn_conv_impl(ConvAlgo::direct, pass, x, w, y, p, bias);
  if (onednn.find("_dw") != std::string::npos) return "";
  return fmt::format("duet depthwise: oneDNN has no depthwise kernel here (it offers {})", onednn);
}

// The rules in order; direct on the tensors' own layout when none applies.
ConvPlan rule_plan(const ConvProblem& pb) {
  const Tensor &x = pb.x, &w = pb.w, &y = pb.y;
  if (std::string r = tap_rule(x, w, y, pb.p); !r.empty()) return {ConvAlgo::tap_matmul, r};
  if (std::string r = depthwise_rule(pb.pass, x, w, y, pb.p, pb.bias); !r.empty()) return {ConvAlgo::own_depthwise, r};
  if (std::string r = own_winograd_rule(pb); !r.empty()) return {ConvAlgo::own_winograd, r};
  if (pb.pass == ConvPass::forward)
    if (std::string r = own_direct_rule(pb); !r.empty()) return {ConvAlgo::own_direct, r};
  if (pb.pass == ConvPass::backward_weight)
    if (std::string r = own_direct_wgrad_rule(pb); !r.empty()) return {ConvAlgo::own_direct, r};
  if (std::string r = pointwise_rule(pb.pass, x, w, y, pb.p, pb.bias); !r.empty()) return {ConvAlgo::matmul, r};
  if (pb.pass == ConvPass::backward_weight)
    if (std::string r = im2col_rule(x, w, y, pb.p, pb.bias); !r.empty()) return {ConvAlgo::im2col_matmul, r};
  if (pb.pass == ConvPass::backward_data) {
    if (std::string r = own_direct_dgrad_rule(pb); !r.empty()) return {ConvAlgo::own_direct, r};
    if (std::string r = flipped_dgrad_rule(x, w, y, pb.p); !r.empty()) return {ConvAlgo::flipped_forward, r};
    if (std::string r = col2im_dgrad_rule(x, w, y, pb.p); !r.empty()) return {ConvAlgo::col2im_matmul, r};
  }
  if (pb.pass == ConvPass::forward)
    if (std::string r = im2col_forward_rule(pb); !r.empty()) return {ConvAlgo::im2col_matmul, r};
  if (std::string r = winograd_plan(pb); !r.empty()) return {ConvAlgo::winograd, r};
  if (pb.pass == ConvPass::forward)
    if (std::string r = blocked_forward_rule(w, y, pb.p); !r.empty()) return {ConvAlgo::direct_blocked, r};
  return {ConvAlgo::direct, "direct: no other rule applies"};
}

// Every algorithm that can run the pass (a policy set to never rules its algorithm out).
std::vector<ConvAlgo> candidates(const ConvProblem& pb) {
  const Tensor &x = pb.x, &w = pb.w, &y = pb.y;
  std::vector<ConvAlgo> c{ConvAlgo::direct};
  if (pb.pass == ConvPass::forward && pb.p.groups == 1 && (w.size(2) > 1 || w.size(3) > 1))
    c.push_back(ConvAlgo::direct_blocked);
  if (winograd_policy() != KernelPolicy::never && winograd_applicable(x, w, pb.p)) c.push_back(ConvAlgo::winograd);
  if (pointwise_gemm_policy() != KernelPolicy::never && pointwise_gemm_applicable(x, w, y, pb.p) &&
      !(pb.pass == ConvPass::backward_weight && pb.bias))
    c.push_back(ConvAlgo::matmul);
  if (pb.pass == ConvPass::forward && im2col_forward_policy() != KernelPolicy::never &&
      im2col_forward_applicable(x, w, y, pb.p))
    c.push_back(ConvAlgo::im2col_matmul);
  if (own_direct_policy() != KernelPolicy::never &&
      (pb.pass == ConvPass::backward_data ? own_direct_data_gradient_applicable(x, w, y, pb.p)
                                          : own_direct_applicable(x, w, y, pb.p)) &&
      !(pb.pass == ConvPass::backward_weight && pb.bias))
    c.push_back(ConvAlgo::own_direct);
  if (own_winograd_policy() != KernelPolicy::never &&
      (pb.pass == ConvPass::backward_data ? own_winograd_data_gradient_applicable(x, w, y, pb.p)
                                          : own_winograd_applicable(x, w, y, pb.p)) &&
      !(pb.pass == ConvPass::backward_weight && pb.bias))
    c.push_back(ConvAlgo::own_winograd);
  if (pb.pass == ConvPass::backward_weight && im2col_weight_gradient_policy() != KernelPolicy::never &&
      im2col_weight_gradient_applicable(x, w, y, pb.p) && !pb.bias)
    c.push_back(ConvAlgo::im2col_matmul);
  if (pb.pass == ConvPass::backward_data && flipped_data_gradient_policy() != KernelPolicy::never &&
      flipped_data_gradient_applicable(x, w, y, pb.p))
    c.push_back(ConvAlgo::flipped_forward);
  if (pb.pass == ConvPass::backward_data && col2im_data_gradient_policy() != KernelPolicy::never &&
      col2im_data_gradient_applicable(x, w, y, pb.p))
    c.push_back(ConvAlgo::col2im_matmul);
  return c;
}

// What a plan depends on: the tensors' shapes, strides and dtypes, the attributes, the pass, the
// thread count (Key adds it), and every policy and the autotune switch (tests flip them at run time).
Key plan_key(const ConvProblem& pb) {
  Key k("plan");
  k.add(pb.x).add(pb.w).add(pb.y);
  const Conv2dParams& p = pb.p;
  k.add(p.stride_h).add(p.stride_w).add(p.pad_h).add(p.pad_w).add(p.dilation_h).add(p.dilation_w).add(p.groups);
  k.add(static_cast<int64_t>(pb.pass)).add(int64_t(pb.bias)).add(p.act ? 1 + static_cast<int64_t>(*p.act) : 0);
  for (const RulePolicy& r : kRulePolicies) k.add(static_cast<int64_t>(r.get()));
  k.add(int64_t(conv_autotune())).add(int64_t(bf16_math_in_f32()));
  return k;
}

// The fastest candidate on this machine for this shape, timed on the call's own tensors; a
// candidate that fails to build is skipped.
ConvPlan autotuned(const ConvProblem& pb, const ConvPlan& rule, const std::function<void(ConvAlgo)>& run) {
  const std::vector<ConvAlgo> cands = candidates(pb);
  if (cands.size() < 2) return rule;
  ConvAlgo best = rule.algo;
  double best_ns = std::numeric_limits<double>::infinity();
  std::string timings;
  for (ConvAlgo c : cands) {
    std::array<double, 3> ns{};
    try {
      run(c);  // builds the primitive and warms the caches
      for (double& t : ns) {
        const auto t0 = std::chrono::steady_clock::now();
        run(c);
        t = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      }
    } catch (const dnnl::error&) {
      continue;
    } catch (const Error&) {
      continue;
    }
    g_tuning_runs.fetch_add(4);
    std::sort(ns.begin(), ns.end());
    timings += fmt::format("{}{} {:.2f} ms", timings.empty() ? "" : ", ", algo_name(c), ns[1] * 1e-6);
    if (ns[1] < best_ns) {
      best_ns = ns[1];
      best = c;
    }
  }
  return {best, fmt::format("autotuned: {}", timings)};
}

// Plans made so far: a shape is planned (and tuned) once, and a step that repeats the shapes of the
// previous one formats no reason and asks oneDNN nothing. Entries are never removed, so the
// references handed out stay valid.
std::mutex g_plans_mutex;
KeyedBy<ConvPlan> g_plans;  // guarded by g_plans_mutex

}  // namespace

const ConvPlan& plan_conv(const ConvProblem& pb, const std::function<void(ConvAlgo)>& run) {
  const Key key = plan_key(pb);
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    if (auto it = g_plans.find(key.view()); it != g_plans.end()) return it->second;
  }
  ConvPlan plan = rule_plan(pb);
  // A single tap and duet's depthwise loops answer what no candidate of oneDNN's can; they are
  // not tuned against it.
  if (conv_autotune() && plan.algo != ConvAlgo::tap_matmul && plan.algo != ConvAlgo::own_depthwise)
    plan = autotuned(pb, plan, run);
  // oneDNN's convolutions compute in the type conv.cpp's compute_dtype gives them, which this same
  // test decides; the matrix products decide for their own operands (matmul.cpp) and say so.
  const bool onednn_conv = plan.algo == ConvAlgo::direct || plan.algo == ConvAlgo::direct_blocked ||
                           plan.algo == ConvAlgo::winograd || plan.algo == ConvAlgo::flipped_forward;
  if (onednn_conv && pb.x.dtype() == DType::bf16 && bf16_conv_in_f32(pb.x, pb.w, pb.y, pb.p.groups))
    plan.reason += "; " + bf16_conv_in_f32_reason(pb.x, pb.w, pb.y);
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return g_plans.emplace(key.str(), std::move(plan)).first->second;
}

}  // namespace duet::cpu
