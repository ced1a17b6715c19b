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

// The first finite element, as the shift that keeps the one-pass variance exact enough;
// false if none of these n.
template <class Get>
bool FirstFinite(Get get, uint64_t n, double* shift) {
  for (uint64_t i = 0; i < n; ++i) {
    double x = get(i);
    if (std::isfinite(x)) {
      *shift = x;
      return true;
    }
  }
  return false;
}

template <class Fn>
void WithGetter(const void* data, DType dtype, Fn fn) {
  const auto* f32 = static_cast<const float*>(data);
  const auto* f64 = static_cast<const double*>(data);
  const auto* u16 = static_cast<const uint16_t*>(data);
  switch (dtype) {
    case DType::kF64: fn([f64](uint64_t i) { return f64[i]; }); break;
    case DType::kF32: fn([f32](uint64_t i) { return double{f32[i]}; }); break;
    case DType::kF16: fn([u16](uint64_t i) { return double{stats::HalfToFloat(u16[i])}; }); break;
    default: fn([u16](uint64_t i) { return double{stats::Bf16ToFloat(u16[i])}; }); break;
  }
}

void Accumulate(const void* data, DType dtype, uint64_t n, const KernelParams& kp, double shift,
                const ScalarLimits& lim, Isa isa, bool scalar_only, Acc* acc) {
  if (dtype == DType::kF64 || scalar_only) {
    WithGetter(data, dtype, [&](auto get) {
      stats::AccumulateScalar(get, kp.first, n, kp.k, kp.hist, shift, lim, true, acc);
    });
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

// Where the elements come from: the buffer itself (layout == nullptr) or a strided view.
struct Source {
  const void* data;
  DType dtype;
  uint64_t numel;
  const HostLayout* layout;
};

size_t ElementSize(DType d) { return d == DType::kF64 ? 8 : d == DType::kF32 ? 4 : 2; }

// Reads a strided view in flat (row-major) order into a buffer, a run of the last dim at
// a time; keeps the running element offset of the outer index instead of recomputing it.
class StridedReader {
 public:
  StridedReader(const void* data, size_t elem, const HostLayout& l)
      : base_(static_cast<const char*>(data)), elem_(elem), l_(l), left_(l.numel) {}

  // Copies the next min(max, left) elements to dst; returns how many.
  uint64_t Read(unsigned char* dst, uint64_t max) {
    const int last = l_.ndim - 1;
    const int64_t run = l_.sizes[last], step = l_.strides[last];
    uint64_t got = 0;
    while (got < max && left_ > 0) {
      const uint64_t n = std::min<uint64_t>(max - got, static_cast<uint64_t>(run - pos_));
      const char* src = base_ + (off_ + pos_ * step) * static_cast<int64_t>(elem_);
      unsigned char* out = dst + got * elem_;
      if (step == 1) {
        std::memcpy(out, src, n * elem_);
      } else {
        const int64_t jump = step * static_cast<int64_t>(elem_);
        for (uint64_t j = 0; j < n; ++j, src += jump, out += elem_) std::memcpy(out, src, elem_);
      }
      got += n;
      left_ -= n;
      pos_ += static_cast<int64_t>(n);
      if (pos_ == run) {  // next run: advance the outer index, carrying
        pos_ = 0;
        for (int d = last - 1; d >= 0; --d) {
          off_ += l_.strides[d];
          if (++idx_[d] < l_.sizes[d]) break;
          off_ -= l_.strides[d] * l_.sizes[d];
          idx_[d] = 0;
        }
      }
    }
    return got;
  }

 private:
  const char* base_;
  size_t elem_;
  const HostLayout& l_;
  uint64_t left_;
  int64_t idx_[kMaxHostDims] = {};  // outer dims' index
  int64_t off_ = 0;                 // element offset of the current run
  int64_t pos_ = 0;                 // position inside the run
};

// Bytes of a strided view read at a time: a tile of fp32 for the kernel, on the stack
// (no allocation, no TLS in a dlopen'ed module), warm in L1 when the kernel reads it.
constexpr size_t kChunkBytes = 32768;

// Calls fn(ptr, n, first) for the source's elements in flat order, in pieces whose flat
// start `first` is a multiple of `k` (the sketch's blocks must not straddle two calls),
// until fn returns false.
template <class Fn>
void ForEachChunk(const Source& src, int k, Fn fn) {
  if (src.layout == nullptr) {
    fn(src.data, src.numel, uint64_t{0});
    return;
  }
  const size_t elem = ElementSize(src.dtype);
  uint64_t chunk = kChunkBytes / elem;
  if (k > 0) chunk -= chunk % static_cast<uint64_t>(k);
  alignas(64) unsigned char buf[kChunkBytes];
  StridedReader reader(src.data, elem, *src.layout);
  for (uint64_t first = 0; first < src.numel;) {
    const uint64_t n = reader.Read(buf, chunk);
    if (n == 0 || !fn(static_cast<const void*>(buf), n, first)) return;
    first += n;
  }
}

Status Compute(const Source& src, const StatsConfig& config, Isa isa, TensorStats* out) noexcept {
  const DType dtype = src.dtype;
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
  if (src.data == nullptr && src.numel > 0)
    return Status::InvalidArgument("ComputeHostStats got a null buffer for " + std::to_string(src.numel) + " elements.");
  if (!stats::IsaSupported(isa)) isa = Isa::kGeneric;

  const DType limit = LimitDType(dtype);
  const Limits lm = LimitsOf(limit);
  KernelParams kp;
  kp.k = config.sketch_k;
  kp.hist = config.hist_bins > 0;
  std::memcpy(&kp.sat_bits, &lm.sat, 4);
  kp.min_normal_exp = lm.min_exp;
  ScalarLimits lim{lm.sat, std::ldexp(1.0, lm.min_exp - 127)};

  double shift = 0;
  bool found = false;
  ForEachChunk(src, kp.k, [&](const void* p, uint64_t n, uint64_t) {
    WithGetter(p, dtype, [&](auto get) { found = FirstFinite(get, n, &shift); });
    return !found;
  });
  kp.shift = static_cast<float>(shift);  // exact: the element is a float (fp64 uses the double)

  auto accumulate = [&](bool scalar_only, Acc* acc) {
    ForEachChunk(src, kp.k, [&](const void* p, uint64_t n, uint64_t first) {
      kp.first = first;
      Accumulate(p, dtype, n, kp, shift, lim, isa, scalar_only, acc);
      return true;
    });
  };
  Acc acc;
  accumulate(false, &acc);
  if (dtype != DType::kF64 && acc.finite > 0 &&
      !(std::isfinite(acc.s1) && std::isfinite(acc.s2) && std::isfinite(acc.sq))) {
    // A float partial sum overflowed (values beyond ~1e19): redo this tensor in double.
    acc = Acc();
    accumulate(true, &acc);
  }
  Finish(acc, src.numel, shift, kp.k, config.hist_bins, limit, out);
  return Status::OK();
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
  return Compute(Source{data, dtype, numel, nullptr}, config, isa, out);
}

Status ComputeHostStatsStridedWithIsa(const void* data, DType dtype, const HostLayout& layout,
                                      const StatsConfig& config, Isa isa,
                                      TensorStats* out) noexcept {
  return Compute(Source{data, dtype, layout.numel, layout.contiguous() ? nullptr : &layout},
                 config, isa, out);
}

}  // namespace stats

Status ComputeHostStats(const void* data, DType dtype, uint64_t numel, const StatsConfig& config,
                        TensorStats* out) noexcept {
  return stats::ComputeHostStatsWithIsa(data, dtype, numel, config, stats::BestIsa(), out);
}

Status ComputeHostStatsStrided(const void* data, DType dtype, const HostLayout& layout,
                               const StatsConfig& config, TensorStats* out) noexcept {
  return stats::ComputeHostStatsStridedWithIsa(data, dtype, layout, config, stats::BestIsa(), out);
}

Status MakeHostLayout(const int64_t* sizes, const int64_t* strides, int ndim,
                      HostLayout* out) noexcept {
  if (ndim < 0 || (ndim > 0 && (sizes == nullptr || strides == nullptr)))
    return Status::InvalidArgument("MakeHostLayout needs sizes and strides for " +
                                   std::to_string(ndim) + " dims.");
  HostLayout l;
  l.numel = 1;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] < 0 || strides[d] < 0)
      return Status::InvalidArgument("MakeHostLayout: dim " + std::to_string(d) + " has size " +
                                     std::to_string(sizes[d]) + " and stride " +
                                     std::to_string(strides[d]) + "; both must be >= 0.");
    l.numel *= static_cast<uint64_t>(sizes[d]);
  }
  if (l.numel == 0) {  // nothing to read: an empty contiguous buffer
    *out = l;
    out->numel = 0;
    return Status::OK();
  }
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 1) continue;  // its stride never matters
    if (l.ndim > 0 && l.strides[l.ndim - 1] == strides[d] * sizes[d]) {
      // The previous dim steps over exactly this one: one longer dim.
      l.sizes[l.ndim - 1] *= sizes[d];
      l.strides[l.ndim - 1] = strides[d];
      continue;
    }
    if (l.ndim == kMaxHostDims)
      return Status::InvalidArgument("MakeHostLayout: more than " + std::to_string(kMaxHostDims) +
                                     " dims after merging; make the tensor contiguous first.");
    l.sizes[l.ndim] = sizes[d];
    l.strides[l.ndim] = strides[d];
    ++l.ndim;
  }
  if (l.ndim == 0) {  // every dim of size 1: one element
    l.ndim = 1;
    l.sizes[0] = 1;
    l.strides[0] = 1;
  }
  *out = l;
  return Status::OK();
}

}  // namespace lockstep
