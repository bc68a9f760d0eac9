#include "datasets/image_folder.h"
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include "datasets/image_file.h"
#include "engine/allocator.h"

namespace duet::datasets {

namespace fs = std::filesystem;

namespace {
bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}
bool hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }
}  // namespace

std::vector<std::string> list_image_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  DUET_CHECK(!ec, "image folder: cannot list '{}': {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    DUET_CHECK(!ec, "image folder: cannot list '{}': {}", dir, ec.message());
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && has_image_extension(it->path())) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ImageFolder::ImageFolder(const std::string& root, ImageFolderOptions opt) : root_(root), opt_(opt) {
  DUET_CHECK(opt.image_size >= 1 && opt.resize_short_side >= 0,
             "image folder: image_size must be >= 1 and resize_short_side >= 0 (got {} and {})", opt.image_size,
             opt.resize_short_side);
  std::error_code ec;
  DUET_CHECK(fs::exists(root, ec), "image folder '{}' does not exist", root);
  DUET_CHECK(fs::is_directory(root, ec), "image folder '{}' is not a folder", root);
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && !hidden(e.path())) classes_.push_back(e.path().filename().string());
  DUET_CHECK(!ec, "image folder '{}': cannot list it: {}", root, ec.message());
  std::sort(classes_.begin(), classes_.end());
  DUET_CHECK(!classes_.empty(),
             "image folder '{}' has no class subfolders; expected one subfolder per class (such as '{}/cat' and "
             "'{}/dog') holding .jpg, .jpeg or .png files",
             root, root, root);
  DUET_CHECK(classes_.size() >= 2, "image folder '{}' has only one class folder ('{}'); classification needs at least two",
             root, classes_[0]);

  std::vector<int64_t> per_class(classes_.size(), 0);
  for (size_t k = 0; k < classes_.size(); ++k) {
    const fs::path dir = fs::path(root) / classes_[k];
    const std::vector<std::string> files = list_image_files(dir.string());
    DUET_CHECK(!files.empty(), "image folder '{}': class folder '{}' holds no .jpg, .jpeg or .png files", root,
               dir.string());
    for (const std::string& f : files) {
      if (opt.verify || opt.skip_bad) {
        const std::string problem = check_image_file(f, opt.max_pixels);
        if (!problem.empty()) {
          DUET_CHECK(opt.skip_bad, "'{}': {} (image folder '{}'; skip_bad leaves such files out)", f, problem, root);
          if (skipped_.size() < 20) std::fprintf(stderr, "warning: skipping '%s': %s\n", f.c_str(), problem.c_str());
          skipped_.push_back(f + ": " + problem);
          continue;
        }
      }
      paths_.push_back(f);
      labels_.push_back(static_cast<int64_t>(k));
      ++per_class[k];
    }
  }
  if (!skipped_.empty()) {
    std::fprintf(stderr, "warning: image folder '%s': skipped %zu bad file(s); %zu images remain\n", root.c_str(),
                 skipped_.size(), paths_.size());
    for (size_t k = 0; k < classes_.size(); ++k)
      DUET_CHECK(per_class[k] > 0, "image folder '{}': every file of class '{}' is bad ({} skipped in all)", root,
                 classes_[k], skipped_.size());
  }
  if (opt.cache) {
    cache_.resize(paths_.size());
    ready_ = std::make_unique<std::atomic<bool>[]>(paths_.size());
  }
}

const std::string& ImageFolder::path(int64_t index) const {
  DUET_CHECK(index >= 0 && index < size(), "image folder '{}': index {} is out of range for {} images", root_, index,
             size());
  return paths_[static_cast<size_t>(index)];
}

int64_t ImageFolder::label(int64_t index) const {
  path(index);  // range check
  return labels_[static_cast<size_t>(index)];
}

Sample ImageFolder::load(int64_t index) const {
  const std::string& p = path(index);
  Sample s;
  s.label = labels_[static_cast<size_t>(index)];
  const auto i = static_cast<size_t>(index);
  if (opt_.cache && ready_[i].load(std::memory_order_acquire)) {
    const Tensor& t = cache_[i];
    s.image.h = t.size(0);
    s.image.w = t.size(1);
    s.image.c = t.size(2);
    const uint8_t* px = t.data<uint8_t>();
    s.image.pixels.assign(px, px + t.numel());
    return s;
  }
  Image img = decode_image_file(p, opt_.max_pixels);
  if (opt_.resize_short_side > 0) {
    int64_t h, w;
    shorter_side_size(img.h, img.w, opt_.resize_short_side, h, w);
    if (h != img.h || w != img.w) img = resize(img, h, w, true);
  }
  if (opt_.cache) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (!ready_[i].load(std::memory_order_relaxed)) {
      MemTagGuard tag(MemTag::data);
      cache_[i] = Tensor::empty({img.h, img.w, img.c}, TensorOptions(DType::u8));
      std::memcpy(cache_[i].data<uint8_t>(), img.pixels.data(), img.pixels.size());
      ready_[i].store(true, std::memory_order_release);
      cached_count_.fetch_add(1);
    }
  }
  s.image = std::move(img);
  return s;
}

}  // namespace duet::datasets
