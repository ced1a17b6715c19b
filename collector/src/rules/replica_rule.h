// `replicas`: the data-parallel replicas of one run must hold the same gradient after
// the all-reduce (docs/rules.md "replicas"). Every few steps each rank of a job whose
// model is a DistributedDataParallel records every watched parameter's .grad at the
// optimizer's pre-step (kind grad_reduced, docs/python.md "The replica check"); this
// rule compares, per (step, parameter), every rank's statistics with the lowest rank's,
// bit for bit, and raises one critical alert per step where any differ: silent data
// corruption, or a rank that skipped or corrupted the reduction.
//
// What is compared: every statistic of a record the C++ host kernel computed (one
// pass in a fixed order: identical bytes give identical bits). For a record of the
// agent's batched device path (StatRow::device, on either rank) only what does not
// depend on the order of additions: numel, min, max, absmax, the five counts and the
// histogram (schema StatFlags.kDevice says why its float sums may not repeat).
//
// A step is judged once all of the run's ranks (its Hellos' world_size) have sent it,
// whatever order they arrive in, so live and `compare` judge the same sets and say
// the same thing. Waiting steps are bounded (kMaxPending, the oldest dropped unjudged):
// DDP ranks move in lockstep, a rank that far behind has stopped. A parameter one rank
// did not send is not judged (a record dropped on the way is no disagreement).
//
// Threads: the analyzer's thread only, like every RunDetector.
#ifndef LOCKSTEP_COLLECTOR_RULES_REPLICA_RULE_H_
#define LOCKSTEP_COLLECTOR_RULES_REPLICA_RULE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "rules/detector.h"

namespace lockstep::collector {

class ReplicaDetector : public RunDetector {
 public:
  explicit ReplicaDetector(const RunCtx* ctx) : ctx_(ctx) {}
  const char* rule() const override { return "replicas"; }
  void OnStep(const StepData& s) override;

  // Steps waiting for their other ranks, at most.
  static constexpr size_t kMaxPending = 64;

  // One grad_reduced record, copied out of its StepData (which is not kept).
  struct Row {
    StatRow stat;
    std::vector<float> sketch;
    std::vector<uint32_t> hist;
  };

 private:
  void Judge(uint64_t step, const std::map<uint32_t, std::vector<Row>>& ranks);

  const RunCtx* ctx_;
  // step -> rank -> its grad_reduced rows, sorted by key.
  std::map<uint64_t, std::map<uint32_t, std::vector<Row>>> pending_;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_REPLICA_RULE_H_
