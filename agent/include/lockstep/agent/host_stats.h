// The statistics of one CPU tensor in one pass over its memory (DESIGN.md "Statistics
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

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_HOST_STATS_H_
