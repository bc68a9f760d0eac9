// `duet selftest`: wraps backends/cuda/selftest.h when the CUDA backend is built in.
#include "apps/selftest_cmd.h"
#include <iostream>
#include <memory>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "engine/device.h"
#include "engine/error.h"
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/selftest.h"
#endif

namespace duet::app {

Command add_selftest_command(CLI::App& app, GlobalOptions& g) {
  auto device = std::make_shared<std::string>("cuda");
  CLI::App* cmd = app.add_subcommand("selftest", "Check every op of a device backend against the reference loops");
  cmd->add_option("--device", *device, "Device to test: cuda or cuda:N")->capture_default_str();
  cmd->add_option("--seed", g.seed, "Seed of the random shapes and values")->capture_default_str();
  cmd->footer("Example:\n  duet selftest --device cuda");
  return {cmd, [device, &g](std::ostream& out) {
            const Device d = Device::parse(*device);
            DUET_CHECK(d.type == DeviceType::cuda,
                       "selftest --device {}: the self-test covers the CUDA backend; the CPU backends are checked by the "
                       "test suite (ctest)",
                       *device);
#ifdef DUET_HAVE_CUDA
            DUET_CHECK(d.index == 0, "selftest runs on cuda:0; restrict the visible GPUs with CUDA_VISIBLE_DEVICES");
            return cuda_selftest(out, g.seed == 0 ? 2024 : g.seed);
#else
            out << "duet selftest: built without the CUDA backend (rebuild with -DDUET_CUDA=ON on a machine with the "
                   "CUDA Toolkit and cuDNN)\n";
            return 1;
#endif
          }};
}

}  // namespace duet::app
