// The epoch metrics' JSON form, the step hook and the JSONL epoch log (see train_callbacks.h).
#include "train/train_callbacks.h"
#include <fstream>
#include "engine/error.h"
#include "train/output_check.h"

namespace duet::app {

nlohmann::json EpochMetrics::to_json() const {
  nlohmann::json j = {{"epoch", epoch},
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
  if (has_val) {
    j.erase("test_loss");
    j.erase("test_acc");
    j["val_loss"] = val_loss;
    j["val_acc"] = val_accuracy;
  }
  return j;
}

void EpochLog::start_new() const {
  std::ofstream f(path_, std::ios::trunc);
  DUET_CHECK(f.good(), "--log '{}': cannot create the file", path_);
}

void EpochLog::on_epoch_end(const EpochMetrics& m) {
  std::ofstream f(path_, std::ios::app);
  DUET_CHECK(f.good(), "--log '{}': cannot open the file for appending", path_);
  f << (dump_lenient(m.to_json()) + "\n") << std::flush;
  DUET_CHECK(f.good(), "--log '{}': writing failed (disk full?)", path_);
}

}  // namespace duet::app
