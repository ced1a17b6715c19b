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

TEST(PairMetrics, HistogramKlIsZeroForEqualAndPositiveOtherwise) {
  uint32_t p[16] = {0, 0, 5, 10, 20, 10, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t q[16] = {0, 0, 0, 0, 5, 10, 20, 10, 5, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_DOUBLE_EQ(HistKl(p, p, 16), 0.0);
  EXPECT_GT(HistKl(p, q, 16), 0.5);
}

}  // namespace
}  // namespace lockstep::collector
