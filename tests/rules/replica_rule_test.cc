// The `replicas` rule (rules/replica_rule.h): the data-parallel ranks of one run must
// record bit-identical reduced gradients (kind grad_reduced); one alert per step when
// they do not, naming the first differing parameter in execution order and the rank.
#include "rules/replica_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace lockstep::collector {
namespace {

class ReplicaRuleTest : public ::testing::Test {
 protected:
  ReplicaRuleTest()
      : emitter_([this](alerting::Alert a) { alerts_.push_back(std::move(a)); }, nullptr) {
    ctx_.run = "ddp";
    ctx_.experiment = "exp";
    ctx_.names = &names_;
    ctx_.cfg = &cfg_;
    ctx_.out = &emitter_;
    ctx_.world_size = &world_;
    w1_ = names_.Intern("fc1.weight");
    w2_ = names_.Intern("fc2.weight");
  }

  // A step of `rank`: the two parameters' reduced gradients (fc1 first in execution
  // order) and fc1's param_grad row, which differs per rank as local gradients do; rows
  // sorted by key, as a closed step's are.
  StepData Step(uint64_t step, uint32_t rank, bool device = false) {
    StepData s;
    s.step = step;
    s.rank = rank;
    auto add = [&](uint32_t name, Kind kind, uint32_t order, double scale) {
      StatRow r;
      r.key = MakeKey(name, kind, 0);
      r.order = order;
      r.dtype = DT::kF32;
      r.numel = 64;
      r.min = -0.25 * scale;
      r.max = 0.5 * scale;
      r.absmax = 0.5 * scale;
      r.mean = 0.0123 * scale;
      r.std = 0.1 * scale;
      r.l2 = 0.8 * scale;
      r.zero_count = 1;
      r.device = device;
      r.hist_bins = 2;
      r.hist_off = static_cast<uint32_t>(s.hist.size());
      s.hist.push_back(10);
      s.hist.push_back(54);
      r.sketch_k = 2;
      r.sketch_off = static_cast<uint32_t>(s.sketch.size());
      s.sketch.push_back(0.5f * static_cast<float>(scale));
      s.sketch.push_back(-0.25f * static_cast<float>(scale));
      s.rows.push_back(r);
    };
    add(w1_, Kind::kParamGrad, 0, 1.0 + rank);  // local: differs per rank, never judged
    add(w1_, Kind::kGradReduced, 2, 1.0);
    add(w2_, Kind::kGradReduced, 3, 2.0);
    std::sort(s.rows.begin(), s.rows.end(),
              [](const StatRow& a, const StatRow& b) { return a.key < b.key; });
    return s;
  }

  StatRow& Row(StepData* s, uint32_t name) {
    for (StatRow& r : s->rows)
      if (KeyNameId(r.key) == name && KeyKind(r.key) == Kind::kGradReduced) return r;
    ADD_FAILURE() << "no row";
    return s->rows[0];
  }

