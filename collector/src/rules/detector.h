// The detector interfaces and what they see (docs/design.md "Detectors", docs/rules.md).
//
// Per-run detectors (nonfinite, overflow, underflow, spike, stall) get every closed
// step of one run, one instance per run. Per-pair detectors (loss_drift, tensor_drift,
// first_divergence, trend) get every compared step of one (baseline, candidate) pair,
// one instance per pair, with the matched tensors already evaluated.
// Alerts leave through AlertEmitter, which stamps id, time and counts, and hands them
// to the callback (the alerting Dispatcher's queue, a JSONL writer, a test vector).
//
// Threads: all of this runs on the analyzer's single thread.
#ifndef LOCKSTEP_COLLECTOR_RULES_DETECTOR_H_
#define LOCKSTEP_COLLECTOR_RULES_DETECTOR_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "align/names.h"
#include "align/pair_metrics.h"
#include "align/step_data.h"
#include "rules/birth.h"
#include "rules/rules_config.h"
#include "rules/setup_rule.h"
#include "lockstep/alerting/alert.h"
#include "lockstep/common/clock.h"

namespace lockstep::collector {

using AlertFn = std::function<void(alerting::Alert)>;

class AlertEmitter {
 public:
  // `clock` (not owned, outlives the emitter) stamps first_seen with its unix time;
  // null: first_seen stays 0 and Now() reads 0 (output that must not depend on time).
  AlertEmitter(AlertFn fn, const Clock* clock) : fn_(std::move(fn)), clock_(clock) {}
  // Stamps id (dedup key @ step), first_seen and the incident key (incident_key.h),
  // counts, and hands it on. Returns the alert as stamped (valid until the next Emit).
  const alerting::Alert& Emit(alerting::Alert a);
  int64_t Now() const { return clock_ != nullptr ? clock_->NowUnixNs() : 0; }
  // Alerts emitted so far, by rule and by severity.
  const std::map<std::string, uint64_t>& by_rule() const { return by_rule_; }
  uint64_t count(alerting::Severity s) const { return by_severity_[static_cast<int>(s)]; }
  uint64_t total() const { return total_; }
  // The most recent alert emitted (empty rule before the first).
  const alerting::Alert& last() const { return last_; }

 private:
  AlertFn fn_;
  const Clock* clock_;
  std::map<std::string, uint64_t> by_rule_;
  uint64_t by_severity_[3] = {0, 0, 0};
  uint64_t total_ = 0;
  alerting::Alert last_;
};

struct RunCtx {
  std::string run;
  std::string experiment;
  const NameTable* names = nullptr;
  const RulesConfig* cfg = nullptr;
  AlertEmitter* out = nullptr;
  // The ranks it says it has (its Hellos' world_size; null or 0: unknown yet): the
  // replicas rule judges a step once every rank has sent it.
  const uint32_t* world_size = nullptr;
  // An alert about this run with the common fields filled.
  alerting::Alert Make(const char* rule, alerting::Severity sev, uint64_t step, uint32_t rank) const;
};

// What a pair's rules concluded that the report shows: set by first_divergence when it
// fires (a typed signal, not a rule name read back from the emitter).
struct PairOutcome {
  bool diverged = false;
  alerting::Alert first_divergence;  // as emitted (id, incident stamped); valid when diverged
  // Trends the `trend` rule found downstream of a rank's onset (its first drifting
  // tensor or born op: the first divergence's cause) and counted instead of alerting.
  uint64_t trends_downstream = 0;
  // The first divergence was born in a container's own code: the module to zoom into
  // (docs/rules.md "Zoomed: the call"; the collector asks both runs, when live). Once
  // zoomed rows name the call inside it, first_divergence is that call and `refined`.
  std::string zoom;
  bool refined = false;
};

struct PairCtx {
  std::string experiment;
  std::string baseline, candidate;
  const NameTable* names = nullptr;
  const RulesConfig* cfg = nullptr;
  AlertEmitter* out = nullptr;
  PairFacts* facts = nullptr;  // owned by the pair: setup differences, scalar findings
  PairOutcome* outcome = nullptr;  // owned by the pair: its first divergence
  // The ranks the two runs say they have (Hello's world_size; null or 0: unknown):
  // first_divergence waits for all of them at its onset step.
  const uint32_t* world_b = nullptr;
  const uint32_t* world_c = nullptr;
  uint32_t WorldSize() const {
    return std::max(world_b != nullptr ? *world_b : 0u, world_c != nullptr ? *world_c : 0u);
  }
  alerting::Alert Make(const char* rule, alerting::Severity sev, uint64_t step, uint32_t rank) const;
};

// Rule state of one (pair, rank, tensor key): the noise floor, the recent scores
// (trend) and the drift level already reported. Per rank, learned in that rank's step
// order, so the same logs give the same state whatever order the ranks arrive in
// (docs/rules.md "Noise floor"). Owned by the pair's detection state; the rules read
// and update it. The compare table (worst step, first drift) is kept apart, per tensor
// over all ranks (Analyzer).
struct TensorTrack {
  uint64_t key = 0;
  uint32_t rank = 0;
  uint32_t floor_n = 0;        // steps learned so far
  double floor = 0;            // max normalized score over the learning steps
  std::vector<float> recent;   // ring of the last trend_window scores
  std::vector<float> recent_raw;  // and of score x l2 (the difference itself, not scaled by the tensor)
  uint32_t recent_pos = 0;
  uint8_t drift_level = 0;     // 0 none, 1 warned, 2 critical sent
  bool trend_fired = false;

