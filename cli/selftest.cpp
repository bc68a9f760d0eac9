// `duet selftest`: the op table (opcheck/) on one device's backend, in one of its modes: every case
// against the reference loops (conformance, the default), the reference's gradients against finite
// differences (gradient), or each case timed (perf). On a GPU it is the check of the CUDA backend.
#include "cli/commands.h"
#include "cli/global_options.h"
#include <iostream>
#include <memory>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "engine/backend.h"
#include "engine/error.h"
#include "opcheck/op_check.h"
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/selftest.h"
#endif

namespace duet::app {

namespace {

struct SelftestOptions {
  std::string device = "cuda";
  std::string mode = "conformance";
  std::string filter;
};

#ifdef DUET_HAVE_CUDA
// The cases only a GPU has: TF32 tensor cores (a 10-bit mantissa, so about 1e-3 relative, PyTorch's
// allow_tf32 tolerance), switched on for the case's duration.
std::vector<opcheck::Case> cuda_cases() {
  opcheck::Case tf32{"conv2d_tf32_allowed", {opcheck::In{{2, 8, 11, 9}}, opcheck::In{{12, 8, 3, 3}}},
                     [](const std::vector<Tensor>& v) {
                       const bool before = cuda_allow_tf32();
                       cuda_set_allow_tf32(true);
                       Tensor y = conv2d(v[0], v[1], Tensor(), {1, 1, 1, 1, 1, 1, 1});
                       cuda_set_allow_tf32(before);
                       return std::vector<Tensor>{y};
                     }};
  tf32.atol = tf32.rtol = 5e-3;
  tf32.gradient_check = false;
  tf32.only = {Backend::cuda};
  return {tf32};
}
#endif

opcheck::Mode parse_mode(const std::string& m) {
  if (m == "conformance") return opcheck::Mode::conformance;
  if (m == "gradient") return opcheck::Mode::gradient;
  if (m == "perf") return opcheck::Mode::perf;
  throw Error(fmt::format("selftest --mode {}: expected conformance, gradient or perf", m));
}

}  // namespace

Command add_selftest_command(CLI::App& app, GlobalOptions& g) {
  auto o = std::make_shared<SelftestOptions>();
  CLI::App* cmd = app.add_subcommand("selftest", "Run the op table on a device's backend: against the reference loops, "
                                                 "gradients against finite differences, or timed");
  cmd->add_option("--device", o->device, "Device whose backend is tested: cuda, cuda:N or cpu (with --backend)")
      ->capture_default_str();
  cmd->add_option("--backend", g.backend, "With --device cpu: cpu (oneDNN, the default) or reference");
  cmd->add_option("--mode", o->mode, "conformance (against the reference loops), gradient (f64 finite differences) or perf")
      ->capture_default_str();
  cmd->add_option("--filter", o->filter, "Only the cases whose name contains this text");
  cmd->add_option("--seed", g.seed, "Shifts the values of every case's inputs (0: the table's own)")->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  duet selftest --device cuda                         # every op on the GPU against the reference loops\n"
      "  duet selftest --device cpu --filter conv_           # the oneDNN backend's convolutions\n"
      "  duet selftest --device cpu --mode perf --filter perf_   # the benchmark shapes, timed");
  return {cmd, [o, &g](std::ostream& out) {
            const opcheck::Mode mode = parse_mode(o->mode);
            const Device d = Device::parse(o->device);
            std::vector<opcheck::Case> cases = opcheck::all_cases();
            opcheck::Target target;
            if (d.type == DeviceType::cpu) {
              const Backend b = g.backend.empty() ? (backend_available(Backend::cpu) ? Backend::cpu : Backend::reference)
                                                  : backend_from_name(g.backend);
              DUET_CHECK(backend_available(b), "selftest: the {} backend is not built into this binary", g.backend);
              target = opcheck::cpu_target(b);
            } else {
#ifdef DUET_HAVE_CUDA
              if (cuda_device_count() == 0) {
                out << "duet selftest: " << cuda::unavailable_reason() << "\n";
                return 2;
              }
              DUET_CHECK(d.index < cuda_device_count(), "selftest --device {}: this machine has {} CUDA device(s)", o->device,
                         cuda_device_count());
              target = opcheck::device_target(d);
              out << cuda_selftest_header(d.index);
              for (opcheck::Case& c : cuda_cases()) cases.push_back(std::move(c));
#else
              out << "duet selftest: built without the CUDA backend (rebuild with -DDUET_CUDA=ON on a machine with the "
                     "CUDA Toolkit and cuDNN)\n";
              return 1;
#endif
            }
            const int failed = opcheck::run_table(out, cases, target, mode, o->filter, g.seed);
#ifdef DUET_HAVE_CUDA
            if (d.type == DeviceType::cuda) out << cuda_selftest_footer(d.index);
#endif
            return failed == 0 ? 0 : 1;
          }};
}

}  // namespace duet::app
