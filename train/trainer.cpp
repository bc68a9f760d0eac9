// The training loop (see trainer.h): fit() runs epochs of steps, asks StopRules after each step
// and each epoch whether to stop, and writes the checkpoints; resume checks live in resume.cpp.
#include "train/trainer.h"
#include <chrono>
#include <cmath>
#include <csignal>
#include <ostream>
#include <fmt/format.h>
#include "datasets/loader.h"
#include "distributed/sync.h"
#include "distributed/sync_batch_norm.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler/events.h"
#include "train/amp.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/interrupt.h"
#include "train/progress.h"
#include "train/resume.h"

namespace duet::app {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
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
      scaler_(optim::GradScaler::Options{.enabled = c_.amp == "fp16"}),
      stops_(c_.stop_after_minutes, c_.stop_after_epochs, comm_) {
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
  const ResumePoint at = check_resume(path, ck,
                                      {.config = checkpoint_config(),
                                       .world_size = comm_.size(),
                                       .steps_per_epoch = steps_per_epoch_,
                                       .optimizer = c_.optim.optimizer,
                                       .optimizer_state = opt_->stepped_state_names(),
                                       .loss_scaling = scaler_.enabled()},
                                      out_);
  load_state_dict(*model_, ck.model, true);
  opt_->load_state_tensors(ck.optimizer);
  best_.load(ck.state.metrics);
  if (at.grad_scaler) scaler_.load_state(*at.grad_scaler);
  start_epoch_ = at.epoch;
  step_ = at.step;
  resume_partial_ = at.partial_epoch;
  default_generator().seed = ck.state.generator_seed;
  default_generator().offset = ck.state.generator_offset;
  train_seconds_before_ = at.train_seconds;
  last_checkpoint_ = path;
  last_checkpoint_epoch_ = at.epoch;
  out_ << resumed_line(path, ck, at, steps_per_epoch_);
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
  CheckpointState s = checkpoint_state(epochs_done, m);
  s.partial_epoch = partial_epoch;
  save_checkpoint(c_.checkpoint, *model_, opt_.get(), s);
  last_checkpoint_ = c_.checkpoint;
  last_checkpoint_epoch_ = epochs_done;
}

CheckpointState Trainer::checkpoint_state(int64_t epochs_done, const EpochMetrics& m) const {
  CheckpointState s;
  s.epoch = epochs_done;
  s.step = step_;
  s.generator_seed = default_generator().seed;
  s.generator_offset = default_generator().offset;
  s.config = checkpoint_config();
  s.metrics = m.to_json();
  best_.store(s.metrics);
  if (scaler_.enabled()) {
    const optim::GradScaler::State g = scaler_.state();
    s.grad_scaler = {{"scale", g.scale}, {"growth_tracker", g.growth_tracker}, {"skipped_steps", g.skipped_steps}};
  }
  return s;
}

// The best epoch on validation so far: its model and the run's metadata, without optimizer state
// (for eval, predict and export; --resume continues from the latest checkpoint).
void Trainer::write_best_checkpoint(const EpochMetrics& m) {
  save_checkpoint(best_checkpoint_path(c_.checkpoint), *model_, nullptr, checkpoint_state(m.epoch, m));
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

void Trainer::start_callbacks() {
  active_.clear();
  active_.push_back(std::make_shared<ProgressPrinter>(out_, progress_bar, c_.log_every, c_.epochs));
  if (!c_.log.empty() && comm_.rank() == 0) {
    auto log = std::make_shared<EpochLog>(c_.log);
    if (c_.resume.empty()) log->start_new();  // a resumed run appends to its own log
    active_.push_back(log);
  }
  active_.insert(active_.end(), callbacks_.begin(), callbacks_.end());
}

StepTotals Trainer::train_step(int64_t epoch, size_t k, size_t batches, int64_t n, double run_seconds) {
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
  const double local_loss = loss.item();
  const int64_t correct = count_correct(logits, b.labels);
  // Data-parallel: the global batch's mean loss and accuracy, and the stop votes, agreed before
  // any rank updates its weights, so that every rank stops (or goes on) at the same step.
  const StepTotals o = stops_.agree_on_step(local_loss, correct, n, run_seconds);
  if (StopRules::bad_loss(o)) {
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
  start_callbacks();
  Allocator& alloc = device_allocator(env_.device);
  // Data-parallel: the batches one process with the global batch would evaluate, sharded.
  const EvalSetup eval_setup{.batch_size = std::max<int64_t>(c_.batch * comm_.size(), 256),
                             .workers = c_.data.workers,
                             .device = env_.device,
                             .memory_format = format_,
                             .comm = distributed() ? &comm_ : nullptr};
  double train_seconds = train_seconds_before_;
  bool paused = false;  // --stop-after-epochs: the run goes on later with --resume

  for (int64_t epoch = start_epoch_; epoch < c_.epochs; ++epoch) {
    model_->train();
    alloc.reset_peak();
    EpochSums sums = begin_epoch(epoch);
    loader_->start_epoch(epoch, static_cast<int64_t>(sums.first_batch));
    const size_t batches = loader_->current_batches().size();
    each_callback([&](TrainCallback& cb) { cb.on_epoch_begin(epoch, static_cast<int64_t>(batches)); });
    const auto t0 =
        Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sums.seconds_before));
    const auto run_seconds = [&](double epoch_seconds) { return train_seconds + epoch_seconds - sums.seconds_before; };

    // The epoch's steps, up to its last batch or a stop. On a stop, k is the batch to continue at.
    Stop stop = Stop::none;
    size_t k = sums.first_batch;
    double elapsed = 0;  // seconds of this epoch after its latest step
    while (k < batches && stop == Stop::none) {
      const double lr = schedule_->lr_at(step_);
      opt_->set_lr(lr);
      const auto n = static_cast<int64_t>(loader_->current_batches()[k].size());
      profiler::step_begin(step_, n, env_.device);
      const StepTotals o = train_step(epoch, k, batches, n, run_seconds(seconds_since(t0)));
      profiler::step_end();
      sums.add(o);
      elapsed = seconds_since(t0);
      const StepRecord record{step_, epoch, static_cast<int64_t>(k), o.loss, lr};
      const EpochProgress progress = sums.progress(k + 1, batches, elapsed);
      ++step_;
      ++k;
      each_callback([&](TrainCallback& cb) { cb.on_step(record, progress); });
      if (k < batches) stop = stops_.after_step(run_seconds(elapsed));
    }
    if (stop == Stop::signal) {  // between two steps: a checkpoint that finishes this epoch from batch k
      train_seconds = run_seconds(elapsed);
      save_interrupted_epoch(epoch, k, sums, elapsed, train_seconds);
      result.interrupted_by = stopped_by_signal();
      out_ << stop_note(stop, epoch, train_seconds, true) << std::flush;
      break;
    }
    const double secs = seconds_since(t0);
    train_seconds = run_seconds(secs);
    result.epochs.push_back(end_epoch(epoch, sums, secs, train_seconds, stop == Stop::time_budget, eval_setup));

    if (stop == Stop::none && epoch + 1 < c_.epochs) stop = stops_.after_epoch(train_seconds, epoch + 1 - start_epoch_);
    if (stop != Stop::none) {
      result.stopped_early = stop == Stop::time_budget;
      paused = stop == Stop::epoch_budget;
      if (stop == Stop::signal) result.interrupted_by = stopped_by_signal();
      out_ << stop_note(stop, epoch, train_seconds, false) << std::flush;
      break;
    }
  }
  result.steps = step_;
  result.train_seconds = train_seconds - train_seconds_before_;
  // --val-fraction: the test split once, when the run is over (not a pause to be resumed).
  if (data_.val && result.interrupted_by == 0 && !paused && !result.epochs.empty()) {
    TestReport t{.epoch = best_.epoch(), .val_accuracy = best_.accuracy(), .best_epoch = best_.epoch()};
    const auto run_test = [&] {
      const AmpScope amp(amp_);
      t.result = evaluate(*model_, *data_.test, data_.eval_pipeline, eval_setup);
    };
    if (!best_.with_best_weights(*model_, best_checkpoint_path(c_.checkpoint), run_test)) {
      t.best = false;
      t.epoch = result.epochs.back().epoch;
      t.val_accuracy = result.epochs.back().val_accuracy;
      run_test();
    }
    result.test = t;
    if (comm_.rank() == 0) append_test_record(c_.log, t);  // after the epochs' lines
  }
  return result;
}

void Trainer::save_interrupted_epoch(int64_t epoch, size_t next_batch, const EpochSums& sums, double elapsed,
                                     double train_seconds) {
  each_callback([](TrainCallback& cb) { cb.on_epoch_steps_end(); });
  check_weights_finite(epoch, static_cast<int64_t>(next_batch) - 1);
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.steps = step_;
  m.train_seconds = train_seconds;
  write_checkpoint(epoch, m, partial_epoch_state(next_batch, sums, elapsed));
}

EpochMetrics Trainer::end_epoch(int64_t epoch, const EpochSums& s, double secs, double train_seconds, bool cut_short,
                                const EvalSetup& eval_setup) {
  each_callback([](TrainCallback& cb) { cb.on_epoch_steps_end(); });
  // The loss is checked before every update; the epoch's last update is checked here, before
  // the weights are evaluated or saved, so "the last good checkpoint" is always good.
  check_weights_finite(epoch, static_cast<int64_t>(loader_->current_batches().size()) - 1);
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.steps = step_;
  m.lr = opt_->lr();
  m.train_loss = s.loss_sum / static_cast<double>(std::max<int64_t>(s.seen, 1));
  m.train_accuracy = static_cast<double>(s.correct) / static_cast<double>(std::max<int64_t>(s.seen, 1));
  m.images_per_s = static_cast<double>(s.seen) / secs;
  m.epoch_seconds = secs;
  m.train_seconds = train_seconds;
  m.peak_memory_bytes = device_allocator(env_.device).stats().peak;
  m.amp = c_.amp;
  m.skipped_steps = scaler_.skipped_steps() - s.skipped_before;
  m.loss_scale = scaler_.scale();
  m.time_budget_reached = cut_short;
  const EvalResult ev = [&] {
    const AmpScope amp(amp_);  // evaluate the model as it trains (--val-fraction: on the validation split)
    return evaluate(*model_, data_.val ? *data_.val : *data_.test, data_.eval_pipeline, eval_setup);
  }();
  if (data_.val) {
    m.has_val = true;
    m.val_loss = ev.loss;
    m.val_accuracy = ev.accuracy;
    if (best_.update(m.epoch, m.val_accuracy, *model_) && !c_.checkpoint.empty() && comm_.rank() == 0)
      write_best_checkpoint(m);
  } else {
    m.test_loss = ev.loss;
    m.test_accuracy = ev.accuracy;
  }
  m.eval_seconds = ev.seconds;
  // The checkpoint of an epoch cut short would resume at the wrong step; write only whole ones.
  if (!cut_short) write_checkpoint(epoch + 1, m);
  each_callback([&](TrainCallback& cb) { cb.on_epoch_end(m); });
  return m;
}

int Trainer::stopped_by_signal() const {
  return interrupt_signal() != 0 ? interrupt_signal() : SIGTERM;  // or another rank's
}

std::string Trainer::stop_note(Stop why, int64_t epoch, double train_seconds, bool mid_epoch) const {
  const bool no_file = c_.checkpoint.empty();
  const std::string no_checkpoint = "no checkpoint was written (pass --checkpoint FILE to be able to resume)";
  switch (why) {
    case Stop::signal:
      if (mid_epoch)
        return fmt::format("{}: stopped after step {} (epoch {}, batch {} of {}); {}\n", signal_label(stopped_by_signal()),
                           step_, epoch + 1, step_ - epoch * steps_per_epoch_, steps_per_epoch_,
                           no_file ? no_checkpoint
                                   : fmt::format("checkpoint '{}' written: continue with the same options and --resume {}",
                                                 c_.checkpoint, c_.checkpoint));
      return fmt::format("{}: stopped after epoch {} of {}; {}\n", signal_label(stopped_by_signal()), epoch + 1, c_.epochs,
                         no_file ? no_checkpoint : fmt::format("continue with the same options and --resume {}", c_.checkpoint));
    case Stop::time_budget:
      return fmt::format("stopped after {:.1f} minutes of training (--stop-after-minutes {:g})\n", train_seconds / 60.0,
                         c_.stop_after_minutes);
    case Stop::epoch_budget:
      return fmt::format("stopped after {} epoch(s) of this run (--stop-after-epochs); {} of {} done{}\n",
                         c_.stop_after_epochs, epoch + 1, c_.epochs,
                         no_file ? "" : fmt::format(": continue with --resume {}", c_.checkpoint));
    case Stop::none: break;
  }
  return "";
}

}  // namespace duet::app
