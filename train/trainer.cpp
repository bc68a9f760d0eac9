// The training loop (see trainer.h).
#include "train/trainer.h"
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <ostream>
#include <set>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "train/amp.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/evaluate.h"
#include "train/interrupt.h"
#include "train/output_check.h"
#include "train/progress.h"
#include "train/profiling.h"
#include "datasets/loader.h"
#include "distributed/sync.h"
#include "distributed/sync_batch_norm.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler/events.h"
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

}  // namespace

Trainer::Trainer(TrainConfig config, RunEnv env, TrainData data, std::shared_ptr<nn::Module> model, std::ostream& out,
                 dist::Communicator& comm)
    : c_(std::move(config)),
      env_(env),
      data_(std::move(data)),
      model_(std::move(model)),
      out_(out),
      comm_(comm),
      amp_(amp_dtype(c_.amp)),
      scaler_(optim::GradScaler::Options{.enabled = c_.amp == "fp16"}) {
  DUET_CHECK(c_.epochs >= 1 && c_.batch >= 1, "--epochs {} and --batch {}: expected positive numbers", c_.epochs, c_.batch);
  format_ = input_memory_format(c_.data.memory_format, env_);
  place_model(*model_, env_.device, format_);
  model_->train();
  opt_ = make_optimizer(c_.optim, model_->parameters());

  datasets::LoaderOptions lo;
  lo.batch_size = c_.batch;
  lo.shuffle = true;
  lo.seed = c_.seed;
  lo.num_workers = c_.data.workers;
  lo.memory_format = format_;
  // Data-parallel: rank r takes batches r, r + W, ... of the one permutation every rank computes
  // from the seed, so step s covers exactly the samples of one process's step s with batch W * b.
  // drop_last: every rank takes the same number of steps (the collectives need it); the samples
  // left over after the last full global batch (fewer than W * b) are not trained on that epoch.
  lo.rank = comm_.rank();
  lo.world_size = comm_.size();
  lo.drop_last = distributed();
  loader_ = std::make_unique<datasets::DataLoader>(*data_.train, lo, data_.train_pipeline);
  steps_per_epoch_ = loader_->batches_per_epoch();
  DUET_CHECK(steps_per_epoch_ >= 1,
             "--batch {} on {} ranks: a global batch of {} images, more than the training set's {}; expected a smaller "
             "--batch or fewer ranks",
             c_.batch, comm_.size(), c_.batch * comm_.size(), data_.train->size());
  schedule_ = std::make_unique<LrSchedule>(make_schedule_config(c_.optim, c_.epochs, steps_per_epoch_));
  if (!c_.resume.empty()) resume_from(c_.resume);
  if (distributed()) {
    // Every rank starts from rank 0's weights and buffers (a resumed run: the checkpoint's, which
    // every rank read; broadcasting anyway costs one copy and rules out any drift).
    std::vector<Tensor> state = model_->parameters();
    for (const auto& [name, b] : model_->named_buffers()) state.push_back(b);
    dist::broadcast_tensors(comm_, state, 0);
    // --sync-bn all-reduces statistics on the training thread during backward; a communication
    // thread all-reducing buckets at the same time could interleave the two kinds of collective
    // in a different order on different ranks, so the buckets are then reduced on the training
    // thread too, in backward's order (no overlap).
    if (c_.sync_bn) sync_bn_layers_ = dist::sync_batch_norm(*model_, comm_);
    reducer_ = std::make_unique<dist::GradReducer>(
        comm_, model_->parameters(), dist::GradReducerOptions{.bucket_mb = c_.bucket_mb, .overlap = !c_.sync_bn});
  }
}

Trainer::~Trainer() = default;