  NameTable names_;
  RulesConfig cfg_;
  std::vector<alerting::Alert> alerts_;
  AlertEmitter emitter_;
  RunCtx ctx_;
  uint32_t world_ = 2;
  uint32_t w1_ = 0, w2_ = 0;
};

TEST_F(ReplicaRuleTest, AgreeingRanksRaiseNothing) {
  ReplicaDetector d(&ctx_);
  for (uint64_t step = 0; step < 20; step += 5) {
    d.OnStep(Step(step, 1));  // any arrival order
    d.OnStep(Step(step, 0));
  }
  EXPECT_TRUE(alerts_.empty());
}

TEST_F(ReplicaRuleTest, OneUlpOnRankOneNamesThatRankAndParameter) {
  ReplicaDetector d(&ctx_);
  StepData r0 = Step(5, 0);
  StepData r1 = Step(5, 1);
  StatRow& bad = Row(&r1, w2_);
  bad.l2 = std::nextafter(bad.l2, 2.0);  // one ulp
  d.OnStep(r1);
  EXPECT_TRUE(alerts_.empty());  // rank 0 not there yet: nothing judged
  d.OnStep(r0);
  ASSERT_EQ(alerts_.size(), 1u);
  const alerting::Alert& a = alerts_[0];
  EXPECT_EQ(a.rule, "replicas");
  EXPECT_EQ(a.severity, alerting::Severity::kCritical);
  EXPECT_EQ(a.step, 5u);
  EXPECT_EQ(a.rank, 1u);
  EXPECT_EQ(a.tensor, "fc2.weight");
  EXPECT_EQ(a.kind, "grad_reduced");
  EXPECT_EQ(a.metric, "l2");
  EXPECT_EQ(a.runs, std::vector<std::string>{"ddp"});
  EXPECT_NE(a.message.find("on rank 1 differs from rank 0"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("silent data corruption"), std::string::npos) << a.message;
  EXPECT_EQ(a.id, "replicas/exp/ddp/fc2.weight/grad_reduced/rank1@5");
  EXPECT_EQ(a.incident, "replicas/exp/ddp");
  // The next step agrees again: nothing more.
  d.OnStep(Step(10, 0));
  d.OnStep(Step(10, 1));
  EXPECT_EQ(alerts_.size(), 1u);
}

TEST_F(ReplicaRuleTest, TheFirstParameterInExecutionOrderAndOneAlertPerStep) {
  world_ = 3;
  ReplicaDetector d(&ctx_);
  StepData r0 = Step(7, 0), r1 = Step(7, 1), r2 = Step(7, 2);
  Row(&r2, w1_).max = 0.75;  // earlier in execution order, on rank 2
  Row(&r1, w2_).mean = 1.0;  // later, on rank 1
  d.OnStep(r2);
  d.OnStep(r0);
  d.OnStep(r1);
  ASSERT_EQ(alerts_.size(), 1u);
  EXPECT_EQ(alerts_[0].tensor, "fc1.weight");
  EXPECT_EQ(alerts_[0].rank, 2u);
  EXPECT_EQ(alerts_[0].metric, "max");
  EXPECT_NE(alerts_[0].message.find("2 parameter(s) differ, on rank(s) 1, 2 of 3"),
            std::string::npos)
      << alerts_[0].message;
}

TEST_F(ReplicaRuleTest, DeviceRecordsAreJudgedOnWhatDoesNotDependOnTheBatch) {
  ReplicaDetector d(&ctx_);
  StepData r0 = Step(0, 0, /*device=*/true), r1 = Step(0, 1, /*device=*/true);
  Row(&r1, w1_).l2 = std::nextafter(Row(&r1, w1_).l2, 2.0);  // a float sum: not judged
  r1.sketch[Row(&r1, w1_).sketch_off] += 1e-3f;
  d.OnStep(r0);
  d.OnStep(r1);
  EXPECT_TRUE(alerts_.empty());
  StepData s0 = Step(1, 0, true), s1 = Step(1, 1, true);
  s1.hist[Row(&s1, w1_).hist_off] += 1;  // a count: judged
  d.OnStep(s0);
  d.OnStep(s1);
  ASSERT_EQ(alerts_.size(), 1u);
  EXPECT_EQ(alerts_[0].metric, "histogram");
}

TEST_F(ReplicaRuleTest, AStepWaitsForEveryRankAndAMissingParameterIsNotJudged) {
  world_ = 0;  // no Hello yet: nothing judged
  ReplicaDetector d(&ctx_);
  StepData r1 = Step(0, 1);
  Row(&r1, w2_).min = -9;
  d.OnStep(Step(0, 0));
  d.OnStep(r1);
  EXPECT_TRUE(alerts_.empty());
  world_ = 2;
  StepData t0 = Step(5, 0), t1 = Step(5, 1);
  t1.rows.erase(std::remove_if(t1.rows.begin(), t1.rows.end(),
                               [&](const StatRow& r) { return KeyNameId(r.key) == w2_; }),
                t1.rows.end());
  d.OnStep(t0);
  d.OnStep(t1);
  EXPECT_TRUE(alerts_.empty());
}

}  // namespace
}  // namespace lockstep::collector
