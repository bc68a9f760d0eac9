// Resume validation (see resume.h): the checks run in the order a user fixes them, what the run
// is first, then the file's counters, then its optimizer and loss-scaler state.
#include "train/resume.h"
#include <algorithm>
#include <cmath>
#include <ostream>
#include <set>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "engine/error.h"
#include "train/output_check.h"

namespace duet::app {

ResumePoint check_resume(const std::string& path, const Checkpoint& ck, const ResumeTarget& run, std::ostream& out) {
  const nlohmann::json& was = ck.state.config;
  const nlohmann::json& now = run.config;
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
    DUET_CHECK(was_world == run.world_size,
               "--resume '{}': the checkpoint was written by a run on {} rank{} and this run has {}; resuming needs "
               "the same number of ranks (--batch is per rank, so the global batch, the steps per epoch and the data "
               "order depend on it); start it with mpirun -np {}{}",
               path, was_world, was_world == 1 ? "" : "s", run.world_size, was_world,
               was_world == 1 ? " or without mpirun" : "");
    const nlohmann::json none = nlohmann::json::object();
    const nlohmann::json data = was.value("data", none), optim = was.value("optim", none);
    DUET_CHECK(data.is_object() && optim.is_object(), "--resume '{}': the checkpoint's config has data {} and optim {}; "
               "expected objects", path, dump_lenient(data), dump_lenient(optim));
    same(data.value("dataset", nlohmann::json()), now["data"]["dataset"], "dataset");
    same(data.value("val_fraction", nlohmann::json(0.0)), now["data"].value("val_fraction", nlohmann::json(0.0)),
         "--val-fraction");
    same(optim.value("optimizer", nlohmann::json()), now["optim"]["optimizer"], "optimizer");
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume '{}': the checkpoint's config is malformed ({})", path, e.what()));
  }
  if (was.contains("epochs") && was["epochs"] != now["epochs"])
    out << fmt::format("note: the checkpoint's run was set for {} epochs, this one for {}: the learning-rate schedule is "
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
    DUET_CHECK(batch > 0 && batch < run.steps_per_epoch,
               "--resume '{}': the checkpoint stopped after batch {} of an epoch of {} batches; expected 1 to {}", path,
               batch, run.steps_per_epoch, run.steps_per_epoch - 1);
  }
  DUET_CHECK(ck.state.step == ck.state.epoch * run.steps_per_epoch + batch,
             "--resume '{}': {} steps in {} epochs{} does not match {} batches per epoch of this data; was the dataset "
             "changed?",
             path, ck.state.step, ck.state.epoch, batch > 0 ? fmt::format(" and {} batches", batch) : "",
             run.steps_per_epoch);
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
    for (const std::string& n : run.optimizer_state)
      if (!have.count(n)) missing.push_back("optimizer." + n);
    DUET_CHECK(missing.empty(), "--resume '{}': the checkpoint lacks {} optimizer state tensor{} of this {} run ({}{}); "
               "the file is damaged or from another optimizer setting",
               path, missing.size(), missing.size() == 1 ? "" : "s", run.optimizer,
               fmt::join(missing.begin(), missing.begin() + std::min<ptrdiff_t>(5, std::ssize(missing)), ", "),
               missing.size() > 5 ? ", ..." : "");
  }
  ResumePoint at;
  at.epoch = ck.state.epoch;
  at.step = ck.state.step;
  at.batch = batch;
  at.partial_epoch = partial;
  // fp16: continue with the loss scale the run had reached (a new scaler would start at 2^16 and
  // skip steps the uninterrupted run did not).
  if (run.loss_scaling && !ck.state.grad_scaler.is_null()) {
    const nlohmann::json& g = ck.state.grad_scaler;
    optim::GradScaler::State st;
    try {
      st = {g.at("scale").get<double>(), g.at("growth_tracker").get<int64_t>(), g.at("skipped_steps").get<int64_t>()};
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("--resume '{}': metadata 'grad_scaler' is malformed ({})", path, e.what()));
    }
    DUET_CHECK(std::isfinite(st.scale) && st.scale > 0 && st.growth_tracker >= 0 && st.skipped_steps >= 0,
               "--resume '{}': grad_scaler {}: expected a finite scale > 0 and counts >= 0", path, dump_lenient(g));
    at.grad_scaler = st;
  }
  try {
    at.train_seconds = ck.state.metrics.is_object() ? ck.state.metrics.value("train_seconds", 0.0) : 0.0;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume '{}': metadata 'metrics' is malformed ({})", path, e.what()));
  }
  DUET_CHECK(std::isfinite(at.train_seconds) && at.train_seconds >= 0,
             "--resume '{}': metrics.train_seconds is {}; expected a finite number >= 0", path, at.train_seconds);
  return at;
}

std::string resumed_line(const std::string& path, const Checkpoint& ck, const ResumePoint& at, int64_t steps_per_epoch) {
  const nlohmann::json& m = ck.state.metrics;
  const bool has_acc = m.is_object() && m.contains("test_acc") && m["test_acc"].is_number();
  return fmt::format("resumed from '{}': {} epochs ({} steps) done{}{}\n", path, ck.state.epoch, ck.state.step,
                     at.batch > 0 ? fmt::format(" and {} of {} batches of epoch {}", at.batch, steps_per_epoch,
                                                ck.state.epoch + 1)
                                  : "",
                     has_acc && at.batch == 0 ? fmt::format(", test acc {:.2f}%", 100.0 * m["test_acc"].get<double>())
                                              : "");
}

}  // namespace duet::app
