// Internal interface between host_stats.cc (validation, dispatch, the scalar paths
// and the final statistics) and the per-ISA vector kernels (kernel_*.cc, which all
// compile kernel_body.inc with a different lane count and target flags).
// Everything here runs on the caller's thread; nothing allocates.
#ifndef LOCKSTEP_AGENT_STATS_KERNEL_H_
#define LOCKSTEP_AGENT_STATS_KERNEL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lockstep/agent/host_stats.h"
#include "lockstep/common/wire.h"
#include "stats/sketch_hash.h"

namespace lockstep::stats {

// Running sums of one tensor. The vector kernels and the scalar code both add into
// it, so a tensor may be split between them (block tails, the last partial block).
struct Acc {
  double s1 = 0, s2 = 0, sq = 0;  // sum(x - shift), sum((x - shift)^2), sum(x^2), finite x
  double mn = std::numeric_limits<double>::infinity();
  double mx = -std::numeric_limits<double>::infinity();
  uint64_t finite = 0, nan = 0, zero = 0, sat = 0, subnormal = 0;
  uint64_t hist[kHistBins] = {};
  // Doubled sketch: sketch[j] = sketch2[j] + sketch2[j + K]; a block rotated by r
  // adds its offsets o into sketch2[o + r], which needs no modulo.
  double sketch2[2 * kMaxSketchK] = {};
};

struct KernelParams {
  int k = 0;              // sketch width, 0 = off
  bool hist = false;
  float shift = 0;        // first finite element (0 if none)
  int32_t sat_bits = 0;   // fp32 bit pattern of limit_dtype's max finite (|x| >= it: sat)
  int min_normal_exp = 0; // biased fp32 exponent of limit_dtype's min normal
  uint64_t first = 0;     // flat index of the buffer's element 0 (a multiple of k if k > 0):
                          // a strided tensor is read a chunk at a time
};

// Scalar fp16 / bf16 -> fp32, exact. The fp16 subnormal case goes through an integer
// conversion so a flush-denormals-to-zero FPU mode cannot change the value.
inline float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t u = h & 0x7FFFu;
  uint32_t bits;
  if (u < 0x400u) {
    float f = static_cast<float>(u) * 0x1p-24f;
    std::memcpy(&bits, &f, 4);
  } else {
    bits = (u << 13) + (112u << 23);
    if (u >= 0x7C00u) bits += 112u << 23;  // Inf/NaN: exponent 31 -> 255
  }
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float Bf16ToFloat(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Vector kernels: accumulate elements [0, n) of the buffer, whose first element has
// flat index kp.first, into acc. Elements that do not fill a vector are handled by the
// scalar code (AccumulateScalarF32), which the kernels call themselves.
enum class Isa { kGeneric, kAvx2, kAvx512 };
#define LOCKSTEP_STATS_DECLARE(isa)                                                   \
  void AccumulateF32_##isa(const float* p, uint64_t n, const KernelParams& kp, Acc* acc); \
  void AccumulateF16_##isa(const uint16_t* p, uint64_t n, const KernelParams& kp, Acc* acc); \
  void AccumulateBF16_##isa(const uint16_t* p, uint64_t n, const KernelParams& kp, Acc* acc);
LOCKSTEP_STATS_DECLARE(Generic)
LOCKSTEP_STATS_DECLARE(Avx2)
LOCKSTEP_STATS_DECLARE(Avx512)
#undef LOCKSTEP_STATS_DECLARE

// Scalar reference path, used for fp64 tensors, for the vector kernels' leftovers and
// as the fallback when float partial sums overflowed. `get(j)` returns element j
// (0 <= j < count) as double; the element's flat index is first + j.
struct ScalarLimits {
  double sat = 0;         // |x| >= sat: saturated
  double min_normal = 0;  // 0 < |x| < min_normal: subnormal
};

inline int HistBinOf(double ax) {  // ax = |x|, finite, non-zero
  int e;
  std::frexp(ax, &e);  // ax = m * 2^e, m in [0.5, 1)
  return HistBinFromExponent(e - 1);
}

template <class Get>
inline void AccumulateScalar(Get get, uint64_t first, uint64_t count, int k, bool hist,
                             double shift, const ScalarLimits& lim, bool moments, Acc* acc) {
  uint64_t i = first, end = first + count;
  while (i < end) {
    // One block (or what of it lies in range) at a time: rotation and pattern per block.
    uint64_t b = k > 0 ? i / static_cast<uint64_t>(k) : 0;
    uint64_t block_end = k > 0 ? (b + 1) * static_cast<uint64_t>(k) : end;
    if (block_end > end) block_end = end;
    uint32_t rot = k > 0 ? BlockRotation(b, k) : 0;
    uint32_t ph = k > 0 ? BlockPatternHash(b) : 0;
    const uint32_t* pat = &kPatterns[(ph >> 24) * kPatternWords];
    bool flip = (ph >> 23) & 1u;
    for (; i < block_end; ++i) {
      double x = get(i - first);
      double ax = std::fabs(x);
      if (std::isnan(x)) { ++acc->nan; continue; }
      if (std::isinf(x)) continue;
      ++acc->finite;
      if (moments) {
        double d = x - shift;
        acc->s1 += d;
        acc->s2 += d * d;
        acc->sq += x * x;
        if (x < acc->mn) acc->mn = x;
        if (x > acc->mx) acc->mx = x;
      }
      if (x == 0) ++acc->zero;
      else if (ax < lim.min_normal) ++acc->subnormal;
      if (ax >= lim.sat) ++acc->sat;
      if (hist) ++acc->hist[x == 0 ? 0 : HistBinOf(ax)];
      if (k > 0) {
        uint32_t o = static_cast<uint32_t>(i - b * static_cast<uint64_t>(k));
        bool neg = ((pat[o / 32] >> (o % 32)) & 1u) != static_cast<uint32_t>(flip);
        acc->sketch2[o + rot] += neg ? -x : x;
      }
    }
  }
}

}  // namespace lockstep::stats


// For tests and the bench: the same as ComputeHostStats with a chosen vector kernel.
namespace lockstep::stats {
bool IsaSupported(Isa isa) noexcept;
Isa BestIsa() noexcept;
Status ComputeHostStatsWithIsa(const void* data, DType dtype, uint64_t numel,
                               const StatsConfig& config, Isa isa, TensorStats* out) noexcept;
Status ComputeHostStatsStridedWithIsa(const void* data, DType dtype, const HostLayout& layout,
                                      const StatsConfig& config, Isa isa,
                                      TensorStats* out) noexcept;
}  // namespace lockstep::stats

#endif  // LOCKSTEP_AGENT_STATS_KERNEL_H_
