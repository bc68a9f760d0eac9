// Op records (see records.h): events summed per distinct op, and their JSON form.
#include "reports/records.h"
#include <map>
#include <tuple>
#include "engine/error.h"

namespace duet::profiler {

std::vector<OpRecord> aggregate(const std::vector<OpEvent>& ops, const std::vector<int64_t>& self) {
  using Key = std::tuple<std::string, Phase, std::string, DType, std::string, std::string, std::string, std::string>;
  std::map<Key, size_t> index;
  std::vector<OpRecord> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpEvent& e = ops[i];
    const std::string dev = e.device.str();
    Key k{e.name, e.phase, backend_label(e), e.dtype, dev, e.shapes, e.scope, e.impl};
    auto [it, inserted] = index.try_emplace(k, out.size());
    const int64_t total = e.end_ns - e.start_ns;
    if (inserted) {
      OpRecord r;
      r.name = e.name;
      r.phase = phase_name(e.phase);
      r.backend = backend_label(e);  // a collective's transport ("mpi", "nccl") for communication
      r.dtype = dtype_name(e.dtype);
      r.device = dev;
      r.shapes = e.shapes;
      r.scope = e.scope;
      r.impl = e.impl;
      r.min_ns = total;
      r.max_ns = total;
      r.first_start_ns = e.start_ns;
      out.push_back(std::move(r));
    }
    OpRecord& r = out[it->second];
    r.calls++;
    r.self_ns += self[i];
    r.total_ns += total;
    r.min_ns = std::min(r.min_ns, total);
    r.max_ns = std::max(r.max_ns, total);
    r.flops += e.flops;
    r.bytes += e.bytes;
    r.bytes_allocated += e.bytes_allocated;
  }
  return out;
}

nlohmann::json to_json(const OpRecord& r) {
  return {{"name", r.name},         {"phase", r.phase},       {"backend", r.backend},   {"dtype", r.dtype},
          {"device", r.device},     {"shapes", r.shapes},     {"scope", r.scope},       {"impl", r.impl},
          {"calls", r.calls},       {"self_ns", r.self_ns},   {"total_ns", r.total_ns}, {"min_ns", r.min_ns},
          {"max_ns", r.max_ns},     {"flops", r.flops},       {"bytes", r.bytes},       {"bytes_allocated", r.bytes_allocated},
          {"first_start_ns", r.first_start_ns}};
}

namespace {
template <class T>
T field(const nlohmann::json& j, const char* key, const char* type) {
  DUET_CHECK(j.is_object(), "op_records entry is {}: expected an object", j.type_name());
  auto it = j.find(key);
  DUET_CHECK(it != j.end(), "op_records entry lacks field '{}' ({} expected)", key, type);
  if constexpr (std::is_integral_v<T>)
    DUET_CHECK(is_int64(*it), "op_records field '{}' is {}: expected {} that fits in 64 bits", key, it->dump(), type);
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("op_records field '{}' is {} ({}): expected {}", key, it->type_name(), it->dump(), type));
  }
}
}  // namespace

OpRecord op_record_from_json(const nlohmann::json& j) {
  OpRecord r;
  r.name = field<std::string>(j, "name", "a string");
  r.phase = field<std::string>(j, "phase", "a string");
  r.backend = field<std::string>(j, "backend", "a string");
  r.dtype = field<std::string>(j, "dtype", "a string");
  r.device = field<std::string>(j, "device", "a string");
  r.shapes = field<std::string>(j, "shapes", "a string");
  r.scope = field<std::string>(j, "scope", "a string");
  r.impl = field<std::string>(j, "impl", "a string");
  r.calls = field<int64_t>(j, "calls", "an integer");
  r.self_ns = field<int64_t>(j, "self_ns", "an integer");
  r.total_ns = field<int64_t>(j, "total_ns", "an integer");
  r.min_ns = field<int64_t>(j, "min_ns", "an integer");
  r.max_ns = field<int64_t>(j, "max_ns", "an integer");
  r.flops = field<double>(j, "flops", "a number");
  r.bytes = field<double>(j, "bytes", "a number");
  r.bytes_allocated = field<int64_t>(j, "bytes_allocated", "an integer");
  r.first_start_ns = field<int64_t>(j, "first_start_ns", "an integer");
  return r;
}

bool is_int64(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  return v.is_number_integer();
}

const nlohmann::json& member(const nlohmann::json& j, const std::string& key) {
  static const nlohmann::json null;
  if (!j.is_object()) return null;
  const auto it = j.find(key);
  return it == j.end() ? null : *it;
}
const nlohmann::json& member(const nlohmann::json& j, const char* key) { return member(j, std::string(key)); }

}  // namespace duet::profiler
