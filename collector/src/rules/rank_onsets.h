// Which ranks of a pair diverge first, and where (the "ranks shown" of a verdict): fed every
// compared (pair, rank, step) by Analyzer::SetPairStepObserver, it keeps each rank's
// first step with a drifting tensor and the first such tensor in execution order, so
// `compare` and `top` can say "on all 4 ranks" when every rank parts at the same step in
// the same tensor, instead of naming whichever rank happened to be compared first. (A
// rank fed other data parts at its input while the others part later in the step, at
// the all-reduced gradients: that is not "all ranks".)
//
// Threads: not synchronised; one owner (the analyzer's thread, or compare's).
#ifndef LOCKSTEP_COLLECTOR_RULES_RANK_ONSETS_H_
#define LOCKSTEP_COLLECTOR_RULES_RANK_ONSETS_H_

#include <cstdint>
#include <map>
#include <string>

#include "rules/detector.h"

namespace lockstep::collector {

class RankOnsets {
 public:
  void Observe(const PairStepView& v);
  // Distinct ranks compared.
  uint32_t ranks() const { return static_cast<uint32_t>(first_.size()); }
  // Ranks whose first drifting step is `step`.
  uint32_t FirstAt(uint64_t step) const;
  // Where a divergence first seen at (`step`, `rank`) is: "rank 2"; "all 4 ranks" when
  // every rank compared first drifts at `step` in the same tensor as `rank`; "ranks 0, 3
  // of 4" when several (but not all) do.
  std::string Where(uint64_t step, uint32_t rank) const;

 private:
  struct Onset {
    int64_t step = -1;  // first drifting step, -1 none yet
    uint64_t key = 0;   // its first drifting tensor in execution order
  };
  std::map<uint32_t, Onset> first_;
};

// "80" for one rank; "20 steps × 4 ranks" when every rank was compared equally often,
// else "80 (step, rank)s over 4 ranks": what steps_compared counts.
std::string StepsTimesRanks(uint64_t steps_compared, uint32_t ranks);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_RULES_RANK_ONSETS_H_
