// Telemetry: a background thread that samples, every N ms, this process's CPU use (utime+stime
// over wall time, /proc/self/stat), the machine's (/proc/stat) and resident memory, the CPU's
// temperature and power where sysfs exposes them, plus whatever registered sources add (GPU
// utilisation, memory, power through NVML, from the CUDA backend).
// A reading a source cannot take is absent (null in reports), never 0.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace duet::profiler {

struct Reading {
  std::string name;  // "process_cpu_pct", "gpu0.util_pct": stable across calls of one source
  std::string unit;  // "%", "bytes", "W", "C", "MHz"
  std::optional<double> value;
};

class TelemetrySource {
public:
  virtual ~TelemetrySource() = default;
  virtual std::string name() const = 0;
  // Called from the sampler thread only; must not throw. The first call may return absent rates
  // (a rate needs two readings).
  virtual std::vector<Reading> read() = 0;
};

// CPU utilisation of the process (100% = one core busy) and of the machine (100% = all cores
// busy), and RSS.
std::unique_ptr<TelemetrySource> make_proc_telemetry_source();

// The CPU's temperature (`cpu_temperature_c`: the hottest of the hwmon CPU sensors, k10temp,
// zenpower, coretemp, else the CPU thermal zones) and package power (`cpu_power_w`, from the RAPL
// energy counters in powercap) under `sysfs_root`; null when the machine exposes neither (most
// virtual machines), so that no channel is made for readings that can never come.
std::unique_ptr<TelemetrySource> make_cpu_sensor_source(const std::string& sysfs_root = "/sys");

// Sources made for every sampler started after the call (the CUDA backend registers NVML here).
using TelemetrySourceFactory = std::function<std::unique_ptr<TelemetrySource>()>;
void register_telemetry_source(const std::string& name, TelemetrySourceFactory factory);

struct TelemetrySample {
  int64_t t_ns = 0;  // profiler::now_ns() clock, comparable with op and step times
  std::vector<std::optional<double>> values;  // one per channel, in TelemetryLog::channels order
};
struct TelemetryChannel {
  std::string name, unit, source;
};
struct TelemetryLog {
  int interval_ms = 0;
  std::vector<TelemetryChannel> channels;
  std::vector<TelemetrySample> samples;
};

class TelemetrySampler {
public:
  // The proc source, the CPU sensors where present, every registered source; `extra` for tests.
  explicit TelemetrySampler(int interval_ms, std::vector<std::unique_ptr<TelemetrySource>> extra = {});
  ~TelemetrySampler();  // stops the thread
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;
  void start();
  void stop();  // takes a last sample, joins
  TelemetryLog log() const;

private:
  void sample_once();
  void run();
  int interval_ms_;
  std::vector<std::unique_ptr<TelemetrySource>> sources_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  TelemetryLog log_;
};

// The process-wide sampler that profiling sessions use (engine/profiler/session.h).
void start_telemetry(int interval_ms);
void stop_telemetry();
// The samples of the latest (or running) global sampler; empty when none ran.
TelemetryLog telemetry_log();

}  // namespace duet::profiler
