// The duet side of the ONNX Runtime check (tests/onnx_runtime_check.py): for one zoo model at its
// full size and native input size, duet's eval-mode logits on a random batch and the model exported
// as ONNX, as files the Python side reads.
//
//   onnx_reference --list                          the zoo's names, one a line
//   onnx_reference --model NAME --out DIR [--batch 2] [--seed 1]
//
// writes DIR/NAME.onnx (+ NAME.onnx.data when the weights exceed 1.5 GiB), DIR/NAME.input.npy
// [batch, 3, S, S] and DIR/NAME.logits.npy [batch, classes] (f32), and prints one line of timings.
//
// A freshly initialised model would make a weak test: ViT's head and ConvNeXt V2's GRN start at
// zero, ConvNeXt's layer scale at 1e-6 (its blocks then barely count), and batch norm's running
// statistics at 0 and 1. So before the forward pass every parameter and buffer that training would
// move is set to a plausible trained value, deterministically from the seed: running means and
// variances, batch- and layer-norm scales and shifts, biases, tokens, layer scales and heads drawn
// around their usual sizes; convolution and linear weights keep their (random) initialisation.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <fmt/format.h>
#include "engine/autograd.h"
#include "engine/duet.h"
#include "export/onnx_export.h"
#include "models/registry.h"

using namespace duet;

namespace {

// numpy's .npy format, version 1.0: magic, header length, a Python dict literal, the raw data.
void write_npy(const std::string& path, const Tensor& t) {
  const Tensor c = t.detach().to(Device::cpu()).to(DType::f32).contiguous();
  std::string shape;
  for (int64_t d : c.shape()) shape += fmt::format("{}, ", d);
  if (c.dim() > 1) shape.resize(shape.size() - 2);
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", shape);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  f.write(static_cast<const char*>(c.raw_data()), static_cast<std::streamsize>(c.numel() * 4));
  DUET_CHECK(f.good(), "onnx_reference: cannot write '{}'", path);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Values a trained network would hold where a fresh one holds zeros, ones or tiny constants.
void make_plausible(nn::Module& model, uint64_t seed) {
  NoGradGuard no_grad;
  Generator gen(seed);
  const auto draw = [&](const Tensor& t, double lo, double hi) {
    const Tensor u = Tensor::rand(t.shape(), TensorOptions(t.dtype()), &gen);
    t.copy_(add(mul(u, hi - lo), lo));
  };
  const auto jitter = [&](const Tensor& t, double std) {
    t.copy_(add(t, mul(Tensor::randn(t.shape(), TensorOptions(t.dtype()), &gen), std)));
  };
  for (const auto& [name, b] : model.named_buffers()) {
    if (ends_with(name, "running_mean")) draw(b, -0.2, 0.2);
    else if (ends_with(name, "running_var")) draw(b, 0.5, 2.0);
  }
  for (const auto& [name, p] : model.named_parameters()) {
    if (ends_with(name, "layer_scale")) draw(p, 0.1, 0.5);
    else if (p.dim() == 1 && ends_with(name, "weight")) draw(p, 0.7, 1.3);  // norm and GRN scales
    else if (p.dim() == 1) jitter(p, 0.05);                                 // biases and shifts
    else if (ends_with(name, "token") || ends_with(name, "pos_embedding")) jitter(p, 0.02);
    else if (amax(abs(p)).item() == 0.0) jitter(p, 0.02);  // heads that start at zero
  }
}

int run(int argc, char** argv) {
  std::string model_name, out;
  int64_t batch = 2;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      DUET_CHECK(i + 1 < argc, "onnx_reference: {} needs a value", a);
      return argv[++i];
    };
    if (a == "--list") {
      for (const models::ModelInfo& m : models::list_models()) std::cout << m.name << "\n";
      return 0;
    }
    if (a == "--model") model_name = next();
    else if (a == "--out") out = next();
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--seed") seed = std::stoull(next());
    else throw Error(fmt::format("onnx_reference: unknown argument '{}'", a));
  }
  DUET_CHECK(!model_name.empty() && !out.empty(), "usage: onnx_reference --model NAME --out DIR [--batch B] [--seed S]");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const models::ModelInfo info = models::model_info(model_name);
  manual_seed(seed);
  const std::shared_ptr<nn::Module> model = models::create_model(model_name);
  make_plausible(*model, seed + 1);
  model->eval();
  const int64_t s = info.default_image_size;
  Generator gen(seed + 2);
  const Tensor x = Tensor::randn({batch, 3, s, s}, {}, &gen);
  const auto t1 = Clock::now();
  Tensor logits;
  {
    NoGradGuard no_grad;
    logits = (*model)(x);
  }
  const auto t2 = Clock::now();
  exporter::OnnxExportInfo e;
  e.model_name = model_name;
  e.image_size = s;
  e.source = fmt::format("tests/onnx_reference.cpp, seed {}", seed);
  const exporter::OnnxExportResult r = exporter::export_onnx(*model, e, out + "/" + model_name + ".onnx");
  const auto t3 = Clock::now();
  write_npy(out + "/" + model_name + ".input.npy", x);
  write_npy(out + "/" + model_name + ".logits.npy", logits);
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::cout << fmt::format("{}: {:.1f}M parameters; build {:.1f} s, duet forward (batch {}) {:.1f} s, export {:.1f} s{}\n",
                           model_name, static_cast<double>(model->num_parameters()) / 1e6, secs(t0, t1), batch,
                           secs(t1, t2), secs(t2, t3), r.external_data ? " (external data)" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "onnx_reference: " << e.what() << "\n";
    return 1;
  }
}
