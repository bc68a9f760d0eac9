// Training steps of a zoo model on generated data, profiled (see profile_steps.h).
#include "train/profile_steps.h"
#include <cmath>
#include <functional>
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/functional.h"
#include "engine/optim/grad_scaler.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler/session.h"
#include "models/registry.h"
#include "reports/report.h"
#include "train/amp.h"
#include "train/evaluate.h"
#include "train/profiling.h"
#include "train/train_config.h"

namespace duet::app {

namespace {

TimingMode timing_mode_for(const ProfileConfig& c, size_t batch_sizes) {
  if (c.mode == "per-op") return TimingMode::per_op;
  if (c.mode == "throughput") return TimingMode::throughput;
  DUET_CHECK(c.mode == "auto", "--mode {}: expected per-op, throughput or auto", c.mode);
  return batch_sizes == 1 ? TimingMode::per_op : TimingMode::throughput;
}

}  // namespace

nlohmann::json profile_run_config(const ProfileConfig& c, const RunEnv& env, const ProfileSizes& sz, int64_t batch,
                                  uint64_t seed) {
  return {{"command", "profile"},
          {"model", c.model.name},
          {"width_mult", c.model.width_mult},
          {"classes", sz.classes},
          {"dataset", "generated (resident on the device)"},
          {"image_size", sz.image_size},
          {"batch", batch},
          {"steps", c.steps},
          {"warmup", c.warmup},
          {"optimizer", c.optimizer},
          {"amp", c.amp},
          {"inference", c.inference},
          {"memory_format", memory_format_label(input_memory_format(c.memory_format, env))},
          {"device", env.device.str()},
          {"backend", backend_name(env.backend)},
          {"threads", env.threads},
          {"seed", seed}};
}

ProfileSizes profile_sizes(const ProfileConfig& c) {
  const models::ModelInfo info = models::model_info(c.model.name);  // unknown names list the known ones
  return {c.image_size > 0 ? c.image_size : info.default_image_size,
          c.model.classes > 0 ? c.model.classes : info.default_num_classes};
}

ProfileRunResult profile_batch(const ProfileConfig& c, const GlobalOptions& g, int64_t batch) {
  DUET_CHECK(c.steps >= 1 && c.warmup >= 0, "--steps {} --warmup {}: expected at least 1 timed step", c.steps, c.warmup);
  const RunEnv env = apply_global_options(g);
  const ProfileSizes sz = profile_sizes(c);
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
  // An inference pass: eval mode (batch norm's running statistics, no dropout), no autograd record,
  // autocast as in training, and the top-1 class read back, as `duet predict` does.
  const auto infer = [&](int64_t i) {
    profiler::step_begin(i, batch, env.device);
    {
      profiler::PhaseGuard phase(Phase::forward);
      NoGradGuard no_grad;
      const AmpScope amp(low);
      const Tensor top1 = argmax((*model)(x), 1).to(Device::cpu());
      DUET_CHECK(top1.numel() == batch, "profile --inference: {} predictions for {} images", top1.numel(), batch);
    }
    profiler::step_end();
  };
  if (c.inference) {
    model->eval();
    model->freeze();  // as duet eval and predict run it: weights converted once
  }
  const std::function<void(int64_t)> one = c.inference ? std::function<void(int64_t)>(infer) : step;
  for (int64_t i = 0; i < c.warmup; ++i) one(i);
  start_profile({.mode = mode, .device = env.device});
  try {
    for (int64_t i = 0; i < c.steps; ++i) one(c.warmup + i);
  } catch (...) {
    profiler::stop_session();
    throw;
  }
  profiler::stop_session();
  ProfileRunResult r;
  r.capture = profiler::capture();
  nlohmann::json run = profile_run_config(c, env, sz, batch, g.seed);
  run["parameters"] = model->num_parameters();
  r.report = profiler::build_report(r.capture, run);
  r.point = profiler::sweep_point_from_report(batch, r.report);
  r.model = model;
  return r;
}

}  // namespace duet::app
