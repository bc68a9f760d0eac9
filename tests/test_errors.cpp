// Bad input gives a duet::Error whose message names the op, the argument, what was given and
// what was expected; never an abort and never a silently wrong result.
#include "engine/nn/layers.h"
#include "tests/test_support.h"

using namespace duet;

namespace {
// Runs f, expects a duet::Error containing every fragment.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "message: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a duet::Error mentioning '" << fragments.front() << "'";
}
}  // namespace

TEST(Errors, ShapeMismatches) {
  expect_error([] { add(Tensor::ones({2, 3}), Tensor::ones({4})); }, {"add", "[2, 3]", "[4]", "broadcast"});
  expect_error([] { matmul(Tensor::ones({2, 3}), Tensor::ones({4, 5})); }, {"matmul", "inner dims", "[2, 3]", "[4, 5]"});
  expect_error([] { linear(Tensor::ones({2, 3}), Tensor::ones({4, 5})); }, {"linear", "[2, 3]", "expected", "5"});
  expect_error([] { conv2d(Tensor::ones({1, 3, 8, 8}), Tensor::ones({4, 2, 3, 3})); }, {"conv2d", "3 channels", "groups"});
  expect_error([] { conv2d(Tensor::ones({1, 3, 2, 2}), Tensor::ones({4, 3, 3, 3})); }, {"conv2d", "does not fit", "2x2"});
  expect_error([] { conv2d(Tensor::ones({3, 8, 8}), Tensor::ones({4, 3, 3, 3})); }, {"conv2d", "'input'", "[3, 8, 8]", "4 dims"});
  expect_error([] { cat({Tensor::ones({2, 3}), Tensor::ones({3, 3})}, 1); }, {"cat", "tensors[1]", "[3, 3]", "dim 1"});
  expect_error([] { Tensor::ones({2, 3}).view({4}); }, {"view", "[4]", "6"});
  expect_error([] { Tensor::ones({2, 3}).expand({3, 3}); }, {"expand", "[2, 3]", "[3, 3]"});
  expect_error([] { layer_norm(Tensor::ones({2, 3}), Tensor::ones({4}), Tensor()); }, {"layer_norm", "'weight'", "[4]", "[3]"});
  expect_error([] { cross_entropy(Tensor::ones({2, 3}), Tensor::zeros({3}, DType::i64)); }, {"cross_entropy", "2", "3 labels"});
  expect_error([] { max_pool2d(Tensor::ones({1, 1, 2, 2}), Pool2dParams{3, 3, 1, 1}); }, {"max_pool2d", "does not fit"});
}

TEST(Errors, DtypeMismatches) {
  expect_error([] { add(Tensor::ones({2}), Tensor::ones({2}, DType::f64)); }, {"add", "f64", "f32", "same dtype"});
  expect_error([] { relu(Tensor::ones({2}, DType::i64)); }, {"relu", "i64", "expected f32, f64, f16 or bf16"});
  expect_error([] { cross_entropy(Tensor::ones({2, 3}), Tensor::zeros({2})); }, {"cross_entropy", "'target'", "f32", "i64"});
  expect_error([] { dtype_from_name("float7"); }, {"float7", "f32"});
}

TEST(Errors, OutOfRangeDimsAndValues) {
  expect_error([] { sum(Tensor::ones({2, 3}), {2}); }, {"sum", "dim 2", "2 dims", "-2 to 1"});
  expect_error([] { softmax(Tensor::ones({2, 3}), -3); }, {"softmax", "dim -3"});
  expect_error([] { Tensor::ones({2, 3}).permute({0, 0}); }, {"permute", "twice"});
  expect_error([] { Tensor::ones({2, 3}).select(1, 3); }, {"select", "index 3", "size 3"});
  expect_error([] { dropout(Tensor::ones({2}), 1.5, true); }, {"dropout", "[0, 1]", "1.5"});
  expect_error([] { Tensor::ones({3}).item(); }, {"item", "3 elements"});
  for (Backend b : duet::testing::cpu_backends()) {
    BackendGuard g(DeviceType::cpu, b);
    expect_error([] { cross_entropy(Tensor::ones({2, 3}), Tensor::from_vector<int64_t>({0, 3}, {2})); },
                 {"cross_entropy", "3"});
  }
}

TEST(Errors, DevicesAndBackends) {
  expect_error([] { Device::parse("tpu"); }, {"tpu", "cuda:N"});
  expect_error([] { backend_from_name("metal"); }, {"metal", "reference"});
  if (!backend_available(Backend::cuda)) {
    expect_error([] { set_default_backend(DeviceType::cpu, Backend::cuda); }, {"cuda", "not available"});
    expect_error([] { Tensor::ones({2}).to(Device::cuda(0)); }, {"cuda"});
  }
}

// An activation's parameter must be a number: LeakyReLU's slope of NaN is refused by name.
TEST(Errors, ActivationParameterMustBeFinite) {
  const Tensor x = Tensor::ones({2, 3});
  expect_error([&] { (void)leaky_relu(x, std::numeric_limits<double>::quiet_NaN()); },
               {"leaky_relu", "parameter is nan", "finite"});
  EXPECT_EQ(leaky_relu(Tensor::from_vector(std::vector<float>{-2.0f, 3.0f}, {2}), 0.1).to_vector<float>(),
            (std::vector<float>{-0.2f, 3.0f}));
  EXPECT_EQ(nn::LeakyReLU(0.1)->forward(Tensor::from_vector(std::vector<float>{-1.0f}, {1})).to_vector<float>(),
            (std::vector<float>{-0.1f}));
  EXPECT_EQ(nn::LeakyReLU()->type_name(), "LeakyReLU");
}
