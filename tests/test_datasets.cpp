// Datasets, transforms, the loader and the fetch helpers, on files the tests write into a temporary
// folder; the shared CIFAR-10 and cat/dog folders where DUET_DATA_DIR points at them.
#include <stb/stb_image_write.h>
#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <thread>
#include "datasets/cifar10.h"
#include "datasets/fetch.h"
#include "datasets/image_file.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"
#include "datasets/synthetic.h"
#include "datasets/transforms.h"
#include "tests/test_support.h"

namespace duet::datasets {
namespace {

namespace fs = std::filesystem;

// ---- helpers ----------------------------------------------------------------------------------
class TmpDir {
public:
  TmpDir() {
    std::string tmpl = (fs::temp_directory_path() / "duet_datasets_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& s) const { return path_ / s; }
  const fs::path& path() const { return path_; }

private:
  fs::path path_;
};


uint8_t cifar_pixel(int64_t record, int ch, int64_t y, int64_t x) {
  return static_cast<uint8_t>((record * 31 + ch * 85 + y * 7 + x * 3) % 256);
}

void write_cifar(const fs::path& path, const std::vector<int>& labels, int64_t first_record = 0, size_t extra_bytes = 0) {
  std::ofstream out(path, std::ios::binary);
  for (size_t r = 0; r < labels.size(); ++r) {
    out.put(static_cast<char>(labels[r]));
    for (int ch = 0; ch < 3; ++ch)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x) out.put(static_cast<char>(cifar_pixel(first_record + static_cast<int64_t>(r), ch, y, x)));
  }
  for (size_t i = 0; i < extra_bytes; ++i) out.put(0);
}

// An image whose pixel (y, x, c) is a simple function, so decoded values can be checked.
std::vector<uint8_t> pattern(int w, int h, int comp, int seed = 0) {
  std::vector<uint8_t> v(static_cast<size_t>(w * h * comp));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < comp; ++c) v[static_cast<size_t>((y * w + x) * comp + c)] = static_cast<uint8_t>((seed + 40 * c + 9 * y + 5 * x) % 256);
  return v;
}

void write_png(const fs::path& p, int w, int h, int comp, int seed = 0) {
  const std::vector<uint8_t> v = pattern(w, h, comp, seed);
  ASSERT_TRUE(stbi_write_png(p.c_str(), w, h, comp, v.data(), w * comp)) << p;
}
void write_jpg(const fs::path& p, int w, int h, int comp, int seed = 0) {
  const std::vector<uint8_t> v = pattern(w, h, comp, seed);
  ASSERT_TRUE(stbi_write_jpg(p.c_str(), w, h, comp, v.data(), 95)) << p;
}

Image image_from(int64_t h, int64_t w, int64_t c, const std::function<uint8_t(int64_t, int64_t, int64_t)>& f) {
  Image img(h, w, c);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t ch = 0; ch < c; ++ch) img.at(y, x)[ch] = f(y, x, ch);
  return img;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.dtype() == DType::i64) return a.to_vector<int64_t>() == b.to_vector<int64_t>();
  return a.contiguous().to_vector<float>() == b.contiguous().to_vector<float>();
}

// A dataset of 1x1 images whose pixel and label are the index; load() can be slowed down and can
// fail for one index.
class IndexDataset final : public ImageDataset {
public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1, int sleep_us = 0) : n_(n), fail_at_(fail_at), sleep_us_(sleep_us) {}
  int64_t size() const override { return n_; }
  Shape image_shape() const override { return {3, 1, 1}; }
  Sample load(int64_t index) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (index == fail_at_) throw Error(fmt::format("'broken_{}.jpg': truncated: no end-of-image marker", index));
    Sample s;
    s.image = Image(1, 1, 3, static_cast<uint8_t>(index % 256));
    s.label = index;
    return s;
  }
  int64_t label(int64_t index) const override { return index; }
  std::vector<std::string> class_names() const override { return std::vector<std::string>(static_cast<size_t>(n_), "c"); }
  Pipeline train_pipeline() const override { return eval_pipeline(); }
  Pipeline eval_pipeline() const override { return {{}, {{0, 0, 0}, {1, 1, 1}}}; }

private:
  int64_t n_, fail_at_;
  int sleep_us_;
};

std::vector<Batch> whole_epoch(DataLoader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<Batch> out;
  Batch b;
  while (loader.next(b)) out.push_back(b);
  return out;
}

