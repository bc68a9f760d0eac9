// The global options on the command line (see global_options.h).
#include "cli/global_options.h"
#include <string>
#include <CLI/CLI.hpp>

namespace duet::app {

void add_global_options(CLI::App& cmd, GlobalOptions& g) {
  const std::string grp = "Global";
  cmd.add_option("--device", g.device, "Where tensors live: cpu, cuda or cuda:N")->capture_default_str()->group(grp);
  cmd.add_option("--backend", g.backend,
                 "Who computes: reference (plain loops), cpu (oneDNN + OpenMP) or cuda (default: the device's)")
      ->check(CLI::IsMember({"reference", "cpu", "cuda"}))
      ->group(grp);
  cmd.add_option("--threads", g.threads, "CPU threads (default: OMP_NUM_THREADS, else the cores this process may use)")
      ->check(CLI::Range(0, 4096))
      ->group(grp);
  cmd.add_option("--seed", g.seed, "Random seed: initialisation, data order, augmentation, dropout")
      ->capture_default_str()
      ->group(grp);
}

}  // namespace duet::app
