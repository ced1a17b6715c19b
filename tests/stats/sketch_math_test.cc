// The estimators of sketch_math.h over real sketches from the host kernel: their
// error at the default K = 32 matches docs/statistics.md ("Error at K"), also for a
// difference concentrated in one column of a matrix, and for the law-of-cosines
// cosine near cos = 1.
#include "lockstep/common/sketch_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lockstep/agent/host_stats.h"

namespace lockstep {
namespace {

const float* z32() {
  static const float kZero[kMaxSketchK] = {};
  return kZero;
}

TensorStats Stats(const std::vector<float>& v) {
  TensorStats s;
  EXPECT_TRUE(ComputeHostStats(v.data(), DType::kF32, v.size(), StatsConfig{}, &s).ok());
  return s;
}

double TrueDistance(const std::vector<float>& x, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
  return std::sqrt(s);
}

struct Moments {
  double mean = 0, sd = 0;
};
Moments Of(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= v.size();
  for (double x : v) m.sd += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(m.sd / (v.size() - 1));
  return m;
}

// Ratio estimate/true of the relative distance over many random pairs. Predicted:
// E[ratio^2] = 1 (unbiased d^2), sd(ratio) = sqrt(1/(2K)) = 0.125 at K = 32.
TEST(SketchMath, RelDistanceErrorAtDefaultKMatchesTheDerivation) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<double> logeps(-5, -1);
  std::vector<double> ratio, ratio2;
  for (int t = 0; t < 400; ++t) {
    const size_t n = 2048 + 37 * t;
    std::vector<float> x(n), y(n);
    const float eps = static_cast<float>(std::pow(10.0, logeps(rng)));
    for (size_t i = 0; i < n; ++i) {
      x[i] = nd(rng);
      y[i] = x[i] + eps * nd(rng);
    }
    TensorStats sx = Stats(x), sy = Stats(y);
    const double truth = TrueDistance(x, y) / sx.l2;
    const double est = SketchRelDistance(sx.sketch, sy.sketch, sx.sketch_k, sx.l2);
    ratio.push_back(est / truth);
    ratio2.push_back((est / truth) * (est / truth));
  }
  Moments r = Of(ratio), r2 = Of(ratio2);
  const double sigma = SketchRelDistanceSigma(kDefaultSketchK);
  EXPECT_NEAR(sigma, 0.125, 1e-12);
  // 400 samples: the sd estimate is within ~4 % (1 sigma); the bands are ~3 sigma and
  // exclude K = 16 (0.177) or K = 64 (0.088) behaviour.
  EXPECT_GT(r.sd, 0.85 * sigma) << "sd " << r.sd;
  EXPECT_LT(r.sd, 1.15 * sigma) << "sd " << r.sd;
  EXPECT_NEAR(r2.mean, 1.0, 0.05) << "d^2 biased";
}

// A difference that sits in one column of a row-major [rows, 64] matrix: every such
// element has the same index mod K. The block rotation must still spread it.
TEST(SketchMath, ColumnConcentratedDifferenceIsStillSpread) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_int_distribution<int> col(0, 63);
  std::vector<double> ratio;
  const size_t rows = 256, cols = 64;
  for (int t = 0; t < 300; ++t) {
    std::vector<float> x(rows * cols), y;
    for (auto& v : x) v = nd(rng);
    y = x;
    const int c = col(rng);
    for (size_t r = 0; r < rows; ++r) y[r * cols + c] += 1e-2f * nd(rng);
    TensorStats sx = Stats(x), sy = Stats(y);
    const double truth = TrueDistance(x, y) / sx.l2;
    ratio.push_back(SketchRelDistance(sx.sketch, sy.sketch, 32, sx.l2) / truth);
  }
  Moments r = Of(ratio);
  // bucket = i % K would put the whole column in one bucket: sd ~ 0.6.
  EXPECT_LT(r.sd, 1.2 * SketchRelDistanceSigma(32)) << "sd " << r.sd;
  EXPECT_NEAR(r.mean, 1.0, 0.05);
}

