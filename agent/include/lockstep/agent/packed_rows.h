// The packed row layout: statistics computed elsewhere (lockstep._torch_stats and
// _triton_stats on a device) arrive as rows of float64, one per tensor, and are turned
// into TensorStats here. This header is the one definition of the layout; the Python
// package reads it from lockstep._core (PACKED_FIXED_FIELDS, PACKED_COLUMNS).
//
// Threads: plain functions; RecordPackedRows is as thread-safe as the Agent. Nothing
// allocates.
#ifndef LOCKSTEP_AGENT_PACKED_ROWS_H_
#define LOCKSTEP_AGENT_PACKED_ROWS_H_

#include <cstddef>
#include <cstdint>

#include "lockstep/agent/agent.h"
#include "lockstep/agent/host_stats.h"
#include "lockstep/agent/types.h"

namespace lockstep {

// One row: kPackedFixed fixed columns, then sketch_k sketch values, then hist_bins
// histogram counts. Counts are non-negative integers below 2^53; limit_dtype is a DType.
enum PackedColumn : int {
  kColNumel = 0, kColMin, kColMax, kColMean, kColStd, kColL2, kColAbsmax, kColNan,
  kColInf, kColZero, kColSat, kColSubnormal, kColLimitDtype, kPackedFixed
};
// The fixed columns' names, in column order (the names lockstep._torch_stats uses).
inline constexpr const char* kPackedColumnNames[kPackedFixed] = {
    "numel", "min", "max", "mean", "std", "l2", "absmax", "nan", "inf",
    "zero", "sat", "subnormal", "limit_dtype"};

// Converts one row of `cols` values. false when the row is malformed (width does not
// match sketch_k/hist_bins, or a count/limit code out of range).
bool UnpackRow(const double* row, size_t cols, int sketch_k, int hist_bins,
               TensorStats* out) noexcept;

struct PackedResult {
  size_t accepted = 0;   // rows the agent took
  size_t malformed = 0;  // rows UnpackRow rejected (not recorded)
};

// Records `n` rows of a [n, cols] row-major matrix at `step`: row i is tensor ids[i] at
// micro step micros[i] with order orders[i]; flags (optional, n values) marks with
// kStatRepeat a row that repeats a tensor recorded before it under another name.
PackedResult RecordPackedRows(Agent* agent, const StatsConfig& config, uint64_t step,
                              const uint32_t* micros, const uint32_t* ids,
                              const uint32_t* orders, const double* rows, size_t n,
                              size_t cols, const uint8_t* flags) noexcept;

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_PACKED_ROWS_H_
