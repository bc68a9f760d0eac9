// safetensors reading and writing, state-dict loading and the transfer-learning helpers.
#include "engine/serialize.h"
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include "engine/atomic_file.h"
#include "engine/autograd.h"
#include "engine/nn/module.h"

namespace duet {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; duet reads and writes it with plain memcpy");

namespace {
using Json = nlohmann::ordered_json;  // keeps the header's tensor order

// Header sizes beyond this are rejected as corrupt before allocating (safetensors' own limit).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    if (s == st_dtype(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  // Everything is checked and brought to host memory before the file is created.
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    DUET_CHECK(!name.empty() && name != "__metadata__",
               "save_safetensors('{}'): tensor name '{}' is reserved or empty", path, name);
    DUET_CHECK(seen.insert(name).second, "save_safetensors('{}'): tensor '{}' is given twice", path, name);
    DUET_CHECK(t.defined(), "save_safetensors('{}'): tensor '{}' is undefined", path, name);
    NoGradGuard no_grad;
    Tensor h = t.detach();
    if (h.device() != Device::cpu()) h = h.to(Device::cpu());
    h = h.contiguous();
    const uint64_t bytes = h.nbytes();
    header[name] = Json{{"dtype", st_dtype(h.dtype())}, {"shape", h.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(h);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("save_safetensors('{}'): a tensor name or metadata value is not valid UTF-8, which the "
                            "format's JSON header cannot hold ({})",
                            path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as the reference writer does
  const uint64_t n = text.size();
  unsigned char len[8];
  std::memcpy(len, &n, 8);

  write_file_atomically(path, "save_safetensors", [&](const FileSink& out) {
    out.write(len, 8);
    out.write(text.data(), text.size());
    for (const Tensor& h : host)
      if (h.numel() > 0) out.write(h.raw_data(), h.nbytes());
  });
}

// ---- reading ---------------------------------------------------------------------------------------
namespace {
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct File {
  std::FILE* f;
  explicit File(const std::string& path) : f(std::fopen(path.c_str(), "rb")) {}
  ~File() {
    if (f) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
};

Entry parse_entry(const std::string& path, const std::string& name, const Json& v) {
  const auto bad = [&](const std::string& what) {
    return Error(fmt::format("safetensors file '{}': corrupt header: tensor '{}' {}", path, name, what));
  };
  if (!v.is_object()) throw bad(fmt::format("is {}, expected an object with dtype, shape and data_offsets", v.dump()));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) throw bad(fmt::format("has no \"{}\" field", key));
  Entry e;
  e.name = name;
  if (!v["dtype"].is_string()) throw bad(fmt::format("has dtype {}, expected a string", v["dtype"].dump()));
  const std::string dt = v["dtype"].get<std::string>();
  if (!parse_st_dtype(dt, e.dtype))
    throw Error(fmt::format("safetensors file '{}': tensor '{}' has dtype {}, which duet does not support (expected "
                            "F64, F32, F16, BF16, I64, I32 or U8)",
                            path, name, dt));
  const Json& shape = v["shape"];
  if (!shape.is_array()) throw bad(fmt::format("has shape {}, expected a list of sizes", shape.dump()));
  // The byte count is computed with overflow checks: [2^32, 2^32] of U8 would wrap to 0 bytes
  // in 64 bits. Zero sizes count as 1 here, so that the strides of an empty tensor fit too.
  uint64_t product = static_cast<uint64_t>(dtype_size(e.dtype));
  for (const Json& d : shape) {
    if (!d.is_number_unsigned()) throw bad(fmt::format("has shape {}, expected non-negative integer sizes", shape.dump()));
    const uint64_t size = d.get<uint64_t>();
    if (__builtin_mul_overflow(product, std::max<uint64_t>(size, 1), &product) || product > uint64_t{INT64_MAX})
      throw bad(fmt::format("has shape {}: its byte count as {} overflows a 64-bit size", shape.dump(), dt));
    e.shape.push_back(static_cast<int64_t>(size));
  }
  const Json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw bad(fmt::format("has data_offsets {}, expected [begin, end] with non-negative integers", off.dump()));
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.end < e.begin) throw bad(fmt::format("has data_offsets [{}, {}]: end before begin", e.begin, e.end));
  const uint64_t want = static_cast<uint64_t>(numel_of(e.shape)) * dtype_size(e.dtype);
  if (e.end - e.begin != want)
    throw bad(fmt::format("has data_offsets [{}, {}] ({} bytes), but shape {} of {} needs {} bytes", e.begin, e.end,
                          e.end - e.begin, shape_str(e.shape), dt, want));
  return e;
}
}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("cannot read safetensors file '{}': {}", path, ec.message()));
  File file(path);
  if (!file.f) throw Error(fmt::format("cannot open safetensors file '{}': {}", path, errno_str()));
  if (size < 8)
    throw Error(fmt::format("safetensors file '{}' is truncated: {} bytes, too short for the 8-byte header length",
                            path, size));
  unsigned char len[8];
  if (std::fread(len, 1, 8, file.f) != 8) throw Error(fmt::format("reading safetensors file '{}' failed", path));
  uint64_t n;
  std::memcpy(&n, len, 8);
  if (n > kMaxHeaderBytes)
    throw Error(fmt::format("safetensors file '{}': corrupt header: header length {} exceeds the {} byte limit "
                            "(not a safetensors file?)",
                            path, n, kMaxHeaderBytes));
  if (n > size - 8)
    throw Error(fmt::format("safetensors file '{}' is truncated: the header claims {} bytes but only {} follow the "
                            "length field",
                            path, n, size - 8));
  std::string text(n, '\0');
  if (n > 0 && std::fread(text.data(), 1, n, file.f) != n)
    throw Error(fmt::format("reading the header of safetensors file '{}' failed", path));
  Json header;
  try {
    header = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("safetensors file '{}': corrupt header: not valid JSON ({})", path, e.what()));
  }
  if (!header.is_object())
    throw Error(fmt::format("safetensors file '{}': corrupt header: expected a JSON object, got {}", path,
                            header.type_name()));

