// `duet predict`: images through the checkpoint's eval transform, in batches; the top-k classes of
// each, printed or written to a CSV or JSON Lines file. Under mpirun the batches are sharded over
// the ranks and rank 0 writes every image's result in input order.
#include "cli/commands.h"
#include "cli/global_options.h"
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "train/data_parallel.h"
#include "train/evaluate.h"
#include "train/model_file.h"
#include "train/output_check.h"
#include "train/predict.h"
#include "train/train_data.h"
#include "datasets/image_folder.h"
#include "engine/autograd.h"
#include "engine/hash.h"
#include "reports/files.h"
#include "reports/text_table.h"

namespace duet::app {

namespace {
struct PredictCmd {
  std::vector<std::string> images;
  std::string checkpoint;
  int64_t top = 5;
  int64_t batch = 64;
  std::string out;
};

enum class OutFormat { text, csv, jsonl };

OutFormat out_format(const std::string& path) {
  if (path.empty()) return OutFormat::text;
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".csv") return OutFormat::csv;
  if (ext == ".jsonl") return OutFormat::jsonl;
  throw Error(fmt::format("--out '{}': expected a file ending in .csv (one row per image) or .jsonl (JSON Lines)", path));
}

// The files named, each folder replaced by the image files under it (sorted, recursively).
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    if (!std::filesystem::is_directory(in)) {
      files.push_back(in);
      continue;
    }
    const std::vector<std::string> found = datasets::list_image_files(in);
    DUET_CHECK(!found.empty(), "predict: the folder '{}' holds no .jpg, .jpeg or .png files", in);
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// Every image's top-k as (class index, probability) pairs, k pairs per image, in input order.
using TopTable = std::vector<double>;

std::string format_results(OutFormat f, const std::vector<std::string>& files, const TopTable& table, int64_t k,
                           const std::vector<std::string>& names) {
  const auto name = [&](double index) {
    const auto i = static_cast<size_t>(index);
    return i < names.size() ? names[i] : fmt::format("class{}", i);
  };
  std::ostringstream s;
  if (f == OutFormat::csv) {
    s << "file";
    for (int64_t j = 1; j <= k; ++j) s << fmt::format(",class{0},probability{0}", j);
    s << "\n";
  }
  for (size_t r = 0; r < files.size(); ++r) {
    const double* row = table.data() + r * static_cast<size_t>(2 * k);
    if (f == OutFormat::text) {
      s << files[r] << "\n";
      for (int64_t j = 0; j < k; ++j) s << fmt::format("  {:>6.2f}%  {}\n", 100.0 * row[2 * j + 1], name(row[2 * j]));
    } else if (f == OutFormat::csv) {
      s << profiler::csv_field(files[r]);
      for (int64_t j = 0; j < k; ++j) s << "," << profiler::csv_field(name(row[2 * j])) << fmt::format(",{:.6g}", row[2 * j + 1]);
      s << "\n";
    } else {
      nlohmann::json top = nlohmann::json::array();
      for (int64_t j = 0; j < k; ++j)
        top.push_back({{"class", name(row[2 * j])}, {"index", static_cast<int64_t>(row[2 * j])}, {"probability", row[2 * j + 1]}});
      s << dump_lenient({{"file", files[r]}, {"top", top}}) << "\n";  // file names are bytes, not always UTF-8
    }
  }
  return s.str();
}

int run_predict(const PredictCmd& p, const GlobalOptions& g0, std::ostream& out, dist::Communicator& comm) {
  const OutFormat format = out_format(p.out);
  if (comm.rank() == 0) check_output_file("--out", p.out);
  const std::vector<std::string> files = expand_inputs(p.images);
  if (comm.size() > 1) {
    std::string listed;  // every rank must see the same files in the same order
    for (const std::string& f : files) listed += f + '\n';
    dist::check_same_on_all_ranks(comm, {{"--checkpoint", p.checkpoint}, {"--top", std::to_string(p.top)},
                                         {"--batch", std::to_string(p.batch)}, {"--out", p.out}, {"--device", g0.device},
                                         {"--backend", g0.backend},
                                         {"images", fmt::format("{} files (list hash {:016x})", files.size(),
                                                                fnv1a(listed))}});
  }
  const RunEnv env = apply_global_options(options_for_rank(comm, g0));
  TrainedModel t = load_trained_model(p.checkpoint);
  const datasets::Pipeline pipeline = pipeline_from_json(t.raw_config.value("eval_transform", nlohmann::json()));
  const MemoryFormat mf = input_memory_format(t.config.data.memory_format, env);
  place_model(*t.model, env.device, mf);
  NoGradGuard no_grad;
  const int64_t k = std::min<int64_t>(p.top, t.config.model.classes);
  const auto classes = static_cast<size_t>(t.config.model.classes);
  const auto batch = static_cast<size_t>(p.batch);

  // Rank r classifies batches r, r + N, ...; one all-reduce of the table, zeros where another rank
  // wrote (adding zeros is exact), gives rank 0 every row. Batches are the same as one process's,
  // so each image goes through the same computation as there.
  const auto t0 = std::chrono::steady_clock::now();
  TopTable table(files.size() * static_cast<size_t>(2 * k), 0.0);
  for (size_t i = static_cast<size_t>(comm.rank()) * batch; i < files.size(); i += batch * static_cast<size_t>(comm.size())) {
    const std::vector<std::string> paths(files.begin() + static_cast<std::ptrdiff_t>(i),
                                         files.begin() + static_cast<std::ptrdiff_t>(std::min(i + batch, files.size())));
    const Tensor logits = (*t.model)(prepare_input(load_image_batch(paths, pipeline, mf), env.device, mf));
    const std::vector<float> all = logits.to(Device::cpu()).contiguous().to_vector<float>();
    for (size_t r = 0; r < paths.size(); ++r) {
      const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(r * classes),
                                   all.begin() + static_cast<std::ptrdiff_t>((r + 1) * classes));
      double* dst = table.data() + (i + r) * static_cast<size_t>(2 * k);
      for (const Prediction& pr : top_k(row, k, {})) {
        *dst++ = static_cast<double>(pr.index);
        *dst++ = pr.probability;
      }
    }
  }
  if (comm.size() > 1) comm.all_reduce_sum(table.data(), table.size());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() != 0) return 0;

  const std::string text = format_results(format, files, table, k, t.class_names);
  if (format == OutFormat::text) out << text;
  else profiler::write_file_atomic(p.out, text);
  out << fmt::format("{} image{} in {:.2f} s ({:.1f} img/s){}{}\n", files.size(), files.size() == 1 ? "" : "s", seconds,
                     static_cast<double>(files.size()) / std::max(seconds, 1e-9),
                     comm.size() > 1 ? fmt::format(", sharded over {} ranks", comm.size()) : "",
                     p.out.empty() ? "" : fmt::format("; results in '{}'", p.out));
  return 0;
}
}  // namespace

