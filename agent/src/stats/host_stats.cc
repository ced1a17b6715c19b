#include "lockstep/agent/host_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "stats/kernel.h"

namespace lockstep {
namespace {

using stats::Acc;
using stats::Isa;
using stats::KernelParams;
using stats::ScalarLimits;

struct Limits {
  float sat;      // max finite of limit_dtype (exact in fp32)
  int min_exp;    // biased fp32 exponent of its min normal
};

Limits LimitsOf(DType limit) {
  switch (limit) {
    case DType::kBF16: return {0x1.FEp127f, 1};            // (2 - 2^-7) * 2^127, 2^-126
    case DType::kF8E4M3: return {448.0f, 127 - 6};          // e4m3fn: 448, 2^-6
    case DType::kF8E5M2: return {57344.0f, 127 - 14};       // 57344, 2^-14
    case DType::kF16:
    default: return {65504.0f, 127 - 14};                   // 65504, 2^-14
  }
}

// The first finite element, as the shift that keeps the one-pass variance exact enough.
template <class Get>
double FirstFinite(Get get, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    double x = get(i);
    if (std::isfinite(x)) return x;
  }
  return 0;
}

void Accumulate(const void* data, DType dtype, uint64_t n, const KernelParams& kp, double shift,
                const ScalarLimits& lim, Isa isa, bool scalar_only, Acc* acc) {
  if (dtype == DType::kF64 || scalar_only) {
    auto run = [&](auto get) {
      stats::AccumulateScalar(get, 0, n, kp.k, kp.hist, shift, lim, true, acc);
    };
    const auto* f32 = static_cast<const float*>(data);
    const auto* f64 = static_cast<const double*>(data);
    const auto* u16 = static_cast<const uint16_t*>(data);
    switch (dtype) {
      case DType::kF64: run([f64](uint64_t i) { return f64[i]; }); break;
      case DType::kF32: run([f32](uint64_t i) { return double{f32[i]}; }); break;
      case DType::kF16: run([u16](uint64_t i) { return double{stats::HalfToFloat(u16[i])}; }); break;
      default: run([u16](uint64_t i) { return double{stats::Bf16ToFloat(u16[i])}; }); break;
    }
    return;
  }
#define LOCKSTEP_DISPATCH(isa_name)                                                      \
  switch (dtype) {                                                                       \
    case DType::kF32:                                                                    \
      stats::AccumulateF32_##isa_name(static_cast<const float*>(data), n, kp, acc); break; \
    case DType::kF16:                                                                    \
      stats::AccumulateF16_##isa_name(static_cast<const uint16_t*>(data), n, kp, acc); break; \
    default:                                                                             \
      stats::AccumulateBF16_##isa_name(static_cast<const uint16_t*>(data), n, kp, acc); break; \
  }
  switch (isa) {
    case Isa::kAvx512: LOCKSTEP_DISPATCH(Avx512); break;
    case Isa::kAvx2: LOCKSTEP_DISPATCH(Avx2); break;
    default: LOCKSTEP_DISPATCH(Generic); break;
  }
#undef LOCKSTEP_DISPATCH
}

void Finish(const Acc& acc, uint64_t numel, double shift, int k, int bins, DType limit,
            TensorStats* out) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  out->numel = numel;
  out->nan_count = acc.nan;
  out->inf_count = numel - acc.finite - acc.nan;
  out->zero_count = acc.zero;
  out->sat_count = acc.sat;
  out->subnormal_count = acc.subnormal;
  out->limit_dtype = limit;
  if (acc.finite == 0) {
    out->min = out->max = out->mean = out->std = out->l2 = out->absmax = kNaN;
  } else {
    const double nf = static_cast<double>(acc.finite);
    const double m1 = acc.s1 / nf;
    out->min = acc.mn;
    out->max = acc.mx;
    out->mean = shift + m1;
    out->std = std::sqrt(std::max(0.0, acc.s2 / nf - m1 * m1));
    out->l2 = std::sqrt(acc.sq);
    out->absmax = std::max(-acc.mn, acc.mx);
  }
  out->sketch_k = static_cast<uint16_t>(k);
  for (int j = 0; j < k; ++j) out->sketch[j] = static_cast<float>(acc.sketch2[j] + acc.sketch2[j + k]);
  out->hist_bins = static_cast<uint8_t>(bins);
  for (int b = 0; b < bins; ++b)
    out->hist[b] = static_cast<uint32_t>(std::min<uint64_t>(acc.hist[b], UINT32_MAX));
}

}  // namespace

