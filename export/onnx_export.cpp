// ONNX export (see onnx_export.h): the ModelProto around the translated graph, its metadata, the
// checks (onnx::checker, strict shape inference against the tracked shapes) and the atomic writes.
#include "export/onnx_export.h"
#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>
#include "engine/atomic_file.h"
#include "engine/error.h"
#include "export/onnx_graph.h"
#include "export/onnx_modules.h"

#ifndef DUET_VERSION
#define DUET_VERSION "unknown"
#endif

namespace duet::exporter {

namespace fs = std::filesystem;

namespace {

int64_t external_threshold = int64_t{3} << 29;  // 1.5 GiB: protobuf refuses messages of 2 GiB and more

// Restores the module's training mode when the export ends, however it ends.
struct EvalModeGuard {
  nn::Module& m;
  bool was_training;
  explicit EvalModeGuard(nn::Module& mod) : m(mod), was_training(mod.is_training()) { m.eval(); }
  ~EvalModeGuard() { m.train(was_training); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;
};

void check_info(const OnnxExportInfo& i) {
  DUET_CHECK(!i.model_name.empty(), "ONNX export: no model name given");
  DUET_CHECK(i.image_size > 0 && i.in_channels > 0, "ONNX export of '{}': image size {} and {} input channels; expected "
             "both positive", i.model_name, i.image_size, i.in_channels);
  DUET_CHECK(i.mean.size() == i.std.size() && (i.mean.empty() || static_cast<int64_t>(i.mean.size()) == i.in_channels),
             "ONNX export of '{}': normalisation mean [{}] and std [{}]; expected one value per input channel ({}) in "
             "each, or neither",
             i.model_name, fmt::join(i.mean, ", "), fmt::join(i.std, ", "), i.in_channels);
  for (float s : i.std) DUET_CHECK(s > 0, "ONNX export of '{}': normalisation std {} is not positive", i.model_name, s);
}

void check_output_folder(const std::string& path) {
  DUET_CHECK(!path.empty(), "ONNX export: no output file given");
  std::error_code ec;
  DUET_CHECK(!fs::is_directory(path, ec), "ONNX export: '{}' is a folder; expected a file name such as '{}/model.onnx'",
             path, path);
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  DUET_CHECK(fs::is_directory(folder, ec), "ONNX export: the folder '{}' of '{}' does not exist; expected an existing "
             "folder", folder.string(), path);
}

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // class folders' names are bytes
}

void add_metadata(onnx::ModelProto& m, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto& e = *m.add_metadata_props();
  e.set_key(key);
  e.set_value(value);
}

void write_metadata(onnx::ModelProto& m, const OnnxExportInfo& i, int64_t classes) {
  add_metadata(m, "model", i.model_name);
  add_metadata(m, "duet_version", DUET_VERSION);
  add_metadata(m, "num_classes", std::to_string(classes));
  add_metadata(m, "class_names", json_text(i.class_names));
  add_metadata(m, "input_size", std::to_string(i.image_size));
  add_metadata(m, "input", fmt::format("float32 [batch, {}, {}, {}] (NCHW, RGB)", i.in_channels, i.image_size, i.image_size));
  if (!i.mean.empty()) {
    add_metadata(m, "mean", json_text(i.mean));
    add_metadata(m, "std", json_text(i.std));
  }
  std::string prep;
  if (i.resize_shorter > 0)
    prep = fmt::format("resize the shorter side to {} pixels, centre-crop {}x{}, ", i.resize_shorter, i.image_size,
                       i.image_size);
  prep += i.mean.empty() ? "no normalisation recorded (the model was not trained on images)"
                         : "divide the 8-bit RGB values by 255, subtract mean and divide by std per channel";
  add_metadata(m, "preprocessing", prep);
  if (i.resize_shorter > 0) add_metadata(m, "resize_shorter", std::to_string(i.resize_shorter));
  add_metadata(m, "output", "logits [batch, num_classes] (softmax gives the class probabilities)");
  if (!i.source.empty()) add_metadata(m, "source", i.source);
  if (i.epoch >= 0) add_metadata(m, "epochs_trained", std::to_string(i.epoch));
}

// The dims ONNX's shape inference found for a value, as a tracked shape (kBatch for a symbolic or
// unknown dim), and whether it found a shape at all.
bool inferred_shape(const onnx::ValueInfoProto& v, Shape& s) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return false;
  s.clear();
  for (const auto& d : v.type().tensor_type().shape().dim()) s.push_back(d.has_dim_value() ? d.dim_value() : kBatch);
  return true;
}

// Runs ONNX's strict shape inference on the graph (weights left out) and holds every shape it finds
// to the one the exporter tracked: a dim the exporter left to the batch must not become a number.
void check_shapes(const onnx::ModelProto& skeleton, const std::map<std::string, Shape>& tracked, const std::string& model) {
  onnx::ModelProto m = skeleton;
  try {
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict=*/1, /*data_prop=*/true));
  } catch (const std::exception& e) {
    throw Error(fmt::format("ONNX export of '{}': ONNX's shape inference rejects the graph ({}); this is a bug of duet's "
                            "exporter",
                            model, e.what()));
  }
  const auto compare = [&](const onnx::ValueInfoProto& v) {
    const auto it = tracked.find(v.name());
    Shape s;
    if (it == tracked.end() || !inferred_shape(v, s)) return;
    // An unknown dim is inference's silence; a number must be the tracked one (never the batch's).
    bool same = s.size() == it->second.size();
    for (size_t k = 0; same && k < s.size(); ++k) same = s[k] == kBatch || s[k] == it->second[k];
    DUET_CHECK(same, "ONNX export of '{}': ONNX's shape inference gives '{}' the shape {}, the exporter expected {}; this "
               "is a bug of duet's exporter",
               model, v.name(), tracked_shape_str(s), tracked_shape_str(it->second));
  };
  for (const auto& v : m.graph().value_info()) compare(v);
  for (const auto& v : m.graph().output()) compare(v);
}

