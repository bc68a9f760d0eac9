// `duet data`: cifar10 folders (data_batch_*.bin, test_batch.bin), single .bin files, and image
// folders (train/ and test/ of class folders, or class folders directly).
#include "cli/commands.h"
#include "cli/global_options.h"
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "datasets/cifar10.h"
#include "datasets/fetch.h"
#include "datasets/image_file.h"
#include "datasets/image_folder.h"
#include "engine/error.h"

namespace duet::app {

namespace fs = std::filesystem;

namespace {
struct Split {
  std::string name;
  std::shared_ptr<datasets::ImageDataset> data;
  std::string source;
};

std::string table(const std::vector<Split>& splits) {
  const std::vector<std::string> names = splits.front().data->class_names();
  size_t width = 5;
  for (const auto& n : names) width = std::max(width, n.size());
  std::string s = fmt::format("  {:<{}}", "class", width);
  std::vector<std::vector<int64_t>> counts;
  for (const Split& sp : splits) {
    s += fmt::format(" {:>9}", sp.name);
    std::vector<int64_t> c(names.size(), 0);
    for (int64_t i = 0; i < sp.data->size(); ++i) c[static_cast<size_t>(sp.data->label(i))]++;
    counts.push_back(c);
  }
  s += "\n";
  for (size_t k = 0; k < names.size(); ++k) {
    s += fmt::format("  {:<{}}", names[k], width);
    for (const auto& c : counts) s += fmt::format(" {:>9}", k < c.size() ? c[k] : 0);
    s += "\n";
  }
  s += fmt::format("  {:<{}}", "total", width);
  for (const Split& sp : splits) s += fmt::format(" {:>9}", sp.data->size());
  return s + "\n";
}

// A folder of files and no class folders: not a dataset, but say which files decode.
std::string describe_loose_files(const std::string& path, std::vector<fs::path> files) {
  std::sort(files.begin(), files.end());
  std::string s = fmt::format("'{}' has no class subfolders, so it is not a dataset; its {} files:\n", path, files.size());
  for (const fs::path& f : files) {
    const std::string problem = datasets::check_image_file(f.string());
    s += fmt::format("  {:<32} {}\n", f.filename().string(), problem.empty() ? "ok" : problem);
  }
  return s;
}

std::shared_ptr<datasets::ImageFolder> folder(const fs::path& p) {
  datasets::ImageFolderOptions o;
  o.skip_bad = true;  // report broken files instead of stopping at the first
  return std::make_shared<datasets::ImageFolder>(p.string(), o);
}
}  // namespace

std::string describe_dataset(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  DUET_CHECK(fs::exists(p, ec), "dataset path '{}' does not exist", path);
  std::vector<Split> splits;
  std::string kind;
  if (fs::is_regular_file(p, ec)) {
    DUET_CHECK(p.extension() == ".bin", "'{}' is a file but not a CIFAR-10 .bin batch; expected a folder or a .bin file",
               path);
    kind = "cifar10 batch file";
    splits.push_back({"images", std::make_shared<datasets::Cifar10>(std::vector<std::string>{path}), p.filename().string()});
  } else if (fs::exists(p / "test_batch.bin", ec) || fs::exists(p / "data_batch_1.bin", ec)) {
    kind = "cifar10";
    for (const std::string split : {"train", "test"}) {
      const auto files = datasets::Cifar10::split_files(path, split);
      if (files.empty()) continue;
      std::string src;
      for (const auto& f : files) src += (src.empty() ? "" : ", ") + fs::path(f).filename().string();
      splits.push_back({split, std::make_shared<datasets::Cifar10>(files), src});
    }
  } else if (fs::is_directory(p / "train", ec) || fs::is_directory(p / "test", ec)) {
    kind = "image folder";
    for (const std::string split : {"train", "test", "val"})
      if (fs::is_directory(p / split, ec)) splits.push_back({split, folder(p / split), split + "/"});
  } else {
    bool has_class_dirs = false;
    std::vector<fs::path> loose;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      if (e.path().filename().string().starts_with(".")) continue;
      if (e.is_directory(ec)) has_class_dirs = true;
      else if (e.is_regular_file(ec)) loose.push_back(e.path());
    }
    if (!has_class_dirs && !loose.empty()) return describe_loose_files(path, loose);
    kind = "image folder (one split)";
    splits.push_back({"images", folder(p), "class folders"});
  }
  DUET_CHECK(!splits.empty(), "'{}' holds no dataset duet can read", path);
  std::string s = fmt::format("{} '{}'\n", kind, path);
  for (const Split& sp : splits) {
    s += fmt::format("  {}: {} images, {} classes ({})\n", sp.name, sp.data->size(), sp.data->num_classes(), sp.source);
    if (const auto* f = dynamic_cast<const datasets::ImageFolder*>(sp.data.get()))
      for (const std::string& bad : f->skipped_files()) s += fmt::format("    broken, left out: {}\n", bad);
  }
  for (size_t i = 1; i < splits.size(); ++i)
    if (splits[i].data->class_names() != splits[0].data->class_names())
      s += fmt::format("  warning: {} and {} have different class folders\n", splits[0].name, splits[i].name);
  return s + table(splits);
}

namespace {
struct DataCmd {
  std::string path;
  CLI::App* fetch = nullptr;
  std::string fetch_name, dest, archive;
  bool keep = false;
};
}  // namespace

Command add_data_command(CLI::App& app, GlobalOptions& g) {
  auto d = std::make_shared<DataCmd>();
  CLI::App* cmd = app.add_subcommand("data", "Describe a dataset folder (images per class and split), or fetch one");
  cmd->add_option("path", d->path, "A cifar10 folder, a .bin batch, or an image folder");
  d->fetch = cmd->add_subcommand("fetch", "Download a dataset (cifar10: 162 MB, MD5-checked) and unpack it");
  d->fetch->add_option("name", d->fetch_name, "Dataset: cifar10")->required();
  d->fetch->add_option("--dest", d->dest, "Folder to unpack into (default: data/<name>)");
  d->fetch->add_option("--archive", d->archive, "Use this already-downloaded archive instead of downloading")
      ->check(CLI::ExistingFile);
  d->fetch->add_flag("--keep-archive", d->keep, "Keep the downloaded archive");
  add_global_options(*cmd, g);
  cmd->footer("Examples:\n  duet data ../shared/data/cifar10\n  duet data ../shared/data/cats_dogs\n"
              "  duet data fetch cifar10 --dest data/cifar10");
  return {cmd, [d](std::ostream& out) {
            if (d->fetch->parsed()) {
              datasets::FetchOptions o;
              o.archive = d->archive;
              o.keep_archive = d->keep;
              const std::string dest = d->dest.empty() ? "data/" + d->fetch_name : d->dest;
              const std::string dir = datasets::fetch_dataset(d->fetch_name, dest, o);
              out << fmt::format("{} is ready in {}; train with --dataset {} --data {}\n", d->fetch_name, dir,
                                 d->fetch_name, dir);
              return 0;
            }
            DUET_CHECK(!d->path.empty(), "duet data needs a dataset PATH (or `duet data fetch cifar10`); see {}",
                       "duet data --help");
            out << describe_dataset(d->path);
            return 0;
          }};
}

}  // namespace duet::app