nlohmann::json Trainer::checkpoint_config() const {
  nlohmann::json j = stored_config(c_);
  j["model"]["classes"] = data_.class_names.size();
  j["image_size"] = data_.image_size;
  j["class_names"] = data_.class_names;
  j["eval_transform"] = data_.eval_transform;
  j["memory_format"] = memory_format_label(format_);
  if (distributed()) j["world_size"] = comm_.size();  // --batch is per rank: resuming needs as many ranks
  if (c_.sync_bn && distributed()) j["sync_bn"] = true;
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
               path, what, dump_lenient(a), dump_lenient(b));
  };
  try {
    same(was.value("model", nlohmann::json()), now["model"], "model");
    same(was.value("image_size", nlohmann::json()), now["image_size"], "image size");
    same(was.value("batch", nlohmann::json()), now["batch"], "batch size");
    same(was.value("seed", nlohmann::json()), now["seed"], "seed");
    same(was.value("sync_bn", false), now.value("sync_bn", false), "--sync-bn");
    const int64_t was_world = was.value("world_size", int64_t{1});
    DUET_CHECK(was_world == comm_.size(),
               "--resume '{}': the checkpoint was written by a run on {} rank{} and this run has {}; resuming needs "
               "the same number of ranks (--batch is per rank, so the global batch, the steps per epoch and the data "
               "order depend on it); start it with mpirun -np {}{}",
               path, was_world, was_world == 1 ? "" : "s", comm_.size(), was_world,
               was_world == 1 ? " or without mpirun" : "");
    const nlohmann::json none = nlohmann::json::object();
    const nlohmann::json data = was.value("data", none), optim = was.value("optim", none);
    DUET_CHECK(data.is_object() && optim.is_object(), "--resume '{}': the checkpoint's config has data {} and optim {}; "
               "expected objects", path, dump_lenient(data), dump_lenient(optim));
    same(data.value("dataset", nlohmann::json()), now["data"]["dataset"], "dataset");
    same(optim.value("optimizer", nlohmann::json()), now["optim"]["optimizer"], "optimizer");
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume '{}': the checkpoint's config is malformed ({})", path, e.what()));
  }
  if (was.contains("epochs") && was["epochs"] != now["epochs"])
    out_ << fmt::format("note: the checkpoint's run was set for {} epochs, this one for {}: the learning-rate schedule is "
                        "stretched to the new length\n",
                        dump_lenient(was["epochs"]), dump_lenient(now["epochs"]));
  // Ranges first, so that epoch * steps_per_epoch cannot overflow.
  DUET_CHECK(ck.state.epoch <= 1000000, "--resume '{}': the checkpoint says {} epochs are done; expected at most 1000000",
             path, ck.state.epoch);
  int64_t batch = 0;
  const nlohmann::json& partial = ck.state.partial_epoch;
  if (!partial.is_null()) {
    try {
      batch = partial.at("batch").get<int64_t>();
      for (const char* k : {"loss_sum", "seconds"})
        DUET_CHECK(std::isfinite(partial.at(k).get<double>()) && partial.at(k).get<double>() >= 0,
                   "--resume '{}': partial_epoch.{} is {}; expected a finite number >= 0", path, k,
                   partial.at(k).get<double>());
      for (const char* k : {"correct", "seen", "skipped_before"})
        DUET_CHECK(partial.at(k).get<int64_t>() >= 0, "--resume '{}': partial_epoch.{} is {}; expected >= 0", path, k,
                   partial.at(k).get<int64_t>());
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("--resume '{}': metadata 'partial_epoch' is malformed ({})", path, e.what()));
    }
    DUET_CHECK(batch > 0 && batch < steps_per_epoch_,
               "--resume '{}': the checkpoint stopped after batch {} of an epoch of {} batches; expected 1 to {}", path,
               batch, steps_per_epoch_, steps_per_epoch_ - 1);
  }
  DUET_CHECK(ck.state.step == ck.state.epoch * steps_per_epoch_ + batch,
             "--resume '{}': {} steps in {} epochs{} does not match {} batches per epoch of this data; was the dataset "
             "changed?",
             path, ck.state.step, ck.state.epoch, batch > 0 ? fmt::format(" and {} batches", batch) : "",
             steps_per_epoch_);
  // Every buffer the optimizer keeps must be there once it has stepped: a missing one would
  // silently restart that parameter's momentum from zero.
  double opt_steps = -1;
  std::set<std::string> have;
  for (const auto& [name, t] : ck.optimizer) {
    have.insert(name);
    if (name == "steps" && t.numel() == 1) opt_steps = t.item();
  }
  DUET_CHECK(opt_steps >= 0, "--resume '{}': the checkpoint has no optimizer tensor 'optimizer.steps'; expected a file "
             "written by duet train", path);
  if (opt_steps > 0) {
    std::vector<std::string> missing;
    for (const std::string& n : opt_->stepped_state_names())
      if (!have.count(n)) missing.push_back("optimizer." + n);
    DUET_CHECK(missing.empty(), "--resume '{}': the checkpoint lacks {} optimizer state tensor{} of this {} run ({}{}); "
               "the file is damaged or from another optimizer setting",
               path, missing.size(), missing.size() == 1 ? "" : "s", c_.optim.optimizer,
               fmt::join(missing.begin(), missing.begin() + std::min<ptrdiff_t>(5, std::ssize(missing)), ", "),
               missing.size() > 5 ? ", ..." : "");
  }
  load_state_dict(*model_, ck.model, true);
  opt_->load_state_tensors(ck.optimizer);
  // fp16: continue with the loss scale the run had reached (a new scaler would start at 2^16 and
  // skip steps the uninterrupted run did not).
  if (scaler_.enabled() && !ck.state.grad_scaler.is_null()) {
    const nlohmann::json& g = ck.state.grad_scaler;
    optim::GradScaler::State st;
    try {
      st = {g.at("scale").get<double>(), g.at("growth_tracker").get<int64_t>(), g.at("skipped_steps").get<int64_t>()};
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("--resume '{}': metadata 'grad_scaler' is malformed ({})", path, e.what()));
    }
    DUET_CHECK(std::isfinite(st.scale) && st.scale > 0 && st.growth_tracker >= 0 && st.skipped_steps >= 0,
               "--resume '{}': grad_scaler {}: expected a finite scale > 0 and counts >= 0", path, dump_lenient(g));
    scaler_.load_state(st);
  }
  double train_seconds = 0;
  try {
    train_seconds = ck.state.metrics.is_object() ? ck.state.metrics.value("train_seconds", 0.0) : 0.0;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume '{}': metadata 'metrics' is malformed ({})", path, e.what()));
  }
  DUET_CHECK(std::isfinite(train_seconds) && train_seconds >= 0,
             "--resume '{}': metrics.train_seconds is {}; expected a finite number >= 0", path, train_seconds);
  start_epoch_ = ck.state.epoch;
  step_ = ck.state.step;
  resume_partial_ = partial;
  default_generator().seed = ck.state.generator_seed;
  default_generator().offset = ck.state.generator_offset;
  train_seconds_before_ = train_seconds;
  last_checkpoint_ = path;
  last_checkpoint_epoch_ = ck.state.epoch;
  const nlohmann::json& m = ck.state.metrics;
  const bool has_acc = m.is_object() && m.contains("test_acc") && m["test_acc"].is_number();
  out_ << fmt::format("resumed from '{}': {} epochs ({} steps) done{}{}\n", path, ck.state.epoch, ck.state.step,
                      batch > 0 ? fmt::format(" and {} of {} batches of epoch {}", batch, steps_per_epoch_,
                                              ck.state.epoch + 1)
                                : "",
                      has_acc && batch == 0 ? fmt::format(", test acc {:.2f}%", 100.0 * m["test_acc"].get<double>()) : "");
}

