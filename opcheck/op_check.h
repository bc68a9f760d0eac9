// Running the op table (opcheck/op_table.h) on one backend, in one of its three modes:
//
//   conformance  every output and input gradient of a case against the reference backend's, in the
//                case's dtype: the backend computes what the plain loops define;
//   gradient     the reference backend's gradients in f64 against central differences of the same
//                case: the front-end's backward formula is right (which conformance cannot see, as
//                every backend shares it);
//   perf         forward + backward timed on the backend (median after a warm-up), with the FLOPs and
//                bytes the profiler's cost model gives the ops that ran.
//
// A run of a case builds its leaves (same values on every backend), applies each input's layout,
// calls the case, and backpropagates sum_i <out_i, R_i> for fixed random R_i, so every output
// element's gradient matters.
#pragma once
#include <ostream>
#include <utility>
#include <string>
#include <vector>
#include "engine/ops/dispatch.h"
#include "opcheck/op_table.h"

namespace duet::opcheck {

// Where a case runs: a device, and for the CPU device which of its backends.
struct Target {
  Device device = Device::cpu();
  Backend backend = Backend::cpu;
  std::string name() const;  // "cpu", "reference", "cuda:0"
};
Target cpu_target(Backend b);
Target device_target(Device d);  // a device's default backend (cuda:N -> cuda)

enum class Mode { conformance, gradient, perf };
const char* mode_name(Mode m);

// Whether the case belongs to the mode and the target's backend; "" if it does, else why not. A
// case that would send an op to the backend in a dtype the backend refuses (BackendImpl::support)
// is skipped with the op, the dtype and the backend's reason, rather than run into its error.
std::string skip_reason(const Case& c, const Target& t, Mode m);
// The first op the case sends to backend `b` in a dtype `b` refuses, as "<op> in <dtype>: <why>";
// "" when there is none (or `b` is not built in). Found by tracing the case on the reference loops
// as `b` routes it, so it needs no device of `b`'s; remembered per case and backend, and traced only
// where `b` refuses some op in the case's dtype (an f32 case whose body makes 16-bit tensors itself
// is caught by the dispatch's refusal when it runs; tests/test_conformance.cpp traces every case).
std::string refused_op(const Case& c, Backend b);
// The ops (and their dtypes) the case sends to `as`'s backend, traced (engine/ops/dispatch.h's
// OpTrace) on that backend where it is the host's, else on the reference loops as `as` would route
// them: the case's body, its loss and backward; not the making of leaves and weights, which happens
// on the host for every target.
std::vector<OpTrace::Entry> trace_case(const Case& c, const BackendImpl& as);

// The outputs and the gradients of the leaves (undefined where none flows), on the host. `seed`
// shifts the values of the leaves (0: the table's own).
struct Run {
  std::vector<Tensor> outs, grads;
};
Run run_case(const Case& c, const Target& t, uint64_t seed = 0);

struct Outcome {
  std::vector<std::string> problems;  // empty: passed
  double forward_error = 0;           // max |got - ref| / (atol + rtol |ref|) over the outputs (<= 1 passes)
  double backward_error = 0;          // the same over the gradients
  bool passed() const { return problems.empty(); }
};
Outcome check_conformance(const Case& c, const Target& t, uint64_t seed = 0);
Outcome check_gradients(const Case& c);

// A case made ready to run again and again on a target: its leaves made once, the R_i fixed by the
// first step. What perf mode and bench_ops time.
class Prepared {
public:
  Prepared(const Case& c, const Target& t);
  void step();  // forward + backward (one differentiable output takes R as its gradient directly), synchronised
  // FLOPs and bytes of one step, from the profiler's cost of every op that ran (runs a step).
  std::pair<double, double> cost();

private:
  Case c_;
  Target t_;
  std::vector<Tensor> leaves_, R_;
};

struct Timing {
  double median_ms = 0;   // forward + backward, the device synchronised
  int reps = 0;
  double flops = 0, bytes = 0;  // per rep, from the profiler's cost of every op that ran
};
Timing time_case(const Case& c, const Target& t, double min_seconds = 0.2, int min_reps = 3);

// max |a - b| / (atol + rtol |b|); NaN must meet NaN, equal values (infinities too) count as 0.
double closeness(const Tensor& a, const Tensor& b, double atol, double rtol);
// The conformance tolerances of a case.
double case_atol(const Case& c);
double case_rtol(const Case& c);

// `duet selftest`: every case of `cases` whose name contains `filter` in `mode` on `t`, one line
// each (errors and problems below it), and a summary. Returns the number of cases that failed.
int run_table(std::ostream& os, const std::vector<Case>& cases, const Target& t, Mode mode,
              const std::string& filter = "", uint64_t seed = 0);

}  // namespace duet::opcheck