// ---- CIFAR-10 ---------------------------------------------------------------------------------
TEST(Cifar10, ReadsPixelsLabelsAndRgbOrder) {
  TmpDir tmp;
  write_cifar(tmp / "a.bin", {3, 0, 9});
  write_cifar(tmp / "b.bin", {7, 1}, 3);
  Cifar10 ds(std::vector<std::string>{(tmp / "a.bin").string(), (tmp / "b.bin").string()});
  ASSERT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_EQ(ds.class_names()[3], "cat");  // no batches.meta.txt: the standard names
  const std::vector<int64_t> labels = {3, 0, 9, 7, 1};
  for (int64_t i = 0; i < 5; ++i) {
    const Sample s = ds.load(i);
    EXPECT_EQ(s.label, labels[static_cast<size_t>(i)]);
    ASSERT_EQ(s.image.h, 32);
    ASSERT_EQ(s.image.w, 32);
    ASSERT_EQ(s.image.c, 3);
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x)
        for (int ch = 0; ch < 3; ++ch) ASSERT_EQ(s.image.at(y, x)[ch], cifar_pixel(i, ch, y, x)) << i << " " << y << " " << x << " " << ch;
  }
  // batch(): the eval pipeline, normalised NCHW with channel 0 = red.
  const Batch b = ds.batch({4, 0});
  ASSERT_EQ(b.images.shape(), (Shape{2, 3, 32, 32}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 3}));
  const Normalization n = cifar10_normalization();
  const std::vector<float> v = b.images.to_vector<float>();
  for (int ch = 0; ch < 3; ++ch) {
    const float expect = (cifar_pixel(0, ch, 5, 7) / 255.0f - n.mean[ch]) / n.std[ch];
    EXPECT_NEAR(v[static_cast<size_t>(3 * 1024 + ch * 1024 + 5 * 32 + 7)], expect, 1e-5);
  }
}

TEST(Cifar10, ReadsMetaFileNames) {
  TmpDir tmp;
  write_cifar(tmp / "data_batch_1.bin", {0, 1});
  {
    std::ofstream m(tmp / "batches.meta.txt");
    for (int i = 0; i < 10; ++i) m << "class" << i << "\n";
    m << "\n";
  }
  Cifar10 ds(tmp.path().string(), "train");
  EXPECT_EQ(ds.class_names()[9], "class9");
  {
    std::ofstream m(tmp / "batches.meta.txt");
    m << "a\nb\nc\n";
  }
  EXPECT_ERROR_HAS(Cifar10(tmp.path().string(), "train"), "batches.meta.txt", "10 class names", "3");
}

TEST(Cifar10, TruncatedFileIsAnError) {
  TmpDir tmp;
  write_cifar(tmp / "cut.bin", {1, 2}, 0, 100);
  EXPECT_ERROR_HAS(Cifar10({(tmp / "cut.bin").string()}), "cut.bin", std::to_string(2 * 3073 + 100), "3073");
  std::ofstream(tmp / "empty.bin").close();
  EXPECT_ERROR_HAS(Cifar10({(tmp / "empty.bin").string()}), "empty.bin", "empty");
}

TEST(Cifar10, LabelOutOfRangeIsAnError) {
  TmpDir tmp;
  write_cifar(tmp / "bad_label.bin", {1, 10, 2});
  EXPECT_ERROR_HAS(Cifar10({(tmp / "bad_label.bin").string()}), "bad_label.bin", "record 1", "label byte 10");
}

TEST(Cifar10, MissingFileOrSplitIsAnError) {
  TmpDir tmp;
  EXPECT_ERROR_HAS(Cifar10({(tmp / "nope.bin").string()}), (tmp / "nope.bin").string(), "does not exist");
  EXPECT_ERROR_HAS(Cifar10(tmp.path().string(), "train"), "data_batch_1.bin", tmp.path().string());
  EXPECT_ERROR_HAS(Cifar10(tmp.path().string(), "test"), "test_batch.bin");
  EXPECT_ERROR_HAS(Cifar10(tmp.path().string(), "validation"), "unknown split 'validation'");
  EXPECT_ERROR_HAS(Cifar10((tmp / "missing").string(), "train"), "missing", "does not exist");
}

TEST(Cifar10, SharedData) {
  DUET_REQUIRE_DATA_DIR();
  const std::string dir = testing::data_dir() + "/cifar10";
  Cifar10 train(dir, "train");
  EXPECT_EQ(train.size(), 10000);
  EXPECT_EQ(train.class_names()[0], "airplane");
  EXPECT_EQ(train.class_names()[9], "truck");
  std::vector<int64_t> counts(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) ++counts[static_cast<size_t>(train.label(i))];
  for (int64_t c : counts) EXPECT_EQ(c, 1000);
  Cifar10 test(dir, "test");
  EXPECT_EQ(test.size(), 10000);
  // Official test order: the first ten labels are 3 8 8 0 6 6 1 6 3 1.
  Cifar10 first({dir + "/test_batch_first1000_lossless.bin"});
  ASSERT_EQ(first.size(), 1000);
  std::vector<int64_t> l;
  for (int64_t i = 0; i < 10; ++i) l.push_back(first.label(i));
  EXPECT_EQ(l, (std::vector<int64_t>{3, 8, 8, 0, 6, 6, 1, 6, 3, 1}));
  // Real photos are not constant planes and use the range.
  const Sample s = train.load(0);
  const auto [lo, hi] = std::minmax_element(s.image.pixels.begin(), s.image.pixels.end());
  EXPECT_LT(*lo, 60);
  EXPECT_GT(*hi, 190);
}

