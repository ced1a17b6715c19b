// Per-pair rules (docs/rules.md): loss_drift, tensor_drift, first_divergence, trend.
// One instance per (baseline, candidate) pair; each sees every compared step with its
// matched tensors already evaluated (PairStepView). Threads: the analyzer's thread.
#ifndef LOCKSTEP_COLLECTOR_RULES_PAIR_RULES_H_
#define LOCKSTEP_COLLECTOR_RULES_PAIR_RULES_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rules/detector.h"
#include "rules/rank_onsets.h"

namespace lockstep::collector {

// `loss_drift`: the two runs' losses at one step differ beyond loss_rtol.
class LossDriftDetector : public PairDetector {
 public:
  explicit LossDriftDetector(const PairCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "loss_drift"; }
  void OnPairStep(const PairStepView& v) override;

 private:
  const PairCtx* ctx_;
  std::map<uint32_t, int> level_;  // per rank: 0 none, 1 warned, 2 critical sent
};

// `tensor_drift`: a matched tensor's drift score is above its threshold. Once per
// (rank, tensor) when it starts drifting, once more if it becomes critical (the level
// is in its TensorTrack); at most max_tensor_alerts_per_step per (rank, step),
// earliest in execution order first.
class TensorDriftDetector : public PairDetector {
 public:
  explicit TensorDriftDetector(const PairCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "tensor_drift"; }
  void OnPairStep(const PairStepView& v) override;

 private:
  const PairCtx* ctx_;
};

// `scalars`: the two runs' lr, loss scale, samples or global grad norm differ (beyond
// scalar_rtol / grad_norm_rtol): once per scalar, at the first step it differs ("lr
// differs from step 100: 0.001 vs 0.01"). Notes lr / loss scale / samples in PairFacts,
// where first_divergence finds its cause.
class ScalarsDetector : public PairDetector {
 public:
  explicit ScalarsDetector(const PairCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "scalars"; }
  void OnPairStep(const PairStepView& v) override;

 private:
  void Check(const char* what, double b, double c, double rtol, const PairStepView& v, int bit);
  const PairCtx* ctx_;
  unsigned fired_ = 0;  // bits: lr, loss_scale, samples, grad_norm
};

// `first_divergence`: at the first step where an op adds error of its own (its birth
// point, rules/birth.h, even below the tolerance: warning; critical when its output
// is also beyond it) or any tensor drifts, that op — else the earliest drifting
// tensor in execution order — with both runs' values and its likely cause
// (docs/rules.md "Causes"): weights, data, config, precision, op or unknown. Once per
// pair; what it sent is kept in the pair's PairOutcome (PairCtx::outcome).
// Across ranks the decision waits until every rank has been compared at that step:
// every rank the runs say they have (Hello's world_size), else every rank compared so
// far (ranks arrive in any order; an earlier onset on a lagging rank replaces a later
// one), so the live collector and `compare` name the same
// step and rank(s): one alert, "at step 3 on all 4 ranks" / "on ranks 0, 2 of 4" /
// "rank 2" (RankOnsets::Where), for the rank whose first drifting tensor is earliest
// in execution order (the lowest rank on a tie). A rank that ended or went silent
// holds it at most kWaitNs (the decoder's idle close), and not past the pair's end.
class FirstDivergenceDetector : public PairDetector {
 public:
  static constexpr int64_t kWaitNs = 2'000'000'000;

  explicit FirstDivergenceDetector(const PairCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "first_divergence"; }
  void OnPairStep(const PairStepView& v) override;
  void OnTick(int64_t now_ns) override;
  void OnEnd() override;

 private:
  // Sets a->cause and returns the sentence that explains it.
  std::string Cause(const PairStepView& v, const MatchedTensor& first, alerting::Alert* a) const;
  // The causes the pair's facts show (data by samples, config, precision): sets
  // a->cause and returns the sentence, or "" when they show none. `at_op`: for a birth
  // point (the setup explains that op), not for the whole drift.
  std::string SetupCause(const PairStepView& v, alerting::Alert* a, bool at_op) const;
  // No module output, module input or model input beyond the tolerance at this step.
  static bool ForwardAgrees(const PairStepView& v);
  // The module whose own code made the input row `input` of a module: the enclosing
  // module, or the root, displayed.
  std::string ParentOf(uint32_t input) const;
  // The alert naming the birth point `b` (rules/birth.h); `drifting` tensors are
  // beyond the tolerance at the step.
  alerting::Alert BirthAlert(const PairStepView& v, const OpBirth& b, size_t drifting) const;
  // Emits the pending onset when every rank seen has been compared at its step (or `force`).
  void Decide(bool force);
  // After the first divergence, born in a container's own code (outcome->zoom): the
  // first step whose birth point is a call inside it (zoomed rows, docs/rules.md
  // "Zoomed: the call") names that call, once, as the refined first divergence.
  void Refine(const PairStepView& v);
  // ... or, at a zoomed step whose calls all agree where both runs make them, names the
  // calls only one run makes (a cast to fp16, an extra scaling) as where it is born.
  void RefineByOneSidedCalls(const PairStepView& v);
  const PairCtx* ctx_;
  bool fired_ = false;
  RankOnsets onsets_;
  std::map<uint32_t, int64_t> compared_;  // rank -> last step compared
  // rank -> the last step compared with tensors (not only the loss): a sampled run
  // (watch(every=), --sample-quiet) has steps between with none, where an onset hides.
  std::map<uint32_t, int64_t> with_tensors_;
  // The earliest onset not yet decided: its step, and per rank drifting at it the
  // alert as it would be sent and its first tensor's execution order.
  int64_t pending_step_ = -1;
  int64_t pending_since_ns_ = 0;
  std::map<uint32_t, std::pair<uint32_t, alerting::Alert>> pending_;
  std::map<uint32_t, std::string> zoom_of_;  // rank -> the container born in its own code at the onset
};

// `trend`: a tensor's drift score grew trend_growth-fold over trend_window steps of
// one rank, mostly monotonically, and is still under its threshold: reported before it
// crosses. Once per (rank, tensor). A trend downstream of the rank's onset — at a later
// step than the rank's first drifting tensor or born op, or later in execution order at
// that step — is the divergence already found spreading: counted in the pair's
// PairOutcome::trends_downstream, not alerted. Per rank, from that rank's own steps in
// order, so the live collector and `compare` count the same.
class TrendDetector : public PairDetector {
 public:
  explicit TrendDetector(const PairCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "trend"; }
  void OnPairStep(const PairStepView& v) override;

 private:
  struct Onset {
    uint64_t step = 0;
    uint32_t order = 0;  // the earliest drifting tensor's or born op's execution order
  };
  const PairCtx* ctx_;
  std::map<uint32_t, Onset> onset_;  // rank -> its onset, once it has one
};

// Fills the human part of a pair alert about one tensor.
void DescribeTensorPair(const PairCtx& ctx, const PairStepView& v, const MatchedTensor& m,
                        alerting::Alert* a);

std::vector<std::unique_ptr<PairDetector>> MakePairDetectors(const PairCtx* ctx);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_PAIR_RULES_H_
