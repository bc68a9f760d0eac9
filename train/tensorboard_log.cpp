// What a run writes for TensorBoard (see tensorboard_log.h).
#include "train/tensorboard_log.h"
#include <span>
#include <vector>
#include <fmt/format.h>
#include "engine/backend.h"
#include "engine/error.h"
#include "reports/report.h"
#include "train/output_check.h"

namespace duet::app {

namespace {

// The values of `t` as floats: read in place when they are dense f32 on the host (no op is
// dispatched, so a profile stays as it was), else through a copy.
profiler::Histogram histogram_of(const Tensor& t) {
  if (t.device() == Device::cpu() && t.dtype() == DType::f32 && t.is_dense())
    return profiler::make_histogram(std::span<const float>(t.data<float>(), static_cast<size_t>(t.numel())));
  const std::vector<float> v = t.to_vector<float>();
  return profiler::make_histogram(v);
}

std::string code_block(const std::string& text) {
  // Indented by four spaces: a markdown code block, so TensorBoard keeps the columns.
  std::string s;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    s += "    " + line + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return s;
}

double mib_of(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

void write_histograms(profiler::EventFileWriter& w, const nn::Module& model, int64_t step) {
  for (const auto& [name, p] : model.named_parameters()) {
    w.histogram("weights/" + name, step, histogram_of(p), "values of the parameter " + name);
    const Tensor g = p.grad();
    if (g.defined())
      w.histogram("gradients/" + name, step, histogram_of(g), "gradient of " + name + " from the step's backward pass");
  }
}

void write_run_config(profiler::EventFileWriter& w, const nlohmann::json& run_config) {
  w.text("run/config", 0, code_block(dump_lenient(run_config, 1)), "the run's configuration");
}

void write_profile_summary(profiler::EventFileWriter& w, const nlohmann::json& report, int64_t step) {
  const std::string device = report["totals"].value("device", std::string("cpu"));
  for (const auto& s : report["steps"]) {
    const int64_t x = s["step"].get<int64_t>() + 1;
    const double ns = s["dur_ns"].get<double>();
    w.scalar("profile/step_time_ms", x, ns / 1e6, "the profiled step's time (the report's steps[].dur_ns), ms");
    if (ns > 0)
      w.scalar("profile/images_per_s", x, s["images"].get<double>() / (ns / 1e9),
               "images of the profiled step over its time");
    for (const auto& m : s["memory"])
      if (m.value("device", std::string()) == device)
        w.scalar("profile/peak_memory_mib", x, mib_of(m["peak"].get<double>()),
                 "the run device's allocator peak at the step's end (steps[].memory[].peak), MiB");
  }
  // format_report opens with the header; the op table keeps it, the other two leave it out.
  const std::string header = profiler::format_header(report);
  const auto body = [&](const profiler::PrintOptions& o) { return profiler::format_report(report, o).substr(header.size()); };
  profiler::PrintOptions p;
  p.top = 40;
  p.steps = p.memory = p.telemetry = false;
  w.text("profile/op_table", step, code_block(header + body(p)), "the operator table of the profile (as `duet report` prints it)");
  p.ops = false;
  p.layers = true;
  w.text("profile/layer_table", step, code_block(body(p)), "the per-layer table of the profile");
  p.layers = false;
  p.steps = p.memory = p.telemetry = true;
  w.text("profile/steps_and_memory", step, code_block(body(p)),
         "the step breakdown, the memory summary and the telemetry of the profile");
  w.flush();
}

std::string write_profile_events(const std::string& dir, const nlohmann::json& report, const nn::Module& model,
                                 int64_t step) {
  profiler::EventFileWriter w(dir);
  write_run_config(w, report["run_config"]);
  write_histograms(w, model, step);
  write_profile_summary(w, report, step);
  return w.path();
}

TensorBoardLog::TensorBoardLog(const std::string& dir, std::shared_ptr<nn::Module> model, Device device,
                               int64_t histogram_every)
    : writer_(dir), model_(std::move(model)), device_(device), histogram_every_(histogram_every) {}

void TensorBoardLog::on_epoch_begin(int64_t, int64_t) { last_ = std::chrono::steady_clock::now(); }

void TensorBoardLog::on_step(const StepRecord& s, const EpochProgress& p) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  steps_done_ = s.step + 1;
  batches_done_ = p.batches_done;
  const int64_t x = steps_done_;
  writer_.scalar("step/loss", x, s.loss, "the step's mean loss over its (global) batch");
  writer_.scalar("step/lr", x, s.lr, "the learning rate the step used");
  writer_.scalar("step/time_ms", x, ms, "wall time since the previous step ended (or the epoch began), ms");
  writer_.scalar("step/images_per_s", x, p.images_per_s, "images per second of the epoch so far (the progress line's)");
  writer_.scalar("step/peak_memory_mib", x,
                 mib_of(static_cast<double>(device_allocator(device_).stats().peak)),
                 "the device allocator's peak since the epoch began, MiB");
  if (histogram_every_ > 0 && x % histogram_every_ == 0) {
    write_histograms(writer_, *model_, x);
    last_histogram_ = x;
  }
}

void TensorBoardLog::on_epoch_end(const EpochMetrics& m) {
  const int64_t x = m.steps;
  const nlohmann::json line = m.to_json();
  for (const auto& [key, v] : line.items()) {
    if (key == "epoch" || key == "step" || !v.is_number()) continue;
    writer_.scalar("epoch/" + key, x, v.get<double>(), fmt::format("the epoch's `{}`, as the --log line has it", key));
  }
  if (batches_done_ > 0)
    writer_.scalar("epoch/step_time_ms", x, m.epoch_seconds * 1000.0 / static_cast<double>(batches_done_),
                   "the epoch's training seconds over its steps, ms");
  if (histogram_every_ > 0 && last_histogram_ != x) {
    write_histograms(writer_, *model_, x);
    last_histogram_ = x;
  }
  writer_.flush();
}

}  // namespace duet::app
