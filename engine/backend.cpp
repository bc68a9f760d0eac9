#include "engine/backend.h"
#include <array>

#pragma GCC diagnostic ignored "-Wunused-parameter"  // default bodies ignore their arguments

namespace duet {

namespace {
const char* const kOpNames[] = {
#define DUET_OP(name, params, ...) #name,
#include "engine/ops.def"
#undef DUET_OP
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOps, "every op in ops.def needs a name");
}  // namespace

const char* op_name(OpId op) { return kOpNames[static_cast<int>(op)]; }

// ---- the backend table ---------------------------------------------------------------------------
namespace {
constexpr Backend kAllBackends[] = {Backend::reference, Backend::cpu, Backend::cuda};
static_assert(std::size(kAllBackends) == kNumBackends, "every Backend in the table's order");

struct DeviceEntry {
  Allocator& (*allocator)(int) = nullptr;
  int (*count)() = nullptr;
};

// Function-local, so the table exists before the first registration whatever the order in which
// static initialisers run.
std::array<BackendImpl& (*)(), kNumBackends>& backend_table() {
  static std::array<BackendImpl& (*)(), kNumBackends> table{};
  return table;
}
DeviceEntry& cuda_device_entry() {
  static DeviceEntry e;
  return e;
}
}  // namespace

void register_backend(Backend b, BackendImpl& (*get)()) { backend_table()[static_cast<size_t>(b)] = get; }

void register_device_type(DeviceType t, Allocator& (*allocator)(int), int (*count)()) {
  DUET_CHECK(t == DeviceType::cuda, "register_device_type: only cuda devices are registered; the host is built in");
  cuda_device_entry() = {allocator, count};
}

bool backend_available(Backend b) { return backend_table()[static_cast<size_t>(b)] != nullptr; }

std::string available_backends_str() {
  std::string s;
  for (Backend b : kAllBackends)
    if (backend_available(b)) s += (s.empty() ? "" : ", ") + std::string(backend_name(b));
  return s;
}

BackendImpl& backend(Backend b) {
  if (auto get = backend_table()[static_cast<size_t>(b)]) return get();
  throw Error(fmt::format("backend '{}' is not built into this binary (available: {}); rebuild with {}", backend_name(b),
                          available_backends_str(), b == Backend::cuda ? "-DDUET_CUDA=ON" : "oneDNN (libdnnl-dev)"));
}

Allocator& device_allocator(Device d) {
  if (d.type == DeviceType::cpu) return cpu_allocator();
  if (cuda_device_entry().allocator) return cuda_device_entry().allocator(d.index);
  throw Error(fmt::format("device '{}' needs the cuda backend, which is not built into this binary (available: {})",
                          d.str(), available_backends_str()));
}

int device_count(DeviceType t) {
  if (t == DeviceType::cpu) return 1;
  return cuda_device_entry().count ? cuda_device_entry().count() : 0;
}

DTypeSupport BackendImpl::support(OpId, DType) const { return {}; }

void BackendImpl::not_implemented(OpId op) const {
  throw Error(fmt::format("{} is not implemented on backend '{}' (available backends: {})", op_name(op), name(),
                          available_backends_str()));
}

// Default bodies: every op throws until a backend overrides it.
#define DUET_OP(name, params, ...) \
  void BackendImpl::name params { not_implemented(OpId::name); }
#include "engine/ops.def"
#undef DUET_OP

}  // namespace duet
