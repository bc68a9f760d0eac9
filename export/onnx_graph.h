// The ONNX graph under construction: onnx's own protobuf classes (onnx::GraphProto) filled one node
// at a time, with the shape of every value tracked on the way, so that each module's translation
// (export/onnx_modules.cpp) can compute the reshapes and pooling windows it needs and check what it
// is given. The batch dimension is dynamic: kBatch in a tracked shape, the dim_param "batch" in the
// graph's input and output. This header is the exporter's inside; only export/ includes it (the
// public side, export/onnx_export.h, shows no onnx type).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <onnx/onnx_pb.h>
#include "engine/tensor.h"

namespace duet::exporter {

inline constexpr int64_t kBatch = -1;  // the dynamic batch dimension in a tracked shape

// A value of the graph: its name and its shape (kBatch where the batch size goes).
struct Value {
  std::string name;
  Shape shape;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
};

std::string tracked_shape_str(const Shape& s);  // "[batch, 64, 56, 56]"

class OnnxGraph {
public:
  explicit OnnxGraph(onnx::GraphProto& g) : g_(g) {}

  // The graph's input (f32, NCHW) and output (f32), batch dimension "batch".
  Value input(const std::string& name, const Shape& shape);
  void output(const Value& v, const std::string& name);

  // A node `op` reading `inputs` (names; "" for an omitted optional input) and writing one value
  // of shape `shape`; `attrs` sets its attributes. `scope` (the module's path) names the node.
  Value node(const std::string& scope, const std::string& op, const std::vector<std::string>& inputs, Shape shape,
             const std::function<void(onnx::NodeProto&)>& attrs = {});

  // Initializers. weight(): a parameter or buffer as f32 under its own dotted name (as PyTorch's
  // exporter names them); the others: constants under a unique name made from `hint`.
  std::string weight(const std::string& name, const Tensor& t);
  std::string ints(const std::string& hint, const std::vector<int64_t>& v, bool scalar = false);
  std::string floats(const std::string& hint, const std::vector<float>& v, const Shape& shape);

  int64_t weight_bytes() const { return weight_bytes_; }
  // Every node output's tracked shape, by name (checked against ONNX's shape inference).
  const std::map<std::string, Shape>& tracked_shapes() const { return shapes_; }

private:
  std::string unique(const std::string& hint);
  onnx::GraphProto& g_;
  std::map<std::string, int> used_;
  std::map<std::string, Shape> shapes_;
  int64_t weight_bytes_ = 0;
};

// Attribute setters.
void attr(onnx::NodeProto& n, const std::string& name, int64_t v);
void attr(onnx::NodeProto& n, const std::string& name, float v);
void attr(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v);

}  // namespace duet::exporter
