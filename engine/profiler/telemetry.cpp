// The telemetry sampler thread and its registered sources (see telemetry.h).
#include "engine/profiler/telemetry.h"
#include <chrono>
#include <map>
#include "engine/error.h"
#include "engine/profiler/events.h"
#include "engine/profiler/proc.h"

namespace duet::profiler {

namespace {

class ProcSource final : public TelemetrySource {
public:
  std::string name() const override { return "proc"; }
  std::vector<Reading> read() override {
    const int64_t t = now_ns();
    const std::optional<double> cpu_s = read_process_cpu_seconds();
    const std::optional<MachineCpuTicks> ticks = read_machine_cpu_ticks();
    std::optional<double> proc_pct, machine_pct;
    if (cpu_s && last_cpu_s_ && t > last_t_)
      proc_pct = 100.0 * (*cpu_s - *last_cpu_s_) / (static_cast<double>(t - last_t_) * 1e-9);
    if (ticks && last_ticks_ && ticks->total > last_ticks_->total)
      machine_pct = 100.0 * static_cast<double>(ticks->busy - last_ticks_->busy) /
                    static_cast<double>(ticks->total - last_ticks_->total);
    last_t_ = t;
    last_cpu_s_ = cpu_s;
    last_ticks_ = ticks;
    const ProcessMemory m = read_process_memory();
    std::optional<double> rss;
    if (m.rss_bytes) rss = static_cast<double>(*m.rss_bytes);
    return {{"process_cpu_pct", "%", proc_pct}, {"machine_cpu_pct", "%", machine_pct}, {"rss_bytes", "bytes", rss}};
  }

private:
  int64_t last_t_ = 0;
  std::optional<double> last_cpu_s_;
  std::optional<MachineCpuTicks> last_ticks_;
};

std::mutex g_factories_mu;
std::map<std::string, TelemetrySourceFactory>& factories() {
  static std::map<std::string, TelemetrySourceFactory> f;
  return f;
}

std::mutex g_global_mu;
std::unique_ptr<TelemetrySampler>& global_sampler() {
  static std::unique_ptr<TelemetrySampler> s;
  return s;
}
TelemetryLog& last_global_log() {
  static TelemetryLog l;
  return l;
}

}  // namespace

std::unique_ptr<TelemetrySource> make_proc_telemetry_source() { return std::make_unique<ProcSource>(); }

void register_telemetry_source(const std::string& name, TelemetrySourceFactory factory) {
  std::lock_guard<std::mutex> lk(g_factories_mu);
  factories()[name] = std::move(factory);
}

TelemetrySampler::TelemetrySampler(int interval_ms, std::vector<std::unique_ptr<TelemetrySource>> extra)
    : interval_ms_(interval_ms) {
  DUET_CHECK(interval_ms >= 1, "telemetry interval is {} ms: expected at least 1 ms", interval_ms);
  sources_.push_back(make_proc_telemetry_source());
  try {
    if (auto s = make_cpu_sensor_source()) sources_.push_back(std::move(s));
  } catch (...) {  // unreadable sysfs: no sensor channels
  }
  {
    std::lock_guard<std::mutex> lk(g_factories_mu);
    for (auto& [name, make] : factories()) {
      try {
        if (auto s = make()) sources_.push_back(std::move(s));
      } catch (...) {  // a source that cannot start is simply absent
      }
    }
  }
  for (auto& s : extra) sources_.push_back(std::move(s));
  log_.interval_ms = interval_ms;
}

TelemetrySampler::~TelemetrySampler() { stop(); }

void TelemetrySampler::sample_once() {
  TelemetrySample s;
  s.t_ns = now_ns();
  std::vector<TelemetryChannel> channels;
  for (auto& src : sources_) {
    std::vector<Reading> rs;
    try {
      rs = src->read();
    } catch (...) {
      rs.clear();
    }
    for (Reading& r : rs) {
      channels.push_back({r.name, r.unit, src->name()});
      s.values.push_back(r.value);
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  // Channels are fixed by the first sample; a source that changes its readings is matched by name.
  if (log_.channels.empty()) {
    log_.channels = channels;
  } else if (channels.size() != log_.channels.size()) {
    std::vector<std::optional<double>> aligned(log_.channels.size());
    for (size_t i = 0; i < channels.size(); ++i)
      for (size_t j = 0; j < log_.channels.size(); ++j)
        if (log_.channels[j].name == channels[i].name) aligned[j] = s.values[i];
    s.values = std::move(aligned);
  }
  log_.samples.push_back(std::move(s));
}

void TelemetrySampler::run() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    lk.unlock();
    sample_once();
    lk.lock();
    cv_.wait_for(lk, std::chrono::milliseconds(interval_ms_), [&] { return stop_; });
  }
}

void TelemetrySampler::start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

void TelemetrySampler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  sample_once();
}

TelemetryLog TelemetrySampler::log() const {
  std::lock_guard<std::mutex> lk(mu_);
  return log_;
}

void start_telemetry(int interval_ms) {
  std::lock_guard<std::mutex> lk(g_global_mu);
  if (global_sampler()) global_sampler()->stop();
  global_sampler() = std::make_unique<TelemetrySampler>(interval_ms);
  global_sampler()->start();
}

void stop_telemetry() {
  std::lock_guard<std::mutex> lk(g_global_mu);
  if (!global_sampler()) return;
  global_sampler()->stop();
  last_global_log() = global_sampler()->log();
  global_sampler().reset();
}

TelemetryLog telemetry_log() {
  std::lock_guard<std::mutex> lk(g_global_mu);
  if (global_sampler()) return global_sampler()->log();
  return last_global_log();
}

}  // namespace duet::profiler
