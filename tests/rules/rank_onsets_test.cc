// Ranks shown (issue 20): which ranks part first, said as "rank 2", "all 4 ranks" or
// "ranks 0, 3 of 4", and "20 steps × 4 ranks" for what steps_compared counts.
#include "rules/rank_onsets.h"

#include <vector>

#include <gtest/gtest.h>

#include "detect/compare_gate.h"

namespace lockstep::collector {
namespace {

// One compared (rank, step): `drifting` lists the keys that drift, in execution order.
struct FakeStep {
  std::vector<StatRow> rows;
  std::vector<MatchedTensor> matched;
  FakeStep(std::vector<uint64_t> keys, std::vector<bool> drifting) {
    rows.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      rows[i].key = keys[i];
      rows[i].order = static_cast<uint32_t>(i);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      MatchedTensor m;
      m.b = m.c = &rows[i];
      m.threshold = 1;
      m.eval.score = drifting[i] ? 5 : 0.1;
      matched.push_back(m);
    }
  }
  PairStepView View(uint64_t step, uint32_t rank) {
    PairStepView v;
    v.step = step;
    v.rank = rank;
    v.matched = &matched;
    return v;
  }
};

const uint64_t kInput = MakeKey(0, Kind::kInput, 0);
const uint64_t kLayer = MakeKey(1, Kind::kAct, 0);
const uint64_t kGrad = MakeKey(2, Kind::kParamGrad, 0);

TEST(RankOnsets, AllRanksPartingInOneTensorAtOneStepAreSaidSo) {
  RankOnsets o;
  FakeStep clean({kInput, kLayer, kGrad}, {false, false, false});
  FakeStep layer({kInput, kLayer, kGrad}, {false, true, true});
  for (uint32_t r = 0; r < 4; ++r) o.Observe(clean.View(0, r));
  for (uint32_t r = 0; r < 4; ++r) o.Observe(layer.View(1, r));
  for (uint32_t r = 0; r < 4; ++r) o.Observe(layer.View(2, r));  // later steps change nothing
  EXPECT_EQ(o.ranks(), 4u);
  EXPECT_EQ(o.FirstAt(1), 4u);
  EXPECT_EQ(o.Where(1, 3), "all 4 ranks");
}

TEST(RankOnsets, OneRankFedOtherDataIsThatRankNotAll) {
  RankOnsets o;
  FakeStep data({kInput, kLayer, kGrad}, {true, true, true});
  FakeStep reduced({kInput, kLayer, kGrad}, {false, false, true});  // the all-reduced gradient
  for (uint32_t r = 0; r < 4; ++r) o.Observe((r == 2 ? data : reduced).View(5, r));
  EXPECT_EQ(o.FirstAt(5), 4u);        // every rank drifts at step 5...
  EXPECT_EQ(o.Where(5, 2), "rank 2");  // ...but only rank 2 starts at its input
  EXPECT_EQ(o.Where(5, 0), "ranks 0, 1, 3 of 4");
}

TEST(RankOnsets, OneRankIsJustThatRank) {
  RankOnsets o;
  FakeStep layer({kInput, kLayer}, {false, true});
  o.Observe(layer.View(3, 0));
  EXPECT_EQ(o.Where(3, 0), "rank 0");
}

TEST(RankOnsets, StepsTimesRanks) {
  EXPECT_EQ(StepsTimesRanks(80, 1), "80");
  EXPECT_EQ(StepsTimesRanks(80, 4), "20 steps × 4 ranks");
  EXPECT_EQ(StepsTimesRanks(79, 4), "79 (step, rank)s over 4 ranks");
}

TEST(RankOnsets, TheFirstDivergenceMessageSaysAllRanks) {
  RankOnsets o;
  FakeStep layer({kInput, kLayer}, {false, true});
  for (uint32_t r = 0; r < 4; ++r) o.Observe(layer.View(7, r));
  alerting::Alert a;
  a.step = 7;
  a.rank = 1;
  const std::string msg = "runs b and c part ways: first divergent tensor blk.1 (act, order 1) at step 7 rank 1: l2 1 vs 2";
  EXPECT_EQ(WithWhere(msg, a, &o),
            "runs b and c part ways: first divergent tensor blk.1 (act, order 1) at step 7 on all 4 ranks: l2 1 vs 2");
  EXPECT_EQ(WithWhere(msg, a, nullptr), msg);
  EXPECT_EQ(FirstDivergenceWhere(a, &o), "all 4 ranks");
}

}  // namespace
}  // namespace lockstep::collector
