#include "opcheck/op_check.h"
#include "engine/half.h"
#include "engine/ops/dispatch.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <fmt/format.h>

namespace duet::opcheck {

namespace {

uint64_t leaf_seed(size_t i, uint64_t seed) { return 1000 + 17 * i + seed * 100003; }

// The leaf of input `in`, with the table's values for its position, on device d.
Tensor make_leaf(const In& in, uint64_t seed, DType dtype, Device d) {
  Tensor t;
  if (in.classes > 0) {
    std::vector<int64_t> v(static_cast<size_t>(numel_of(in.shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + seed * 3) % in.classes);
    t = Tensor::from_vector<int64_t>(v, in.shape, TensorOptions(DType::i64));
  } else {
    Shape s = in.shape;
    if (in.layout == Layout::transposed) std::swap(s[s.size() - 1], s[s.size() - 2]);
    if (in.layout == Layout::strided) s.back() *= 2;
    // A 16-bit case's leaves are f32 holding 16-bit values (only f32 and f64 tensors take a
    // gradient); views_of casts them, as a mixed-precision network casts its f32 weights and inputs.
    // Parameters of normalisations stay f32.
    const bool half = is_half(dtype);
    t = random_values(s, seed, in.param && half ? DType::f32 : dtype, in.lo, in.hi);
    if (half) t = t.to(DType::f32);
    if (in.layout == Layout::channels_last) {
      BackendGuard ref(DeviceType::cpu, Backend::reference);
      t = t.contiguous(MemoryFormat::channels_last).detach();
    }
  }
  t = t.to(d).detach();  // keeps the layout
  if (in.grad && in.classes == 0) t.set_requires_grad(true);
  return t;
}

Tensor view_of(const In& in, const Tensor& leaf) {
  switch (in.layout) {
    case Layout::transposed: return leaf.transpose(-1, -2);
    case Layout::strided: return leaf.slice(-1, 0, leaf.size(-1), 2);
    case Layout::expanded: return leaf.expand(in.expand_to);
    default: return leaf;
  }
}

// While a run lives: the CPU device's backend is the target's (the reference when the target is a
// GPU, so that whatever the case does on the host is defined by the loops).
BackendGuard host_backend(const Target& t) {
  return BackendGuard(DeviceType::cpu, t.device.type == DeviceType::cpu ? t.backend : Backend::reference);
}

void synchronize(const Target& t) {
  if (t.device.type != DeviceType::cpu) backend(t.backend).synchronize();
}

// The fixed random weights R_i of the differentiable outputs (undefined for the others).
std::vector<Tensor> output_weights(const std::vector<Tensor>& outs) {
  std::vector<Tensor> R(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& o = outs[i];
    if (!o.requires_grad() || !is_floating(o.dtype())) continue;
    R[i] = random_values(o.shape(), 77 + i, o.dtype()).to(o.device());
  }
  return R;
}

// sum_i <out_i, R_i>; undefined when no output is differentiable. A 16-bit output and its R_i enter
// the sum in f32: every backend has f32 maths (the GPU's own kernels have no 16-bit ones), and the
// gradient that reaches the output, R_i cast back, is R_i exactly.
Tensor weighted_loss(const std::vector<Tensor>& outs, const std::vector<Tensor>& R) {
  Tensor loss;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!R[i].defined()) continue;
    const bool half = is_half(outs[i].dtype());
    const Tensor term = half ? sum(mul(outs[i].to(DType::f32), R[i].to(DType::f32))) : sum(mul(outs[i], R[i]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  return loss;
}

std::vector<Tensor> leaves_of(const Case& c, DType dtype, Device d, uint64_t seed) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < c.ins.size(); ++i) leaves.push_back(make_leaf(c.ins[i], leaf_seed(i, seed), dtype, d));
  return leaves;
}

std::vector<Tensor> views_of(const Case& c, const std::vector<Tensor>& leaves) {
  const bool half = is_half(c.dtype);
  std::vector<Tensor> views;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    const In& in = c.ins[i];
    // Cast before the view: the cast keeps a dense leaf's layout, the view then strides it.
    const bool cast = half && in.classes == 0 && !in.param;
    views.push_back(view_of(in, cast ? leaves[i].to(c.dtype) : leaves[i]));
  }
  return views;
}

// |a - b| <= atol + rtol |b| element by element (NaN only against NaN); the first element that is
// not, described, or "".
std::string first_mismatch(const Tensor& got, const Tensor& want, double atol, double rtol) {
  if (got.shape() != want.shape()) return fmt::format("shapes differ: {} vs {}", shape_str(got.shape()), shape_str(want.shape()));
  const std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool nan_mismatch = std::isnan(a[i]) != std::isnan(b[i]);
    if (nan_mismatch || (a[i] != b[i] && std::abs(a[i] - b[i]) > atol + rtol * std::abs(b[i])))
      return fmt::format("element {} of {}: {} vs {} (atol {}, rtol {})", i, shape_str(got.shape()), a[i], b[i], atol, rtol);
  }
  return "";
}

}  // namespace