std::string op_counts(const onnx::GraphProto& g) {
  std::map<std::string, int64_t> n;
  for (const auto& node : g.node()) n[node.op_type()]++;
  std::vector<std::pair<std::string, int64_t>> v(n.begin(), n.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  for (const auto& [op, c] : v) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", op, c);
  return s;
}

// The model built and checked; the weights of initializers listed in `blobs` are held there instead
// of in the proto when `external` (then their external_data says where they go in the data file).
struct Blob {
  std::string data;
  int64_t offset = 0;  // in the data file
};
struct Built {
  onnx::ModelProto model;
  std::vector<Blob> blobs;  // external data, in file order
  OnnxExportResult result;
};

void build(nn::Module& model, const OnnxExportInfo& info, bool allow_external, const std::string& data_location,
           Built& b) {
  check_info(info);
  onnx::ModelProto& m = b.model;
  m.set_ir_version(kOnnxIrVersion);
  m.set_producer_name("duet");
  m.set_producer_version(DUET_VERSION);
  m.set_model_version(1);
  m.set_doc_string(fmt::format("{} exported by duet {} (eval mode, batch norm as BatchNormalization)", info.model_name,
                               DUET_VERSION));
  onnx::OperatorSetIdProto& opset = *m.add_opset_import();
  opset.set_domain("");
  opset.set_version(kOnnxOpset);
  onnx::GraphProto& graph = *m.mutable_graph();
  graph.set_name(info.model_name);

  OnnxGraph g(graph);
  const Value x = g.input("input", {kBatch, info.in_channels, info.image_size, info.image_size});
  Value y;
  {
    const EvalModeGuard eval(model);
    y = translate(g, model, "", x);
  }
  DUET_CHECK(y.rank() == 2 && y.dim(0) == kBatch,
             "ONNX export of '{}': the model's output has shape {}; expected logits [batch, classes]", info.model_name,
             tracked_shape_str(y.shape));
  DUET_CHECK(info.class_names.empty() || static_cast<int64_t>(info.class_names.size()) == y.dim(1),
             "ONNX export of '{}': the model has {} outputs but {} class names were given", info.model_name, y.dim(1),
             info.class_names.size());
  g.output(y, "logits");
  write_metadata(m, info, y.dim(1));

  OnnxExportResult& r = b.result;
  r.nodes = graph.node_size();
  r.initializers = graph.initializer_size();
  r.weight_bytes = g.weight_bytes();
  r.output_shape = y.shape;
  r.op_counts = op_counts(graph);

  // The weights step aside while shape inference runs on a copy of the rest.
  std::vector<std::pair<onnx::TensorProto*, std::string>> held;
  for (onnx::TensorProto& t : *graph.mutable_initializer()) {
    if (t.raw_data().empty()) continue;  // small constants stay: data propagation reads them
    held.emplace_back(&t, std::string());
    held.back().second.swap(*t.mutable_raw_data());
    t.clear_raw_data();
  }
  check_shapes(m, g.tracked_shapes(), info.model_name);

  for (auto& [t, data] : held) t->mutable_raw_data()->swap(data);
  // The checker sees every weight in place; weights bound for a data file would make it look for
  // that file, which is written only once the model has passed.
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw Error(fmt::format("ONNX export of '{}': onnx::checker rejects the model ({}); this is a bug of duet's exporter",
                            info.model_name, e.what()));
  }
  r.external_data = r.weight_bytes > external_threshold;
  DUET_CHECK(!r.external_data || allow_external,
             "ONNX export of '{}': {:.2f} GB of weights do not fit one protobuf message (2 GB); export to a file, which "
             "keeps them in a .data file beside it",
             info.model_name, static_cast<double>(r.weight_bytes) / 1e9);
  if (r.external_data) {
    int64_t end = 0;
    for (auto& [t, unused] : held) {
      const auto entry = [&](const char* key, const std::string& value) {
        onnx::StringStringEntryProto& e = *t->add_external_data();
        e.set_key(key);
        e.set_value(value);
      };
      Blob& blob = b.blobs.emplace_back();
      blob.data.swap(*t->mutable_raw_data());
      const auto length = static_cast<int64_t>(blob.data.size());
      // Large tensors start on a 4 KiB page, so that a reader may map them (as onnx's own writer aligns them).
      blob.offset = length >= (int64_t{1} << 20) ? (end + 4095) / 4096 * 4096 : end;
      end = blob.offset + length;
      t->clear_raw_data();
      t->set_data_location(onnx::TensorProto::EXTERNAL);
      entry("location", data_location);
      entry("offset", std::to_string(blob.offset));
      entry("length", std::to_string(length));
    }
  }
  DUET_CHECK(m.ByteSizeLong() < static_cast<size_t>(std::numeric_limits<int>::max()),
             "ONNX export of '{}': the model message is {} bytes, more than protobuf can write", info.model_name,
             m.ByteSizeLong());
}

