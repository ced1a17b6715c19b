#include "rules/rank_onsets.h"

#include <vector>

namespace lockstep::collector {

void RankOnsets::Observe(const PairStepView& v) {
  auto [it, inserted] = first_.try_emplace(v.rank);
  Onset& o = it->second;
  if (o.step >= 0 && static_cast<uint64_t>(o.step) <= v.step) return;
  if (v.matched == nullptr) return;
  for (const MatchedTensor& m : *v.matched) {  // in execution order
    if (m.drifting()) {
      o.step = static_cast<int64_t>(v.step);
      o.key = m.c->key;
      return;
    }
  }
}

uint32_t RankOnsets::FirstAt(uint64_t step) const {
  uint32_t n = 0;
  for (const auto& [rank, o] : first_) n += o.step == static_cast<int64_t>(step);
  return n;
}

std::string RankOnsets::Where(uint64_t step, uint32_t rank) const {
  const std::string one = "rank " + std::to_string(rank);
  auto self = first_.find(rank);
  if (first_.size() <= 1 || self == first_.end() || self->second.step != static_cast<int64_t>(step)) return one;
  std::vector<uint32_t> at;
  for (const auto& [r, o] : first_)
    if (o.step == self->second.step && o.key == self->second.key) at.push_back(r);
  if (at.size() <= 1) return one;
  const std::string of = std::to_string(first_.size());
  if (at.size() == first_.size()) return "all " + of + " ranks";
  std::string s = "ranks ";
  for (size_t i = 0; i < at.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(at[i]);
  if (at.size() > 8) s += ", ...";
  return s + " of " + of;
}

std::string StepsTimesRanks(uint64_t steps_compared, uint32_t ranks) {
  if (ranks <= 1) return std::to_string(steps_compared);
  if (steps_compared % ranks == 0)
    return std::to_string(steps_compared / ranks) + " steps × " + std::to_string(ranks) + " ranks";
  return std::to_string(steps_compared) + " (step, rank)s over " + std::to_string(ranks) + " ranks";
}

}  // namespace lockstep::collector