std::vector<OpTrace::Entry> trace_case(const Case& c, const BackendImpl& as) {
  const std::vector<Tensor> leaves = leaves_of(c, c.dtype, Device::cpu(), 0);
  // A host backend is traced on itself; a device backend on the reference loops, routed as it.
  const bool host = as.kind() == Backend::cpu || as.kind() == Backend::reference;
  BackendGuard on(DeviceType::cpu, host ? as.kind() : Backend::reference);
  std::vector<OpTrace::Entry> entries;
  std::vector<Tensor> outs;
  {
    OpTrace trace(as);
    outs = c.f(views_of(c, leaves));
    entries = trace.entries();
  }
  const std::vector<Tensor> R = output_weights(outs);
  OpTrace trace(as);
  const Tensor loss = weighted_loss(outs, R);
  if (loss.defined()) loss.backward();
  entries.insert(entries.end(), trace.entries().begin(), trace.entries().end());
  return entries;
}

std::string refused_op(const Case& c, Backend b) {
  if (b == Backend::reference || !backend_available(b)) return "";
  static std::mutex mu;
  static std::map<std::pair<std::string, Backend>, std::string> known;  // a case's ops do not change
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = known.find({c.name, b}); it != known.end()) return it->second;
  }
  const BackendImpl& as = backend(b);
  // A trace runs the case on the loops: only worth it where the backend refuses some op in the
  // case's dtype (the cpu backend: f64 on oneDNN; the GPU: the 16-bit types beyond its matrix ops).
  bool refuses_some_op = false;
  for (int op = 0; op < kNumOps; ++op)
    refuses_some_op = refuses_some_op || as.support(static_cast<OpId>(op), c.dtype).coverage == Coverage::refused;
  if (!refuses_some_op) return "";
  std::string why;
  try {
    for (const OpTrace::Entry& e : trace_case(c, as)) {
      const DTypeSupport s = as.support(e.op, e.dtype);
      if (s.coverage != Coverage::refused) continue;
      why = fmt::format("{} in {}: {}", op_name(e.op), dtype_name(e.dtype), s.why);
      break;
    }
  } catch (const std::exception&) {
    // A case broken on the reference loops is reported by the run itself, not hidden as a skip.
  }
  std::lock_guard<std::mutex> lock(mu);
  known.emplace(std::make_pair(c.name, b), why);
  return why;
}

std::string Target::name() const {
  if (device.type == DeviceType::cpu) return backend_name(backend);
  return device.str();
}

Target cpu_target(Backend b) { return Target{Device::cpu(), b}; }
Target device_target(Device d) {
  return Target{d, d.type == DeviceType::cpu ? Backend::cpu : Backend::cuda};
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::conformance: return "conformance";
    case Mode::gradient: return "gradient";
    case Mode::perf: return "perf";
  }
  return "?";
}

namespace {
constexpr const char* kRefuses = "the backend refuses ";
}  // namespace

std::string skip_reason(const Case& c, const Target& t, Mode m) {
  if (c.perf_only && m != Mode::perf) return "timed only (a benchmark's shape)";
  if (!c.only.empty() && std::find(c.only.begin(), c.only.end(), t.backend) == c.only.end())
    return fmt::format("not a case of the {} backend", backend_name(t.backend));
  if (m == Mode::gradient) {
    bool grad = false;
    for (const In& in : c.ins) grad = grad || (in.grad && in.classes == 0);
    if (!grad) return "no input takes a gradient";
    if (!c.gradient_check) return "rounds to a narrower dtype on purpose";
    if (c.dtype != DType::f32) return "a dtype case";
    return "";  // the gradient mode runs on the reference loops in f64
  }
  // The timed-only cases are benchmark shapes in f32, too large to trace on the loops.
  if (c.perf_only) return "";
  if (const std::string op = refused_op(c, t.backend); !op.empty()) return kRefuses + op;
  return "";
}