DType LimitDType(DType d) noexcept {
  switch (d) {
    case DType::kF16: case DType::kBF16: case DType::kF8E4M3: case DType::kF8E5M2: return d;
    case DType::kF32: case DType::kF64: return DType::kF16;
    default: return DType::kUnknown;
  }
}

namespace stats {

bool IsaSupported(Isa isa) noexcept {
  switch (isa) {
    case Isa::kGeneric: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return IsaSupported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}

Isa BestIsa() noexcept {
  static const Isa best = IsaSupported(Isa::kAvx512) ? Isa::kAvx512
                          : IsaSupported(Isa::kAvx2) ? Isa::kAvx2
                                                     : Isa::kGeneric;
  return best;
}

Status ComputeHostStatsWithIsa(const void* data, DType dtype, uint64_t numel,
                               const StatsConfig& config, Isa isa, TensorStats* out) noexcept {
  if (out == nullptr) return Status::InvalidArgument("ComputeHostStats needs an output TensorStats; got null.");
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16 && dtype != DType::kF64)
    return Status::InvalidArgument("ComputeHostStats supports fp32, fp16, bf16 and fp64 tensors, not dtype code " +
                                   std::to_string(static_cast<int>(dtype)) +
                                   "; convert the tensor or use the torch implementation.");
  if (config.sketch_k < 0 || config.sketch_k > kMaxSketchK)
    return Status::InvalidArgument("sketch_k is " + std::to_string(config.sketch_k) + "; use 0 (off) to " +
                                   std::to_string(kMaxSketchK) + ".");
  if (config.hist_bins != 0 && config.hist_bins != kHistBins)
    return Status::InvalidArgument("hist_bins is " + std::to_string(config.hist_bins) + "; use 0 (off) or " +
                                   std::to_string(kHistBins) + ".");
  if (data == nullptr && numel > 0)
    return Status::InvalidArgument("ComputeHostStats got a null buffer for " + std::to_string(numel) + " elements.");
  if (!IsaSupported(isa)) isa = Isa::kGeneric;

  const DType limit = LimitDType(dtype);
  const Limits lm = LimitsOf(limit);
  KernelParams kp;
  kp.k = config.sketch_k;
  kp.hist = config.hist_bins > 0;
  std::memcpy(&kp.sat_bits, &lm.sat, 4);
  kp.min_normal_exp = lm.min_exp;
  ScalarLimits lim{lm.sat, std::ldexp(1.0, lm.min_exp - 127)};

  double shift = 0;
  {
    const auto* f32 = static_cast<const float*>(data);
    const auto* f64 = static_cast<const double*>(data);
    const auto* u16 = static_cast<const uint16_t*>(data);
    switch (dtype) {
      case DType::kF64: shift = FirstFinite([f64](uint64_t i) { return f64[i]; }, numel); break;
      case DType::kF32: shift = FirstFinite([f32](uint64_t i) { return double{f32[i]}; }, numel); break;
      case DType::kF16: shift = FirstFinite([u16](uint64_t i) { return double{stats::HalfToFloat(u16[i])}; }, numel); break;
      default: shift = FirstFinite([u16](uint64_t i) { return double{stats::Bf16ToFloat(u16[i])}; }, numel); break;
    }
  }
  kp.shift = static_cast<float>(shift);  // exact: the element is a float (fp64 uses the double)

  Acc acc;
  Accumulate(data, dtype, numel, kp, shift, lim, isa, false, &acc);
  if (dtype != DType::kF64 && acc.finite > 0 &&
      !(std::isfinite(acc.s1) && std::isfinite(acc.s2) && std::isfinite(acc.sq))) {
    // A float partial sum overflowed (values beyond ~1e19): redo this tensor in double.
    acc = Acc();
    Accumulate(data, dtype, numel, kp, shift, lim, isa, true, &acc);
  }
  Finish(acc, numel, shift, kp.k, config.hist_bins, limit, out);
  return Status::OK();
}

}  // namespace stats

Status ComputeHostStats(const void* data, DType dtype, uint64_t numel, const StatsConfig& config,
                        TensorStats* out) noexcept {
  return stats::ComputeHostStatsWithIsa(data, dtype, numel, config, stats::BestIsa(), out);
}

}  // namespace lockstep
