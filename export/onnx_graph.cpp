// The ONNX graph builder of onnx_graph.h.
#include "export/onnx_graph.h"
#include <fmt/format.h>
#include "engine/error.h"

namespace duet::exporter {

std::string tracked_shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + (s[i] == kBatch ? std::string("batch") : std::to_string(s[i]));
  return out + "]";
}

namespace {
void set_type(onnx::ValueInfoProto& v, const std::string& name, const Shape& shape) {
  v.set_name(name);
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* s = t->mutable_shape();
  for (int64_t d : shape) {
    if (d == kBatch) s->add_dim()->set_dim_param("batch");
    else s->add_dim()->set_dim_value(d);
  }
}
}  // namespace

Value OnnxGraph::input(const std::string& name, const Shape& shape) {
  set_type(*g_.add_input(), name, shape);
  used_[name] = 1;
  return {name, shape};
}

void OnnxGraph::output(const Value& v, const std::string& name) {
  // The last node writes the output's name directly (no Identity in between), as PyTorch's exporter does.
  DUET_CHECK(g_.node_size() > 0, "ONNX export: the model computes nothing (its output is its input)");
  onnx::NodeProto& last = *g_.mutable_node(g_.node_size() - 1);
  DUET_CHECK(last.output_size() == 1 && last.output(0) == v.name,
             "ONNX export: internal: the output '{}' is not the last node's", v.name);
  last.set_output(0, name);
  shapes_.erase(v.name);
  shapes_[name] = v.shape;
  set_type(*g_.add_output(), name, v.shape);
}

std::string OnnxGraph::unique(const std::string& hint) {
  const int n = used_[hint]++;
  return n == 0 ? hint : fmt::format("{}_{}", hint, n);
}

Value OnnxGraph::node(const std::string& scope, const std::string& op, const std::vector<std::string>& inputs,
                      Shape shape, const std::function<void(onnx::NodeProto&)>& attrs) {
  onnx::NodeProto& n = *g_.add_node();
  n.set_op_type(op);
  const std::string base = (scope.empty() ? std::string() : "/" + scope) + "/" + op;
  n.set_name(unique(base));
  for (const std::string& in : inputs) n.add_input(in);
  const std::string out = unique(base + "_output");
  n.add_output(out);
  if (attrs) attrs(n);
  shapes_[out] = shape;
  return {out, std::move(shape)};
}

std::string OnnxGraph::weight(const std::string& name, const Tensor& t) {
  DUET_CHECK(t.defined(), "ONNX export: the tensor '{}' is undefined", name);
  const Tensor f = t.detach().to(Device::cpu()).to(DType::f32).contiguous();
  onnx::TensorProto& p = *g_.add_initializer();
  const std::string unique_name = unique(name);
  p.set_name(unique_name);
  p.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : f.shape()) p.add_dims(d);
  const auto bytes = static_cast<size_t>(f.numel()) * sizeof(float);
  p.set_raw_data(f.raw_data(), bytes);  // little-endian floats, as ONNX stores them
  weight_bytes_ += static_cast<int64_t>(bytes);
  return unique_name;
}

std::string OnnxGraph::ints(const std::string& hint, const std::vector<int64_t>& v, bool scalar) {
  DUET_CHECK(!scalar || v.size() == 1, "ONNX export: internal: a scalar constant '{}' with {} values", hint, v.size());
  onnx::TensorProto& p = *g_.add_initializer();
  const std::string name = unique(hint);
  p.set_name(name);
  p.set_data_type(onnx::TensorProto::INT64);
  if (!scalar) p.add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) p.add_int64_data(x);
  return name;
}

std::string OnnxGraph::floats(const std::string& hint, const std::vector<float>& v, const Shape& shape) {
  onnx::TensorProto& p = *g_.add_initializer();
  const std::string name = unique(hint);
  p.set_name(name);
  p.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape) p.add_dims(d);
  for (float x : v) p.add_float_data(x);
  return name;
}

void attr(onnx::NodeProto& n, const std::string& name, int64_t v) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
}

void attr(onnx::NodeProto& n, const std::string& name, float v) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(v);
}

void attr(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto& a = *n.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
}

}  // namespace duet::exporter