double closeness(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape()) return INFINITY;
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) {
      if (!(std::isnan(va[i]) && std::isnan(vb[i]))) return INFINITY;
      continue;
    }
    if (va[i] == vb[i]) continue;  // equal infinities too
    const double r = std::abs(va[i] - vb[i]) / (atol + rtol * std::abs(vb[i]));
    worst = std::isnan(r) ? INFINITY : std::max(worst, r);
  }
  return worst;
}

double case_atol(const Case& c) { return c.atol > 0 ? c.atol : 1e-5 * c.tol; }
double case_rtol(const Case& c) { return c.rtol > 0 ? c.rtol : 1e-4 * c.tol; }

Run run_case(const Case& c, const Target& t, uint64_t seed) {
  const std::vector<Tensor> leaves = leaves_of(c, c.dtype, t.device, seed);
  BackendGuard guard = host_backend(t);
  Run r;
  r.outs = c.f(views_of(c, leaves));
  const Tensor loss = weighted_loss(r.outs, output_weights(r.outs));
  if (loss.defined()) loss.backward();
  for (const Tensor& l : leaves) r.grads.push_back(l.requires_grad() && l.grad().defined() ? l.grad().to(Device::cpu()) : Tensor());
  for (Tensor& o : r.outs) {
    if (o.device() != t.device)
      throw Error(fmt::format("the case made an output on {}, not on {}: it must make its tensors on its inputs' device",
                              o.device().str(), t.device.str()));
    o = o.detach().to(Device::cpu());
  }
  return r;
}

Outcome check_conformance(const Case& c, const Target& t, uint64_t seed) {
  Outcome res;
  try {
    const Run ref = run_case(c, cpu_target(Backend::reference), seed);
    const Run got = run_case(c, t, seed);
    const double atol = case_atol(c), rtol = case_rtol(c);
    if (ref.outs.size() != got.outs.size()) {
      res.problems.push_back(fmt::format("{} outputs, the reference has {}", got.outs.size(), ref.outs.size()));
      return res;
    }
    for (size_t i = 0; i < ref.outs.size(); ++i) {
      if (ref.outs[i].dtype() != got.outs[i].dtype()) {
        res.problems.push_back(fmt::format("output {} is {}, the reference's {}", i, dtype_name(got.outs[i].dtype()),
                                           dtype_name(ref.outs[i].dtype())));
        return res;
      }
      if (ref.outs[i].shape() != got.outs[i].shape()) {
        res.problems.push_back(fmt::format("output {} has shape {}, the reference's {}", i, shape_str(got.outs[i].shape()),
                                           shape_str(ref.outs[i].shape())));
        continue;
      }
      res.forward_error = std::max(res.forward_error, closeness(got.outs[i], ref.outs[i], atol, rtol));
      if (ref.outs[i].dtype() == DType::i64) {
        if (ref.outs[i].to_vector<int64_t>() != got.outs[i].to_vector<int64_t>())
          res.problems.push_back(fmt::format("output {} (i64) differs from the reference", i));
      } else if (const std::string m = first_mismatch(got.outs[i], ref.outs[i], atol, rtol); !m.empty()) {
        res.problems.push_back(fmt::format("output {}: {}", i, m));
      }
    }
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      if (ref.grads[i].defined() != got.grads[i].defined()) {
        res.problems.push_back(fmt::format("gradient of input {}: {} here, {} on the reference", i,
                                           got.grads[i].defined() ? "defined" : "undefined",
                                           ref.grads[i].defined() ? "defined" : "undefined"));
        return res;
      }
      if (!ref.grads[i].defined()) continue;
      res.backward_error = std::max(res.backward_error, closeness(got.grads[i], ref.grads[i], atol, rtol));
      if (const std::string m = first_mismatch(got.grads[i], ref.grads[i], atol, rtol); !m.empty())
        res.problems.push_back(fmt::format("gradient of input {}: {}", i, m));
    }
  } catch (const std::exception& e) {
    res.problems.push_back(std::string("error: ") + e.what());
  }
  return res;
}

