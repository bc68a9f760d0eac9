// `duet train` end to end (see train_run.h): the run's settings checked on every rank, its output
// files probed, data, model and trainer built, the run's header printed, the profile written.
#include "train/train_run.h"
#include <iostream>
#include <fmt/format.h>
#include "distributed/sync.h"
#include "engine/backend.h"
#include "engine/profiler/events.h"
#include "models/registry.h"
#include "train/data_parallel.h"
#include "train/interrupt.h"
#include "train/output_check.h"
#include "train/profiling.h"
#include "train/progress.h"
#include "train/tensorboard_log.h"
#include "train/val_split.h"

namespace duet::app {

namespace {
std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}
}  // namespace

namespace {
TrainResult run_training_on(dist::Communicator& comm, const TrainConfig& c0, const GlobalOptions& g0, std::ostream& out) {
  TrainConfig c = c0;
  c.seed = g0.seed;
  const bool distributed = comm.size() > 1;
  // Before anything is read: a rank started with other options would train something else.
  comm.set_timeout(c.comm_timeout_s);
  if (distributed) dist::check_same_on_all_ranks(comm, run_settings(c, g0));
  const GlobalOptions g = options_for_rank(comm, g0);
  // Every file the run will write is probed before any data is read or any step is taken (by
  // rank 0, the one that writes them).
  if (comm.rank() == 0) {
    check_output_file("--checkpoint", c.checkpoint);
    check_output_file("--log", c.log, c.resume.empty() ? OutputKind::replaces : OutputKind::appends);
    check_output_file("--profile", c.profile_path, OutputKind::creates_folders);
    check_output_file("--trace", c.trace_path, OutputKind::creates_folders);
    check_output_file("--tensorboard", c.tensorboard, OutputKind::folder);
  }
  const RunEnv env = apply_global_options(g);
  models::model_info(c.model.name);  // an unknown name fails before any data is read
  manual_seed(c.seed);
  if (c.data.dataset == "synthetic" && c.model.classes > 0) c.data.synthetic_classes = c.model.classes;
  TrainData data = make_train_data(c.data, c.seed);
  const auto classes = static_cast<int64_t>(data.class_names.size());
  DUET_CHECK(c.model.classes == 0 || c.model.classes == classes,
             "--classes {}: the dataset has {} classes ({}...); expected the dataset's count (or leave --classes out)",
             c.model.classes, classes, data.class_names.empty() ? "" : data.class_names[0]);
  c.model.classes = classes;
  std::shared_ptr<nn::Module> model = build_model(c.model, classes, data.image_size);
  if (!c.init_from.empty()) init_from(*model, c.init_from, c.freeze_backbone, out);
  else DUET_CHECK(!c.freeze_backbone, "--freeze-backbone needs --init-from FILE (a backbone worth freezing)");

  int64_t trainable = 0;
  for (const Tensor& p : model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  out << fmt::format("model {} ({} parameters{}) | {}\n", c.model.name, with_commas(model->num_parameters()),
                     trainable == model->num_parameters() ? "" : fmt::format(", {} trainable", with_commas(trainable)),
                     data.summary);
  Trainer trainer(c, env, std::move(data), model, out, comm);
  if (const std::string bad = first_invalid_utf8(trainer.checkpoint_config()); !bad.empty())
    out << fmt::format("note: the configuration's '{}' is not valid UTF-8; checkpoints store it with U+FFFD in place of "
                       "the bad bytes\n",
                       bad);
  // Under mpirun a rank's stdout is a pseudo-terminal of mpirun's even when mpirun's own output
  // goes to a file: data-parallel runs print plain lines (--log-every) instead of a bar.
  trainer.progress_bar = !distributed && &out == &std::cout && stdout_is_terminal();
  out << fmt::format("device {} | backend {} | threads {} | input {} | optimizer {}{} wd {:g}{} | batch {} | epochs {} | "
                     "seed {}{}\n",
                     env.device.str(), backend_name(env.backend), env.threads,
                     memory_format_label(trainer.memory_format()), c.optim.optimizer,
                     c.optim.optimizer == "sgd" ? fmt::format(" momentum {:g}{}", c.optim.momentum,
                                                              c.optim.nesterov ? " nesterov" : "")
                                                : "",
                     c.optim.resolved_weight_decay(),
                     c.optim.label_smoothing > 0 ? fmt::format(" label smoothing {:g}", c.optim.label_smoothing) : "",
                     c.batch, c.epochs, c.seed, c.amp == "off" ? "" : fmt::format(" | amp {}", c.amp));
  out << fmt::format("lr schedule {} | {} steps per epoch\n", trainer.schedule().describe(), trainer.steps_per_epoch());
  if (c.sync_bn && !distributed)
    out << "note: --sync-bn has no effect in one process (its batch norm already sees the whole batch)\n";
  if (distributed) {
    const std::vector<dist::GradReducer::BucketInfo> buckets = trainer.reducer()->buckets();
    int64_t bytes = 0;
    for (const auto& b : buckets) bytes += b.bytes;
    out << fmt::format("data-parallel: {} | global batch {} ({} per rank) | gradients {} in {} bucket{} of up to {:g} MB, "
                       "{} backward\n",
                       comm.describe(), c.batch * comm.size(), c.batch, mib(bytes), buckets.size(),
                       buckets.size() == 1 ? "" : "s", c.bucket_mb,
                       trainer.reducer()->overlapping() ? "averaged during"
                       : c.sync_bn                       ? "averaged after (--sync-bn)"
                                                         : "averaged after (no MPI thread support)");
    out << rank_layout(comm, g0.threads, env.threads);
    if (c.sync_bn)
      out << fmt::format("sync-bn: {} batch norm layer{} normalised over all ranks' batches\n",
                         trainer.sync_bn_layers(), trainer.sync_bn_layers() == 1 ? "" : "s");
  }
  out << busy_machine_note(env.threads) << precision_note(env, c.amp) << std::flush;

  // The profile report's "run" line: what identifies the run, flat.
  const nlohmann::json run_config{{"command", "train"},
                                  {"model", c.model.name},
                                  {"dataset", c.data.dataset},
                                  {"image_size", trainer.checkpoint_config()["image_size"]},
                                  {"batch", c.batch},
                                  {"epochs", c.epochs},
                                  {"optimizer", c.optim.optimizer},
                                  {"lr", c.optim.resolved_lr()},
                                  {"schedule", c.optim.schedule},
                                  {"memory_format", memory_format_label(trainer.memory_format())},
                                  {"device", env.device.str()},
                                  {"backend", backend_name(env.backend)},
                                  {"threads", env.threads},
                                  {"seed", c.seed},
                                  {"amp", c.amp}};
  std::shared_ptr<TensorBoardLog> tensorboard;  // rank 0 writes the event files
  if (!c.tensorboard.empty() && comm.rank() == 0) {
    tensorboard = std::make_shared<TensorBoardLog>(c.tensorboard, model, env.device, c.tensorboard_histograms);
    write_run_config(tensorboard->writer(), run_config);
    trainer.add_callback(tensorboard);
    out << fmt::format("tensorboard: {} (view with `tensorboard --logdir {}`)\n", tensorboard->writer().path(),
                       c.tensorboard);
  }
  if (c.profile) {
    DUET_CHECK(c.profile_mode == "per-op" || c.profile_mode == "throughput",
               "--profile-mode {}: expected per-op or throughput", c.profile_mode);
    start_profile({.mode = c.profile_mode == "per-op" ? TimingMode::per_op : TimingMode::throughput,
                   .device = env.device,
                   .sync_per_op = c.profile_sync});
  }
  // Data-parallel traces line the ranks up on the moment they all left this barrier.
  int64_t trace_t0_ns = 0;
  if (c.profile && distributed) {
    comm.barrier();
    trace_t0_ns = profiler::now_ns();
  }
  const InterruptGuard interrupts;
  TrainResult r = trainer.fit();
  const int64_t images = [&] {
    int64_t n = 0;
    for (const EpochMetrics& m : r.epochs) n += static_cast<int64_t>(m.images_per_s * m.epoch_seconds + 0.5);
    return n;
  }();
  if (!r.epochs.empty())
    out << fmt::format("trained {} epochs ({} steps) in {:.2f} s ({:.0f} img/s); final {} accuracy {:.2f}% (chance "
                       "{:.1f}%){}\n",
                       r.epochs.size(), r.steps, r.train_seconds, r.train_seconds > 0 ? static_cast<double>(images) / r.train_seconds : 0.0,
                       r.epochs.back().has_val ? "validation" : "test",
                       100.0 * (r.epochs.back().has_val ? r.epochs.back().val_accuracy : r.epochs.back().test_accuracy),
                       100.0 / static_cast<double>(classes),
                       trainer.last_checkpoint().empty()
                           ? ""
                           : fmt::format("; checkpoint '{}'", trainer.last_checkpoint()));
  if (r.test) {  // --val-fraction: the test split's one evaluation
    out << r.test->line();
    if (r.test->best && !c.checkpoint.empty())
      out << fmt::format("best epoch on validation: '{}'\n", best_checkpoint_path(c.checkpoint));
  }
  nlohmann::json report;
  if (c.profile && distributed)
    report = finish_profile_on_ranks(comm, run_config, c.profile_path, c.trace_path, trace_t0_ns, out);
  else if (c.profile) report = finish_profile(run_config, c.profile_path, c.trace_path, out);
  if (tensorboard && c.profile) write_profile_summary(tensorboard->writer(), report, tensorboard->steps_done());
  return r;
}
}  // namespace

TrainResult run_training(const TrainConfig& c, const GlobalOptions& g, std::ostream& out) {
  dist::Communicator& comm = dist::world();
  return run_on_every_rank(comm, out, [&](std::ostream& o) { return run_training_on(comm, c, g, o); });
}

}  // namespace duet::app
