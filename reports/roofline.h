// The roofline: an op doing F FLOPs while moving B bytes can at best run at
// min(GEMM GFLOP/s, F/B * copy GB/s). Ops left of the ridge point (F/B below GEMM / copy) are
// memory-bound, ops right of it compute-bound. The ceilings are measured by `duet probe`, never
// taken from datasheets. FLOPs done on 16-bit floats (an autocast step's convolutions and matrix
// products) are held against the bf16 GEMM's ceiling where the probe measured one: on a CPU with
// AVX-512 BF16 it is about twice fp32's, with AMX several times.
#pragma once
#include <optional>
#include <string>
#include <nlohmann/json.hpp>

namespace duet::profiler {

struct Ceilings {
  double gemm_gflops = 0;  // fp32 GEMM at a large square size
  double gemm_bf16_gflops = 0;  // bf16 GEMM, same size; 0 when not measured (then fp32's is used)
  double copy_gbs = 0;     // bytes read plus written per second by a large copy
  int threads = 0;         // CPU threads the ceilings were measured with (0: not a CPU probe)
  std::string device, backend, created, probe_path;
  double ridge() const { return copy_gbs > 0 ? gemm_gflops / copy_gbs : 0; }  // FLOP/byte
  double attainable_gflops(double flop_per_byte) const;  // for fp32 FLOPs
  // The least time, in ns, that `flops` FLOPs (`flops_16` of them on 16-bit floats) take at the
  // compute ceilings, and that `bytes` take at the copy ceiling. An op's roof is the larger.
  double compute_ns(double flops, double flops_16 = 0) const;
  double memory_ns(double bytes) const { return copy_gbs > 0 ? bytes / copy_gbs : 0; }
};

// "memory" or "compute" against the ridge point; "memory" for ops that move bytes but do no
// FLOPs (copies); "" without ceilings or when the op does neither.
std::string bound_of(double flops, double bytes, const std::optional<Ceilings>& c, double flops_16 = 0);

// The "roofline" object of a report: the ceilings used, or {"probe": null, "note": why}.
nlohmann::json roofline_json(const std::optional<Ceilings>& c, const std::string& note);
std::optional<Ceilings> ceilings_from_roofline_json(const nlohmann::json& roofline);

}  // namespace duet::profiler
