// ONNX export: a duet model as an ONNX graph (opset 17) that ONNX Runtime and every other ONNX
// consumer runs, built with onnx's own protobuf classes and checked by onnx::checker before a
// byte is written.
//
// The exporter walks the model's modules: each module type of engine/nn and models/ has one
// translation into ONNX nodes, in one table (export/onnx_modules.cpp), the way PyTorch's exporter
// has one symbolic function per op. The graph computes the model's eval-mode forward pass: batch
// norm as BatchNormalization with the running statistics (not folded into the convolutions, as
// PyTorch's exporter leaves it), dropout and stochastic depth as nothing. The batch dimension is
// dynamic ("batch"); height and width are the export's image size. A module without a translation
// (a Lambda, a custom module) is a duet::Error naming its path and type, raised before any file
// is touched.
//
// Parameters and buffers keep their names (torchvision's) as initializers. A model whose weights
// exceed what one protobuf message may hold (2 GB; ViT-H/14) keeps them in "<file>.data" beside
// the .onnx file, as PyTorch's exporter does (ONNX's external data).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "engine/nn/module.h"

namespace duet::exporter {

inline constexpr int64_t kOnnxOpset = 17;  // ONNX 1.12 (Debian 12) and ONNX Runtime >= 1.13 run it
inline constexpr int64_t kOnnxIrVersion = 8;  // the IR version that goes with opset 17

// What the file says about the model (its metadata_props) and the input it takes.
struct OnnxExportInfo {
  std::string model_name;  // the zoo name ("resnet18"): metadata "model"
  int64_t image_size = 0;  // the input's height and width (> 0)
  int64_t in_channels = 3;
  std::vector<std::string> class_names;  // may be empty (a fresh model): metadata "class_names"
  // The normalisation the model was trained with: input = (pixel / 255 - mean) / std per channel.
  // Empty when unknown (a fresh model, synthetic data); else one value per input channel.
  std::vector<float> mean, std;
  // The eval transform of an image before normalisation: shorter side resized to this, then a
  // centre crop of image_size (0: unknown).
  int64_t resize_shorter = 0;
  std::string source;  // where the weights came from (a checkpoint's path, or "fresh"): metadata "source"
  int64_t epoch = -1;  // the checkpoint's epochs of training (-1: none)
};

struct OnnxExportResult {
  int64_t nodes = 0, initializers = 0;
  int64_t weight_bytes = 0;
  bool external_data = false;  // weights in "<path>.data"
  std::string data_path;       // that file, when external_data
  std::vector<int64_t> output_shape;  // [-1 (batch), classes]
  std::string op_counts;       // "Conv 20, BatchNormalization 20, Relu 17, ..."
};

// Writes `model` (on any device; its mode is restored afterwards) to `path` as ONNX. Validates
// `info`, builds the whole graph in memory, runs onnx::checker::check_model and ONNX's strict shape
// inference on it, and compares the shapes inference finds with those the exporter tracked (the
// batch dimension must stay dynamic); only then writes the file(s), each atomically
// (engine/atomic_file.h). Any failure is a duet::Error and leaves no file behind.
OnnxExportResult export_onnx(nn::Module& model, const OnnxExportInfo& info, const std::string& path);

// The serialized ModelProto, checked as above, with every weight inside (tests; small models).
// duet::Error when the weights do not fit one protobuf message.
std::string onnx_model_bytes(nn::Module& model, const OnnxExportInfo& info, OnnxExportResult* result = nullptr);

// For tests: weights above this many bytes go to an external data file (default: 1.5 GiB, under
// protobuf's 2 GiB limit). Returns the previous threshold.
int64_t set_external_data_threshold(int64_t bytes);

}  // namespace duet::exporter
