// The training loop (see trainer.h).
#include "apps/trainer.h"
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <ostream>
#include <fmt/format.h>
#include "apps/checkpoint.h"
#include "apps/evaluate.h"
#include "apps/progress.h"
#include "apps/profile_cmds.h"
#include "datasets/loader.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler.h"
#include "models/registry.h"

namespace duet::app {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

// --amp: the autocast dtype (none for "off") and the loss scaler, which only fp16 needs.
std::optional<DType> amp_dtype(const std::string& amp) {
  if (amp == "off") return std::nullopt;
  if (amp == "bf16") return DType::bf16;
  if (amp == "fp16") return DType::f16;
  throw Error(fmt::format("--amp {}: expected off, bf16 or fp16", amp));
}

// Autocast for the scope of a forward pass when the run uses mixed precision.
struct AmpScope {
  std::optional<AutocastGuard> guard;
  explicit AmpScope(std::optional<DType> low) {
    if (low) guard.emplace(*low);
  }
};
}  // namespace

nlohmann::json EpochMetrics::to_json() const {
  return {{"epoch", epoch},
          {"step", steps},
          {"lr", lr},
          {"train_loss", train_loss},
          {"train_acc", train_accuracy},
          {"test_loss", test_loss},
          {"test_acc", test_accuracy},
          {"images_per_s", images_per_s},
          {"epoch_seconds", epoch_seconds},
          {"eval_seconds", eval_seconds},
          {"train_seconds", train_seconds},
          {"peak_memory_bytes", peak_memory_bytes},
          {"amp", amp},
          {"skipped_steps", skipped_steps},
          {"loss_scale", loss_scale}};
}

Trainer::Trainer(TrainConfig config, RunEnv env, TrainData data, std::shared_ptr<nn::Module> model, std::ostream& out)
    : c_(std::move(config)),
      env_(env),
      data_(std::move(data)),
      model_(std::move(model)),
      out_(out),
      amp_(amp_dtype(c_.amp)),
      scaler_(optim::GradScaler::Options{.enabled = c_.amp == "fp16"}) {
  DUET_CHECK(c_.epochs >= 1 && c_.batch >= 1, "--epochs {} and --batch {}: expected positive numbers", c_.epochs, c_.batch);
  format_ = input_memory_format(c_.data.memory_format, env_);
  model_->to(env_.device);
  model_->train();
  opt_ = make_optimizer(c_.optim, model_->parameters());

  datasets::LoaderOptions lo;
  lo.batch_size = c_.batch;
  lo.shuffle = true;
  lo.seed = c_.seed;
  lo.num_workers = c_.data.workers;
  lo.memory_format = format_;
  loader_ = std::make_unique<datasets::DataLoader>(*data_.train, lo, data_.train_pipeline);
  steps_per_epoch_ = loader_->batches_per_epoch();
  schedule_ = std::make_unique<LrSchedule>(make_schedule_config(c_.optim, c_.epochs, steps_per_epoch_));
  if (!c_.resume.empty()) resume_from(c_.resume);
}

Trainer::~Trainer() = default;

nlohmann::json Trainer::checkpoint_config() const {
  nlohmann::json j = to_json(c_);
  j["model"]["classes"] = data_.class_names.size();
  j["image_size"] = data_.image_size;
  j["class_names"] = data_.class_names;
  j["eval_transform"] = data_.eval_transform;
  j["memory_format"] = memory_format_label(format_);
  return j;
}

