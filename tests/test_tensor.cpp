// Tensor metadata, views sharing storage, layouts, copies and printing.
#include <algorithm>
#include <numeric>
#include <random>
#include "tests/test_support.h"

using namespace duet;
using duet::testing::all_close;

namespace {
Tensor iota(const Shape& s, DType dt = DType::f32) {
  std::vector<double> v(static_cast<size_t>(numel_of(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor::from_vector(v, s, TensorOptions(dt));
}
}  // namespace

TEST(Tensor, CreationAndMetadata) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << "allocations must be 64-byte aligned";
  EXPECT_EQ(Tensor::full({2}, 7.5, DType::f64).to_vector<double>(), (std::vector<double>{7.5, 7.5}));
  EXPECT_EQ(Tensor::scalar(3).item(), 3.0);
  EXPECT_EQ(Tensor::arange(4, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
}

// is_contiguous and is_dense compare strides in place (no vectors built); checked here against
// their definitions on permutations and slices of up to 10 dims (past is_dense's 8 inline slots).
TEST(Tensor, LayoutChecksMatchTheirDefinitions) {
  const auto dense_by_definition = [](const Tensor& t) {  // every element a distinct offset, spanning numel
    std::vector<int64_t> offs{0};
    for (int64_t d = 0; d < t.dim(); ++d) {
      std::vector<int64_t> next;
      for (int64_t o : offs)
        for (int64_t i = 0; i < t.size(d); ++i) next.push_back(o + i * t.stride(d));
      offs = next;
    }
    std::sort(offs.begin(), offs.end());
    for (size_t i = 0; i < offs.size(); ++i)
      if (offs[i] != offs[0] + static_cast<int64_t>(i)) return false;
    return true;
  };
  const auto strides_match = [](const Tensor& t, const Shape& expected) {
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) != 1 && t.stride(d) != expected[static_cast<size_t>(d)]) return false;
    return true;
  };
  std::mt19937 g(7);
  int checked_dense = 0, checked_not = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t nd = 1 + trial % 10;
    Shape shape;
    for (int64_t d = 0; d < nd; ++d) shape.push_back(1 + static_cast<int64_t>(g() % (nd > 6 ? 2 : 3)));
    Tensor t = Tensor::empty(shape);
    std::vector<int64_t> perm(static_cast<size_t>(nd));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[g() % i]);
    t = t.permute(perm);
    if (trial % 2 == 0) {  // a strided slice of one dim
      const int64_t d = static_cast<int64_t>(g() % static_cast<uint32_t>(nd));
      t = t.slice(d, 0, t.size(d), 2);
    }
    const bool dense = dense_by_definition(t);
    EXPECT_EQ(t.is_dense(), dense) << shape_str(t.shape()) << " strides " << shape_str(t.strides());
    EXPECT_EQ(t.is_contiguous(), strides_match(t, contiguous_strides(t.shape()))) << shape_str(t.strides());
    if (t.dim() == 4)
      EXPECT_EQ(t.is_contiguous(MemoryFormat::channels_last), strides_match(t, channels_last_strides(t.shape())))
          << shape_str(t.shape()) << " strides " << shape_str(t.strides());
    ++(dense ? checked_dense : checked_not);
  }
  EXPECT_GT(checked_dense, 50);
  EXPECT_GT(checked_not, 50);
}

// The cpu backend's strided copy walks at most 16 dims that do not merge; more is a duet::Error
// naming the limit, not a write past the walk's fixed arrays. (The reference loops have no limit.)
TEST(Tensor, CopyOfManyUnmergeableDimsIsBoundedWithAClearError) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  ASSERT_EQ(default_backend(DeviceType::cpu), Backend::cpu);
  const auto reversed = [](int64_t nd) {  // [2, ..., 2] with its dims in reverse order: none merge
    std::vector<int64_t> perm(static_cast<size_t>(nd));
    std::iota(perm.rbegin(), perm.rend(), 0);
    return Tensor::zeros(Shape(static_cast<size_t>(nd), 2)).permute(perm);
  };
  EXPECT_EQ(reversed(16).contiguous().numel(), int64_t(1) << 16);
  try {
    reversed(17).contiguous();
    ADD_FAILURE() << "a walk over 17 unmergeable dims ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 16 dims"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, 4});
  EXPECT_EQ(v.storage(), t.storage());
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_TRUE(p.is_dense());
  EXPECT_EQ(p.storage(), t.storage());
  // element [k, i, j] of p is t[i, j, k] = 12 i + 4 j + k
  const std::vector<float> pv = p.contiguous().to_vector<float>();
  EXPECT_EQ(pv[1 * 6 + 1 * 3 + 2], 12 * 1 + 4 * 2 + 1);
  Tensor s = t.slice(2, 1, 4, 2);  // k in {1, 3}
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_FALSE(s.is_dense());
  EXPECT_EQ(s.contiguous().to_vector<float>()[1], 3.0f);
  // writing through a view changes the base
  s.fill_(-1.0);
  EXPECT_EQ(t.to_vector<float>()[1], -1.0f);
  EXPECT_EQ(t.to_vector<float>()[0], 0.0f);
  Tensor e = Tensor::ones({3, 1}).expand({2, 3, 5});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.contiguous().to_vector<float>(), std::vector<float>(30, 1.0f));
  EXPECT_EQ(t.select(1, 2).shape(), (Shape{2, 4}));
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(t.transpose(0, 2).shape(), (Shape{4, 3, 2}));
}

