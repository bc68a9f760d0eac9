// `duet profile`: the options of a profile of training steps on generated data (train/profile_steps.h);
// with one batch size the per-op report (as `duet train --profile` prints it), with a list,
// `--batch 16,32,64,128`, the batch-size sweep: images/s, step time and peak memory per size.
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "cli/global_options.h"
#include "cli/run_options.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "reports/files.h"
#include "reports/sweep.h"
#include "train/output_check.h"
#include "train/profile_steps.h"
#include "train/profiling.h"
#include "train/run_env.h"
#include "train/tensorboard_log.h"

namespace duet::app {

namespace {

std::string summary_line(const ProfileConfig& c, const profiler::SweepPoint& p) {
  return fmt::format("{} batch {}: {:.1f} images/s, median step {:.2f} ms, peak {:.1f} MiB ({} timed steps, {})\n",
                     c.model.name, p.batch, p.images_per_s.value_or(0.0), p.median_step_ms.value_or(0.0),
                     static_cast<double>(p.peak_bytes.value_or(0)) / (1024.0 * 1024.0), p.steps, p.timing_mode);
}

// The end of a sweep: the table, and the sweep JSON (schema duet.sweep/1) when json_path is set.
void finish_sweep(const nlohmann::json& run_config, const std::vector<profiler::SweepPoint>& points,
                  const std::string& json_path, std::ostream& out) {
  out << "\nthroughput by batch size\n" << profiler::format_sweep_table(points);
  if (!json_path.empty()) {
    profiler::write_file_atomic(json_path, profiler::sweep_json(run_config, points).dump(1) + "\n");
    out << fmt::format("sweep written to {} (plot: scripts/plot_profile.py --sweep {})\n", json_path, json_path);
  }
}

int run_profile(const ProfileConfig& c, const GlobalOptions& g, std::ostream& out) {
  check_output_file("--out", c.out, OutputKind::creates_folders);  // before the steps are run
  check_output_file("--trace", c.trace, OutputKind::creates_folders);
  check_output_file("--tensorboard", c.tensorboard, OutputKind::folder);
  const std::vector<int64_t> batches = profiler::parse_batch_list(c.batches);
  const RunEnv env = apply_global_options(g);
  const ProfileSizes sz = profile_sizes(c);
  out << fmt::format("profile {} ({} classes, {}x{} input) | device {} | backend {} | threads {} | {} warm-up + {} "
                     "timed steps per batch size on generated data resident on the device\n",
                     c.model.name, sz.classes, sz.image_size, sz.image_size, env.device.str(), backend_name(env.backend),
                     env.threads, c.warmup, c.steps)
      << busy_machine_note(env.threads) << precision_note(env, c.amp) << std::flush;
  if (batches.size() == 1) {
    const ProfileRunResult r = profile_batch(c, g, batches[0]);
    present_profile(r.report, r.capture, c.out, c.trace, out);
    if (!c.tensorboard.empty())
      out << fmt::format("tensorboard: {} (view with `tensorboard --logdir {}`)\n",
                         write_profile_events(c.tensorboard, r.report, *r.model, c.warmup + c.steps), c.tensorboard);
    out << summary_line(c, r.point);
    return 0;
  }
  DUET_CHECK(c.trace.empty(), "--trace is for one batch size; a sweep ({}) writes no trace", c.batches);
  DUET_CHECK(c.tensorboard.empty(), "--tensorboard is for one batch size; a sweep ({}) writes no event files", c.batches);
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
  nlohmann::json run = profile_run_config(c, env, sz, 0, g.seed);
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
  cmd->add_flag("--inference", c->inference,
                "Eval-mode forward passes without gradients (what duet eval and predict run per batch) instead of "
                "training steps");
  cmd->add_option("--tensorboard", c->tensorboard,
                  "One batch size: write TensorBoard event files to this folder (step times, memory, the op table, "
                  "weight and gradient histograms); view with `tensorboard --logdir DIR`")
      ->type_name("DIR");
  add_global_options(*cmd, g);
  cmd->footer(kProfileFooter);
  return {cmd, [c, &g](std::ostream& out) { return run_profile(*c, g, out); }};
}

}  // namespace duet::app
