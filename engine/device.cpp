#include "engine/device.h"
#include <atomic>
#include "engine/backend.h"
#include "engine/error.h"

namespace duet {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    DUET_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos,
               "bad device '{}': expected 'cpu', 'cuda' or 'cuda:N' with N a device index", s);
    return cuda(std::stoi(idx));
  }
  throw Error(fmt::format("bad device '{}': expected 'cpu', 'cuda' or 'cuda:N'", s));
}

std::string Device::str() const {
  return type == DeviceType::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

Backend backend_from_name(const std::string& s) {
  for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda})
    if (s == backend_name(b)) return b;
  throw Error(fmt::format("unknown backend '{}': expected reference, cpu or cuda", s));
}

namespace {
// The CPU device defaults to the oneDNN backend when it was built, else to the reference loops.
std::atomic<Backend>& cpu_backend_slot() {
  static std::atomic<Backend> b{backend_available(Backend::cpu) ? Backend::cpu : Backend::reference};
  return b;
}
}  // namespace

Backend default_backend(DeviceType t) {
  return t == DeviceType::cpu ? cpu_backend_slot().load(std::memory_order_relaxed) : Backend::cuda;
}

void set_default_backend(DeviceType t, Backend b) {
  DUET_CHECK(backend_available(b), "backend '{}' is not available in this build (available: {})",
             backend_name(b), available_backends_str());
  if (t == DeviceType::cpu) {
    DUET_CHECK(b != Backend::cuda, "backend 'cuda' cannot compute on device 'cpu': expected reference or cpu");
    cpu_backend_slot().store(b);
  } else {
    DUET_CHECK(b == Backend::cuda, "backend '{}' cannot compute on a cuda device: expected cuda", backend_name(b));
  }
}

BackendGuard::BackendGuard(DeviceType t, Backend b) : type_(t), prev_(default_backend(t)) {
  set_default_backend(t, b);
}
BackendGuard::~BackendGuard() {
  if (type_ == DeviceType::cpu) cpu_backend_slot().store(prev_);
}

}  // namespace duet