// ---- image files and folders ------------------------------------------------------------------
TEST(ImageFile, PngAndJpegOddSizesGreyAndRgbaBecomeRgb) {
  TmpDir tmp;
  write_png(tmp / "rgb.png", 7, 5, 3);
  write_png(tmp / "grey.png", 9, 3, 1);
  write_png(tmp / "rgba.png", 5, 11, 4);
  write_png(tmp / "grey_alpha.png", 3, 3, 2);
  write_jpg(tmp / "rgb.jpg", 13, 7, 3);
  write_jpg(tmp / "grey.jpg", 6, 17, 1);
  const Image rgb = decode_image_file((tmp / "rgb.png").string());
  ASSERT_EQ(rgb.h, 5);
  ASSERT_EQ(rgb.w, 7);
  ASSERT_EQ(rgb.c, 3);
  EXPECT_EQ(rgb.pixels, pattern(7, 5, 3));
  const Image grey = decode_image_file((tmp / "grey.png").string());
  ASSERT_EQ(grey.c, 3);
  const std::vector<uint8_t> g = pattern(9, 3, 1);
  for (int64_t i = 0; i < 27; ++i)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(grey.pixels[static_cast<size_t>(i * 3 + c)], g[static_cast<size_t>(i)]);
  const Image rgba = decode_image_file((tmp / "rgba.png").string());
  ASSERT_EQ(rgba.h, 11);
  ASSERT_EQ(rgba.c, 3);
  const std::vector<uint8_t> a = pattern(5, 11, 4);
  for (int64_t i = 0; i < 55; ++i)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(rgba.pixels[static_cast<size_t>(i * 3 + c)], a[static_cast<size_t>(i * 4 + c)]);
  EXPECT_EQ(decode_image_file((tmp / "grey_alpha.png").string()).c, 3);
  const Image j = decode_image_file((tmp / "rgb.jpg").string());
  EXPECT_EQ(j.h, 7);
  EXPECT_EQ(j.w, 13);
  EXPECT_EQ(j.c, 3);
  const Image jg = decode_image_file((tmp / "grey.jpg").string());
  EXPECT_EQ(jg.h, 17);
  EXPECT_EQ(jg.c, 3);
  EXPECT_EQ(jg.pixels[0], jg.pixels[1]);  // grey stays grey
}

TEST(ImageFile, TruncatedFilesAreErrors) {
  TmpDir tmp;
  write_jpg(tmp / "full.jpg", 64, 48, 3);
  write_png(tmp / "full.png", 64, 48, 3);
  for (const char* name : {"full.jpg", "full.png"}) {
    std::vector<uint8_t> bytes = read_file_bytes((tmp / name).string());
    ASSERT_EQ(check_image_bytes(bytes.data(), bytes.size()), "");
    for (size_t keep : {bytes.size() - 1, bytes.size() * 3 / 4, bytes.size() / 2, size_t{40}, size_t{5}}) {
      const std::string cut = fmt::format("cut_{}_{}", keep, name);
      std::ofstream(tmp / cut, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(keep));
      EXPECT_ERROR_HAS(decode_image_file((tmp / cut).string()), cut, "truncated");
      EXPECT_NE(check_image_file((tmp / cut).string()), "");
    }
  }
  // Trailing bytes after the end of the image are tolerated, as other decoders do.
  std::vector<uint8_t> bytes = read_file_bytes((tmp / "full.jpg").string());
  bytes.insert(bytes.end(), {0, 0, 0, 0});
  EXPECT_EQ(check_image_bytes(bytes.data(), bytes.size()), "");
}

// A folder with two classes; `extra` files (path, source) are copied into class a.
void two_class_folder(const fs::path& root, const std::vector<fs::path>& extra = {}) {
  fs::create_directories(root / "a");
  fs::create_directories(root / "b");
  write_png(root / "a" / "good_a.png", 8, 6, 3);
  write_png(root / "b" / "good_b.png", 5, 9, 1);
  for (const fs::path& src : extra) fs::copy_file(src, root / "a" / src.filename());
}

TEST(ImageFolder, ListsSortedClassesAndFiles) {
  TmpDir tmp;
  const fs::path root = tmp / "root";
  fs::create_directories(root / "zebra");
  fs::create_directories(root / "ant" / "nested");
  fs::create_directories(root / ".hidden");
  write_png(root / "zebra" / "2.png", 4, 4, 3);
  write_jpg(root / "zebra" / "1.JPG", 4, 4, 3);
  write_png(root / "ant" / "b.png", 3, 5, 4);
  write_png(root / "ant" / "nested" / "c.png", 3, 5, 1);
  write_png(root / "ant" / "a.jpeg.png", 3, 5, 3);
  std::ofstream(root / "ant" / "notes.txt") << "not an image";
  std::ofstream(root / "README") << "ignored";
  ImageFolder ds(root.string());
  EXPECT_EQ(ds.class_names(), (std::vector<std::string>{"ant", "zebra"}));
  ASSERT_EQ(ds.size(), 5);
  EXPECT_EQ(fs::path(ds.path(0)).filename(), "a.jpeg.png");
  EXPECT_EQ(fs::path(ds.path(1)).filename(), "b.png");
  EXPECT_EQ(fs::path(ds.path(2)).filename(), "c.png");
  EXPECT_EQ(fs::path(ds.path(3)).filename(), "1.JPG");
  EXPECT_EQ(ds.label(2), 0);
  EXPECT_EQ(ds.label(3), 1);
  EXPECT_EQ(ds.skipped(), 0);
  const Sample s = ds.load(1);
  EXPECT_EQ(s.image.c, 3);
  EXPECT_EQ(s.image.h, 5);
  // batch(): the eval pipeline brings every size to image_size.
  ImageFolderOptions o;
  o.image_size = 8;
  ImageFolder small(root.string(), o);
  const Batch b = small.batch({0, 1, 2, 3, 4});
  EXPECT_EQ(b.images.shape(), (Shape{5, 3, 8, 8}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1, 1}));
}

