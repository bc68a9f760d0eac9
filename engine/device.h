// Device: where memory lives (cpu, cuda:N). Backend: who computes on it. The CPU device runs the
// `cpu` backend (oneDNN) by default and can be switched to `reference` (plain loops), so the
// naive and the optimised version of every op can be compared inside one program.
#pragma once
#include <cstdint>
#include <string>

namespace duet {

enum class DeviceType : uint8_t { cpu, cuda };
enum class Backend : uint8_t { reference, cpu, cuda };
constexpr int kNumBackends = 3;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1"; throws duet::Error
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

const char* backend_name(Backend b);
Backend backend_from_name(const std::string& s);  // throws duet::Error

// The backend that computes ops on tensors of this device. For cpu it is settable.
Backend default_backend(DeviceType t);
void set_default_backend(DeviceType t, Backend b);  // throws if b cannot run on t or is absent

// Scoped switch of the CPU backend (tests and `duet compare` use it).
class BackendGuard {
public:
  BackendGuard(DeviceType t, Backend b);
  ~BackendGuard();
  BackendGuard(const BackendGuard&) = delete;
  BackendGuard& operator=(const BackendGuard&) = delete;
private:
  DeviceType type_;
  Backend prev_;
};

}  // namespace duet