void Trainer::resume_from(const std::string& path) {
  const Checkpoint ck = read_checkpoint(path);
  const nlohmann::json& was = ck.state.config;
  const nlohmann::json now = checkpoint_config();
  // What must not change for the resumed run to continue the same curve.
  const auto same = [&](const nlohmann::json& a, const nlohmann::json& b, const std::string& what) {
    DUET_CHECK(a == b,
               "--resume '{}': the checkpoint was trained with {} {} but this run asks for {}; resuming needs the same "
               "model, data, batch size and seed (start a new run, or use --init-from to start from its weights)",
               path, what, a.dump(), b.dump());
  };
  same(was.value("model", nlohmann::json()), now["model"], "model");
  same(was.value("image_size", nlohmann::json()), now["image_size"], "image size");
  same(was.value("batch", nlohmann::json()), now["batch"], "batch size");
  same(was.value("seed", nlohmann::json()), now["seed"], "seed");
  const nlohmann::json none = nlohmann::json::object();
  same(was.value("data", none).value("dataset", nlohmann::json()), now["data"]["dataset"], "dataset");
  same(was.value("optim", none).value("optimizer", nlohmann::json()), now["optim"]["optimizer"], "optimizer");
  if (was.contains("epochs") && was["epochs"] != now["epochs"])
    out_ << fmt::format("note: the checkpoint's run was set for {} epochs, this one for {}: the learning-rate schedule is "
                        "stretched to the new length\n",
                        was["epochs"].dump(), now["epochs"].dump());
  DUET_CHECK(ck.state.step == ck.state.epoch * steps_per_epoch_,
             "--resume '{}': {} steps in {} epochs does not match {} batches per epoch of this data; was the dataset "
             "changed?",
             path, ck.state.step, ck.state.epoch, steps_per_epoch_);
  load_state_dict(*model_, ck.model, true);
  opt_->load_state_tensors(ck.optimizer);
  // fp16: continue with the loss scale the run had reached (a new scaler would start at 2^16 and
  // skip steps the uninterrupted run did not).
  if (scaler_.enabled() && !ck.state.grad_scaler.is_null()) {
    const nlohmann::json& g = ck.state.grad_scaler;
    scaler_.load_state({g.at("scale").get<double>(), g.at("growth_tracker").get<int64_t>(),
                        g.at("skipped_steps").get<int64_t>()});
  }
  start_epoch_ = ck.state.epoch;
  step_ = ck.state.step;
  default_generator().seed = ck.state.generator_seed;
  default_generator().offset = ck.state.generator_offset;
  train_seconds_before_ = ck.state.metrics.value("train_seconds", 0.0);
  last_checkpoint_ = path;
  last_checkpoint_epoch_ = ck.state.epoch;
  out_ << fmt::format("resumed from '{}': {} epochs ({} steps) done{}\n", path, ck.state.epoch, ck.state.step,
                      ck.state.metrics.contains("test_acc")
                          ? fmt::format(", test acc {:.2f}%", 100.0 * ck.state.metrics["test_acc"].get<double>())
                          : "");
}

void Trainer::write_checkpoint(int64_t epochs_done, const EpochMetrics& m) {
  if (c_.checkpoint.empty()) return;
  CheckpointState s;
  s.epoch = epochs_done;
  s.step = step_;
  s.generator_seed = default_generator().seed;
  s.generator_offset = default_generator().offset;
  s.config = checkpoint_config();
  s.metrics = m.to_json();
  if (scaler_.enabled()) {
    const optim::GradScaler::State g = scaler_.state();
    s.grad_scaler = {{"scale", g.scale}, {"growth_tracker", g.growth_tracker}, {"skipped_steps", g.skipped_steps}};
  }
  save_checkpoint(c_.checkpoint, *model_, opt_.get(), s);
  last_checkpoint_ = c_.checkpoint;
  last_checkpoint_epoch_ = epochs_done;
}

void Trainer::log_epoch(const EpochMetrics& m) {
  if (c_.log.empty()) return;
  std::ofstream f(c_.log, std::ios::app);
  DUET_CHECK(f.good(), "--log '{}': cannot open the file for appending", c_.log);
  // One write per line, so a reader never sees half an object.
  f << (m.to_json().dump() + "\n") << std::flush;
  DUET_CHECK(f.good(), "--log '{}': writing failed (disk full?)", c_.log);
}

std::string Trainer::last_good_checkpoint() const {
  return last_checkpoint_.empty()
             ? "no checkpoint was written (pass --checkpoint FILE to keep one after every epoch)"
             : fmt::format("the last good checkpoint is '{}' (after epoch {}); continue from it with --resume {} and a "
                           "lower --lr",
                           last_checkpoint_, last_checkpoint_epoch_, last_checkpoint_);
}

void Trainer::stop_on_bad_loss(double loss, int64_t epoch, int64_t batch) const {
  const std::string where =
      fmt::format("step {} (epoch {}, batch {} of {}, lr {:.4g})", step_, epoch + 1, batch + 1, steps_per_epoch_,
                  schedule_->lr_at(step_));
  throw Error(fmt::format("training stopped: the loss is {} at {}; the weights were not updated with it, and {}",
                          std::isnan(loss) ? "nan" : "infinite", where, last_good_checkpoint()));
}

void Trainer::stop_on_bad_weights(int64_t epoch) const {
  const NoGradGuard no_grad;
  for (const auto& [name, p] : model_->named_parameters()) {
    const double biggest = amax(abs(p.detach())).item();
    if (std::isfinite(biggest)) continue;
    throw Error(fmt::format("training stopped: the last update of epoch {} (step {}) made parameter '{}' {}; this "
                            "epoch was neither evaluated nor checkpointed, and {}",
                            epoch + 1, step_ - 1, name, std::isnan(biggest) ? "nan" : "infinite", last_good_checkpoint()));
  }
}

