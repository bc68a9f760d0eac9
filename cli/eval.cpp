// `duet eval`: the checkpoint's own data options unless overridden on the command line.
#include "cli/commands.h"
#include "cli/global_options.h"
#include <memory>
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "train/data_parallel.h"
#include "train/evaluate.h"
#include "train/model_file.h"
#include "train/train_data.h"
#include "engine/backend.h"

namespace duet::app {

namespace {
struct EvalCmd {
  std::string checkpoint, dataset, data, split = "test", memory_format;
  int64_t batch = 256;
  int workers = 2;
};

// Under mpirun each rank evaluates its share of the batches (rank r: r, r + N, ...; --batch is
// the batch one process would use) and rank 0 prints the all-reduced result, which equals one
// process's.
int run_eval(const EvalCmd& e, const GlobalOptions& g0, std::ostream& out, dist::Communicator& comm) {
  const bool distributed = comm.size() > 1;
  if (distributed)
    dist::check_same_on_all_ranks(
        comm, {{"checkpoint", e.checkpoint}, {"--dataset", e.dataset}, {"--data", e.data}, {"--split", e.split},
               {"--batch", std::to_string(e.batch)}, {"--memory-format", e.memory_format}, {"--device", g0.device},
               {"--backend", g0.backend}, {"--seed", std::to_string(g0.seed)}});
  const GlobalOptions g = options_for_rank(comm, g0);
  const RunEnv env = apply_global_options(g);
  TrainedModel t = load_trained_model(e.checkpoint);
  DataOptions d = t.config.data;
  if (!e.dataset.empty()) d.dataset = e.dataset;
  if (!e.data.empty()) d.path = e.data;
  if (!e.memory_format.empty()) d.memory_format = e.memory_format;
  d.image_size = t.image_size;
  d.workers = e.workers;
  if (d.dataset == "synthetic") d.synthetic_classes = t.config.model.classes;
  const TrainData data = make_eval_data(d, t.config.seed, e.split);
  DUET_CHECK(static_cast<int64_t>(data.class_names.size()) == t.config.model.classes,
             "the checkpoint's model has {} classes but the {} split of '{}' has {}; expected the same classes",
             t.config.model.classes, e.split, d.path.empty() ? d.dataset : d.path, data.class_names.size());
  const MemoryFormat format = input_memory_format(d.memory_format, env);
  place_model(*t.model, env.device, format);
  const EvalSetup setup{.batch_size = e.batch,
                        .workers = e.workers,
                        .device = env.device,
                        .memory_format = format,
                        .comm = distributed ? &comm : nullptr};
  out << fmt::format("model {} from '{}' (epoch {}) | {} split: {} | backend {}{}\n", t.config.model.name, e.checkpoint,
                     t.epoch, e.split, data.summary, backend_name(env.backend),
                     distributed ? fmt::format(" | sharded over {} ranks", comm.size()) : "");
  const EvalResult r = evaluate(*t.model, *data.test, data.eval_pipeline, setup);
  out << fmt::format("accuracy {:.2f}% ({}/{})  loss {:.4f}  ({:.1f} s, {:.0f} img/s)\n", 100.0 * r.accuracy,
                     static_cast<int64_t>(r.accuracy * static_cast<double>(r.images) + 0.5), r.images, r.loss, r.seconds,
                     static_cast<double>(r.images) / std::max(r.seconds, 1e-9));
  out << "per-class accuracy:\n" << format_per_class(r, t.class_names.empty() ? data.class_names : t.class_names);
  return 0;
}
}  // namespace

Command add_eval_command(CLI::App& app, GlobalOptions& g) {
  auto e = std::make_shared<EvalCmd>();
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on a dataset split: accuracy, loss, per-class accuracy");
  cmd->add_option("checkpoint", e->checkpoint, "Checkpoint written by duet train --checkpoint")->required()->check(CLI::ExistingFile);
  cmd->add_option("--dataset", e->dataset, "synthetic, cifar10 or folder (default: the checkpoint's)")
      ->check(CLI::IsMember({"synthetic", "cifar10", "folder"}));
  cmd->add_option("--data", e->data, "Dataset folder (default: the one it was trained on)");
  cmd->add_option("--split", e->split, "test, train, or val (a run with --val-fraction: its validation split)")
      ->capture_default_str()
      ->check(CLI::IsMember({"test", "train", "val"}));
  cmd->add_option("--batch", e->batch, "Batch size")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--workers", e->workers, "Loader threads")->capture_default_str()->check(CLI::Range(0, 64));
  cmd->add_option("--memory-format", e->memory_format, "auto, nhwc or nchw (default: the checkpoint's run)")
      ->check(CLI::IsMember({"auto", "nhwc", "nchw"}));
  add_global_options(*cmd, g);
  cmd->footer("Examples:\n  duet eval cifar.safetensors --data ../shared/data/cifar10\n"
              "  mpirun -np 2 duet eval cifar.safetensors      sharded over 2 processes (same result)");
  return {cmd, [e, &g](std::ostream& out) {
            dist::Communicator& comm = dist::world();
            return run_on_every_rank(comm, out, [&](std::ostream& o) { return run_eval(*e, g, o, comm); });
          }};
}

}  // namespace duet::app
