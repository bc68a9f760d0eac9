// Terminal progress bar and plain progress lines.
#include "train/progress.h"
#include <unistd.h>
#include <cstdio>
#include <ostream>
#include <fmt/format.h>

namespace duet::app {

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

std::string epoch_line(const EpochMetrics& m, int64_t epochs) {
  const std::string amp_note =
      m.amp == "off" ? ""
      : m.amp == "fp16"
          ? fmt::format("  amp fp16 (scale {:g}, {} step{} skipped)", m.loss_scale, m.skipped_steps,
                        m.skipped_steps == 1 ? "" : "s")
          : fmt::format("  amp {}", m.amp);
  const char* split = m.has_val ? "val" : "test";  // --val-fraction: the test split waits for the run's end
  return fmt::format("epoch {}/{}  loss {:.4f}  train acc {:5.1f}%  {} loss {:.4f}  {} acc {:5.2f}%  {:.0f} img/s  "
                     "{:.2f} s  lr {:.4g}  peak {}{}{}\n",
                     m.epoch, epochs, m.train_loss, 100.0 * m.train_accuracy, split,
                     m.has_val ? m.val_loss : m.test_loss, split, 100.0 * (m.has_val ? m.val_accuracy : m.test_accuracy),
                     m.images_per_s, m.epoch_seconds, m.lr, mib(m.peak_memory_bytes), amp_note,
                     m.time_budget_reached ? "  (time budget reached mid-epoch)" : "");
}

void ProgressPrinter::on_epoch_end(const EpochMetrics& m) { out_ << epoch_line(m, epochs_) << std::flush; }

Progress::Progress(std::ostream& out, bool bar, int64_t every) : out_(out), bar_(bar), every_(every) {}

std::string Progress::bar_text(int64_t done, int64_t total, int width) {
  const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int fill = static_cast<int>(f * width);
  std::string s = "[";
  for (int i = 0; i < width; ++i) s += i < fill ? '=' : (i == fill ? '>' : ' ');
  return s + fmt::format("] {}/{}", done, total);
}

void Progress::begin_epoch(int64_t epoch, int64_t epochs, int64_t batches) {
  epoch_ = epoch;
  epochs_ = epochs;
  batches_ = batches;
  epoch_start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
  drawn_ = false;
}

void Progress::update(int64_t done, double loss, double accuracy, double images_per_s, double lr) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - epoch_start_).count();
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(batches_ - done) : 0.0;
  if (bar_) {
    if (done < batches_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    out_ << fmt::format("\repoch {}/{} {} loss {:.4f} acc {:5.1f}% {:.0f} img/s lr {:.3g} eta {:.0f}s\x1b[K", epoch_ + 1,
                        epochs_, bar_text(done, batches_), loss, 100.0 * accuracy, images_per_s, lr, eta)
         << std::flush;
    drawn_ = true;
  } else if (every_ > 0 && done % every_ == 0 && done < batches_) {
    out_ << fmt::format("epoch {}/{} step {}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} img/s  lr {:.4g}\n", epoch_ + 1,
                        epochs_, done, batches_, loss, 100.0 * accuracy, images_per_s, lr)
         << std::flush;
  }
}

void Progress::end_epoch() {
  if (bar_ && drawn_) out_ << "\r\x1b[K" << std::flush;
  drawn_ = false;
}

}  // namespace duet::app