TEST(Tensor, ViewOfNonContiguousNeedsReshape) {
  Tensor t = iota({3, 4}).transpose(0, 1);  // [4, 3] with strides [1, 4]
  EXPECT_THROW(t.view({12}), Error);
  Tensor r = t.reshape({12});
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.to_vector<float>()[1], 4.0f);
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{12}));
  // a view that splits a dim of a non-contiguous tensor is still possible
  EXPECT_EQ(iota({4, 6}).slice(1, 0, 4).view({4, 2, 2}).strides(), (Shape{6, 2, 1}));
}

TEST(Tensor, ChannelsLast) {
  Tensor x = iota({2, 3, 4, 5});
  Tensor cl = x.contiguous(MemoryFormat::channels_last);
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::channels_last));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::channels_last);
  EXPECT_TRUE(all_close(cl, x, 0, 0));
  // elementwise ops keep the layout (PyTorch's rule), and so does conv2d
  EXPECT_TRUE(relu(cl).is_contiguous(MemoryFormat::channels_last));
  EXPECT_TRUE(add(cl, cl).is_contiguous(MemoryFormat::channels_last));
  Tensor w = Tensor::ones({4, 3, 3, 3});
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  EXPECT_TRUE(conv2d(cl, w, Tensor(), p).is_contiguous(MemoryFormat::channels_last));
  EXPECT_TRUE(conv2d(x, w, Tensor(), p).is_contiguous());
}

// channel_row_stride: rows of C contiguous channels at a uniform stride (channels-last, or a slice
// of one's channels); anything else 0, whatever strides its size-1 dims carry.
TEST(Tensor, ChannelRowStride) {
  const Tensor cl = iota({2, 8, 3, 4}).contiguous(MemoryFormat::channels_last);
  EXPECT_EQ(channel_row_stride(cl), 8);
  EXPECT_EQ(channel_row_stride(cl.slice(1, 2, 5)), 8);
  EXPECT_EQ(channel_row_stride(cl.slice(1, 0, 1)), 8);
  EXPECT_EQ(channel_row_stride(iota({2, 8, 3, 4})), 0);      // NCHW
  EXPECT_EQ(channel_row_stride(cl.slice(2, 0, 2)), 0);       // rows of H skip pixels
  EXPECT_EQ(channel_row_stride(cl.slice(1, 0, 8, 2)), 0);    // channels 2 apart
  EXPECT_EQ(channel_row_stride(iota({1, 8, 1, 1})), 8);      // one pixel: any layout
  EXPECT_EQ(channel_row_stride(iota({8, 3})), 0);            // not 4-d
  const Tensor one_row = iota({1, 8, 1, 4}).contiguous(MemoryFormat::channels_last).slice(1, 0, 3);
  EXPECT_EQ(channel_row_stride(one_row), 8);
}

TEST(Tensor, DtypeConversions) {
  Tensor u = Tensor::from_vector<uint8_t>({0, 128, 255}, {3});
  EXPECT_EQ(u.to(DType::f32).to_vector<float>(), (std::vector<float>{0, 128, 255}));
  Tensor f = Tensor::from_vector<float>({1.5f, -2.25f, 3.0f}, {3});
  EXPECT_EQ(f.to(DType::f64).to_vector<double>(), (std::vector<double>{1.5, -2.25, 3.0}));
  EXPECT_EQ(f.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3}));
  // bf16 and f16 are storage types: values that fit survive the round trip exactly
  EXPECT_EQ(f.to(DType::bf16).to(DType::f32).to_vector<float>(), f.to_vector<float>());
  EXPECT_EQ(f.to(DType::f16).to(DType::f32).to_vector<float>(), f.to_vector<float>());
}

TEST(Tensor, PrintingShowsValuesDtypeAndShape) {
  const std::string s = iota({2, 3}).str();
  EXPECT_NE(s.find("[[0.0000, 1.0000, 2.0000],"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=f32"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 3]"), std::string::npos) << s;
  const std::string big = iota({100}).str(3);
  EXPECT_NE(big.find("..."), std::string::npos) << big;
}

TEST(Tensor, RandomIsSeededAndBackendIndependent) {
  Generator g1(42), g2(42);
  Tensor a = Tensor::randn({1000}, {}, &g1);
  Tensor b = Tensor::randn({1000}, {}, &g2);
  EXPECT_TRUE(all_close(a, b, 0, 0));
  const double m = mean(a).item(), v = mean(square(a)).item();
  EXPECT_NEAR(m, 0.0, 0.1);
  EXPECT_NEAR(v, 1.0, 0.15);
  for (Backend be : duet::testing::cpu_backends()) {
    BackendGuard guard(DeviceType::cpu, be);
    Generator g(7);
    Tensor r = Tensor::rand({257}, {}, &g);
    Generator g0(7);
    BackendGuard ref(DeviceType::cpu, Backend::reference);
    EXPECT_TRUE(all_close(r, Tensor::rand({257}, {}, &g0), 0, 0)) << backend_name(be);
  }
}

TEST(Tensor, DeviceParsingAndCudaAbsence) {
  EXPECT_EQ(Device::parse("cuda:1").index, 1);
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  if (!backend_available(Backend::cuda)) {
    try {
      Tensor::zeros({2}, TensorOptions().with_device(Device::cuda(0)));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    }
  }
}