TrainResult Trainer::fit() {
  TrainResult result;
  result.steps = step_;
  if (start_epoch_ >= c_.epochs) {
    out_ << fmt::format("the checkpoint has already trained {} of {} epochs: nothing to do\n", start_epoch_, c_.epochs);
    return result;
  }
  if (!c_.log.empty() && c_.resume.empty()) {
    // A new run starts a new log; a resumed one appends to its own.
    std::ofstream f(c_.log, std::ios::trunc);
    DUET_CHECK(f.good(), "--log '{}': cannot create the file", c_.log);
  }
  Allocator& alloc = device_allocator(env_.device);
  Progress progress(out_, progress_bar, c_.log_every);
  const EvalSetup eval_setup{.batch_size = std::max<int64_t>(c_.batch, 256),
                             .workers = c_.data.workers,
                             .device = env_.device,
                             .memory_format = format_};
  const double budget_s = c_.stop_after_minutes * 60.0;
  double train_seconds = train_seconds_before_;

  for (int64_t epoch = start_epoch_; epoch < c_.epochs; ++epoch) {
    model_->train();
    alloc.reset_peak();
    loader_->start_epoch(epoch);
    const std::vector<std::vector<int64_t>> batches = loader_->epoch_batches(epoch);
    progress.begin_epoch(epoch, c_.epochs, static_cast<int64_t>(batches.size()));
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    const int64_t skipped_before = scaler_.skipped_steps();
    const auto t0 = Clock::now();
    for (size_t k = 0; k < batches.size(); ++k) {
      const double lr = schedule_->lr_at(step_);
      opt_->set_lr(lr);
      const auto n = static_cast<int64_t>(batches[k].size());
      profiler::step_begin(step_, n, env_.device);
      datasets::Batch b;
      Tensor x, y;
      {
        profiler::PhaseGuard phase(Phase::data);
        DUET_CHECK(loader_->next(b), "the loader ended epoch {} after {} of {} batches", epoch + 1, k, batches.size());
        x = prepare_input(b.images, env_.device, format_);
        y = b.labels.to(env_.device);
      }
      Tensor logits, loss;
      {
        profiler::PhaseGuard phase(Phase::forward);
        const AmpScope amp(amp_);
        logits = (*model_)(x);
        loss = cross_entropy(logits, y, c_.optim.label_smoothing);
      }
      const double loss_v = loss.item();
      if (!std::isfinite(loss_v)) {
        profiler::step_end();
        progress.end_epoch();
        stop_on_bad_loss(loss_v, epoch, static_cast<int64_t>(k));
      }
      opt_->zero_grad();
      // fp16: backward from the scaled loss; the scaler unscales the f32 master gradients and
      // skips the optimizer step when one overflowed. Otherwise these are backward() and step().
      scaler_.scale_loss(loss).backward();
      scaler_.step(*opt_);
      profiler::step_end();

      loss_sum += loss_v * static_cast<double>(n);
      correct += count_correct(logits, y);
      seen += n;
      if (on_step) on_step({step_, epoch, static_cast<int64_t>(k), loss_v, lr});
      ++step_;
      const double elapsed = seconds_since(t0);
      progress.update(static_cast<int64_t>(k) + 1, loss_sum / static_cast<double>(seen),
                      static_cast<double>(correct) / static_cast<double>(seen), static_cast<double>(seen) / elapsed, lr);
      if (budget_s > 0 && train_seconds + elapsed >= budget_s && k + 1 < batches.size()) {
        result.stopped_early = true;
        break;
      }
    }
    const double secs = seconds_since(t0);
    train_seconds += secs;
    progress.end_epoch();
    stop_on_bad_weights(epoch);

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.steps = step_;
    m.lr = opt_->lr();
    m.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(seen, 1));
    m.train_accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
    m.images_per_s = static_cast<double>(seen) / secs;
    m.epoch_seconds = secs;
    m.train_seconds = train_seconds;
    m.peak_memory_bytes = alloc.stats().peak;
    m.amp = c_.amp;
    m.skipped_steps = scaler_.skipped_steps() - skipped_before;
    m.loss_scale = scaler_.scale();
    const EvalResult ev = [&] {
      const AmpScope amp(amp_);  // evaluate the model as it trains
      return evaluate(*model_, *data_.test, data_.eval_pipeline, eval_setup);
    }();
    m.test_loss = ev.loss;
    m.test_accuracy = ev.accuracy;
    m.eval_seconds = ev.seconds;
    const std::string amp_note =
        !amp_ ? ""
        : scaler_.enabled()
            ? fmt::format("  amp fp16 (scale {:g}, {} step{} skipped)", m.loss_scale, m.skipped_steps, m.skipped_steps == 1 ? "" : "s")
            : fmt::format("  amp {}", c_.amp);
    out_ << fmt::format("epoch {}/{}  loss {:.4f}  train acc {:5.1f}%  test loss {:.4f}  test acc {:5.2f}%  {:.0f} img/s  "
                        "{:.2f} s  lr {:.4g}  peak {}{}{}\n",
                        m.epoch, c_.epochs, m.train_loss, 100.0 * m.train_accuracy, m.test_loss, 100.0 * m.test_accuracy,
                        m.images_per_s, secs, m.lr, mib(m.peak_memory_bytes), amp_note,
                        result.stopped_early ? "  (time budget reached mid-epoch)" : "")
         << std::flush;
    // The checkpoint of an epoch cut short would resume at the wrong step; write only whole ones.
    if (!result.stopped_early) write_checkpoint(epoch + 1, m);
    log_epoch(m);
    result.epochs.push_back(m);
    if (budget_s > 0 && train_seconds >= budget_s && epoch + 1 < c_.epochs) result.stopped_early = true;
    if (result.stopped_early) {
      out_ << fmt::format("stopped after {:.1f} minutes of training (--stop-after-minutes {:g})\n", train_seconds / 60.0,
                          c_.stop_after_minutes);
      break;
    }
    if (c_.stop_after_epochs > 0 && epoch + 1 - start_epoch_ >= c_.stop_after_epochs && epoch + 1 < c_.epochs) {
      out_ << fmt::format("stopped after {} epoch(s) of this run (--stop-after-epochs); {} of {} done{}\n",
                          c_.stop_after_epochs, epoch + 1, c_.epochs,
                          c_.checkpoint.empty() ? "" : fmt::format(": continue with --resume {}", c_.checkpoint));
      break;
    }
  }
  result.steps = step_;
  result.train_seconds = train_seconds - train_seconds_before_;
  return result;
}

