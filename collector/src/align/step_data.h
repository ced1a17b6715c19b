// Compact copies of what the analyzer keeps from the wire: one closed step of one
// (run, rank). The Envelope is only valid during OnMessage, so the decoder copies the
// fields detectors use into these flat structs (no strings: names are NameTable ids).
//
// A closed StepData is immutable and shared (std::shared_ptr<const StepData>) between
// the per-run detectors and every pair that still needs it (one baseline step serves
// several candidates), and is freed when the last pair has compared it.
#ifndef LOCKSTEP_COLLECTOR_ALIGN_STEP_DATA_H_
#define LOCKSTEP_COLLECTOR_ALIGN_STEP_DATA_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace lockstep::collector {

// Wire enums as small integers (values of schema/lockstep.fbs; step_data.cc asserts they
// match). Names: KindName and DTypeName, the wire's (lockstep/common/wire_names.h).
enum class Kind : uint8_t {
  kAct = 0, kActGrad = 1, kParamGrad = 2, kParam = 3, kOptim = 4, kLoss = 5, kInput = 6, kActIn = 7,
  kGradReduced = 8
};
enum class DT : uint8_t {
  kUnknown = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kF64 = 4, kI8 = 5, kU8 = 6, kI16 = 7,
  kI32 = 8, kI64 = 9, kBool = 10, kF8E4M3 = 11, kF8E5M2 = 12
};
const char* KindName(Kind k);
const char* DTypeName(DT d);
bool IsLowPrecisionFloat(DT d);  // fp16, bf16, fp8
// Largest finite value of a float dtype (0 for non-float / unknown).
double DTypeMaxFinite(DT d);

// The alignment key: (canonical name id, kind, micro step). Rank and step are
// implied by the StepData the row belongs to.
inline uint64_t MakeKey(uint32_t name_id, Kind kind, uint32_t micro_step) {
  return (static_cast<uint64_t>(name_id) << 32) | (static_cast<uint64_t>(kind) << 24) |
         (micro_step & 0xFFFFFFu);
}
inline uint32_t KeyNameId(uint64_t key) { return static_cast<uint32_t>(key >> 32); }
inline Kind KeyKind(uint64_t key) { return static_cast<Kind>((key >> 24) & 0xFF); }
inline uint32_t KeyMicroStep(uint64_t key) { return static_cast<uint32_t>(key & 0xFFFFFF); }

// One tensor's statistics at one step (TensorStat of the wire, plus where its sketch
// and histogram live in the owning StepData).
struct StatRow {
  uint64_t key = 0;
  uint32_t order = 0;        // execution order index within the step
  DT dtype = DT::kUnknown;   // the tensor's own dtype (from the directory)
  DT limit_dtype = DT::kUnknown;
  uint16_t sketch_k = 0;     // 0 = no sketch
  uint32_t sketch_off = 0;   // into StepData::sketch
  uint8_t hist_bins = 0;     // 0 = no histogram
  uint32_t hist_off = 0;     // into StepData::hist
  uint64_t numel = 0;
  double min = 0, max = 0, mean = 0, std = 0, l2 = 0, absmax = 0;
  uint64_t nan_count = 0, inf_count = 0, zero_count = 0, sat_count = 0, subnormal_count = 0;
  // The agent said this record repeats the one before it (StatFlags::kRepeat): the same
  // tensor under another name. Rules and tables skip it; its producer carries the name
  // as an alias (NameTable::Label).
  bool repeat = false;
  // StatFlags::kStatsOnly: only numel, min, max, mean, l2, absmax are real (an msprobe
  // import); std is NaN, the counts lower bounds, no sketch or histogram.
  bool stats_only = false;
  // StatFlags::kDevice: the agent's batched device path computed it; its float sums
  // (mean, std, l2, sketch) are reproducible only within one batch (rule `replicas`).
  bool device = false;

  bool nonfinite() const { return nan_count + inf_count > 0; }
};

struct ScalarRow {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double loss_scale = std::numeric_limits<double>::quiet_NaN();
  double step_time_s = std::numeric_limits<double>::quiet_NaN();
  uint64_t samples = 0;  // 0 = not given
  bool loss_given = false;  // true: `loss` is the job's value, NaN included
};

struct StepData {
  uint64_t step = 0;
  uint32_t rank = 0;
  std::vector<StatRow> rows;   // sorted by key once closed (merge-join order)
  std::vector<float> sketch;
  std::vector<uint32_t> hist;
  ScalarRow scalars;
  bool has_scalars = false;
  int64_t last_recv_ns = 0;    // when its last record arrived (latency accounting)
  int64_t first_sent_ns = 0;   // agent's send time of its first message

  const float* SketchOf(const StatRow& r) const { return r.sketch_k ? sketch.data() + r.sketch_off : nullptr; }
  const uint32_t* HistOf(const StatRow& r) const { return r.hist_bins ? hist.data() + r.hist_off : nullptr; }
  size_t ApproxBytes() const {
    return sizeof(StepData) + rows.capacity() * sizeof(StatRow) + sketch.capacity() * sizeof(float) +
           hist.capacity() * sizeof(uint32_t);
  }
};
using StepPtr = std::shared_ptr<const StepData>;

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_ALIGN_STEP_DATA_H_
