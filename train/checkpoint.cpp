// Checkpoint files: naming scheme and metadata encoding (every value a string, as safetensors
// metadata requires; 64-bit integers as decimal text so nothing is rounded through a double).
#include "train/checkpoint.h"
#include "train/output_check.h"
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/optim/optimizer.h"

namespace duet::app {

namespace {
const std::string kModel = "model.", kOptim = "optimizer.";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

uint64_t parse_u64(const Metadata& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  DUET_CHECK(it != m.end(), "checkpoint '{}' has no '{}' in its metadata; expected a file written by duet train", path,
             key);
  try {
    // stoull would take "-1" as 2^64 - 1 and skip leading spaces: only digits are a count.
    DUET_CHECK(!it->second.empty() && it->second.find_first_not_of("0123456789") == std::string::npos, "not digits");
    size_t used = 0;
    const uint64_t v = std::stoull(it->second, &used);
    DUET_CHECK(used == it->second.size(), "bad number");
    return v;
  } catch (const std::exception&) {
    throw Error(fmt::format("checkpoint '{}': metadata '{}' is '{}'; expected a non-negative integer", path, key,
                            it->second));
  }
}
// Epochs and steps are signed in the trainer; a value of 2^63 or more is a corrupt file, not a
// run that long.
int64_t parse_count(const Metadata& m, const std::string& key, const std::string& path) {
  const uint64_t v = parse_u64(m, key, path);
  DUET_CHECK(v <= static_cast<uint64_t>(INT64_MAX), "checkpoint '{}': metadata '{}' is {}; expected at most {}", path,
             key, v, INT64_MAX);
  return static_cast<int64_t>(v);
}
}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointState& s) {
  NamedTensors tensors;
  for (auto& [name, t] : state_dict(model)) tensors.emplace_back(kModel + name, t);
  if (optimizer)
    for (auto& [name, t] : optimizer->state_tensors()) tensors.emplace_back(kOptim + name, t);
  Metadata meta{{"format", kCheckpointFormat},
                {"epoch", std::to_string(s.epoch)},
                {"step", std::to_string(s.step)},
                {"generator_seed", std::to_string(s.generator_seed)},
                {"generator_offset", std::to_string(s.generator_offset)},
                {"config", dump_lenient(s.config)},
                {"metrics", dump_lenient(s.metrics)}};
  if (!s.grad_scaler.is_null()) meta.emplace("grad_scaler", dump_lenient(s.grad_scaler));
  if (!s.partial_epoch.is_null()) meta.emplace("partial_epoch", dump_lenient(s.partial_epoch));
  save_safetensors(path, tensors, meta);
}

bool is_checkpoint(const SafetensorsFile& f) {
  const auto it = f.metadata.find("format");
  return it != f.metadata.end() && it->second == kCheckpointFormat;
}

NamedTensors model_tensors(const SafetensorsFile& f) {
  if (!is_checkpoint(f)) return f.tensors;
  NamedTensors out;
  for (const auto& [name, t] : f.tensors)
    if (starts_with(name, kModel)) out.emplace_back(name.substr(kModel.size()), t);
  return out;
}

Checkpoint read_checkpoint(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  DUET_CHECK(is_checkpoint(f),
             "'{}' is a weights file, not a duet checkpoint (its metadata has no format '{}'); use it with --init-from, "
             "or give a checkpoint written by `duet train --checkpoint FILE`",
             path, kCheckpointFormat);
  Checkpoint c;
  for (auto& [name, t] : f.tensors) {
    if (starts_with(name, kModel))
      c.model.emplace_back(name.substr(kModel.size()), t);
    else if (starts_with(name, kOptim))
      c.optimizer.emplace_back(name.substr(kOptim.size()), t);
    else
      throw Error(fmt::format("checkpoint '{}': tensor '{}' is neither 'model.*' nor 'optimizer.*'", path, name));
  }
  const Metadata& m = f.metadata;
  c.state.epoch = parse_count(m, "epoch", path);
  c.state.step = parse_count(m, "step", path);
  c.state.generator_seed = parse_u64(m, "generator_seed", path);
  c.state.generator_offset = parse_u64(m, "generator_offset", path);
  DUET_CHECK(m.count("config"), "checkpoint '{}' has no 'config' in its metadata; expected a file written by duet train",
             path);
  const auto parse = [&](const std::string& key, bool object) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(m.at(key));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint '{}': metadata '{}' is not valid JSON ({})", path, key, e.what()));
    }
    DUET_CHECK(!object || j.is_object() || j.is_null(), "checkpoint '{}': metadata '{}' is {}; expected a JSON object", path, key,
               j.type_name());
    return j;
  };
  c.state.config = parse("config", true);
  if (m.count("metrics")) c.state.metrics = parse("metrics", false);
  if (!c.state.metrics.is_null() && !c.state.metrics.is_object())
    throw Error(fmt::format("checkpoint '{}': metadata 'metrics' is {}; expected a JSON object", path,
                            c.state.metrics.type_name()));
  if (m.count("grad_scaler")) c.state.grad_scaler = parse("grad_scaler", true);
  if (m.count("partial_epoch")) c.state.partial_epoch = parse("partial_epoch", true);
  return c;
}

}  // namespace duet::app