TrainResult run_training(const TrainConfig& c0, const GlobalOptions& g, std::ostream& out) {
  TrainConfig c = c0;
  c.seed = g.seed;
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
  Trainer trainer(c, env, std::move(data), model, out);
  trainer.progress_bar = &out == &std::cout && stdout_is_terminal();
  out << fmt::format("device {} | backend {} | threads {} | input {} | optimizer {}{} wd {:g}{} | batch {} | epochs {} | "
                     "seed {}{}\n",
                     env.device.str(), backend_name(env.backend), env.threads,
                     memory_format_label(input_memory_format(c.data.memory_format, env)), c.optim.optimizer,
                     c.optim.optimizer == "sgd" ? fmt::format(" momentum {:g}{}", c.optim.momentum,
                                                              c.optim.nesterov ? " nesterov" : "")
                                                : "",
                     c.optim.resolved_weight_decay(),
                     c.optim.label_smoothing > 0 ? fmt::format(" label smoothing {:g}", c.optim.label_smoothing) : "",
                     c.batch, c.epochs, c.seed, c.amp == "off" ? "" : fmt::format(" | amp {}", c.amp));
  out << fmt::format("lr schedule {} | {} steps per epoch\n", trainer.schedule().describe(), trainer.steps_per_epoch())
      << busy_machine_note(env.threads) << std::flush;

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
                                  {"memory_format", memory_format_label(input_memory_format(c.data.memory_format, env))},
                                  {"device", env.device.str()},
                                  {"backend", backend_name(env.backend)},
                                  {"threads", env.threads},
                                  {"seed", c.seed},
                                  {"amp", c.amp}};
  if (c.profile) {
    DUET_CHECK(c.profile_mode == "per-op" || c.profile_mode == "throughput",
               "--profile-mode {}: expected per-op or throughput", c.profile_mode);
    start_profile({.mode = c.profile_mode == "per-op" ? TimingMode::per_op : TimingMode::throughput,
                   .device = env.device,
                   .sync_per_op = c.profile_sync});
  }
  TrainResult r = trainer.fit();
  const int64_t images = [&] {
    int64_t n = 0;
    for (const EpochMetrics& m : r.epochs) n += static_cast<int64_t>(m.images_per_s * m.epoch_seconds + 0.5);
    return n;
  }();
  if (!r.epochs.empty())
    out << fmt::format("trained {} epochs ({} steps) in {:.2f} s ({:.0f} img/s); final test accuracy {:.2f}% (chance "
                       "{:.1f}%){}\n",
                       r.epochs.size(), r.steps, r.train_seconds, r.train_seconds > 0 ? static_cast<double>(images) / r.train_seconds : 0.0,
                       100.0 * r.epochs.back().test_accuracy, 100.0 / static_cast<double>(classes),
                       trainer.last_checkpoint().empty()
                           ? ""
                           : fmt::format("; checkpoint '{}'", trainer.last_checkpoint()));
  if (c.profile) finish_profile(run_config, c.profile_path, c.trace_path, out);
  return r;
}

}  // namespace duet::app
