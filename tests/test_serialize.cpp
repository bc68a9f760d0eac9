// engine/serialize: safetensors round trips, loading into modules by name, and every bad input
// (missing, unexpected, mis-shaped, wrong dtype, truncated, corrupt header, offsets out of range)
// giving a duet::Error that names the tensor while leaving the model untouched.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>
#include "engine/nn/layers.h"
#include "engine/serialize.h"
#include "models/registry.h"
#include "tests/test_support.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

class Serialize : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("duet_test_serialize_{}_{}", ::getpid(),
                                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with exactly this header text and data (for hand-made corrupt inputs).
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        int64_t claimed_header_len = -1) const {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = claimed_header_len >= 0 ? static_cast<uint64_t>(claimed_header_len) : header.size();
    char len[8];
    std::memcpy(len, &n, 8);
    f.write(len, 8);
    f << header << data;
    return p;
  }

  fs::path dir_;
};

// Expects f() to throw a duet::Error whose message contains every fragment.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected a duet::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "'" << frag << "' not in: " << msg;
  }
}

// Values of every parameter and buffer, to prove a failed load changed nothing.
std::vector<std::vector<double>> snapshot(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& [n, t] : state_dict(m)) out.push_back(t.to_vector<double>());
  return out;
}

std::shared_ptr<nn::Module> tiny_resnet(int64_t classes = 10) {
  return models::create_model("resnet18_cifar", {.num_classes = classes, .width_mult = 0.125});
}

NamedTensors without(NamedTensors ts, const std::string& name) {
  std::erase_if(ts, [&](const auto& p) { return p.first == name; });
  return ts;
}

NamedTensors replaced(NamedTensors ts, const std::string& name, const Tensor& t) {
  for (auto& [n, v] : ts)
    if (n == name) v = t;
  return ts;
}

// A copy of the model's state with fresh storage (what a file would give).
NamedTensors cloned_state(const nn::Module& m) {
  NamedTensors out;
  for (const auto& [n, t] : state_dict(m)) out.emplace_back(n, t.detach().clone());
  return out;
}

// ---- files -----------------------------------------------------------------------------------------
TEST_F(Serialize, RoundTripKeepsDtypesShapesValuesOrderAndMetadata) {
  const Tensor f32 = testing::random_tensor({2, 3}, 1, DType::f32);
  const Tensor f64 = testing::random_tensor({4}, 2, DType::f64);
  const Tensor i64 = Tensor::from_vector<int64_t>({-5}, {});
  const Tensor i32 = Tensor::zeros({0, 3}, DType::i32);
  const Tensor u8 = Tensor::from_vector<uint8_t>({0, 1, 255}, {3});
  const Tensor f16 = testing::random_tensor({5}, 3, DType::f32).to(DType::f16);
  const Tensor bf16 = testing::random_tensor({2, 2}, 4, DType::f32).to(DType::bf16);
  const Tensor transposed = testing::random_tensor({3, 4}, 5, DType::f32).transpose(0, 1);  // not contiguous
  const NamedTensors in{{"z.f32", f32}, {"a.f64", f64}, {"i64", i64}, {"empty", i32}, {"u8", u8},
                        {"half", f16},  {"bf16", bf16}, {"t", transposed}};
  save_safetensors(path("x.safetensors"), in, {{"format", "pt"}, {"note", "round trip"}});
  const SafetensorsFile out = read_safetensors(path("x.safetensors"));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    const Tensor& a = out.tensors[i].second;
    const Tensor& b = in[i].second;
    EXPECT_EQ(a.dtype(), b.dtype()) << in[i].first;
    EXPECT_EQ(a.shape(), b.shape()) << in[i].first;
    EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << in[i].first;
  }
  EXPECT_EQ(out.metadata.at("format"), "pt");
  EXPECT_EQ(out.metadata.at("note"), "round trip");
  // The header is 8-byte aligned and the file holds exactly header + data.
  std::ifstream f(path("x.safetensors"), std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(Serialize, SaveIsAtomicAndLeavesNoTemporaryFiles) {
  save_safetensors(path("w.safetensors"), {{"a", Tensor::ones({3})}});
  save_safetensors(path("w.safetensors"), {{"b", Tensor::zeros({2})}});  // replaces
  const NamedTensors t = load_safetensors(path("w.safetensors"));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].first, "b");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "w.safetensors");
  }
  EXPECT_EQ(files, 1);
  // A failed save (duplicate name) writes nothing and keeps the old file.
  expect_error([&] { save_safetensors(path("w.safetensors"), {{"a", Tensor::ones({1})}, {"a", Tensor::ones({1})}}); },
               {"'a'", "twice"});
  EXPECT_EQ(load_safetensors(path("w.safetensors"))[0].first, "b");
  expect_error([&] { save_safetensors(path("no/such/dir/x.safetensors"), {{"a", Tensor::ones({1})}}); },
               {"no/such/dir"});
}

