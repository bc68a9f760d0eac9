// Op records: the events of a capture summed per distinct (op, phase, backend, dtype, device,
// input shapes, module path, implementation). That is the finest grain a report keeps: every
// table (per op, per op and shape, per layer) is a regrouping of these rows, so `duet report`
// can print any view from a saved JSON without the raw events.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"

namespace duet::profiler {

struct OpRecord {
  std::string name, phase, backend, dtype, device, shapes, scope, impl;
  int64_t calls = 0;
  int64_t self_ns = 0, total_ns = 0, min_ns = 0, max_ns = 0;  // min/max of one call's total
  double flops = 0, bytes = 0;
  int64_t bytes_allocated = 0;
  int64_t first_start_ns = 0;  // when the first call began: orders layers in execution order
};

// Sums `ops` (with `self`, their self times from self_times()) into records, in order of first
// appearance.
std::vector<OpRecord> aggregate(const std::vector<OpEvent>& ops, const std::vector<int64_t>& self);

nlohmann::json to_json(const OpRecord& r);
// Throws duet::Error naming the missing or mistyped field.
OpRecord op_record_from_json(const nlohmann::json& j);

// j[key] for code that reads a saved report: null when j is not an object or has no such key.
// (nlohmann's const operator[] is undefined behaviour for a missing key, and a report read
// from a file may lack any key.)
const nlohmann::json& member(const nlohmann::json& j, const char* key);
const nlohmann::json& member(const nlohmann::json& j, const std::string& key);
// Whether v is an integer that fits int64_t. nlohmann's get<int64_t>() converts a float (7e111) or an
// unsigned beyond 2^63 with a plain cast, which is undefined: report readers check this first.
bool is_int64(const nlohmann::json& v);

}  // namespace duet::profiler