TEST(ImageFolder, FolderErrors) {
  TmpDir tmp;
  EXPECT_ERROR_HAS(ImageFolder((tmp / "missing").string()), "missing", "does not exist");
  fs::create_directories(tmp / "empty");
  EXPECT_ERROR_HAS(ImageFolder((tmp / "empty").string()), "empty", "no class subfolders");
  fs::create_directories(tmp / "one" / "cat");
  write_png(tmp / "one" / "cat" / "x.png", 4, 4, 3);
  EXPECT_ERROR_HAS(ImageFolder((tmp / "one").string()), "only one class", "cat");
  fs::create_directories(tmp / "one" / "dog");
  EXPECT_ERROR_HAS(ImageFolder((tmp / "one").string()), "dog", "no .jpg");
  std::ofstream(tmp / "file") << "x";
  EXPECT_ERROR_HAS(ImageFolder((tmp / "file").string()), "not a folder");
}

TEST(ImageFolder, BadSharedFilesAreErrorsOrSkippedWithCount) {
  DUET_REQUIRE_DATA_DIR();
  const fs::path bad = fs::path(testing::data_dir()) / "cats_dogs" / "bad";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated_cat.0.jpg", "truncated"}, {"x.jpg", "empty file"}, {"y.jpg", "not a JPEG or PNG"}};
  for (const auto& [name, problem] : cases) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_HAS(decode_image_file((bad / name).string()), name, problem);
    TmpDir tmp;
    two_class_folder(tmp / "root", {bad / name});
    EXPECT_ERROR_HAS(ImageFolder((tmp / "root").string()), name, problem, "skip_bad");
    ImageFolderOptions o;
    o.skip_bad = true;
    ImageFolder ds((tmp / "root").string(), o);
    EXPECT_EQ(ds.size(), 2);
    ASSERT_EQ(ds.skipped(), 1);
    EXPECT_NE(ds.skipped_files()[0].find(name), std::string::npos);
    // Unverified, the bad file surfaces when it is decoded, still naming it.
    ImageFolderOptions lazy;
    lazy.verify = false;
    ImageFolder unchecked((tmp / "root").string(), lazy);
    ASSERT_EQ(unchecked.size(), 3);
    int64_t bad_index = -1;
    for (int64_t i = 0; i < 3; ++i)
      if (fs::path(unchecked.path(i)).filename() == name) bad_index = i;
    EXPECT_ERROR_HAS(unchecked.load(bad_index), name, problem);
  }
  TmpDir tmp;
  two_class_folder(tmp / "root", {bad / "truncated_cat.0.jpg", bad / "x.jpg", bad / "y.jpg"});
  ImageFolderOptions o;
  o.skip_bad = true;
  ImageFolder ds((tmp / "root").string(), o);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.skipped(), 3);
  // A class left with no images at all is an error even with skip_bad.
  TmpDir tmp2;
  fs::create_directories(tmp2 / "r" / "a");
  fs::create_directories(tmp2 / "r" / "b");
  write_png(tmp2 / "r" / "a" / "ok.png", 4, 4, 3);
  fs::copy_file(bad / "x.jpg", tmp2 / "r" / "b" / "x.jpg");
  EXPECT_ERROR_HAS(ImageFolder((tmp2 / "r").string(), o), "every file of class 'b'");
}