TEST_F(Serialize, TruncatedFilesAreNamed) {
  save_safetensors(path("t.safetensors"), {{"first", Tensor::ones({4})}, {"second", Tensor::ones({64})}});
  const auto size = fs::file_size(path("t.safetensors"));
  fs::resize_file(path("t.safetensors"), size - 10);
  expect_error([&] { read_safetensors(path("t.safetensors")); }, {"'second'", "truncated"});
  fs::resize_file(path("t.safetensors"), 5);
  expect_error([&] { read_safetensors(path("t.safetensors")); }, {"truncated", "5 bytes"});
  expect_error([&] { read_safetensors(path("missing.safetensors")); }, {"missing.safetensors"});
}

TEST_F(Serialize, CorruptHeadersAreNamed) {
  expect_error([&] { read_safetensors(write_raw("a", "{not json", "")); }, {"corrupt header", "JSON"});
  expect_error([&] { read_safetensors(write_raw("b", "[1, 2]", "")); }, {"corrupt header", "object"});
  expect_error([&] { read_safetensors(write_raw("c", "{}", "", 1000)); }, {"truncated", "1000"});
  expect_error([&] { read_safetensors(write_raw("d", "{}", "", int64_t{1} << 40)); }, {"corrupt header", "limit"});
  expect_error([&] { read_safetensors(write_raw("e", R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", "12345678")); },
               {"'w'", "dtype"});
  expect_error(
      [&] { read_safetensors(write_raw("f", R"({"w": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", "ab")); },
      {"'w'", "BOOL"});
  expect_error(
      [&] { read_safetensors(write_raw("g", R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678")); },
      {"'w'", "[3]", "12 bytes"});
  expect_error(
      [&] { read_safetensors(write_raw("h", R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", "12345678")); },
      {"'w'", "shape"});
  expect_error(
      [&] { read_safetensors(write_raw("i", R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", "12345678")); },
      {"'w'", "end before begin"});
  expect_error([&] { read_safetensors(write_raw("j", R"({"__metadata__": {"k": 3}})", "")); }, {"__metadata__", "'k'"});
  // Shapes whose byte count overflows 64 bits (the element count alone, or only with the dtype's size);
  // test_reliability holds the [2^32, 2^32] case that wrapped to 0 bytes.
  expect_error(  // 2^62 F32 elements are 2^64 bytes
      [&] { read_safetensors(write_raw("l", R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "")); },
      {"'w'", "overflows a 64-bit size"});
  expect_error(
      [&] { read_safetensors(write_raw("m", R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", "")); },
      {"'w'", "overflows a 64-bit size"});
}

TEST_F(Serialize, OffsetsOutOfRangeAndOverlapsAreNamed) {
  expect_error(
      [&] { read_safetensors(write_raw("a", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", "12345678")); },
      {"'w'", "[8, 24]", "beyond"});
  expect_error(
      [&] {
        read_safetensors(write_raw(
            "b", R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            "123456789012"));
      },
      {"'u'", "'v'", "overlap"});
  // An empty tensor between two overlapping ones hides nothing.
  expect_error(
      [&] {
        read_safetensors(write_raw(
            "c", R"({"big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "none": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}, "late": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
            "1234567890123456"));
      },
      {"'big'", "'late'", "overlap"});
}

// ---- modules -----------------------------------------------------------------------------------------
TEST_F(Serialize, StateDictRoundTripThroughAFile) {
  manual_seed(1);
  auto a = tiny_resnet();
  manual_seed(2);
  auto b = tiny_resnet();
  save_state_dict(path("m.safetensors"), *a, {{"model", "resnet18_cifar"}});
  ASSERT_NE(snapshot(*a), snapshot(*b));
  const LoadReport r = load_state_dict(*b, load_safetensors(path("m.safetensors")));
  EXPECT_EQ(snapshot(*a), snapshot(*b));
  EXPECT_EQ(r.loaded.size(), state_dict(*a).size());
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty() && r.converted.empty());
  // Handles held elsewhere (an optimizer's parameter list) see the loaded values.
  EXPECT_EQ(a->parameters()[0].to_vector<double>(), b->parameters()[0].to_vector<double>());
  EXPECT_TRUE(b->parameters()[0].requires_grad());
}

// A file holds values in their logical order whatever the layout in memory: a channels-last
// model's weights load into a contiguous model and back, the layout of the loading model kept.
TEST_F(Serialize, ChannelsLastWeightsSaveAndLoadInEitherLayout) {
  manual_seed(1);
  auto a = tiny_resnet();
  a->to(MemoryFormat::channels_last);
  manual_seed(2);
  auto b = tiny_resnet();
  save_state_dict(path("cl.safetensors"), *a);
  load_state_dict(*b, load_safetensors(path("cl.safetensors")));
  EXPECT_EQ(snapshot(*a), snapshot(*b));
  for (const Tensor& p : b->parameters()) EXPECT_TRUE(p.is_contiguous());
  manual_seed(3);
  auto c = tiny_resnet();
  c->to(MemoryFormat::channels_last);
  save_state_dict(path("nchw.safetensors"), *b);
  load_state_dict(*c, load_safetensors(path("nchw.safetensors")));
  EXPECT_EQ(snapshot(*b), snapshot(*c));
  for (const Tensor& p : c->parameters()) {
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_contiguous(MemoryFormat::channels_last));
    }
  }
}

TEST_F(Serialize, BadStateDictsNameTheTensorAndChangeNothing) {
  manual_seed(3);
  auto src = tiny_resnet();
  manual_seed(4);
  auto m = tiny_resnet();
  const NamedTensors good = cloned_state(*src);
  const auto before = snapshot(*m);
  auto fails = [&](const NamedTensors& ts, std::initializer_list<std::string> fragments) {
    expect_error([&] { load_state_dict(*m, ts); }, fragments);
    EXPECT_EQ(snapshot(*m), before) << "a failed load changed the model";
  };
  fails(without(good, "fc.weight"), {"'fc.weight'", "missing", "[10, 64]", "unchanged"});
  NamedTensors extra = good;
  extra.emplace_back("head.extra", Tensor::ones({3}));
  fails(extra, {"'head.extra'", "not in the model"});
  fails(replaced(good, "layer2.0.conv1.weight", Tensor::zeros({16, 8, 5, 5})),
        {"'layer2.0.conv1.weight'", "[16, 8, 5, 5]", "[16, 8, 3, 3]"});
  fails(replaced(good, "bn1.weight", Tensor::zeros({8}, DType::i64)), {"'bn1.weight'", "I64", "f32"});
  fails(replaced(good, "bn1.num_batches_tracked", Tensor::zeros({}, DType::f32)), {"'bn1.num_batches_tracked'", "F32", "i64"});
  NamedTensors dup = good;
  dup.push_back(good.front());
  fails(dup, {"'conv1.weight'", "more than once"});
  // Several problems at once are all listed.
  fails(replaced(without(good, "fc.bias"), "conv1.weight", Tensor::zeros({1})), {"'fc.bias'", "'conv1.weight'", "2 problems"});
  // Through a file as well.
  save_safetensors(path("bad.safetensors"), replaced(good, "fc.weight", Tensor::zeros({5, 64})));
  expect_error([&] { load_state_dict(*m, load_safetensors(path("bad.safetensors"))); }, {"'fc.weight'", "[5, 64]"});
  EXPECT_EQ(snapshot(*m), before);
}

TEST_F(Serialize, NonStrictSkipsNamesButNotShapes) {
  auto src = tiny_resnet();
  auto m = tiny_resnet();
  NamedTensors ts = without(cloned_state(*src), "fc.weight");
  ts.emplace_back("unused", Tensor::ones({2}));
  const LoadReport r = load_state_dict(*m, ts, /*strict=*/false);
  EXPECT_EQ(r.missing, std::vector<std::string>{"fc.weight"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"unused"});
  expect_error([&] { load_state_dict(*m, replaced(ts, "fc.bias", Tensor::zeros({3})), false); }, {"'fc.bias'", "[3]"});
}

TEST_F(Serialize, HalfPrecisionWeightsConvertAndOldCheckpointsLoad) {
  auto src = tiny_resnet();
  auto m = tiny_resnet();
  NamedTensors ts;
  for (const auto& [n, t] : cloned_state(*src)) {
    if (n.ends_with("num_batches_tracked")) continue;  // older checkpoints lack it: tolerated
    ts.emplace_back(n, is_floating(t.dtype()) ? t.to(DType::f16) : t);
  }
  const LoadReport r = load_state_dict(*m, ts);
  EXPECT_FALSE(r.converted.empty());
  EXPECT_NE(r.converted.front().find("F16 -> f32"), std::string::npos) << r.converted.front();
  EXPECT_FALSE(r.missing.empty());  // the num_batches_tracked buffers, reported, not fatal
  for (const auto& n : r.missing) EXPECT_TRUE(n.ends_with("num_batches_tracked")) << n;
  const auto [name, w] = m->named_parameters().front();
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.to_vector<double>(), src->named_parameters().front().second.to(DType::f16).to_vector<double>()) << name;
}

// ---- transfer learning -------------------------------------------------------------------------------
TEST_F(Serialize, LoadBackboneIgnoresTheHeadAndFreezeBackboneFreezesTheRest) {
  auto pretrained = tiny_resnet(100);
  save_state_dict(path("pre.safetensors"), *pretrained);
  auto m = tiny_resnet(5);
  const auto fc_before = m->named_parameters().back().second.to_vector<double>();
  expect_error([&] { load_state_dict(*m, load_safetensors(path("pre.safetensors"))); }, {"'fc.weight'", "[100, 64]", "[5, 64]"});
  const LoadReport r = load_backbone(*m, path("pre.safetensors"), "fc");
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(m->named_parameters().back().second.to_vector<double>(), fc_before);
  EXPECT_EQ(m->named_parameters().front().second.to_vector<double>(),
            pretrained->named_parameters().front().second.to_vector<double>());

  const int64_t frozen = freeze_backbone(*m, "fc");
  EXPECT_EQ(frozen, m->num_parameters() - (5 * 64 + 5));
  for (const auto& [n, p] : m->named_parameters()) EXPECT_EQ(p.requires_grad(), has_prefix(n, "fc")) << n;
  const Tensor loss = cross_entropy((*m)(testing::random_tensor({2, 3, 32, 32}, 9, DType::f32)),
                                    Tensor::from_vector<int64_t>({0, 4}, {2}));
  loss.backward();
  for (const auto& [n, p] : m->named_parameters()) EXPECT_EQ(p.grad().defined(), has_prefix(n, "fc")) << n;
  expect_error([&] { freeze_backbone(*m, "classifier"); }, {"'classifier'", "layer1", "fc"});
}

TEST(SerializePrefix, PrefixesAreModulePaths) {
  EXPECT_TRUE(has_prefix("fc.weight", "fc"));
  EXPECT_TRUE(has_prefix("fc.weight", "fc."));
  EXPECT_TRUE(has_prefix("fc", "fc"));
  EXPECT_FALSE(has_prefix("fc2.weight", "fc"));
  EXPECT_TRUE(has_prefix("heads.head.bias", "heads.head"));
  EXPECT_FALSE(has_prefix("heads.head_x", "heads.head"));
}

}  // namespace
}  // namespace duet
