// `duet profile` (see profile_cmd.h).
#include "apps/profile_cmd.h"
#include <cmath>
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "apps/amp.h"
#include "apps/evaluate.h"
#include "apps/output_check.h"
#include "apps/profile_cmds.h"
#include "apps/run_env.h"
#include "apps/train_config.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/functional.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler/capture.h"
#include "reports/report.h"
#include "engine/profiler/session.h"
#include "models/registry.h"

namespace duet::app {

namespace {

TimingMode timing_mode_for(const ProfileConfig& c, size_t batch_sizes) {
  if (c.mode == "per-op") return TimingMode::per_op;
  if (c.mode == "throughput") return TimingMode::throughput;
  DUET_CHECK(c.mode == "auto", "--mode {}: expected per-op, throughput or auto", c.mode);
  return batch_sizes == 1 ? TimingMode::per_op : TimingMode::throughput;
}

nlohmann::json run_config_of(const ProfileConfig& c, const RunEnv& env, int64_t image_size, int64_t classes,
                             int64_t batch, uint64_t seed) {
  return {{"command", "profile"},
          {"model", c.model.name},
          {"width_mult", c.model.width_mult},
          {"classes", classes},
          {"dataset", "generated (resident on the device)"},
          {"image_size", image_size},
          {"batch", batch},
          {"steps", c.steps},
          {"warmup", c.warmup},
          {"optimizer", c.optimizer},
          {"amp", c.amp},
          {"memory_format", memory_format_label(input_memory_format(c.memory_format, env))},
          {"device", env.device.str()},
          {"backend", backend_name(env.backend)},
          {"threads", env.threads},
          {"seed", seed}};
}

struct ResolvedSizes {
  int64_t image_size = 0, classes = 0;
};

ResolvedSizes resolve_sizes(const ProfileConfig& c) {
  const models::ModelInfo info = models::model_info(c.model.name);  // unknown names list the known ones
  return {c.image_size > 0 ? c.image_size : info.default_image_size,
          c.model.classes > 0 ? c.model.classes : info.default_num_classes};
}

}  // namespace

ProfileRunResult profile_batch(const ProfileConfig& c, const GlobalOptions& g, int64_t batch) {
  DUET_CHECK(c.steps >= 1 && c.warmup >= 0, "--steps {} --warmup {}: expected at least 1 timed step", c.steps, c.warmup);
  const RunEnv env = apply_global_options(g);
  const ResolvedSizes sz = resolve_sizes(c);
  DUET_CHECK(sz.classes >= 1, "--classes {}: expected at least 1", sz.classes);
  const TimingMode mode = timing_mode_for(c, profiler::parse_batch_list(c.batches).size());
  manual_seed(g.seed);
  std::shared_ptr<nn::Module> model = build_model(c.model, sz.classes, sz.image_size);
  const MemoryFormat format = input_memory_format(c.memory_format, env);
  place_model(*model, env.device, format);
  model->train();
  OptimConfig oc;
  oc.optimizer = c.optimizer;
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(oc, model->parameters());

  // One batch, made once: the steps measure the model, not the data pipeline.
  const Tensor x = prepare_input(Tensor::randn({batch, 3, sz.image_size, sz.image_size}), env.device, format);
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i) % sz.classes;
  const Tensor y = Tensor::from_vector(labels, {batch}).to(env.device);

  // The step of duet train: autocast in the forward pass with --amp, loss scaling for fp16.
  const std::optional<DType> low = amp_dtype(c.amp);
  optim::GradScaler scaler(optim::GradScaler::Options{.enabled = c.amp == "fp16"});
  const auto step = [&](int64_t i) {
    profiler::step_begin(i, batch, env.device);
    Tensor loss;
    {
      profiler::PhaseGuard phase(Phase::forward);
      const AmpScope amp(low);
      loss = cross_entropy((*model)(x), y);
    }
    const double v = loss.item();  // a real step reads its loss (and waits for the device)
    DUET_CHECK(std::isfinite(v), "profile: the loss of {} is {} at step {}", c.model.name, v, i);
    opt->zero_grad();
    scaler.scale_loss(loss).backward();
    scaler.step(*opt);
    profiler::step_end();
  };
  for (int64_t i = 0; i < c.warmup; ++i) step(i);
  start_profile({.mode = mode, .device = env.device});
  try {
    for (int64_t i = 0; i < c.steps; ++i) step(c.warmup + i);
  } catch (...) {
    profiler::stop_session();
    throw;
  }
  profiler::stop_session();
  ProfileRunResult r;
  r.capture = profiler::capture();
  nlohmann::json run = run_config_of(c, env, sz.image_size, sz.classes, batch, g.seed);
  run["parameters"] = model->num_parameters();
  r.report = profiler::build_report(r.capture, run);
  r.point = profiler::sweep_point_from_report(batch, r.report);
  return r;
}