Command add_predict_command(CLI::App& app, GlobalOptions& g) {
  auto p = std::make_shared<PredictCmd>();
  CLI::App* cmd = app.add_subcommand("predict", "Classify image files with a trained checkpoint (top-k with probabilities)");
  cmd->add_option("images", p->images, "JPEG or PNG files, or folders (every image under them, sorted)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("-c,--checkpoint", p->checkpoint, "Checkpoint written by duet train --checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-k,--top", p->top, "Classes to show per image")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--batch", p->batch, "Images per forward pass")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1 << 16}));
  cmd->add_option("-o,--out", p->out, "Write the results to this .csv or .jsonl file (atomically) instead of printing them");
  add_global_options(*cmd, g);
  cmd->footer("Examples:\n  duet predict --checkpoint catdog.safetensors ../shared/data/cats_dogs/test/cat/cat.2001.jpg\n"
              "  mpirun -np 2 duet predict -c catdog.safetensors ../shared/data/cats_dogs/test --out test.csv\n"
              "      sharded over 2 processes; rank 0 writes every image's row, in input order");
  return {cmd, [p, &g](std::ostream& out) {
            dist::Communicator& comm = dist::world();
            return run_on_every_rank(comm, out, [&](std::ostream& o) { return run_predict(*p, g, o, comm); });
          }};
}

}  // namespace duet::app
