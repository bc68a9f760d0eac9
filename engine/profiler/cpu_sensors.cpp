// CPU temperature and power for the telemetry thread, where Linux exposes them in sysfs: the
// hottest CPU sensor (hwmon drivers k10temp, zenpower, coretemp, cpu_thermal; else the thermal
// zones typed x86_pkg_temp or cpu*) in degrees C, and the CPU packages' power from RAPL's energy
// counters (powercap intel-rapl:N, which AMD Zen CPUs expose too; often readable by root only) in W.
// A machine without them (most virtual machines) gets no source at all, so its reports keep the
// /proc channels only and say nothing false.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include "engine/profiler/events.h"
#include "engine/profiler/telemetry.h"

namespace duet::profiler {

namespace {

namespace fs = std::filesystem;

std::optional<double> read_number(const fs::path& p) {
  std::ifstream f(p);
  double v = 0;
  if (f >> v) return v;
  return std::nullopt;
}

std::string read_word(const fs::path& p) {
  std::ifstream f(p);
  std::string w;
  f >> w;
  return w;
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class CpuSensorSource final : public TelemetrySource {
public:
  CpuSensorSource(std::vector<fs::path> temps, std::vector<fs::path> energy, std::vector<double> ranges)
      : temps_(std::move(temps)), energy_(std::move(energy)), ranges_(std::move(ranges)), last_(energy_.size()) {}
  std::string name() const override { return "cpu_sensors"; }
  std::vector<Reading> read() override {
    std::vector<Reading> out;
    if (!temps_.empty()) {
      std::optional<double> hottest;
      for (const fs::path& p : temps_)
        if (const auto v = read_number(p)) hottest = std::max(hottest.value_or(*v / 1000.0), *v / 1000.0);
      out.push_back({"cpu_temperature_c", "C", hottest});
    }
    if (!energy_.empty()) {
      const int64_t t = now_ns();
      std::vector<double> now(energy_.size());
      bool ok = true;
      for (size_t i = 0; i < energy_.size(); ++i) {
        const auto e = read_number(energy_[i]);
        ok = ok && e.has_value();
        if (e) now[i] = *e;
      }
      std::optional<double> watts;
      if (ok && have_last_ && t > last_t_) {
        double joules = 0;
        for (size_t i = 0; i < now.size(); ++i) {
          double d = now[i] - last_[i];
          if (d < 0) d += ranges_[i];  // the counter wrapped at max_energy_range_uj
          joules += d * 1e-6;
        }
        watts = joules / (static_cast<double>(t - last_t_) * 1e-9);
      }
      have_last_ = ok;
      if (ok) {
        last_ = now;
        last_t_ = t;
      }
      out.push_back({"cpu_power_w", "W", watts});  // the first reading is absent: a rate needs two
    }
    return out;
  }

private:
  std::vector<fs::path> temps_, energy_;
  std::vector<double> ranges_, last_;
  bool have_last_ = false;
  int64_t last_t_ = 0;
};

}  // namespace

std::unique_ptr<TelemetrySource> make_cpu_sensor_source(const std::string& sysfs_root) {
  const fs::path root(sysfs_root);
  std::vector<fs::path> temps, energy;
  std::vector<double> ranges;
  for (const fs::path& dir : sorted_entries(root / "class" / "hwmon")) {
    const std::string name = read_word(dir / "name");
    if (name != "k10temp" && name != "zenpower" && name != "coretemp" && name != "cpu_thermal") continue;
    for (const fs::path& f : sorted_entries(dir)) {
      const std::string file = f.filename().string();
      if (file.rfind("temp", 0) == 0 && file.size() > 6 && file.substr(file.size() - 6) == "_input" && read_number(f))
        temps.push_back(f);
    }
  }
  if (temps.empty()) {  // no CPU hwmon driver: the thermal zones that are the CPU's
    for (const fs::path& dir : sorted_entries(root / "class" / "thermal")) {
      if (dir.filename().string().rfind("thermal_zone", 0) != 0) continue;
      const std::string type = read_word(dir / "type");
      if ((type == "x86_pkg_temp" || type.rfind("cpu", 0) == 0) && read_number(dir / "temp"))
        temps.push_back(dir / "temp");
    }
  }
  for (const fs::path& dir : sorted_entries(root / "class" / "powercap")) {
    const std::string d = dir.filename().string();
    // packages only (intel-rapl:0), not their sub-domains (intel-rapl:0:0), which they already include
    if (d.rfind("intel-rapl:", 0) != 0 || d.find(':', 11) != std::string::npos) continue;
    if (!read_number(dir / "energy_uj")) continue;  // absent, or readable by root only
    energy.push_back(dir / "energy_uj");
    ranges.push_back(read_number(dir / "max_energy_range_uj").value_or(0.0));
  }
  if (temps.empty() && energy.empty()) return nullptr;
  return std::make_unique<CpuSensorSource>(std::move(temps), std::move(energy), std::move(ranges));
}

}  // namespace duet::profiler