TEST(ImageFolder, SharedCatsDogs) {
  DUET_REQUIRE_DATA_DIR();
  const std::string root = testing::data_dir() + "/cats_dogs/train";
  ImageFolderOptions o;
  o.image_size = 64;
  ImageFolder ds(root, o);  // verifies all 1000 files
  EXPECT_EQ(ds.size(), 1000);
  EXPECT_EQ(ds.class_names(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(ds.skipped(), 0);
  EXPECT_EQ(ds.label(0), 0);
  EXPECT_EQ(ds.label(999), 1);
  const Batch b = ds.batch({0, 500, 999});
  EXPECT_EQ(b.images.shape(), (Shape{3, 3, 64, 64}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1}));
}

TEST(ImageFolder, CacheKeepsResizedImages) {
  TmpDir tmp;
  fs::create_directories(tmp / "r" / "a");
  fs::create_directories(tmp / "r" / "b");
  write_jpg(tmp / "r" / "a" / "1.jpg", 40, 30, 3);
  write_png(tmp / "r" / "b" / "2.png", 20, 50, 3);
  ImageFolderOptions o;
  o.resize_short_side = 10;
  o.cache = true;
  ImageFolder ds((tmp / "r").string(), o);
  EXPECT_EQ(ds.cached(), 0);
  const int64_t data_before = cpu_allocator().stats().by_tag[static_cast<int>(MemTag::data)];
  const Sample a = ds.load(0);
  EXPECT_EQ(a.image.h, 10);
  EXPECT_EQ(a.image.w, 13);  // int(10 * 40 / 30)
  const Sample b = ds.load(1);
  EXPECT_EQ(b.image.w, 10);
  EXPECT_EQ(b.image.h, 25);
  EXPECT_EQ(ds.cached(), 2);
  // The cache is counted as data memory.
  EXPECT_GE(cpu_allocator().stats().by_tag[static_cast<int>(MemTag::data)] - data_before, (10 * 13 + 25 * 10) * 3);
  fs::remove_all(tmp / "r");  // later loads come from memory
  EXPECT_EQ(ds.load(0).image.pixels, a.image.pixels);
  EXPECT_EQ(ds.load(1).image.pixels, b.image.pixels);
}

// ---- transforms -------------------------------------------------------------------------------
TEST(Transforms, FlipIsExact) {
  const Image img = image_from(3, 5, 2, [](int64_t y, int64_t x, int64_t c) { return static_cast<uint8_t>(y * 50 + x * 7 + c); });
  const Image f = flip_horizontal(img);
  for (int64_t y = 0; y < 3; ++y)
    for (int64_t x = 0; x < 5; ++x)
      for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(f.at(y, x)[c], img.at(y, 4 - x)[c]);
  EXPECT_EQ(flip_horizontal(f).pixels, img.pixels);
}

TEST(Transforms, CropWithPaddingIsExact) {
  const Image img = image_from(4, 6, 3, [](int64_t y, int64_t x, int64_t c) { return static_cast<uint8_t>(1 + y * 40 + x * 5 + c); });
  const Image c = crop(img, -2, 3, 5, 4);  // 2 rows of padding on top, 1 column on the right
  for (int64_t y = 0; y < 5; ++y)
    for (int64_t x = 0; x < 4; ++x)
      for (int64_t ch = 0; ch < 3; ++ch) {
        const int64_t sy = y - 2, sx = x + 3;
        const uint8_t expect = (sy >= 0 && sy < 4 && sx < 6) ? img.at(sy, sx)[ch] : 0;
        EXPECT_EQ(c.at(y, x)[ch], expect) << y << " " << x;
      }
  // random_crop(size, padding) == zero padding, then a crop at offsets drawn from the sample's
  // stream: replaying the stream gives the offsets.
  for (int64_t index = 0; index < 20; ++index) {
    SampleRng rng(11, 2, index), replay(11, 2, index);
    const Image out = random_crop(4, 2)->apply(img, rng);
    const int64_t top = replay.integer(0, 4 + 4 - 4), left = replay.integer(0, 6 + 4 - 4);
    EXPECT_EQ(out.pixels, crop(img, top - 2, left - 2, 4, 4).pixels);
  }
  SampleRng rng(1, 0, 0);
  EXPECT_ERROR_HAS(random_crop(9, 1)->apply(img, rng), "does not fit");
}

TEST(Transforms, NormalizeValues) {
  const Image img = image_from(2, 3, 3, [](int64_t y, int64_t x, int64_t c) { return static_cast<uint8_t>(y * 100 + x * 20 + c * 3); });
  const Normalization n = cifar10_normalization();
  std::vector<float> chw(18), hwc(18);
  write_normalized(img, n, false, chw.data());
  write_normalized(img, n, true, hwc.data());
  for (int64_t y = 0; y < 2; ++y)
    for (int64_t x = 0; x < 3; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const float expect = (static_cast<float>(img.at(y, x)[c]) / 255.0f - n.mean[c]) / n.std[c];
        EXPECT_NEAR(chw[static_cast<size_t>(c * 6 + y * 3 + x)], expect, 1e-6);
        EXPECT_NEAR(hwc[static_cast<size_t>((y * 3 + x) * 3 + c)], expect, 1e-6);
      }
  EXPECT_NEAR(chw[0], (0.0f - 0.4914f) / 0.2470f, 1e-6);
  Image grey(2, 2, 1);
  EXPECT_ERROR_HAS(write_normalized(grey, n, false, chw.data()), "1 channels", "3/3");
}

TEST(Transforms, ResizeOfConstantImageStaysConstant) {
  const Image img(37, 23, 3, 117);
  for (bool aa : {true, false})
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{5, 9}, {64, 64}, {37, 11}, {100, 23}, {1, 1}}) {
      const Image r = resize(img, h, w, aa);
      ASSERT_EQ(r.h, h);
      ASSERT_EQ(r.w, w);
      for (uint8_t v : r.pixels) ASSERT_EQ(v, 117) << h << "x" << w << " aa " << aa;
    }
}

