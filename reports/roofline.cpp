// Roofline arithmetic and the report's roofline section (see roofline.h).
#include "reports/roofline.h"
#include <algorithm>

namespace duet::profiler {

double Ceilings::attainable_gflops(double flop_per_byte) const {
  return std::min(gemm_gflops, flop_per_byte * copy_gbs);
}

double Ceilings::compute_ns(double flops, double flops_16) const {
  if (gemm_gflops <= 0) return 0;
  const double f16 = std::clamp(flops_16, 0.0, flops);
  const double c16 = gemm_bf16_gflops > 0 ? gemm_bf16_gflops : gemm_gflops;
  return (flops - f16) / gemm_gflops + f16 / c16;
}

std::string bound_of(double flops, double bytes, const std::optional<Ceilings>& c, double flops_16) {
  if (!c || c->copy_gbs <= 0 || c->gemm_gflops <= 0) return "";
  if (flops <= 0) return bytes > 0 ? "memory" : "";
  if (bytes <= 0) return "compute";
  return c->compute_ns(flops, flops_16) < c->memory_ns(bytes) ? "memory" : "compute";
}

nlohmann::json roofline_json(const std::optional<Ceilings>& c, const std::string& note) {
  if (!c) return {{"probe", nullptr}, {"note", note}};
  return {{"probe", c->probe_path},       {"created", c->created},   {"device", c->device},
          {"backend", c->backend},        {"threads", c->threads},   {"gemm_gflops", c->gemm_gflops},
          {"gemm_bf16_gflops", c->gemm_bf16_gflops > 0 ? nlohmann::json(c->gemm_bf16_gflops) : nlohmann::json(nullptr)},
          {"copy_gbs", c->copy_gbs},      {"ridge_flop_per_byte", c->ridge()}, {"note", note}};
}

std::optional<Ceilings> ceilings_from_roofline_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("probe") || j["probe"].is_null()) return std::nullopt;
  if (!j.value("gemm_gflops", nlohmann::json()).is_number() || !j.value("copy_gbs", nlohmann::json()).is_number())
    return std::nullopt;
  Ceilings c;
  c.gemm_gflops = j["gemm_gflops"].get<double>();
  c.copy_gbs = j["copy_gbs"].get<double>();
  if (j.value("gemm_bf16_gflops", nlohmann::json()).is_number()) c.gemm_bf16_gflops = j["gemm_bf16_gflops"].get<double>();
  c.threads = j.value("threads", 0);
  c.device = j.value("device", std::string());
  c.backend = j.value("backend", std::string());
  c.created = j.value("created", std::string());
  c.probe_path = j["probe"].is_string() ? j["probe"].get<std::string>() : std::string();
  return c;
}

}  // namespace duet::profiler