std::string serialize(const onnx::ModelProto& m, const std::string& model) {
  std::string bytes;
  DUET_CHECK(m.SerializeToString(&bytes), "ONNX export of '{}': protobuf could not serialize the model", model);
  return bytes;
}

}  // namespace

int64_t set_external_data_threshold(int64_t bytes) {
  const int64_t was = external_threshold;
  external_threshold = bytes;
  return was;
}

std::string onnx_model_bytes(nn::Module& model, const OnnxExportInfo& info, OnnxExportResult* result) {
  Built b;
  build(model, info, false, "", b);
  if (result) *result = b.result;
  return serialize(b.model, info.model_name);
}

OnnxExportResult export_onnx(nn::Module& model, const OnnxExportInfo& info, const std::string& path) {
  check_output_folder(path);
  const std::string data_path = path + ".data";
  Built b;
  build(model, info, true, fs::path(data_path).filename().string(), b);
  const std::string bytes = serialize(b.model, info.model_name);
  if (b.result.external_data) {
    write_file_atomically(data_path, "ONNX export", [&](const FileSink& sink) {
      const std::string zeros(4096, '\0');
      int64_t at = 0;
      for (const Blob& blob : b.blobs) {
        sink.write(zeros.data(), static_cast<size_t>(blob.offset - at));
        sink.write(blob.data.data(), blob.data.size());
        at = blob.offset + static_cast<int64_t>(blob.data.size());
      }
    });
    b.result.data_path = data_path;
  }
  bool wrote_model = false;
  try {
    write_file_atomically(path, "ONNX export", [&](const FileSink& sink) { sink.write(bytes.data(), bytes.size()); });
    wrote_model = true;
    // With its weights beside it, the pair is checked again as ONNX Runtime will open it.
    if (b.result.external_data) {
      try {
        onnx::checker::check_model(path);
      } catch (const std::exception& e) {
        throw Error(fmt::format("ONNX export of '{}': onnx::checker rejects '{}' with its data file ({}); this is a bug "
                                "of duet's exporter",
                                info.model_name, path, e.what()));
      }
    }
  } catch (...) {
    std::error_code ec;  // neither new file is of use without the other
    if (b.result.external_data) fs::remove(data_path, ec);
    if (wrote_model) fs::remove(path, ec);
    throw;
  }
  return b.result;
}

}  // namespace duet::exporter
