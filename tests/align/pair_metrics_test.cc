#include "align/pair_metrics.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace lockstep::collector {
namespace {

StatRow Row(double l2, double mean, double std, double absmax, uint64_t numel = 100) {
  StatRow r;
  r.numel = numel;
  r.l2 = l2;
  r.mean = mean;
  r.std = std;
  r.absmax = absmax;
  return r;
}

TEST(PairMetrics, EqualTensorsScoreZero) {
  StepData s;
  auto r = Row(10, 0.1, 1, 3);
  auto e = EvaluatePair(s, r, s, r, Tolerance{});
  EXPECT_EQ(e.score, 0);
  EXPECT_EQ(e.dominant, Metric::kNone);
  EXPECT_FALSE(e.nonfinite_mismatch);
}

TEST(PairMetrics, ZerosAndDenormalsAreWithinTheAbsoluteFloor) {
  StepData s;
  auto z = Row(0, 0, 0, 0);
  auto d = Row(1e-39, 1e-41, 1e-40, 1e-40);
  auto e = EvaluatePair(s, z, s, d, Tolerance{});
  EXPECT_LT(e.score, 1e-20);
  // ...but a real value against a zero tensor is a drift.
  auto x = Row(1e-3, 0, 1e-4, 1e-4);
  EXPECT_GT(EvaluatePair(s, z, s, x, Tolerance{}).score, 1);
}

TEST(PairMetrics, MeanIsJudgedAgainstTheTensorScale) {
  StepData s;
  // A gradient with mean ~0: a 1e-6 change of the mean is nothing at rms 0.1.
  auto b = Row(1.0, 1e-9, 0.1, 0.5);
  auto c = Row(1.0, 1e-6, 0.1, 0.5);
  auto e = EvaluatePair(s, b, s, c, Tolerance{});
  EXPECT_LT(e.score, 1);
  EXPECT_NEAR(e.rel_mean, (1e-6 - 1e-9) / 0.1, 1e-12);
}

// A step of parameter gradients at ~1e-2 (rms) and one mathematically-zero gradient
// (a conv bias before BatchNorm) at ~1e-8 whose rounding differs by 50 % between runs.
StepData NoiseStep(double tiny_rms) {
  StepData s;
  for (uint32_t i = 0; i < 6; ++i) {
    StatRow r = Row(1e-2 * 10 * (1 + 0.1 * i), 0, 1e-2, 4e-2);  // rms ~1e-2 at numel 100
    r.key = MakeKey(i, Kind::kParamGrad, 0);
    s.rows.push_back(r);
  }
  StatRow tiny = Row(tiny_rms * 10, tiny_rms * 0.5, tiny_rms, tiny_rms * 3);
  tiny.key = MakeKey(6, Kind::kParamGrad, 0);
  s.rows.push_back(tiny);
  // Activations are another context: huge ones must not lift the gradients' floor.
  StatRow act = Row(1e6, 0, 1e5, 1e6);
  act.key = MakeKey(7, Kind::kAct, 0);
  s.rows.push_back(act);
  return s;
}

TEST(PairMetrics, PeerScalesAreTheMedianRmsPerKind) {
  StepData s = NoiseStep(1e-8);
  PeerScales p(s);
  EXPECT_NEAR(p.Of(Kind::kParamGrad), 1.2e-2, 1e-9);  // upper median of 7, the tiny one included
  EXPECT_NEAR(p.Of(Kind::kAct), 1e5, 1e-6);
  EXPECT_EQ(p.Of(Kind::kActGrad), 0);
}

TEST(PairMetrics, ANoiseLevelTensorIsJudgedAgainstItsContextNotItsOwnScale) {
  StepData s = NoiseStep(1e-8);
  const StatRow& b = s.rows[6];
  StatRow c = b;
  c.l2 *= 1.5;
  c.std *= 1.5;
  c.mean *= -1;
  c.absmax *= 1.5;
  // Alone, a 50 % difference is far beyond any tolerance: critical.
  EXPECT_GT(EvaluatePair(s, b, s, c, Tolerance{}).score, 100);
  // Against its peers (~1e-2), 1e-8 is rounding: well within the floor.
  const Tolerance t = WithContextFloor(Tolerance{}, PeerScales(s), b.key);
  EXPECT_NEAR(t.atol_rms, kContextFloor * 1e-3 * 1.2e-2, 1e-12);
  EXPECT_LT(EvaluatePair(s, b, s, c, t).score, 0.1);
  // The same change on a tensor at its peers' scale is still a drift: the floor costs
  // it about 1 % of sensitivity, no more.
  const StatRow& peer = s.rows[0];
  StatRow moved = peer;
  moved.l2 *= 1.01;  // 1 % = 10x rtol
  const Tolerance tp = WithContextFloor(Tolerance{}, PeerScales(s), peer.key);
  const double with = EvaluatePair(s, peer, s, moved, tp).score;
  const double without = EvaluatePair(s, peer, s, moved, Tolerance{}).score;
  EXPECT_GT(with, 9);
  EXPECT_GT(with, 0.98 * without);
  // A tensor 100x below its peers keeps half its sensitivity, so a real change there
  // (50 %) is still far beyond the tolerance.
  StepData s2 = NoiseStep(1e-4);
  StatRow c2 = s2.rows[6];
  c2.l2 *= 1.5;
  EXPECT_GT(EvaluatePair(s2, s2.rows[6], s2, c2, WithContextFloor(Tolerance{}, PeerScales(s2), s2.rows[6].key)).score,
            100);
}

TEST(PairMetrics, NonfiniteOnOneSideIsAnInfiniteScore) {
  StepData s;
  auto b = Row(1, 0, 1, 1);
  auto c = b;
  c.nan_count = 1;
  auto e = EvaluatePair(s, b, s, c, Tolerance{});
  EXPECT_TRUE(e.nonfinite_mismatch);
  EXPECT_TRUE(std::isinf(e.score));
  EXPECT_EQ(e.dominant, Metric::kNonfinite);
  // Both sides NaN in the same way: no mismatch.
  b.nan_count = 1;
  EXPECT_FALSE(EvaluatePair(s, b, s, c, Tolerance{}).nonfinite_mismatch);
}

TEST(PairMetrics, SketchEstimatesDistanceAndCosine) {
  // Exact count-sketch of random vectors: the estimates are within the documented
  // error (rel. std of the distance ~ sqrt(1/(2K)) = 12.5% at K = 32; 4 sigma here).
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0, 1);
  const int k = 32, dim = 4096;
  std::vector<float> sx(k), sy(k);
  double xx = 0, yy = 0, dd = 0;
  for (int i = 0; i < dim; ++i) {
    double x = n(rng), y = x + 0.01 * n(rng);
    int bucket = (i * 7919) % k;
    double sign = ((i * 104729) >> 3) & 1 ? 1 : -1;
    sx[bucket] += static_cast<float>(sign * x);
    sy[bucket] += static_cast<float>(sign * y);
    xx += x * x;
    yy += y * y;
    dd += (x - y) * (x - y);
  }
  const double true_rel = std::sqrt(dd / xx);
  const double est = SketchRelDist(sx.data(), sy.data(), k, std::sqrt(xx));
  EXPECT_NEAR(est / true_rel, 1.0, 0.5);
  const double cos = SketchCosine(sx.data(), sy.data(), k, std::sqrt(xx), std::sqrt(yy));
  EXPECT_GT(cos, 0.999);
  EXPECT_LE(cos, 1.0);
  // Equal sketches: exactly 0 and 1.
  EXPECT_EQ(SketchRelDist(sx.data(), sx.data(), k, std::sqrt(xx)), 0.0);
  EXPECT_EQ(SketchCosine(sx.data(), sx.data(), k, std::sqrt(xx), std::sqrt(xx)), 1.0);
  // Zero tensors.
  std::vector<float> z(k, 0.f);
  EXPECT_EQ(SketchCosine(z.data(), z.data(), k, 0, 0), 1.0);
  EXPECT_EQ(SketchCosine(z.data(), sx.data(), k, 0, std::sqrt(xx)), 0.0);
}

