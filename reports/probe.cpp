// `duet probe`'s measurements (see probe.h): GEMM and copy ceilings, and the probe file.
#include "reports/probe.h"
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <omp.h>
#include <fmt/format.h>
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/hash.h"
#include "engine/profiler/events.h"
#include "reports/files.h"
#include "engine/profiler/machine.h"
#include "reports/text_table.h"
#include "engine/tensor.h"

namespace duet::profiler {

namespace fs = std::filesystem;
constexpr const char* kProbeSchema = "duet.probe/1";

namespace {

// Best of `repeats` runs after one warm-up, in ns; sync() waits for queued device work.
template <class F, class S>
double best_ns(int repeats, F&& f, S&& sync) {
  f();
  sync();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const int64_t t0 = now_ns();
    f();
    sync();
    best = std::min(best, static_cast<double>(now_ns() - t0));
  }
  return best;
}

// Restores the recording state and thread count however the probe ends.
struct ProbeState {
  bool was_enabled = enabled();
  int threads = omp_get_max_threads();
  ProbeState() { enable(false); }
  ~ProbeState() {
    enable(was_enabled);
    omp_set_num_threads(threads);
  }
};

}  // namespace

ProbeResult run_probe(const ProbeOptions& o) {
  DUET_CHECK(o.gemm_size >= 16, "probe: GEMM size {} is too small: expected at least 16", o.gemm_size);
  DUET_CHECK(o.copy_mib >= 1, "probe: copy buffer of {} MiB: expected at least 1 MiB", o.copy_mib);
  DUET_CHECK(o.repeats >= 1, "probe: {} repeats: expected at least 1", o.repeats);
  const Device dev = Device::parse(o.device);
  const Backend be = o.backend.empty() ? default_backend(dev.type) : backend_from_name(o.backend);
  ProbeState restore;
  std::optional<BackendGuard> guard;
  if (dev.type == DeviceType::cpu) guard.emplace(DeviceType::cpu, be);
  DUET_CHECK(default_backend(dev.type) == be, "probe: backend '{}' cannot run on device {}", backend_name(be), dev.str());

  ProbeResult r;
  r.machine = machine_info();
  r.device = dev.str();
  r.backend = backend_name(be);
  r.created = utc_now();
  r.gemm_size = o.gemm_size;
  r.repeats = o.repeats;
  const int64_t copy_elems = o.copy_mib * 1024 * 1024 / 4;
  r.copy_bytes = copy_elems * 4;

  std::vector<int> threads = o.threads;
  if (dev.type != DeviceType::cpu) threads = {0};
  if (threads.empty())
    for (int t = 1; t <= restore.threads; ++t) threads.push_back(t);
  for (int t : threads)
    DUET_CHECK(t >= 0 && (dev.type != DeviceType::cpu || t >= 1), "probe: thread count {} is invalid: expected >= 1", t);

  BackendImpl& impl = backend(be);
  auto sync = [&] { impl.synchronize(); };
  const TensorOptions opt = TensorOptions(DType::f32).with_device(dev);
  const int64_t n = o.gemm_size;
  const Tensor a = Tensor::randn({n, n}, opt), b = Tensor::randn({n, n}, opt);
  // bf16 where the backend says it runs it on its own kernels: the cpu backend needs AVX-512 for
  // oneDNN's (without it bf16 goes to the reference loops, minutes for one GEMM).
  Tensor a16, b16;
  if (be != Backend::reference && impl.support(OpId::matmul, DType::bf16).coverage == Coverage::native) {
    a16 = a.to(DType::bf16);
    b16 = b.to(DType::bf16);
  }
  Tensor src = Tensor::empty({copy_elems}, opt), dst = Tensor::empty({copy_elems}, opt);
  src.fill_(1.0);  // touch every page before timing
  dst.fill_(0.0);
  for (int t : threads) {
    if (t > 0) omp_set_num_threads(t);
    ProbePoint p;
    p.threads = t;
    p.gemm_best_ns = best_ns(o.repeats, [&] { (void)matmul(a, b); }, sync);
    p.copy_best_ns = best_ns(o.repeats, [&] { dst.copy_(src); }, sync);
    p.gemm_gflops = 2.0 * static_cast<double>(n) * n * n / p.gemm_best_ns;
    if (a16.defined()) {
      try {
        p.gemm_bf16_best_ns = best_ns(o.repeats, [&] { (void)matmul(a16, b16); }, sync);
        p.gemm_bf16_gflops = 2.0 * static_cast<double>(n) * n * n / p.gemm_bf16_best_ns;
      } catch (const Error&) {  // no bf16 GEMM on this device (cuBLAS before sm_80): fp32's ceiling stands
        p.gemm_bf16_best_ns = p.gemm_bf16_gflops = 0;
      }
    }
    p.copy_gbs = 2.0 * static_cast<double>(r.copy_bytes) / p.copy_best_ns;  // read + written
    r.points.push_back(p);
  }
  return r;
}