TEST(Transforms, ResizeValues) {
  // Halving without antialias averages pairs (bilinear, half-pixel centres).
  const Image img = image_from(2, 8, 1, [](int64_t, int64_t x, int64_t) { return static_cast<uint8_t>(x * 10); });
  const Image r = resize(img, 2, 4, false);
  EXPECT_EQ(r.pixels, (std::vector<uint8_t>{5, 25, 45, 65, 5, 25, 45, 65}));
  // Quartering a pattern with every fourth column lit: bilinear reads 2 of every 4 columns and
  // aliases; antialias averages over the filter (interior pixel: weights 7/8 and 1/8 on lit columns).
  const Image lines = image_from(1, 16, 1, [](int64_t, int64_t x, int64_t) { return static_cast<uint8_t>(x % 4 == 1 ? 255 : 0); });
  EXPECT_EQ(resize(lines, 1, 4, false).pixels[1], 128);
  EXPECT_EQ(resize(lines, 1, 4, true).pixels[1], 64);
  const Image ramp = image_from(1, 16, 1, [](int64_t, int64_t x, int64_t) { return static_cast<uint8_t>(x * 10); });
  EXPECT_EQ(resize(ramp, 1, 4, false).pixels[1], 55);
  EXPECT_EQ(resize(ramp, 1, 4, true).pixels[1], 55);
  // Doubling: the image corners are kept, the middle interpolated.
  const Image up = resize(image_from(1, 2, 1, [](int64_t, int64_t x, int64_t) { return static_cast<uint8_t>(x * 100); }), 1, 4, true);
  EXPECT_EQ(up.pixels, (std::vector<uint8_t>{0, 25, 75, 100}));
  int64_t h, w;
  shorter_side_size(375, 500, 64, h, w);
  EXPECT_EQ(h, 64);
  EXPECT_EQ(w, 85);
  shorter_side_size(500, 333, 64, h, w);
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 96);
}

TEST(Transforms, CenterCropMatchesTorchvision) {
  const Image img = image_from(7, 10, 1, [](int64_t y, int64_t x, int64_t) { return static_cast<uint8_t>(y * 16 + x); });
  SampleRng rng(0, 0, 0);
  const Image c = center_crop(4)->apply(img, rng);
  // top = round(1.5) = 2 (halves to even), left = round(3.0) = 3
  EXPECT_EQ(c.at(0, 0)[0], img.at(2, 3)[0]);
  const Image p = center_crop(12)->apply(img, rng);  // padded: 2 above and 1 left
  EXPECT_EQ(p.at(2, 1)[0], img.at(0, 0)[0]);
  EXPECT_EQ(p.at(0, 0)[0], 0);
}

TEST(Transforms, RandomResizedCropBox) {
  for (int64_t index = 0; index < 200; ++index) {
    SampleRng rng(5, 0, index);
    const CropBox b = random_resized_crop_box(50, 80, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_GE(b.h, 1);
    ASSERT_GE(b.w, 1);
    ASSERT_LE(b.top + b.h, 50);
    ASSERT_LE(b.left + b.w, 80);
  }
  // No crop can have ratio 2 and the full area of a square: the fallback is a centred crop with
  // the ratio clamped, as torchvision's.
  SampleRng rng(5, 0, 0);
  const CropBox f = random_resized_crop_box(40, 40, 1.0, 1.0, 2.0, 2.0, rng);
  EXPECT_EQ(f.w, 40);
  EXPECT_EQ(f.h, 20);
  EXPECT_EQ(f.top, 10);
  EXPECT_EQ(f.left, 0);
  SampleRng rng2(5, 0, 1);
  const Image out = random_resized_crop(16)->apply(Image(30, 50, 3, 9), rng2);
  EXPECT_EQ(out.h, 16);
  EXPECT_EQ(out.w, 16);
}

TEST(Transforms, DeterministicUnderSeed) {
  const Image img = image_from(40, 30, 3, [](int64_t y, int64_t x, int64_t c) { return static_cast<uint8_t>((y * 13 + x * 7 + c * 50) % 256); });
  const Pipeline p = imagenet_train_pipeline(16);
  std::set<std::string> distinct;  // (a set of vectors trips a GCC 12 -Wstringop-overread false positive)
  for (int64_t index = 0; index < 8; ++index) {
    SampleRng a(42, 3, index), b(42, 3, index);
    const Image x = p.run(img, a), y = p.run(img, b);
    EXPECT_EQ(x.pixels, y.pixels);
    distinct.insert(std::string(x.pixels.begin(), x.pixels.end()));
  }
  EXPECT_GT(distinct.size(), 4u);  // different samples get different crops
  SampleRng a(42, 3, 0), b(42, 4, 0), c(43, 3, 0);
  const double ua = a.uniform();
  EXPECT_NE(ua, b.uniform());
  EXPECT_NE(ua, c.uniform());
}

// ---- loader -----------------------------------------------------------------------------------
TEST(Loader, SameSeedSameBatchesWhateverTheWorkers) {
  TmpDir tmp;
  std::vector<int> labels(45);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int>(i % 10);
  write_cifar(tmp / "data_batch_1.bin", labels);
  Cifar10 ds(tmp.path().string(), "train");
  std::vector<std::vector<Batch>> runs;
  for (int workers : {0, 1, 2}) {
    LoaderOptions o;
    o.batch_size = 8;
    o.seed = 7;
    o.num_workers = workers;
    o.prefetch_batches = 2;
    DataLoader loader(ds, o, ds.train_pipeline());
    EXPECT_EQ(loader.batches_per_epoch(), 6);
    runs.push_back(whole_epoch(loader, 1));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t k = 0; k < runs[0].size(); ++k) {
      EXPECT_TRUE(same_tensor(runs[r][k].images, runs[0][k].images)) << "run " << r << " batch " << k;
      EXPECT_TRUE(same_tensor(runs[r][k].labels, runs[0][k].labels));
    }
  }
  EXPECT_EQ(runs[0].back().images.size(0), 45 - 5 * 8);
  // Another epoch or seed shuffles differently; augmentation is on (random crop/flip).
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 7;
  DataLoader loader(ds, o, ds.train_pipeline());
  const std::vector<Batch> e2 = whole_epoch(loader, 2);
  EXPECT_FALSE(same_tensor(e2[0].labels, runs[0][0].labels));
  LoaderOptions plain = o;
  plain.shuffle = false;
  DataLoader eval(ds, plain);
  const std::vector<Batch> ev = whole_epoch(eval, 0);
  EXPECT_TRUE(same_tensor(ev[0].images, ds.batch({0, 1, 2, 3, 4, 5, 6, 7}).images));
}