// A statistics-only row (an msprobe import: StatFlags::kStatsOnly, std NaN, no sketch)
// against a live one: judged on l2, mean, absmax and max/min only; no score from the
// std or sketch it lacks; rel_dist is the lower bound max(rel_l2, rel_mean).
TEST(PairMetrics, AStatisticsOnlyPairIsJudgedOnWhatBothSidesHave) {
  StepData bs, cs;
  cs.sketch = std::vector<float>(4, 1.f);
  StatRow b = Row(10, 0.1, NAN, 3);
  b.stats_only = true;
  b.max = 3, b.min = -2;
  StatRow c = Row(10, 0.1, 0.9, 3);  // the same tensor, with a std and a sketch
  c.max = 3, c.min = -2;
  c.sketch_k = 4;
  auto e = EvaluatePair(bs, b, cs, c, Tolerance{});
  EXPECT_TRUE(e.stats_only);
  EXPECT_EQ(e.score, 0);
  EXPECT_TRUE(std::isnan(e.rel_std));
  EXPECT_TRUE(std::isnan(e.cosine));
  EXPECT_EQ(e.rel_dist, 0);
  // Without the flag the NaN std on one side is a total disagreement.
  StatRow full = b;
  full.stats_only = false;
  EXPECT_TRUE(std::isinf(EvaluatePair(bs, full, cs, c, Tolerance{}).score));
  // A moved minimum (absmax unchanged) is seen by rel_err_minmax.
  c.min = -2.5;
  e = EvaluatePair(bs, b, cs, c, Tolerance{});
  EXPECT_EQ(e.dominant, Metric::kMinMax);
  EXPECT_DOUBLE_EQ(e.rel_minmax, 0.5 / 3);
  EXPECT_GT(e.score, 1);
  // The norm and the mean bound the distance from below.
  c.min = -2;
  c.l2 = 10.5;
  c.mean = 0.1 + 0.2;  // rms of b = 10 / sqrt(100) = 1
  e = EvaluatePair(bs, b, cs, c, Tolerance{});
  EXPECT_NEAR(e.rel_dist, std::max(0.05, 0.2), 1e-12);
}

TEST(PairMetrics, HistogramKlIsZeroForEqualAndPositiveOtherwise) {
  uint32_t p[16] = {0, 0, 5, 10, 20, 10, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t q[16] = {0, 0, 0, 0, 5, 10, 20, 10, 5, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_DOUBLE_EQ(HistKl(p, p, 16), 0.0);
  EXPECT_GT(HistKl(p, q, 16), 0.5);
}

}  // namespace
}  // namespace lockstep::collector
