#include "lockstep/agent/packed_rows.h"

namespace lockstep {

namespace {

// A count arrives as a double; it must be a non-negative integer below 2^53.
bool ToCount(double v, uint64_t* out) noexcept {
  if (!(v >= 0.0) || v > 9007199254740992.0) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

}  // namespace

bool UnpackRow(const double* row, size_t cols, int sketch_k, int hist_bins,
               TensorStats* out) noexcept {
  if (sketch_k < 0 || sketch_k > kMaxSketchK || hist_bins < 0 || hist_bins > kHistBins) {
    return false;
  }
  if (cols != static_cast<size_t>(kPackedFixed + sketch_k + hist_bins)) return false;
  TensorStats& s = *out;
  if (!ToCount(row[kColNumel], &s.numel) || !ToCount(row[kColNan], &s.nan_count) ||
      !ToCount(row[kColInf], &s.inf_count) || !ToCount(row[kColZero], &s.zero_count) ||
      !ToCount(row[kColSat], &s.sat_count) ||
      !ToCount(row[kColSubnormal], &s.subnormal_count)) {
    return false;
  }
  uint64_t limit = 0;
  if (!ToCount(row[kColLimitDtype], &limit) || limit > static_cast<uint64_t>(DType::kF8E5M2)) {
    return false;
  }
  s.limit_dtype = static_cast<DType>(limit);
  s.min = row[kColMin];
  s.max = row[kColMax];
  s.mean = row[kColMean];
  s.std = row[kColStd];
  s.l2 = row[kColL2];
  s.absmax = row[kColAbsmax];
  s.sketch_k = static_cast<uint16_t>(sketch_k);
  s.hist_bins = static_cast<uint8_t>(hist_bins);
  const double* sketch = row + kPackedFixed;
  for (int i = 0; i < sketch_k; ++i) s.sketch[i] = static_cast<float>(sketch[i]);
  const double* hist = sketch + sketch_k;
  for (int i = 0; i < hist_bins; ++i) {
    uint64_t c = 0;
    if (!ToCount(hist[i], &c) || c > UINT32_MAX) return false;
    s.hist[i] = static_cast<uint32_t>(c);
  }
  return true;
}

PackedResult RecordPackedRows(Agent* agent, const StatsConfig& config, uint64_t step,
                              const uint32_t* micros, const uint32_t* ids,
                              const uint32_t* orders, const double* rows, size_t n,
                              size_t cols, const uint8_t* flags) noexcept {
  PackedResult result;
  TensorStats stats;
  for (size_t i = 0; i < n; ++i) {
    if (!UnpackRow(rows + i * cols, cols, config.sketch_k, config.hist_bins, &stats)) {
      ++result.malformed;
      continue;
    }
    // flags[i] & kStatRepeat: row i repeats a tensor recorded before it under another
    // name (the device path computes it once); said on the wire as on the host path.
    // Every packed row comes from the batched device path (kStatDevice): its float sums
    // may depend on the batch (schema StatFlags), which the replica check must know.
    stats.flags = static_cast<uint8_t>(kStatDevice | (flags != nullptr ? (flags[i] & kStatRepeat) : 0));
    if (agent->RecordStats(step, micros[i], ids[i], orders[i], stats)) ++result.accepted;
  }
  return result;
}

}  // namespace lockstep