  SafetensorsFile out;
  std::vector<Entry> entries;
  const uint64_t data_size = size - 8 - n;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        throw Error(fmt::format("safetensors file '{}': corrupt header: __metadata__ is {}, expected an object of "
                                "strings",
                                path, v.type_name()));
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string())
          throw Error(fmt::format("safetensors file '{}': corrupt header: __metadata__ value of '{}' is {}, expected "
                                  "a string",
                                  path, k, mv.dump()));
        out.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(path, name, v);
    if (e.end > data_size)
      throw Error(fmt::format("safetensors file '{}': tensor '{}' has data_offsets [{}, {}], beyond the {} bytes of "
                              "data in the file (truncated or corrupt)",
                              path, name, e.begin, e.end, data_size));
    entries.push_back(std::move(e));
  }
  // No two tensors may share bytes: in begin order, each non-empty range starts at or after the
  // furthest end seen so far.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  const Entry* furthest = nullptr;
  for (const Entry* e : by_offset) {
    if (furthest && e->begin < furthest->end)
      throw Error(fmt::format("safetensors file '{}': corrupt header: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap",
                              path, furthest->name, furthest->begin, furthest->end, e->name, e->begin, e->end));
    if (!furthest || e->end > furthest->end) furthest = e;
  }

  const uint64_t data_start = 8 + n;
  for (const Entry& e : entries) {
    Tensor t;
    {
      MemTagGuard tag(MemTag::parameter);
      t = Tensor::empty(e.shape, TensorOptions(e.dtype));
    }
    const uint64_t bytes = e.end - e.begin;
    if (bytes > 0) {
      if (std::fseek(file.f, static_cast<long>(data_start + e.begin), SEEK_SET) != 0 ||
          std::fread(t.raw_data(), 1, bytes, file.f) != bytes)
        throw Error(fmt::format("safetensors file '{}': reading tensor '{}' ({} bytes at offset {}) failed", path,
                                e.name, bytes, data_start + e.begin));
    }
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

NamedTensors load_safetensors(const std::string& path) { return read_safetensors(path).tensors; }

// ---- modules ---------------------------------------------------------------------------------------
NamedTensors state_dict(const nn::Module& m) {
  NamedTensors out = m.named_parameters();
  for (auto& nb : m.named_buffers()) out.push_back(std::move(nb));
  return out;
}

void save_state_dict(const std::string& path, const nn::Module& m, const Metadata& metadata) {
  save_safetensors(path, state_dict(m), metadata);
}

bool has_prefix(const std::string& name, const std::string& prefix) {
  if (prefix.empty()) return true;
  if (name.size() < prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.size() == prefix.size() || prefix.back() == '.' || name[prefix.size()] == '.';
}

namespace {
bool ignored(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (has_prefix(name, p)) return true;
  return false;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Lists at most `limit` items of a problem category, then how many more there are.
void append_list(std::string& msg, const char* title, const std::vector<std::string>& items, size_t limit = 20) {
  if (items.empty()) return;
  msg += fmt::format("\n  {} ({}):", title, items.size());
  for (size_t i = 0; i < items.size() && i < limit; ++i) msg += "\n    " + items[i];
  if (items.size() > limit) msg += fmt::format("\n    ... and {} more", items.size() - limit);
}
}  // namespace

LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, const LoadOptions& o) {
  for (const std::string& p : o.ignore_prefixes)
    DUET_CHECK(!p.empty(), "load_state_dict: an empty ignore prefix would ignore every tensor; expected module paths "
                           "such as \"fc\" or \"heads.head\"");
  LoadReport report;
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> duplicates;
  for (const auto& [name, t] : tensors) {
    if (!given.emplace(name, &t).second) duplicates.push_back(fmt::format("'{}'", name));
  }
  std::vector<std::string> missing, unexpected, bad_shape, bad_dtype;
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source), filled only when all is well
  std::map<std::string, bool> in_model;
  for (const auto& [name, dst] : state_dict(m)) {
    in_model[name] = true;
    if (ignored(name, o.ignore_prefixes)) {
      report.ignored.push_back(name);
      continue;
    }
    const auto it = given.find(name);
    if (it == given.end()) {
      report.missing.push_back(name);
      // Older checkpoints have no num_batches_tracked; torch fills it in, so does duet (it keeps its value).
      if (!ends_with(name, ".num_batches_tracked") && name != "num_batches_tracked")
        missing.push_back(fmt::format("'{}' (the model's is {} {})", name, shape_str(dst.shape()), dtype_name(dst.dtype())));
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined()) {
      bad_shape.push_back(fmt::format("'{}': the given tensor is undefined, the model expects {}", name, shape_str(dst.shape())));
      continue;
    }
    if (src.shape() != dst.shape())
      bad_shape.push_back(fmt::format("'{}': given shape {}, the model expects {}", name, shape_str(src.shape()),
                                      shape_str(dst.shape())));
    const bool fs = is_floating(src.dtype()), fd = is_floating(dst.dtype());
    if (fs != fd) {
      bad_dtype.push_back(fmt::format("'{}': given dtype {}, the model expects {} ({} and {} do not convert)", name,
                                      st_dtype(src.dtype()), dtype_name(dst.dtype()),
                                      fs ? "floating point" : "integer", fd ? "floating point" : "integer"));
    } else if (src.dtype() != dst.dtype()) {
      report.converted.push_back(fmt::format("{}: {} -> {}", name, st_dtype(src.dtype()), dtype_name(dst.dtype())));
    }
    copies.emplace_back(dst, &src);
  }
  for (const auto& [name, t] : tensors) {
    if (in_model.count(name)) continue;
    if (ignored(name, o.ignore_prefixes)) {
      report.ignored.push_back(name);
      continue;
    }
    report.unexpected.push_back(name);
    unexpected.push_back(fmt::format("'{}' ({})", name, t.defined() ? shape_str(t.shape()) : "undefined"));
  }
  if (!o.strict) {
    missing.clear();
    unexpected.clear();
  }
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty() || !bad_dtype.empty() || !duplicates.empty()) {
    const size_t problems = missing.size() + unexpected.size() + bad_shape.size() + bad_dtype.size() + duplicates.size();
    std::string msg = fmt::format("load_state_dict into {}: {} problem{}; nothing was loaded, the model is unchanged",
                                  m.type_name(), problems, problems == 1 ? "" : "s");
    append_list(msg, "missing from the given tensors", missing);
    append_list(msg, "not in the model", unexpected);
    append_list(msg, "shape mismatch", bad_shape);
    append_list(msg, "dtype mismatch", bad_dtype);
    append_list(msg, "given more than once", duplicates);
    if (!unexpected.empty() || !missing.empty())
      msg += "\n  (strict loading; pass strict=false or ignore_prefixes to skip names, e.g. a classifier head)";
    throw Error(msg);
  }
  NoGradGuard no_grad;
  for (const auto& [dst, src] : copies) dst.copy_(*src);  // casts dtype and crosses devices
  for (const auto& [name, dst] : state_dict(m))
    if (!ignored(name, o.ignore_prefixes) && given.count(name)) report.loaded.push_back(name);
  return report;
}

LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, bool strict) {
  return load_state_dict(m, tensors, LoadOptions{.strict = strict});
}

LoadReport load_backbone(nn::Module& m, const std::string& path, const std::string& head_prefix) {
  DUET_CHECK(!head_prefix.empty(), "load_backbone('{}'): head_prefix is empty, expected the head's module path (e.g. "
                                   "\"fc\", \"classifier\", \"heads\")", path);
  return load_state_dict(m, load_safetensors(path), LoadOptions{.strict = true, .ignore_prefixes = {head_prefix}});
}

int64_t freeze_backbone(nn::Module& m, const std::string& head_prefix) {
  return freeze_backbone(m, std::vector<std::string>{head_prefix});
}

int64_t freeze_backbone(nn::Module& m, const std::vector<std::string>& head_prefixes) {
  const auto params = m.named_parameters();
  const auto in_head = [&](const std::string& name) {
    for (const std::string& h : head_prefixes)
      if (!h.empty() && has_prefix(name, h)) return true;
    return false;
  };
  for (const std::string& h : head_prefixes) {
    bool any = false;
    for (const auto& [name, p] : params) any = any || (!h.empty() && has_prefix(name, h));
    if (any) continue;
    std::string children;
    for (const auto& [n, c] : m.children()) children += (children.empty() ? "" : ", ") + n;
    throw Error(fmt::format("freeze_backbone: no parameter lies under head prefix '{}' (the model's top-level modules "
                            "are: {})",
                            h, children));
  }
  int64_t frozen = 0;
  for (const auto& [name, p] : params) {
    Tensor t = p;
    const bool head = in_head(name);
    t.set_requires_grad(head);
    if (!head) {
      t.zero_grad();
      frozen += p.numel();
    }
  }
  return frozen;
}

}  // namespace duet