void Trainer::check_weights_finite(int64_t epoch, int64_t batch) const {
  const NoGradGuard no_grad;
  for (const auto& [name, p] : model_->named_parameters()) {
    if (!is_floating(p.dtype())) continue;
    // One scalar per parameter comes back to the host, not the weights (they may live on a GPU).
    const double biggest = amax(abs(p.detach())).item();
    if (std::isfinite(biggest)) continue;
    throw Error(fmt::format("training stopped: parameter '{}' holds {} after the update of step {} (epoch {}, batch "
                            "{} of {}); these weights were not saved, and {}",
                            name, std::isnan(biggest) ? "nan" : "an infinity", step_ - 1, epoch + 1, batch + 1,
                            steps_per_epoch_, last_good_checkpoint()));
  }
}

void Trainer::write_checkpoint(int64_t epochs_done, const EpochMetrics& m, const nlohmann::json& partial_epoch) {
  if (c_.checkpoint.empty()) return;
  last_checkpoint_ = c_.checkpoint;  // on every rank, for the messages; rank 0 writes the file
  last_checkpoint_epoch_ = epochs_done;
  if (comm_.rank() != 0) return;
  CheckpointState s;
  s.partial_epoch = partial_epoch;
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

bool Trainer::on_any_rank(bool local) {
  if (!distributed()) return local;
  double v = local ? 1.0 : 0.0;
  comm_.all_reduce_sum(&v, 1);
  return v > 0;
}

void Trainer::each_callback(const std::function<void(TrainCallback&)>& f) {
  for (const auto& cb : active_) f(*cb);
}

Trainer::EpochSums Trainer::begin_epoch(int64_t epoch) {
  EpochSums s;
  s.skipped_before = scaler_.skipped_steps();
  // A checkpoint written on an interrupt continues its epoch at the batch it stopped at, with
  // the epoch's running sums, so the epoch's metrics come out as the uninterrupted run's.
  if (epoch == start_epoch_ && !resume_partial_.is_null()) {
    const nlohmann::json& p = resume_partial_;
    s.first_batch = p["batch"].get<size_t>();
    s.loss_sum = p["loss_sum"].get<double>();
    s.correct = p["correct"].get<int64_t>();
    s.seen = p["seen"].get<int64_t>();
    s.seconds_before = p["seconds"].get<double>();
    s.skipped_before = p["skipped_before"].get<int64_t>();
  }
  return s;
}

nlohmann::json Trainer::partial_epoch_state(size_t next_batch, const EpochSums& s, double elapsed) const {
  return {{"batch", next_batch},   {"loss_sum", s.loss_sum},       {"correct", s.correct},
          {"seen", s.seen},        {"seconds", elapsed},           {"skipped_before", s.skipped_before}};
}

Trainer::StepOutcome Trainer::train_step(int64_t epoch, size_t k, size_t batches, int64_t n, double budget_s,
                                         double run_seconds) {
  datasets::Batch b;
  Tensor x, y;
  {
    profiler::PhaseGuard phase(Phase::data);
    DUET_CHECK(loader_->next(b), "the loader ended epoch {} after {} of {} batches", epoch + 1, k, batches);
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
  // The labels as loaded (on the host): no copy back from the device to count hits.
  StepOutcome o{.loss = loss.item(), .correct = count_correct(logits, b.labels), .n = n};
  if (distributed()) {
    // The global batch's mean loss and accuracy, and the stop decisions, agreed before any
    // rank updates its weights: every rank stops (or goes on) at the same step.
    double v[5] = {o.loss * static_cast<double>(n), static_cast<double>(n), static_cast<double>(o.correct),
                   interrupt_signal() != 0 ? 1.0 : 0.0, budget_s > 0 && run_seconds >= budget_s ? 1.0 : 0.0};
    {
      profiler::PhaseGuard phase(Phase::comm);
      profiler::CommScope op("comm.step_metrics", comm_.transport(Device::cpu()), {}, [] { return OpCost{}; });
      comm_.all_reduce_sum(v, 5);
    }
    o.loss = v[0] / v[1];
    o.n = static_cast<int64_t>(v[1]);
    o.correct = static_cast<int64_t>(v[2]);
    o.stop_signal = v[3] > 0;
    o.over_budget = v[4] > 0;
  }
  if (!std::isfinite(o.loss)) {
    profiler::step_end();
    each_callback([](TrainCallback& cb) { cb.on_epoch_steps_end(); });
    stop_on_bad_loss(o.loss, epoch, static_cast<int64_t>(k));
  }
  opt_->zero_grad();
  // fp16: backward from the scaled loss; the scaler unscales the f32 master gradients and
  // skips the optimizer step when one overflowed. Otherwise these are backward() and step().
  if (reducer_) {
    // Buckets of gradients are averaged across ranks while backward runs; the step waits for
    // the last. The scaler then sees the same averaged (scaled) gradients on every rank, so
    // all skip or take the same steps.
    {
      const LeafGradHookGuard hook = reducer_->watch_backward();
      scaler_.scale_loss(loss).backward();
    }
    reducer_->finish();
  } else {
    scaler_.scale_loss(loss).backward();
  }
  scaler_.step(*opt_);
  return o;
}

TrainResult Trainer::fit() {
  TrainResult result;
  result.steps = step_;
  if (start_epoch_ >= c_.epochs) {
    out_ << fmt::format("the checkpoint has already trained {} of {} epochs: nothing to do\n", start_epoch_, c_.epochs);
    return result;
  }
  active_.clear();
  active_.push_back(std::make_shared<ProgressPrinter>(out_, progress_bar, c_.log_every, c_.epochs));
  if (!c_.log.empty() && comm_.rank() == 0) {
    auto log = std::make_shared<EpochLog>(c_.log);
    if (c_.resume.empty()) log->start_new();  // a resumed run appends to its own log
    active_.push_back(log);
  }
  active_.insert(active_.end(), callbacks_.begin(), callbacks_.end());
  Allocator& alloc = device_allocator(env_.device);
  // Data-parallel: the batches one process with the global batch would evaluate, sharded.
  const EvalSetup eval_setup{.batch_size = std::max<int64_t>(c_.batch * comm_.size(), 256),
                             .workers = c_.data.workers,
                             .device = env_.device,
                             .memory_format = format_,
                             .comm = distributed() ? &comm_ : nullptr};
  const double budget_s = c_.stop_after_minutes * 60.0;
  double train_seconds = train_seconds_before_;

  for (int64_t epoch = start_epoch_; epoch < c_.epochs; ++epoch) {
    model_->train();
    alloc.reset_peak();
    EpochSums sums = begin_epoch(epoch);
    loader_->start_epoch(epoch, static_cast<int64_t>(sums.first_batch));
    const std::vector<std::vector<int64_t>>& batches = loader_->current_batches();
    each_callback([&](TrainCallback& cb) { cb.on_epoch_begin(epoch, static_cast<int64_t>(batches.size())); });
    const auto t0 =
        Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sums.seconds_before));
    bool interrupted_mid_epoch = false;
    for (size_t k = sums.first_batch; k < batches.size(); ++k) {
      const double lr = schedule_->lr_at(step_);
      opt_->set_lr(lr);
      const auto n = static_cast<int64_t>(batches[k].size());
      profiler::step_begin(step_, n, env_.device);
      const StepOutcome o =
          train_step(epoch, k, batches.size(), n, budget_s, train_seconds + seconds_since(t0) - sums.seconds_before);
      profiler::step_end();

      sums.loss_sum += o.loss * static_cast<double>(o.n);
      sums.correct += o.correct;
      sums.seen += o.n;
      const double elapsed = seconds_since(t0);
      const StepRecord record{step_, epoch, static_cast<int64_t>(k), o.loss, lr};
      const EpochProgress progress{static_cast<int64_t>(k) + 1, static_cast<int64_t>(batches.size()),
                                   sums.loss_sum / static_cast<double>(sums.seen),
                                   static_cast<double>(sums.correct) / static_cast<double>(sums.seen),
                                   static_cast<double>(sums.seen) / elapsed};
      ++step_;
      each_callback([&](TrainCallback& cb) { cb.on_step(record, progress); });
      // One process decides after its step; ranks decided together in train_step.
      const bool stop_signal = distributed() ? o.stop_signal : interrupt_signal() != 0;
      const bool over_budget =
          distributed() ? o.over_budget : budget_s > 0 && train_seconds + elapsed - sums.seconds_before >= budget_s;
      const bool more = k + 1 < batches.size();
      if (stop_signal && more) {
        interrupted_mid_epoch = true;
        each_callback([](TrainCallback& cb) { cb.on_epoch_steps_end(); });
        check_weights_finite(epoch, static_cast<int64_t>(k));
        EpochMetrics m;
        m.epoch = epoch + 1;
        m.steps = step_;
        m.train_seconds = train_seconds + elapsed - sums.seconds_before;
        write_checkpoint(epoch, m, partial_epoch_state(k + 1, sums, elapsed));
        train_seconds += elapsed - sums.seconds_before;
        break;
      }
      if (over_budget && more) {
        result.stopped_early = true;
        break;
      }
    }
    if (interrupted_mid_epoch) {
      result.interrupted_by = interrupt_signal() != 0 ? interrupt_signal() : SIGTERM;  // or another rank's
      out_ << fmt::format("{}: stopped after step {} (epoch {}, batch {} of {}); {}\n",
                          signal_label(result.interrupted_by), step_, epoch + 1, step_ - epoch * steps_per_epoch_,
                          steps_per_epoch_,
                          c_.checkpoint.empty()
                              ? "no checkpoint was written (pass --checkpoint FILE to be able to resume)"
                              : fmt::format("checkpoint '{}' written: continue with the same options and --resume {}",
                                            c_.checkpoint, c_.checkpoint))
           << std::flush;
      break;
    }
    const double secs = seconds_since(t0);
    train_seconds += secs - sums.seconds_before;
    each_callback([](TrainCallback& cb) { cb.on_epoch_steps_end(); });
    // The loss is checked before every update; the epoch's last update is checked here, before
    // the weights are evaluated or saved, so "the last good checkpoint" is always good.
    check_weights_finite(epoch, static_cast<int64_t>(batches.size()) - 1);

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.steps = step_;
    m.lr = opt_->lr();
    m.train_loss = sums.loss_sum / static_cast<double>(std::max<int64_t>(sums.seen, 1));
    m.train_accuracy = static_cast<double>(sums.correct) / static_cast<double>(std::max<int64_t>(sums.seen, 1));
    m.images_per_s = static_cast<double>(sums.seen) / secs;
    m.epoch_seconds = secs;
    m.train_seconds = train_seconds;
    m.peak_memory_bytes = alloc.stats().peak;
    m.amp = c_.amp;
    m.skipped_steps = scaler_.skipped_steps() - sums.skipped_before;
    m.loss_scale = scaler_.scale();
    m.time_budget_reached = result.stopped_early;
    const EvalResult ev = [&] {
      const AmpScope amp(amp_);  // evaluate the model as it trains
      return evaluate(*model_, *data_.test, data_.eval_pipeline, eval_setup);
    }();
    m.test_loss = ev.loss;
    m.test_accuracy = ev.accuracy;
    m.eval_seconds = ev.seconds;
    // The checkpoint of an epoch cut short would resume at the wrong step; write only whole ones.
    if (!result.stopped_early) write_checkpoint(epoch + 1, m);
    each_callback([&](TrainCallback& cb) { cb.on_epoch_end(m); });
    result.epochs.push_back(m);
    if (on_any_rank(budget_s > 0 && train_seconds >= budget_s) && epoch + 1 < c_.epochs) result.stopped_early = true;
    if (result.stopped_early) {
      out_ << fmt::format("stopped after {:.1f} minutes of training (--stop-after-minutes {:g})\n", train_seconds / 60.0,
                          c_.stop_after_minutes);
      break;
    }
    if (on_any_rank(interrupt_signal() != 0) && epoch + 1 < c_.epochs) {
      result.interrupted_by = interrupt_signal() != 0 ? interrupt_signal() : SIGTERM;  // or another rank's
      out_ << fmt::format("{}: stopped after epoch {} of {}; {}\n", signal_label(result.interrupted_by), epoch + 1,
                          c_.epochs,
                          c_.checkpoint.empty()
                              ? "no checkpoint was written (pass --checkpoint FILE to be able to resume)"
                              : fmt::format("continue with the same options and --resume {}", c_.checkpoint))
           << std::flush;
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
    if (c.sync_bn)
      out << fmt::format("sync-bn: {} batch norm layer{} normalised over all ranks' batches\n",
                         trainer.sync_bn_layers(), trainer.sync_bn_layers() == 1 ? "" : "s");
  }
  out << busy_machine_note(env.threads) << std::flush;

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
    out << fmt::format("trained {} epochs ({} steps) in {:.2f} s ({:.0f} img/s); final test accuracy {:.2f}% (chance "
                       "{:.1f}%){}\n",
                       r.epochs.size(), r.steps, r.train_seconds, r.train_seconds > 0 ? static_cast<double>(images) / r.train_seconds : 0.0,
                       100.0 * r.epochs.back().test_accuracy, 100.0 / static_cast<double>(classes),
                       trainer.last_checkpoint().empty()
                           ? ""
                           : fmt::format("; checkpoint '{}'", trainer.last_checkpoint()));
  if (c.profile && distributed) finish_profile_on_ranks(comm, run_config, c.profile_path, c.trace_path, trace_t0_ns, out);
  else if (c.profile) finish_profile(run_config, c.profile_path, c.trace_path, out);
  return r;
}
}  // namespace

TrainResult run_training(const TrainConfig& c, const GlobalOptions& g, std::ostream& out) {
  dist::Communicator& comm = dist::world();
  return run_on_every_rank(comm, out, [&](std::ostream& o) { return run_training_on(comm, c, g, o); });
}

}  // namespace duet::app
