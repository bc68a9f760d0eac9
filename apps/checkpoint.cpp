// Checkpoint files: naming scheme and metadata encoding (every value a string, as safetensors
// metadata requires; 64-bit integers as decimal text so nothing is rounded through a double).
#include "apps/checkpoint.h"
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
    size_t used = 0;
    const uint64_t v = std::stoull(it->second, &used);
    DUET_CHECK(used == it->second.size(), "bad number");
    return v;
  } catch (const std::exception&) {
    throw Error(fmt::format("checkpoint '{}': metadata '{}' is '{}'; expected a non-negative integer", path, key,
                            it->second));
  }
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
                {"config", s.config.dump()},
                {"metrics", s.metrics.dump()}};
  if (!s.grad_scaler.is_null()) meta.emplace("grad_scaler", s.grad_scaler.dump());
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
  c.state.epoch = static_cast<int64_t>(parse_u64(m, "epoch", path));
  c.state.step = static_cast<int64_t>(parse_u64(m, "step", path));
  c.state.generator_seed = parse_u64(m, "generator_seed", path);
  c.state.generator_offset = parse_u64(m, "generator_offset", path);
  try {
    c.state.config = nlohmann::json::parse(m.at("config"));
    if (m.count("metrics")) c.state.metrics = nlohmann::json::parse(m.at("metrics"));
    if (m.count("grad_scaler")) c.state.grad_scaler = nlohmann::json::parse(m.at("grad_scaler"));
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint '{}': its configuration is not valid JSON ({})", path, e.what()));
  }
  return c;
}

}  // namespace duet::app