// ---- gradient mode ---------------------------------------------------------------------------------

namespace {
// L = sum_i <out_i, R_i> at the leaves given (f64, reference backend). The first call (backward =
// true) picks the outputs gradients flow from (a batch norm's updated running statistics are outputs
// without one) and makes their R_i; later calls evaluate L at other leaves with the same terms.
double weighted_sum(const Case& c, const std::vector<Tensor>& leaves, std::vector<Tensor>& R, bool backward) {
  const std::vector<Tensor> outs = c.f(views_of(c, leaves));
  if (backward) R = output_weights(outs);
  const Tensor loss = weighted_loss(outs, R);
  if (!loss.defined()) return 0.0;
  if (backward) loss.backward();
  return loss.item();
}
}  // namespace

// The directional derivative of L along random directions V (one per differentiable leaf), from the
// analytic gradients (sum_j <grad_j, V_j>), against (L(x + eps V) - L(x - eps V)) / (2 eps). Two
// directions per case, so every element's gradient takes part: one forward and backward pass and
// four forward passes, whatever the case's size.
Outcome check_gradients(const Case& c) {
  Outcome res;
  try {
    BackendGuard guard(DeviceType::cpu, Backend::reference);
    const std::vector<Tensor> leaves = leaves_of(c, DType::f64, Device::cpu(), 0);
    std::vector<Tensor> R;
    weighted_sum(c, leaves, R, true);
    std::vector<size_t> with_grad;
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i].requires_grad() && leaves[i].grad().defined()) with_grad.push_back(i);
    if (with_grad.empty()) {
      res.problems.push_back("no gradient reached an input: the case belongs to the conformance mode only");
      return res;
    }
    // eps balances the rounding of L's long sums (divided by 2 eps) against the curvature; the
    // tolerance is relative to the size of the terms summed, |grad_j| |V_j|, not to their sum,
    // which cancels.
    const double eps = 1e-6;
    for (uint64_t d = 0; d < 2; ++d) {
      NoGradGuard no_grad;
      double analytic = 0, scale = 0;
      std::vector<Tensor> plus, minus;
      for (const Tensor& l : leaves) {
        plus.push_back(l.detach());
        minus.push_back(l.detach());
      }
      for (size_t i : with_grad) {
        const Tensor V = random_values(leaves[i].shape(), 500 + 31 * d + i, DType::f64);
        analytic += sum(mul(leaves[i].grad(), V)).item();
        scale += sum(abs(mul(leaves[i].grad(), V))).item();
        // leaf +- eps V keeps the leaf's layout (channels-last, the strided or transposed storage),
        // so the case's view of it is the same view.
        plus[i] = add(leaves[i].detach(), mul(V, eps));
        minus[i] = sub(leaves[i].detach(), mul(V, eps));
      }
      const double numeric = (weighted_sum(c, plus, R, false) - weighted_sum(c, minus, R, false)) / (2 * eps);
      const double tol = 1e-7 * scale + 1e-9;
      res.forward_error = std::max(res.forward_error, std::abs(analytic - numeric) / tol);
      if (!(std::abs(analytic - numeric) <= tol))
        res.problems.push_back(fmt::format("direction {}: analytic {:.12g}, finite differences {:.12g} (terms summing to {:.6g})",
                                           d, analytic, numeric, scale));
    }
  } catch (const std::exception& e) {
    res.problems.push_back(std::string("error: ") + e.what());
  }
  return res;
}

// ---- perf mode -------------------------------------------------------------------------------------

Prepared::Prepared(const Case& c, const Target& t) : c_(c), t_(t), leaves_(leaves_of(c, c.dtype, t.device, 0)) {}

void Prepared::step() {
  BackendGuard guard = host_backend(t_);
  const std::vector<Tensor> outs = c_.f(views_of(c_, leaves_));
  if (R_.empty()) R_ = output_weights(outs);
  std::vector<size_t> diff;
  for (size_t i = 0; i < outs.size(); ++i)
    if (R_[i].defined()) diff.push_back(i);
  if (diff.size() == 1) {
    outs[diff[0]].backward(R_[diff[0]]);  // no extra op timed
  } else if (!diff.empty()) {
    weighted_loss(outs, R_).backward();
  }
  for (const Tensor& l : leaves_)
    if (l.requires_grad()) l.zero_grad();
  synchronize(t_);
}

