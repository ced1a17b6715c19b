// Per-run rules (docs/rules.md): one small class per job, one instance per run.
// Each sees every closed step of its run (all ranks) and emits through RunCtx::out.
// Threads: the analyzer's thread only.
#ifndef LOCKSTEP_COLLECTOR_RULES_RUN_RULES_H_
#define LOCKSTEP_COLLECTOR_RULES_RUN_RULES_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "align/run_decoder.h"
#include "rules/detector.h"

namespace lockstep::collector {

// `nonfinite`: the earliest tensor in execution order holding NaN/Inf at a step — the
// producer, not everything downstream. Critical. Fires again only after a clean step.
class NonfiniteDetector : public RunDetector {
 public:
  explicit NonfiniteDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "nonfinite"; }
  void OnStep(const StepData& s) override;

 private:
  const RunCtx* ctx_;
  std::map<uint32_t, bool> active_;  // per rank: inside a non-finite episode
};

// `overflow`: values past a dtype's range (sat_count), absmax close to the tensor's
// own low-precision limit, and repeated loss-scale drops (AMP overflowing).
class OverflowDetector : public RunDetector {
 public:
  explicit OverflowDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "overflow"; }
  void OnStep(const StepData& s) override;

 private:
  const RunCtx* ctx_;
  std::unordered_set<uint64_t> fired_;  // (key) once per tensor
  std::map<uint32_t, double> last_scale_;
  std::map<uint32_t, std::deque<uint64_t>> drops_;  // per rank: steps of recent drops
  std::map<uint32_t, int64_t> scale_fired_step_;
};

// `underflow`: low-precision tensors with many subnormal values; parameter gradients
// that were non-zero and became all zeros.
class UnderflowDetector : public RunDetector {
 public:
  explicit UnderflowDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "underflow"; }
  void OnStep(const StepData& s) override;

 private:
  const RunCtx* ctx_;
  std::unordered_set<uint64_t> fired_;
  std::unordered_set<uint64_t> seen_nonzero_;
};

// `spike`: loss or global grad norm jumping away from its EWMA, up or down.
class SpikeDetector : public RunDetector {
 public:
  explicit SpikeDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "spike"; }
  void OnStep(const StepData& s) override;

  struct Ewma {
    double mean = 0, var = 0;
    int64_t n = 0;
    int consecutive = 0;  // spikes in a row: a lasting level change is adopted after 3
  };

 private:
  void Check(const char* what, double x, double ratio, Ewma* e, const StepData& s);
  const RunCtx* ctx_;
  std::map<uint32_t, Ewma> loss_, grad_;
};

// `stall`: no message at all (heartbeats included) for stall_s, or messages but no
// new step for stall_s. Fires once per episode; a Goodbye ends the run quietly.
class StallDetector : public RunDetector {
 public:
  explicit StallDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "stall"; }
  void OnStep(const StepData& s) override;
  void OnActivity(int64_t now_ns, bool goodbye) override;
  void OnTick(int64_t now_ns) override;
  void OnResume(int64_t now_ns) override;

 private:
  const RunCtx* ctx_;
  int64_t last_msg_ns_ = 0, last_step_ns_ = 0;
  uint64_t last_step_ = 0;
  bool steps_seen_ = false, ended_ = false, msg_fired_ = false, step_fired_ = false;
};

// `restart`: a rank's step numbers went back under a new agent session (the job was
// restarted under the same run id without start_step; RunDecoder tells). A warning
// naming the steps whose numbers repeat (they are not compared) and what to pass.
void EmitRestart(const RunCtx& ctx, const Rewind& r);
// The `duplicate_rank` finding: two live processes claim one (run, rank) (Rewind::kDuplicate).
void EmitDuplicateRank(const RunCtx& ctx, const Rewind& r);

// All per-run rules, in the order they run.
std::vector<std::unique_ptr<RunDetector>> MakeRunDetectors(const RunCtx* ctx);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_RUN_RULES_H_
