// The statistics of one CPU tensor in one pass over its memory (docs/design.md "Statistics
// of one tensor"; every definition is pinned in docs/statistics.md).
//
// ComputeHostStats reads a contiguous buffer once and fills every TensorStats field:
// min/max/mean/std/l2/absmax over the finite values, NaN/Inf/zero/saturated/subnormal
// counts, the count-sketch and the log2-magnitude histogram. It does not allocate,
// lock or throw, and may be called from any thread concurrently (it keeps no state).
// The Python agent calls it for CPU tensors (lockstep._core), with the same
// definitions as the torch device implementation (lockstep/_torch_stats.py).
#ifndef LOCKSTEP_AGENT_HOST_STATS_H_
#define LOCKSTEP_AGENT_HOST_STATS_H_

#include <cstdint>

#include "lockstep/agent/types.h"
#include "lockstep/common/status.h"
#include "lockstep/common/wire.h"

namespace lockstep {

struct StatsConfig {
  int sketch_k = kDefaultSketchK;  // 0 (off) .. kMaxSketchK
  int hist_bins = kHistBins;       // 0 (off) or kHistBins
};

// The dtype whose range sat_count / subnormal_count refer to: the tensor's own dtype
// when it is fp16/bf16/fp8, fp16 for fp32 and fp64, kUnknown otherwise.
DType LimitDType(DType tensor_dtype) noexcept;

// `data` holds `numel` elements of `dtype` (kF32, kF16, kBF16 or kF64), contiguous, in
// row-major order (element i of the flat view is data[i]). Returns InvalidArgument for
// another dtype, a null pointer with numel > 0, or a sketch_k / hist_bins out of range;
// `out` is then untouched.
Status ComputeHostStats(const void* data, DType dtype, uint64_t numel, const StatsConfig& config,
                        TensorStats* out) noexcept;

// A strided view (a transposed or sliced tensor): element (i_0, ..., i_{n-1}) of the
// row-major logical tensor is at data + sum(i_d * strides[d]) elements.
inline constexpr int kMaxHostDims = 8;  // after merging (MakeHostLayout)
struct HostLayout {
  int ndim = 0;
  uint64_t numel = 0;
  int64_t sizes[kMaxHostDims] = {};
  int64_t strides[kMaxHostDims] = {};  // in elements
  // Whether the view is the buffer itself, in order (ComputeHostStats applies).
  bool contiguous() const noexcept { return ndim == 0 || (ndim == 1 && strides[0] == 1); }
};

// A view's layout from torch's sizes and strides (any number of dims): dims of size 1
// are dropped and dims that continue each other are merged, so a slice of rows is one
// run. InvalidArgument for a negative size or stride, or more than kMaxHostDims dims
// left after merging (the caller then makes the tensor contiguous first).
Status MakeHostLayout(const int64_t* sizes, const int64_t* strides, int ndim,
                      HostLayout* out) noexcept;

// The statistics of a strided view, equal to those of its contiguous copy (up to the
// order of floating-point additions): the view is read a chunk of ~32 KB at a time into
// a buffer on the stack, in flat order, and each chunk goes through the same kernel
// with its flat index. No allocation; the view's memory is read, never written.
Status ComputeHostStatsStrided(const void* data, DType dtype, const HostLayout& layout,
                               const StatsConfig& config, TensorStats* out) noexcept;

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_HOST_STATS_H_