namespace {

std::string summary_line(const ProfileConfig& c, const profiler::SweepPoint& p) {
  return fmt::format("{} batch {}: {:.1f} images/s, median step {:.2f} ms, peak {:.1f} MiB ({} timed steps, {})\n",
                     c.model.name, p.batch, p.images_per_s.value_or(0.0), p.median_step_ms.value_or(0.0),
                     static_cast<double>(p.peak_bytes.value_or(0)) / (1024.0 * 1024.0), p.steps, p.timing_mode);
}

int run_profile(const ProfileConfig& c, const GlobalOptions& g, std::ostream& out) {
  check_output_file("--out", c.out, OutputKind::creates_folders);  // before the steps are run
  check_output_file("--trace", c.trace, OutputKind::creates_folders);
  const std::vector<int64_t> batches = profiler::parse_batch_list(c.batches);
  const RunEnv env = apply_global_options(g);
  const ResolvedSizes sz = resolve_sizes(c);
  out << fmt::format("profile {} ({} classes, {}x{} input) | device {} | backend {} | threads {} | {} warm-up + {} "
                     "timed steps per batch size on generated data resident on the device\n",
                     c.model.name, sz.classes, sz.image_size, sz.image_size, env.device.str(), backend_name(env.backend),
                     env.threads, c.warmup, c.steps)
      << busy_machine_note(env.threads) << std::flush;
  if (batches.size() == 1) {
    const ProfileRunResult r = profile_batch(c, g, batches[0]);
    present_profile(r.report, r.capture, c.out, c.trace, out);
    out << summary_line(c, r.point);
    return 0;
  }
  DUET_CHECK(c.trace.empty(), "--trace is for one batch size; a sweep ({}) writes no trace", c.batches);
  std::vector<profiler::SweepPoint> points;
  for (int64_t b : batches) {
    profiler::SweepPoint p;
    try {
      p = profile_batch(c, g, b).point;
      out << summary_line(c, p) << std::flush;
    } catch (const Error& e) {
      // One size that does not fit (out of memory) must not lose the others.
      p.batch = b;
      p.error = e.what();
      out << fmt::format("{} batch {}: failed: {}\n", c.model.name, b, p.error) << std::flush;
    }
    points.push_back(p);
  }
  nlohmann::json run = run_config_of(c, env, sz.image_size, sz.classes, 0, g.seed);
  run["batch"] = batches;
  finish_sweep(run, points, c.out, out);
  return 0;
}

const char* kProfileFooter = R"(Examples:
  duet profile --model resnet18_cifar                      per-op profile of 10 steps at batch 64
  duet profile --model resnet18_cifar --out r18.json --trace r18.trace.json
  duet profile --model mobilenet_v2 --batch 16,32,64,128,256 --out sweep.json
      throughput, step time and peak memory per batch size (plot: scripts/plot_profile.py --sweep sweep.json)
  duet --threads 1 profile --model vit_tiny_p4 --mode throughput
The data is generated once and stays on the device, so the numbers are the model's alone; `duet train
--profile` profiles a real run with its data phase.)";

}  // namespace

Command add_profile_command(CLI::App& app, GlobalOptions& g) {
  auto c = std::make_shared<ProfileConfig>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Profile training steps of a model on generated data: per-op tables, or a batch-size sweep");
  add_model_options(*cmd, c->model);
  cmd->add_option("--image-size", c->image_size, "Input height and width (default: the model's)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--batch", c->batches, "Batch size, or a list for a sweep: 16,32,64,128")->capture_default_str();
  cmd->add_option("--amp", c->amp, "Mixed precision as in duet train: off, bf16 or fp16 (with loss scaling)")
      ->check(CLI::IsMember({"off", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--steps", c->steps, "Timed steps per batch size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  cmd->add_option("--warmup", c->warmup, "Untimed steps before them")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  cmd->add_option("--optimizer", c->optimizer, "sgd, adam or adamw")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd->add_option("--mode", c->mode,
                  "per-op (every op timed), throughput (steps only, undisturbed) or auto (per-op for one batch size, "
                  "throughput for a sweep)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "per-op", "throughput"}));
  cmd->add_option("--memory-format", c->memory_format, "Input layout: auto, nhwc or nchw")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nhwc", "nchw", "channels_last", "contiguous"}));
  cmd->add_option("--out", c->out,
                  "Write the report (duet.profile/1; one batch size) or the sweep (duet.sweep/1; several) to this JSON file");
  cmd->add_option("--trace", c->trace, "One batch size: also write a Chrome trace (open in ui.perfetto.dev)");
  add_global_options(*cmd, g);
  cmd->footer(kProfileFooter);
  return {cmd, [c, &g](std::ostream& out) { return run_profile(*c, g, out); }};
}

}  // namespace duet::app