std::pair<double, double> Prepared::cost() {
  profiler::clear();
  profiler::enable(true);
  step();
  profiler::enable(false);
  double flops = 0, bytes = 0;
  for (const OpEvent& e : profiler::collect()) {
    flops += e.flops;
    bytes += e.bytes;
  }
  profiler::clear();
  return {flops, bytes};
}

Timing time_case(const Case& c, const Target& t, double min_seconds, int min_reps) {
  Prepared p(c, t);
  p.step();  // warm-up: primitives created, caches filled
  Timing r;
  std::tie(r.flops, r.bytes) = p.cost();
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(ms.size()) < min_reps ||
         (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < min_seconds && ms.size() < 1000)) {
    const auto t0 = std::chrono::steady_clock::now();
    p.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  r.median_ms = ms[ms.size() / 2];
  r.reps = static_cast<int>(ms.size());
  return r;
}

// ---- the table as a report -------------------------------------------------------------------------

namespace {
std::string shapes_of(const Case& c) {
  std::string s;
  for (const In& in : c.ins) {
    if (!s.empty()) s += ' ';
    s += shape_str(in.shape);
    if (in.layout == Layout::channels_last) s += "cl";
    if (in.layout == Layout::transposed) s += "T";
    if (in.layout == Layout::strided) s += "s";
  }
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}
}  // namespace

int run_table(std::ostream& os, const std::vector<Case>& cases, const Target& t, Mode mode, const std::string& filter,
              uint64_t seed) {
  if (mode == Mode::perf)
    os << fmt::format("{:<46} {:<40} {:>10} {:>6} {:>10} {:>9}\n", "case", "inputs", "ms", "reps", "GFLOP/s", "GB/s");
  else
    os << fmt::format("{:<46} {:<40} {:>10} {:>10}  {}\n", "case", "inputs", mode == Mode::gradient ? "error" : "fwd err",
                      mode == Mode::gradient ? "" : "bwd err", "result");
  int run = 0, failed = 0, skipped = 0;
  std::map<std::string, int> refusals;  // "<op> in <dtype>: <why>" -> cases skipped for it
  for (const Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    if (const std::string why = skip_reason(c, t, mode); !why.empty()) {
      ++skipped;
      if (why.rfind(kRefuses, 0) == 0) ++refusals[why.substr(std::string(kRefuses).size())];
      continue;
    }
    ++run;
    if (mode == Mode::perf) {
      try {
        const Timing tm = time_case(c, t);
        const double s = tm.median_ms * 1e-3;
        os << fmt::format("{:<46} {:<40} {:>10.3f} {:>6} {:>10.1f} {:>9.1f}\n", c.name, shapes_of(c), tm.median_ms, tm.reps,
                          tm.flops / s * 1e-9, tm.bytes / s * 1e-9);
      } catch (const std::exception& e) {
        ++failed;
        os << fmt::format("{:<46} {:<40} error: {}\n", c.name, shapes_of(c), e.what());
      }
      continue;
    }
    const Outcome o = mode == Mode::gradient ? check_gradients(c) : check_conformance(c, t, seed);
    if (!o.passed()) ++failed;
    os << fmt::format("{:<46} {:<40} {:>10.3g} {:>10.3g}  {}\n", c.name, shapes_of(c), o.forward_error, o.backward_error,
                      o.passed() ? "ok" : "FAIL");
    for (const std::string& p : o.problems) os << "    " << p << "\n";
  }
  if (mode == Mode::perf)
    os << fmt::format("{} cases timed on {} ({} not of this mode or backend){}\n", run - failed, t.name(), skipped,
                      failed ? fmt::format(", {} failed", failed) : "");
  else
    os << fmt::format("{} of {} cases passed on {} in {} mode ({} not of this mode or backend){}\n", run - failed, run,
                      t.name(), mode_name(mode), skipped,
                      mode == Mode::conformance ? "; errors are max |got - ref| / (atol + rtol |ref|), <= 1 passes" : "");
  for (const auto& [why, n] : refusals) os << fmt::format("  {} skipped: {} refuses {}\n", n, t.name(), why);
  return failed;
}

}  // namespace duet::opcheck