TEST(Loader, EverySampleOncePerEpochAndSharding) {
  IndexDataset ds(103);
  for (bool drop_last : {false, true}) {
    LoaderOptions o;
    o.batch_size = 10;
    o.seed = 3;
    o.drop_last = drop_last;
    o.num_workers = 2;
    DataLoader loader(ds, o);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> seen;
      for (const Batch& b : whole_epoch(loader, epoch)) {
        const std::vector<int64_t> l = b.labels.to_vector<int64_t>();
        const std::vector<float> px = b.images.to_vector<float>();
        for (size_t i = 0; i < l.size(); ++i) EXPECT_FLOAT_EQ(px[i * 3], static_cast<float>(l[i] % 256) / 255.0f);
        seen.insert(seen.end(), l.begin(), l.end());
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), drop_last ? 100 : 103);
      std::set<int64_t> unique(seen.begin(), seen.end());
      EXPECT_EQ(unique.size(), seen.size());
      EXPECT_FALSE(std::is_sorted(seen.begin(), seen.end()));
    }
    // Three ranks share one permutation and split its batches without overlap.
    std::set<int64_t> all;
    std::vector<int64_t> counts;
    for (int rank = 0; rank < 3; ++rank) {
      LoaderOptions r = o;
      r.rank = rank;
      r.world_size = 3;
      DataLoader shard(ds, r);
      counts.push_back(shard.batches_per_epoch());
      int64_t samples = 0;
      const auto batches = shard.epoch_batches(0);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), shard.batches_per_epoch());
      for (const auto& b : batches) {
        samples += static_cast<int64_t>(b.size());
        for (int64_t i : b) EXPECT_TRUE(all.insert(i).second) << "index " << i << " in two ranks";
      }
      EXPECT_EQ(samples, shard.samples_per_epoch());
    }
    if (drop_last) {
      EXPECT_EQ(counts, (std::vector<int64_t>{3, 3, 3}));  // 10 full batches: 9 used, equal per rank
    } else {
      EXPECT_EQ(all.size(), 103u);
      EXPECT_EQ(counts, (std::vector<int64_t>{4, 4, 3}));
    }
  }
}

TEST(Loader, WorkerErrorsReachTheConsumer) {
  for (int workers : {0, 1, 2}) {
    SCOPED_TRACE(workers);
    IndexDataset ds(40, /*fail_at=*/17);
    LoaderOptions o;
    o.batch_size = 4;
    o.shuffle = false;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    loader.start_epoch(0);
    Batch b;
    int64_t got = 0;
    try {
      while (loader.next(b)) ++got;
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("broken_17.jpg"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("batch 4"), std::string::npos) << e.what();
    }
    EXPECT_EQ(got, 4);  // the batches before the bad one arrive, in order
    EXPECT_FALSE(loader.next(b));
    loader.start_epoch(1);  // the loader is usable again
    EXPECT_TRUE(loader.next(b));
  }
}

TEST(Loader, DestructionMidEpochDoesNotHang) {
  IndexDataset ds(2000, -1, /*sleep_us=*/200);
  const auto t0 = std::chrono::steady_clock::now();
  for (int consumed : {0, 1, 3}) {
    LoaderOptions o;
    o.batch_size = 16;
    o.num_workers = 2;
    DataLoader loader(ds, o);
    loader.start_epoch(0);
    Batch b;
    for (int i = 0; i < consumed; ++i) ASSERT_TRUE(loader.next(b));
  }
  {
    LoaderOptions o;
    o.batch_size = 16;
    DataLoader loader(ds, o);
    loader.start_epoch(0);
    loader.start_epoch(1);  // abandons epoch 0
    Batch b;
    EXPECT_TRUE(loader.next(b));
  }
  { DataLoader never_started(ds, LoaderOptions{}); }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);  // a whole epoch would take 2000 * 0.2 ms / 2 workers per loader
}