// 1 - cos is estimated with relative sd about sqrt(2/K) = 0.25 when the difference
// is isotropic noise and the norms agree.
TEST(SketchMath, CosineErrorNearOneMatchesTheDerivation) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  std::vector<double> rel;
  for (int t = 0; t < 300; ++t) {
    const size_t n = 4096;
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = nd(rng);
      y[i] = x[i] + 1e-2f * nd(rng);
    }
    double xy = 0, xx = 0, yy = 0;
    for (size_t i = 0; i < n; ++i) {
      xy += double{x[i]} * y[i];
      xx += double{x[i]} * x[i];
      yy += double{y[i]} * y[i];
    }
    const double one_minus = 1 - xy / std::sqrt(xx * yy);  // ~5e-5
    TensorStats sx = Stats(x), sy = Stats(y);
    const double est = 1 - SketchCosine(sx.sketch, sy.sketch, 32, sx.l2, sy.l2);
    rel.push_back(est / one_minus);
  }
  Moments r = Of(rel);
  EXPECT_NEAR(r.mean, 1.0, 0.06);
  EXPECT_GT(r.sd, 0.17) << "sd " << r.sd;  // sqrt(2/32) = 0.25
  EXPECT_LT(r.sd, 0.33) << "sd " << r.sd;
}

TEST(SketchMath, EqualTensorsGiveZeroDistanceAndCosineOne) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i);
  TensorStats s = Stats(x);
  EXPECT_EQ(SketchRelDistance(s.sketch, s.sketch, 32, s.l2), 0.0);
  EXPECT_EQ(SketchCosine(s.sketch, s.sketch, 32, s.l2, s.l2), 1.0);
  // Linearity: S(x) - S(2x) = -S(x), so the estimate is exactly ||S(x)|| / ||x||.
  std::vector<float> twice(x);
  for (auto& v : twice) v = 2 * v;
  TensorStats t = Stats(twice);
  const double sketch_norm = std::sqrt(SketchDiffSquared(s.sketch, z32(), 32));
  EXPECT_NEAR(SketchRelDistance(s.sketch, t.sketch, 32, s.l2), sketch_norm / s.l2, 1e-6);
  float z[32] = {};
  EXPECT_EQ(SketchCosine(z, z, 32, 0, 0), 1.0);
  EXPECT_EQ(SketchCosine(z, s.sketch, 32, 0, s.l2), 0.0);
  EXPECT_TRUE(std::isinf(SketchRelDistance(z, s.sketch, 32, 0)));
}

TEST(SketchMath, HistKLIsZeroForEqualAndMatchesHandComputedValue) {
  uint32_t p[16] = {}, q[16] = {};
  p[3] = q[3] = 100;
  p[4] = q[4] = 300;
  EXPECT_EQ(HistKL(p, q, 16), 0.0);
  // Two bins, alpha = 0: P = (0.25, 0.75), Q = (0.5, 0.5).
  uint32_t a[2] = {1, 3}, b[2] = {2, 2};
  const double want = 0.25 * std::log(0.5) + 0.75 * std::log(1.5);
  EXPECT_NEAR(HistKL(a, b, 2, 0.0), want, 1e-12);
  // An empty candidate bin stays finite thanks to the smoothing.
  uint32_t c[2] = {10, 0}, d[2] = {0, 10};
  EXPECT_TRUE(std::isfinite(HistKL(c, d, 2)));
  EXPECT_GT(HistKL(c, d, 2), 1.0);
}

TEST(SketchMath, RelError) {
  EXPECT_NEAR(RelError(1.1, 1.0), RelError(0.9, 1.0), 1e-12);
  EXPECT_NEAR(RelError(1.1, 1.0), 0.1, 1e-12);
  EXPECT_EQ(RelError(0.0, 0.0), 0.0);
  EXPECT_NEAR(RelError(1e-3, 0.0, 1e-6), 1e3, 1e-9);
  EXPECT_TRUE(std::isnan(RelError(NAN, 1.0)));
  EXPECT_EQ(RelError(INFINITY, INFINITY), 0.0);
}

}  // namespace
}  // namespace lockstep