  // The threshold in normalized units: max(1, k x floor) once learned.
  double Threshold(const RulesConfig& cfg) const {
    return floor_n >= static_cast<uint32_t>(cfg.floor_steps) ? std::max(1.0, cfg.floor_k * floor) : 1.0;
  }
  // One more compared step's score, while the floor is being learned.
  void Learn(double score, const RulesConfig& cfg) {
    if (floor_n >= static_cast<uint32_t>(cfg.floor_steps)) return;
    if (std::isfinite(score)) floor = std::max(floor, score);
    ++floor_n;
  }
};

struct MatchedTensor {
  const StatRow* b = nullptr;
  const StatRow* c = nullptr;
  PairEval eval;
  double threshold = 1;        // normalized, from the track before this step's update
  TensorTrack* track = nullptr;  // this (rank, tensor)'s rule state
  bool drifting() const { return eval.score > threshold; }
};

struct PairStepView {
  uint64_t step = 0;
  uint32_t rank = 0;
  const StepData* b = nullptr;
  const StepData* c = nullptr;
  DT precision = DT::kF32;
  std::vector<MatchedTensor>* matched = nullptr;  // in execution order (candidate's)
  // Where the error is born (rules/birth.h): the step's ops ranked by the error they
  // add, and the index of the birth point in it (-1: none). Null when not judged (no
  // act_in records, or --birth-ulps 0).
  const std::vector<OpBirth>* births = nullptr;
  int birth = -1;
  const BirthFinder* birth_state = nullptr;  // this rank's (weights moved apart), or null
};

class RunDetector {
 public:
  virtual ~RunDetector() = default;
  virtual const char* rule() const = 0;
  virtual void OnStep(const StepData& step) = 0;
  // Heartbeat / any message of the run (stall); Goodbye ends it.
  virtual void OnActivity(int64_t /*now_ns*/, bool /*goodbye*/) {}
  virtual void OnTick(int64_t /*now_ns*/) {}
  // The collector restarted at `now_ns` after replaying the logs: time it was down
  // is not the run's silence.
  virtual void OnResume(int64_t /*now_ns*/) {}
};

class PairDetector {
 public:
  virtual ~PairDetector() = default;
  virtual const char* rule() const = 0;
  virtual void OnPairStep(const PairStepView& v) = 0;
  // The analyzer's timer (live only, about every 100 ms) and the pair's end (Finish):
  // for a rule that holds a decision back (first_divergence).
  virtual void OnTick(int64_t /*now_ns*/) {}
  virtual void OnEnd() {}
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_DETECTOR_H_