TEST(Loader, ChannelsLastAndMemoryTag) {
  TmpDir tmp;
  write_cifar(tmp / "data_batch_1.bin", {1, 2, 3, 4, 5});
  Cifar10 ds(tmp.path().string(), "train");
  LoaderOptions o;
  o.batch_size = 5;
  o.shuffle = false;
  DataLoader nchw(ds, o);
  o.memory_format = MemoryFormat::channels_last;
  DataLoader nhwc(ds, o);
  const Batch a = whole_epoch(nchw, 0)[0];
  const Batch b = whole_epoch(nhwc, 0)[0];
  EXPECT_TRUE(a.images.is_contiguous());
  EXPECT_TRUE(b.images.is_contiguous(MemoryFormat::channels_last));
  EXPECT_EQ(b.images.shape(), (Shape{5, 3, 32, 32}));
  EXPECT_TRUE(same_tensor(a.images, b.images));
  EXPECT_EQ(a.images.storage()->tag, MemTag::data);
  EXPECT_EQ(a.labels.storage()->tag, MemTag::data);
  // A dataset that batches itself (synthetic) goes through the loader as well.
  SyntheticDataset syn(20, 4, 3, 8, 8, 1);
  DataLoader sl(syn, o);
  const std::vector<Batch> sb = whole_epoch(sl, 0);
  ASSERT_EQ(sb.size(), 4u);
  EXPECT_TRUE(sb[0].images.is_contiguous(MemoryFormat::channels_last));
  EXPECT_TRUE(same_tensor(sb[1].images, syn.batch({5, 6, 7, 8, 9}).images));
  EXPECT_ERROR_HAS(DataLoader(syn, o, cifar10_train_pipeline()), "ImageDataset");
}

TEST(Loader, WaitIsAProfilerEventInDataPhase) {
  IndexDataset ds(8);
  LoaderOptions o;
  o.batch_size = 4;
  DataLoader loader(ds, o);
  profiler::clear();
  profiler::enable(true);
  whole_epoch(loader, 0);
  profiler::enable(false);
  int waits = 0;
  for (const OpEvent& e : profiler::collect())
    if (std::string(e.name) == "data.wait") {
      ++waits;
      EXPECT_EQ(e.phase, Phase::data);
    }
  profiler::clear();
  EXPECT_EQ(waits, 2);
}

// ---- fetch ------------------------------------------------------------------------------------
TEST(Fetch, Md5) {
  EXPECT_EQ(md5_hex("", 0), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc", 3), "900150983cd24fb0d6963f7d28e17f72");
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(md5_hex(fox.data(), fox.size()), "9e107d9d372bb6826bd81d3542a419d6");
  const std::string digits = "12345678901234567890123456789012345678901234567890123456789012345678901234567890";
  EXPECT_EQ(md5_hex(digits.data(), digits.size()), "57edf4a22be3c955ac49da2e2107b67a");
  TmpDir tmp;
  std::string big(3'000'001, 'x');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>(i % 251);
  std::ofstream(tmp / "big", std::ios::binary) << big;
  EXPECT_EQ(md5_file((tmp / "big").string()), md5_hex(big.data(), big.size()));
  EXPECT_NO_THROW(verify_md5((tmp / "big").string(), md5_hex(big.data(), big.size())));
  EXPECT_ERROR_HAS(verify_md5((tmp / "big").string(), "0123456789abcdef0123456789abcdef"), "big",
                   "0123456789abcdef0123456789abcdef", md5_hex(big.data(), big.size()));
  EXPECT_ERROR_HAS(md5_file((tmp / "none").string()), "none");
}

TEST(Fetch, Cifar10FromLocalArchive) {
  TmpDir tmp;
  const fs::path src = tmp / "cifar-10-batches-bin";
  fs::create_directories(src);
  for (const char* f : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin",
                        "test_batch.bin"})
    write_cifar(src / f, {1, 2});
  {
    std::ofstream m(src / "batches.meta.txt");
    for (int i = 0; i < 10; ++i) m << "n" << i << "\n";
  }
  const std::string archive = (tmp / "cifar.tar.gz").string();
  if (run_command({"tar", "-czf", archive, "-C", tmp.path().string(), "cifar-10-batches-bin"}) != 0)
    GTEST_SKIP() << "tar is not available";
  FetchOptions opt;
  opt.archive = archive;
  opt.url = "file:///nonexistent";  // must never be used when an archive is given
  opt.md5 = "00000000000000000000000000000000";
  EXPECT_ERROR_HAS(fetch_dataset("cifar10", (tmp / "out").string(), opt), "cifar.tar.gz", "checksum mismatch",
                   md5_file(archive));
  EXPECT_FALSE(fs::exists(tmp / "out" / "test_batch.bin"));
  EXPECT_TRUE(fs::exists(archive));  // a user's own archive is never deleted
  opt.md5 = md5_file(archive);
  std::transform(opt.md5.begin(), opt.md5.end(), opt.md5.begin(), [](unsigned char c) { return std::toupper(c); });
  const std::string dir = fetch_dataset("cifar10", (tmp / "out").string(), opt);
  Cifar10 train(dir, "train");
  EXPECT_EQ(train.size(), 10);
  EXPECT_EQ(train.class_names()[4], "n4");
  // Already there: nothing to do, the archive isn't even looked at.
  opt.archive = (tmp / "gone.tar.gz").string();
  EXPECT_EQ(fetch_cifar10(dir, opt), dir);
  EXPECT_ERROR_HAS(fetch_dataset("mnist", dir, opt), "unknown dataset 'mnist'", "cifar10");
  EXPECT_EQ(run_command({"duet-no-such-program-xyz"}), 127);
  EXPECT_EQ(std::string(kCifar10Md5), "c32a1d4ab5d03f1284b67883e8d87530");
}

}  // namespace
}  // namespace duet::datasets