std::string format_probe(const ProbeResult& r) {
  std::string s = fmt::format("probe of {} ({}), backend {}, {}: fp32 and bf16 GEMM {}x{}x{}, copy of {} (read + write counted), best of {}\n",
                              cpu_name(r.machine), r.device, r.backend, r.created, r.gemm_size,
                              r.gemm_size, r.gemm_size, fmt_bytes(static_cast<double>(r.copy_bytes)), r.repeats);
  TextTable t;
  t.column("threads");
  t.column("GEMM GFLOP/s");
  t.column("GEMM ms");
  t.column("bf16 GEMM GFLOP/s");
  t.column("copy GB/s");
  t.column("copy ms");
  t.column("ridge FLOP/B");
  for (const ProbePoint& p : r.points)
    t.row({p.threads > 0 ? std::to_string(p.threads) : "-", fmt_rate(p.gemm_gflops), fmt_ms(p.gemm_best_ns),
           p.gemm_bf16_gflops > 0 ? fmt_rate(p.gemm_bf16_gflops) : "-", fmt_rate(p.copy_gbs), fmt_ms(p.copy_best_ns), fmt_rate(p.copy_gbs > 0 ? p.gemm_gflops / p.copy_gbs : 0)});
  return s + t.str("  ");
}

std::string probe_cache_dir() {
  if (const char* d = std::getenv("DUET_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "duet").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "duet").string();
  return (fs::temp_directory_path() / "duet-cache").string();
}

std::string default_probe_path(const nlohmann::json& machine) {
  // Named by host and CPU: one machine name may stand for different CPUs (cloud VMs named "vm").
  return (fs::path(probe_cache_dir()) /
          fmt::format("probe-{}-{:08x}.json", machine.value("hostname", std::string("host")),
                      static_cast<uint32_t>(fnv1a(cpu_name(machine)))))
      .string();
}

nlohmann::json load_probe(const std::string& path) {
  const std::string text = read_file(path, "probe file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number beyond a double
    throw Error(fmt::format("probe file '{}' is not valid JSON ({}): run `duet probe` to rewrite it", path, e.what()));
  }
  DUET_CHECK(j.is_object() && j.contains("schema"), "probe file '{}' has no \"schema\" field: expected a {} file", path,
             kProbeSchema);
  DUET_CHECK(j["schema"] == kProbeSchema, "probe file '{}' has schema {}: this duet reads {}", path, j["schema"].dump(),
             kProbeSchema);
  DUET_CHECK(j.contains("machine") && j["machine"].is_object() && j.contains("devices") && j["devices"].is_object(),
             "probe file '{}' lacks its \"machine\" or \"devices\" object", path);
  return j;
}

void save_probe(const ProbeResult& r, const std::string& path) {
  nlohmann::json file;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    try {
      file = load_probe(path);
      if (!same_cpu(file["machine"], r.machine)) file = nlohmann::json();  // another machine's: replace
    } catch (const Error&) {
      file = nlohmann::json();  // unreadable: rewritten whole
    }
  }
  if (file.is_null()) file = {{"schema", kProbeSchema}, {"devices", nlohmann::json::object()}};
  file["machine"] = r.machine;
  nlohmann::json points = nlohmann::json::array();
  for (const ProbePoint& p : r.points)
    points.push_back({{"threads", p.threads},
                      {"gemm_gflops", p.gemm_gflops},
                      {"copy_gbs", p.copy_gbs},
                      {"gemm_best_ns", p.gemm_best_ns},
                      {"copy_best_ns", p.copy_best_ns},
                      {"gemm_bf16_gflops", p.gemm_bf16_gflops},
                      {"gemm_bf16_best_ns", p.gemm_bf16_best_ns}});
  file["devices"][r.device] = {{"backend", r.backend},       {"created", r.created}, {"gemm_size", r.gemm_size},
                               {"copy_bytes", r.copy_bytes}, {"repeats", r.repeats}, {"points", points}};
  write_file_atomic(path, file.dump(2) + "\n");
}

namespace {
std::optional<Ceilings> ceilings_in(const nlohmann::json& file, const std::string& path, const std::string& device,
                                    int threads) {
  const auto& devs = file["devices"];
  if (!devs.contains(device)) return std::nullopt;
  const auto& d = devs[device];
  const auto& pts = d.value("points", nlohmann::json::array());
  const nlohmann::json* pick = nullptr;
  int best_below = -1;
  for (const auto& p : pts) {
    const int t = p.value("threads", 0);
    if (t == threads || threads <= 0 || t == 0) {
      pick = &p;
      break;
    }
    if (t < threads && t > best_below) {
      best_below = t;
      pick = &p;
    }
  }
  if (!pick && !pts.empty()) pick = &pts.front();
  if (!pick) return std::nullopt;
  Ceilings c;
  c.gemm_gflops = pick->value("gemm_gflops", 0.0);
  c.copy_gbs = pick->value("copy_gbs", 0.0);
  c.gemm_bf16_gflops = pick->value("gemm_bf16_gflops", 0.0);
  c.threads = pick->value("threads", 0);
  c.device = device;
  c.backend = d.value("backend", std::string());
  c.created = d.value("created", std::string());
  c.probe_path = path;
  if (c.gemm_gflops <= 0 || c.copy_gbs <= 0) return std::nullopt;
  return c;
}
}  // namespace

std::optional<Ceilings> find_ceilings(const nlohmann::json& machine, const std::string& device, int threads,
                                      const std::string& path, std::string* why) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
    return std::nullopt;
  };
  if (!path.empty()) {
    const nlohmann::json file = load_probe(path);  // an explicit path that is broken is an error
    std::optional<Ceilings> c;
    try {
      DUET_CHECK(same_cpu(file["machine"], machine),
                 "probe file '{}' was measured on '{}' ({} CPUs), not on this report's machine '{}' ({} CPUs)", path,
                 cpu_name(file["machine"]), file["machine"].value("logical_cpus", 0),
                 cpu_name(machine), machine.value("logical_cpus", 0));
      c = ceilings_in(file, path, device, threads);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("probe file '{}' has a field missing or of the wrong type ({}): run `duet probe` to "
                              "rewrite it",
                              path, e.what()));
    }
    if (!c) return say(fmt::format("no probe: '{}' has no measurement of device {}", path, device));
    return c;
  }
  const std::string dir = probe_cache_dir();
  std::error_code ec;
  std::optional<Ceilings> best;
  if (fs::is_directory(dir, ec)) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("probe-", 0) != 0 || entry.path().extension() != ".json") continue;
      try {
        const nlohmann::json file = load_probe(entry.path().string());
        if (!same_cpu(file["machine"], machine)) continue;
        auto c = ceilings_in(file, entry.path().string(), device, threads);
        if (c && (!best || c->created > best->created)) best = c;  // ISO-8601 UTC sorts as text
      } catch (const Error&) {  // someone else's broken cache file is not this report's problem
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  if (!best)
    return say(fmt::format("no probe: no probe of device {} on '{}' in {} (run `duet probe`)", device,
                           cpu_name(machine), dir));
  return best;
}

}  // namespace duet::profiler
